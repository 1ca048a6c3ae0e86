"""MPS accounting (issue 13 point 8, note 037): the default SM share per replica is 100 /
the node's ``max_clients``, charged where the job lands; a node's per-client memory cap;
replicas and client processes are two fields."""

from __future__ import annotations

import pytest
import typer

from builders import job, node, policy, scheduler
from gpushepherd.cli.daemon import parse_share
from gpushepherd.core.intake import SpecError, validate_spec
from gpushepherd.daemon.api import ShareBody
from gpushepherd.model.decisions import Start
from gpushepherd.model.job import GpuShare, JobSpec, mps_env
from gpushepherd.model.reasons import ReasonCode as R
from gpushepherd.policy import PolicyError, policy_from_dict

MPS4 = {"mps": {"max_clients": 4, "max_memory_per_client_mib": 8192}}


def started(out) -> dict[str, str]:
    return {d.job_id: str(d.placement) for d in out if isinstance(d, Start)}


def test_a_job_without_a_percentage_gets_its_replicas_share_of_the_node():
    rules = policy(nodes=[node("n1", 1, gpu_mem_mib=40960, sharing=MPS4)])
    one = GpuShare("mps", slots=1, procs=3)  # one replica, three client processes
    sched, out = scheduler(rules, *[job(f"j{i}", share=one) for i in range(5)])
    # four replicas of 25 % (and 8192 MiB each, the cap) fill the card; processes are no replicas
    assert started(out) == {f"j{i}": "n1:0[mps:1x25%:3procs:8192MiB]" for i in range(4)}
    card = sched.ledger.slots[0].cards[0]
    assert (card.milli, card.mem, card.slots) == (1000, 4 * 8192, 4)
    assert sched.jobs["j0"].run_units == 1750  # a quarter of a GPU in quota units
    assert sched.pending_reason("j4").code is R.NO_FIT and sched.pending_reason("j4").detail == "mps-client"


def test_the_charge_follows_the_node_it_lands_on():
    """Pending, the least it could be charged (1/4, over the node with the most
    clients); landing on a node of 2 clients, it is charged 1/2 there."""
    rules = policy(nodes=[node("n1", 1, sharing={"mps": {"max_clients": 2}}),
                          node("n2", 1, sharing={"mps": {"max_clients": 4}}, gpu_type="other")])
    sched, out = scheduler(rules, job("x", share=GpuShare("mps", slots=4)), job("a", share=GpuShare("mps")))
    assert started(out) == {"x": "n2:0[mps:4x25%]", "a": "n1:0[mps:1x50%]"}
    assert sched.jobs["a"].units == 1750 and sched.jobs["a"].run_units == 3500
    assert sched.jobs["x"].run_units == 7000


def test_a_declaration_over_the_memory_cap_does_not_fit_the_node():
    rules = policy(nodes=[node("n1", 1, gpu_mem_mib=40960, sharing=MPS4)])
    sched, out = scheduler(rules, job("big", share=GpuShare("mps", mem_mib=9000)),
                           job("ok", share=GpuShare("mps", mem_mib=8192, slots=2)))
    assert set(started(out)) == {"ok"}
    assert sched.jobs["big"].reason.code is R.EXCEEDS_CAPACITY  # refused at submit: no node could hold it


def test_mps_env_divides_the_jobs_share_among_its_processes():
    assert mps_env("mps:2x25%:3procs:10240MiB") == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "16.6",
                                                    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=6826M"}
    assert mps_env("mps:1x33.3%") == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "33.3"}
    assert mps_env("fraction:0.5") == {} and mps_env("") == {}


