"""A pass on a legal cluster where the nodes a job may use offer no GPU in service (every
GPU unhealthy, a MIG-only node, nodes lost and added again, around a restart) must not
raise, and the fast and the reference cores must agree decision by decision and reason by
reason (design note 072).

``bench/oracle.py`` seed 379637 crashed both cores with ``ZeroDivisionError`` in
``planning._Gate.maybe``: a multi-node job whose class avoids the nodes other jobs hold
was left, for its reservation walk, with one node whose only GPU was unhealthy; the walk's
gate took that node's 0 GPUs in service as "nodes of one size, 0 GPUs each" and divided the job's
GPUs by it. Nodes with nothing to offer must simply not fit.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from builders import job, policy_dict
from gpushepherd.model.events import GpuHealthChanged, NodeAdded, NodeLost
from gpushepherd.model.job import GpuShare
from gpushepherd.sim.engine import Restart
from oracle_checks import _first_difference, drive
from oracle_workloads import Workload

SCALE = max(1, int(os.environ.get("SHEPHERD_PROPERTY_SCALE", "1")))
PROFILE = dict(derandomize=True, database=None, deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
AVOID = {"batch": {"avoid_nodes_with": ["training"]},
         "sandbox": {"sharing": ["whole", "fraction", "time_slice", "mig"]}}
MIG_ONLY = {"name": "n3", "gpus": 1, "gpu_type": "A100-80GB", "gpu_mem_mib": 81920,
            "mig": {"g0": {"layout": ["3g.40gb", "3g.40gb"]}}}


def both_cores(wl: Workload):
    """Drive ``wl`` through the fast core (pending reasons asked after every call,
    restarts as the workload says) and the reference core; assert that neither raises
    (a raise fails the test) and that they agree. Returns both runs' results."""
    fast, fast_calls = drive(wl)
    ref, ref_calls = drive(wl, reference=True)
    assert _first_difference(fast_calls, ref_calls) is None
    for jid, rec in fast.records.items():
        assert rec.reasons == ref.records[jid].reasons, jid
    return fast, ref


def _avoided_but_one_empty_node(n3, events=()) -> Workload:
    # n1 and n2 (4 GPUs each) each run a training job (3 GPUs, 0-100) that batch avoids;
    # J (batch, 6 GPUs: more than one node, so whole nodes plus a remainder) may now use
    # only n3, which has no GPU in service. J cannot start now; once T and U leave at 100
    # it takes n1 whole and 2 GPUs of n2.
    raw = policy_dict(nodes=[("n1", 4), ("n2", 4), n3], classes=AVOID, preemption=False)
    jobs = [(job("T", 3, "training", "t", 0, runtime_estimate_s=100.0), 100.0),
            (job("U", 3, "training", "t", 0, runtime_estimate_s=100.0), 100.0),
            (job("J", 6, "batch", "t", 2, runtime_estimate_s=50.0), 50.0)]
    return Workload(raw, jobs, list(events))


@pytest.mark.parametrize("n3, events", [
    # seed 379637: the node's only GPU unhealthy
    (("n3", 1), [GpuHealthChanged(0.0, node="n3", gpu=0, healthy=False)]),
    # every GPU of the node unhealthy, the scheduler restarted in between
    (("n3", 2), [GpuHealthChanged(0.0, node="n3", gpu=0, healthy=False), Restart(1.0),
                 GpuHealthChanged(1.0, node="n3", gpu=1, healthy=False)]),
    # a node whose only GPU is MIG: no whole GPU at all
    (MIG_ONLY, []),
], ids=["one-gpu-unhealthy", "all-gpus-unhealthy-restart", "mig-only"])
def test_a_multi_node_job_left_only_nodes_with_no_gpu_in_service_waits_and_starts_later(n3, events):
    fast, ref = both_cores(_avoided_but_one_empty_node(n3, events))
    for result in (fast, ref):
        assert [(t, dict(p.parts)) for t, p in result.records["J"].starts] == [
            (100.0, {"n1": (0, 1, 2, 3), "n2": (0, 1)})]


# ------------------------------------------------------------------- property
@st.composite
def empty_node_workloads(draw) -> Workload:
    """Three small nodes (islands, time-slicing, a MIG-only third node possible), batch
    avoiding training; training jobs first (they hold nodes batch then avoids), then
    whole, multi-node, gang, same-node and share jobs; node stories that leave nodes with
    nothing to offer - every GPU unhealthy (and back), lost (and added again) - and
    restarts."""
    nodes = []
    for i in (1, 2, 3):
        if i == 3 and draw(st.booleans()):
            nodes.append(dict(MIG_ONLY))
            continue
        gpus = draw(st.sampled_from([1, 2, 4] if i == 3 else [2, 4]))
        n = {"name": f"n{i}", "gpus": gpus, "gpu_type": "A100-80GB", "gpu_mem_mib": 81920}
        if gpus == 4 and draw(st.booleans()):
            n["nvlink_islands"] = [[0, 1], [2, 3]]
        if draw(st.booleans()):
            n["sharing"] = {"time_slicing": {"replicas": 3}}
        nodes.append(n)
    raw = policy_dict(nodes=nodes, classes=AVOID, preemption=draw(st.booleans()))
    whole = sum(n["gpus"] for n in nodes if "mig" not in n)
    jobs = []
    for k in range(draw(st.integers(2, 6))):
        cls = "training" if k < 2 else draw(st.sampled_from(["training", "batch", "batch", "sandbox"]))
        gpus = draw(st.integers(1, whole))
        kw: dict = {}
        shape = draw(st.sampled_from(["plain", "plain", "pods", "same_node", "share"]))
        if shape == "pods" and gpus % 2 == 0 and gpus > 2:
            kw["gpus_per_pod"] = 2
        elif shape == "same_node":
            kw["same_node"] = True
        elif shape == "share" and cls == "sandbox":
            gpus = 1
            kw["share"] = draw(st.sampled_from([
                GpuShare("fraction", milli=500), GpuShare("time_slice", mem_mib=16384, slots=1),
                GpuShare("mig", profile="3g.40gb")]))
        run = float(draw(st.integers(1, 10)) * 10)
        submit = 0.0 if k < 2 else float(draw(st.integers(0, 6)) * 10)
        jobs.append((job(f"j{k + 1}", gpus, cls, "t", submit, runtime_estimate_s=run, **kw), run))
    wl = Workload(raw, jobs, [])
    by_name = {n.name: n for n in wl.rules.nodes}
    for name in draw(st.lists(st.sampled_from(["n3", "n3", "n1", "n2"]), max_size=2, unique=True)):
        t = float(draw(st.integers(0, 6)) * 10)
        back = float(draw(st.integers(1, 6)) * 10) if draw(st.booleans()) else None
        if draw(st.booleans()):
            wl.events.append(NodeLost(t, node=name))
            if back is not None:
                wl.events.append(NodeAdded(t + back, node=by_name[name]))
        else:
            for g in range(by_name[name].gpus):
                wl.events.append(GpuHealthChanged(t, node=name, gpu=g, healthy=False))
                if back is not None:
                    wl.events.append(GpuHealthChanged(t + back, node=name, gpu=g, healthy=True))
    for t in draw(st.lists(st.integers(0, 12), max_size=2, unique=True)):
        wl.events.append(Restart(float(t * 10)))
    return wl


@settings(max_examples=60 * SCALE, **PROFILE)
@given(empty_node_workloads())
@example(_avoided_but_one_empty_node(("n3", 1), [GpuHealthChanged(0.0, node="n3", gpu=0, healthy=False)]))
def test_no_pass_raises_and_the_cores_agree_when_nodes_offer_nothing(wl):
    both_cores(wl)