def test_policy_memory_cap_is_checked_against_the_gpu():
    with pytest.raises(PolicyError, match=r"max_memory_per_client_mib: 50000 is not allowed: at most the GPU memory"):
        policy_from_dict({"cluster": {"nodes": [{"name": "n", "gpus": 1, "gpu_mem_mib": 40960, "sharing": {
            "mps": {"max_clients": 4, "max_memory_per_client_mib": 50000}}}]}})
    raw = {"cluster": {"nodes": [{"name": "n", "gpus": 1, "gpu_mem_mib": 40960, "sharing": MPS4}]}}
    node_ = policy_from_dict(raw).rules.nodes[0]
    assert (node_.mps_clients, node_.mps_mem_mib) == (4, 8192)


def test_processes_are_validated():
    rules = policy(nodes=[node("n1", 1, sharing=MPS4)])
    bad = JobSpec(id="p", team="t", workload_class="batch", gpus=1, share=GpuShare("mps", slots=1, procs=49))
    with pytest.raises(SpecError, match=r"share.procs: 49 is not allowed: MPS client processes, 1 to 48"):
        validate_spec(rules, bad)
    frac = JobSpec(id="f", team="t", workload_class="batch", gpus=1, share=GpuShare("fraction", milli=500, procs=2))
    with pytest.raises(SpecError, match=r"share.procs: 2 is not allowed"):
        validate_spec(rules, frac)
    validate_spec(rules, JobSpec(id="d", team="t", workload_class="batch", gpus=1, share=GpuShare("mps")))


def test_api_and_cli_take_replicas_and_processes():
    assert ShareBody(kind="mps", slots=2, procs=4).procs == 4
    with pytest.raises(ValueError, match="procs: 3 is not allowed for a fraction share"):
        ShareBody(kind="fraction", milli=500, procs=3)
    assert parse_share("mps:2", 0) == {"kind": "mps", "slots": 2, "milli": 0, "mem_mib": 0, "procs": 1}
    assert parse_share("mps:2:30:4", 1024) == {"kind": "mps", "slots": 2, "milli": 300, "mem_mib": 1024, "procs": 4}
    assert parse_share("mps:1::3", 0)["procs"] == 3
    with pytest.raises(typer.BadParameter):
        parse_share("mps:1:150", 0)


def test_the_local_runner_sets_the_mps_limits(tmp_path):
    import os
    import sys

    from test_local import wait_exits

    from gpushepherd.daemon.local import LocalBackend
    from gpushepherd.model.placement import Placement

    backend = LocalBackend(tmp_path / "data")
    code = ("import os; print(os.environ['CUDA_MPS_ACTIVE_THREAD_PERCENTAGE'], "
            "os.environ['CUDA_MPS_PINNED_DEVICE_MEM_LIMIT'])")
    backend.start("7", 1, [sys.executable, "-c", code], shell=False, env={}, cwd=str(tmp_path),
                  placement=Placement((("n", (0,)),), share="mps:2x25%:2procs:8192MiB"))
    assert wait_exits(backend) == [("7", 0)]
    assert (backend.run_dir("7", 1) / "stdout").read_text().split() == ["25", "0=8192M"]
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in os.environ


@pytest.mark.parametrize("text, fragment", [
    ("fraction:0.0015", "a multiple of 0.001"),   # was rounded to 0.002 without a word
    ("fraction:0.0005", "a multiple of 0.001"),   # was rounded to 0: a memory-only share
    ("mps:0", "N >= 1 replicas"),
    ("mps:1::0", "PROCESSES >= 1"),
    ("mps:1:33.33", "a multiple of 0.1"),
    ("time_slice:0", "N >= 1 replicas"),
])
def test_the_cli_refuses_a_share_it_would_have_to_round(text, fragment):
    """`submit --share` refuses what the API would get changed (newcomer trial of note 042):
    the value typed and what is allowed are named."""
    with pytest.raises(typer.BadParameter, match=fragment) as err:
        parse_share(text, 4096)
    assert repr(text) in str(err.value)
    assert parse_share("fraction:0.125", 0)["milli"] == 125
    assert parse_share("mps:1:12.5", 0)["milli"] == 125
