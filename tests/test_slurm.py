"""The Slurm backend (design note 013).

The pure parts (GRES strings, wait statuses, the inventory check) run everywhere. The
rest runs a real `shepherd server --backend slurm` against a real Slurm 22.05 with two
fake 8-GPU nodes on 127.0.0.1 (`deploy/slurm/fake-cluster.sh`, started once for the
module) and asserts from the jobs' own output. It skips, saying why, where `slurmctld`
is absent (Debian: `apt-get install slurm-wlm`; `.ci/run` does it) or the tests do not
run as root (the fake cluster's daemons run as root).

Every wait is a poll with a generous deadline; jobs wait for flag files, not for time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from engine_cases import (cancel_case, engine_policy, placed_node_case, preemption_case, quota_case,
                          refused_case, restart_case)
from test_daemon import Server, free_port, wait_for, wait_for_file

from gpushepherd.backends import EngineNode, make_backend, node_mismatches
from gpushepherd.backends.fakeslurm import unavailable
from gpushepherd.backends.slurm import comment_of, parse_gres, wait_status_code
from gpushepherd.model.cluster import Node

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "deploy" / "slurm" / "fake-cluster.sh"

POLICY = engine_policy("slurm-test")


# ------------------------------------------------------------------ pure parts
def test_gres_strings_give_type_and_count():
    assert parse_gres("gpu:a100:8") == ("a100", 8)
    assert parse_gres("gpu:a100:8(S:0-1)") == ("a100", 8)
    assert parse_gres("gpu:4") == ("", 4)
    assert parse_gres("gpu:h100:4,gpu:h100:4,shard:8") == ("h100", 8)
    assert parse_gres("(null)") == ("", 0)


def test_wait_statuses_give_exit_codes_and_signals():
    assert wait_status_code(85 << 8) == 85  # ExitCode=85:0: checkpointed, requeue me
    assert wait_status_code(0) == 0
    assert wait_status_code(9) == -9


def test_the_inventory_check_names_both_sides():
    policy = [Node("fake1", 8, "A100", 81920), Node("fake3", 8, "A100", 81920), Node("fake2", 4, "H100", 81920)]
    engine = [EngineNode("fake1", "a100", 8), EngineNode("fake2", "a100", 8)]
    wrong = node_mismatches(policy, engine)
    assert wrong == ["node 'fake3' of the policy is not in the engine (its nodes: fake1, fake2)",
                     "node 'fake2': the policy says 4 GPUs, the engine has 8",
                     "node 'fake2': the policy says GPU type 'H100', the engine 'a100'"]
    assert node_mismatches(policy[:1], engine) == []  # case-insensitive type; extra engine nodes ignored


def test_an_unknown_backend_is_refused_naming_the_allowed_ones(tmp_path):
    with pytest.raises(ValueError, match="'k8s' is not allowed: local, slurm, ray or kubernetes"):
        make_backend("k8s", tmp_path)


# ------------------------------------------------------------------ a real cluster
@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = unavailable()
    if why:
        pytest.skip(f"Slurm: {why}")
    d = tmp_path_factory.mktemp("slurm").resolve() / "cluster"
    env = {**os.environ, "SLURM_CTLD_PORT": str(free_port()), "SLURM_NODE_PORT": str(free_port() - 1)}
    p = subprocess.run(["bash", str(SCRIPT), "start", str(d), "2"], capture_output=True, text=True, env=env,
                       timeout=180)
    if p.returncode != 0:
        subprocess.run(["bash", str(SCRIPT), "stop", str(d)], timeout=60)
        pytest.fail(f"the fake Slurm cluster did not start: {p.stdout}{p.stderr}")
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(d / "slurm.conf")  # absolute: the servers and their jobs inherit it
    yield d
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old
    subprocess.run(["bash", str(SCRIPT), "stop", str(d)], timeout=60)


@pytest.fixture(scope="module")
def server(cluster, tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("slurm-server"))
    s.policy.write_text(POLICY)
    s.start(extra=("--backend", "slurm"))
    yield s
    s.stop()


def slurm_jobs() -> list[dict]:
    out = subprocess.run(["squeue", "--json"], capture_output=True, text=True, check=True, timeout=60).stdout
    return json.loads(out)["jobs"]


def slurm_live(tag_prefix: str = "gpushepherd ") -> list[dict]:
    return [j for j in slurm_jobs() if j.get("comment", "").startswith(tag_prefix)
            and j["job_state"] in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")]


def all_free(server) -> bool:
    return server.free_gpus() == 16 and not slurm_live()


def where(tag: str) -> str:
    """Code printing the job's node, its CUDA_VISIBLE_DEVICES and its run, flushed."""
    return (f"import os; print({tag!r}, os.environ.get('SLURMD_NODENAME'), "
            f"'CVD=' + os.environ.get('CUDA_VISIBLE_DEVICES', ''), 'run', os.environ['SHEPHERD_RUN'], flush=True)")


def test_a_job_runs_on_the_chosen_node_with_its_gpu_count(server):
    job_id = server.submit(where("hello"), gpus=3)
    job = server.wait_state(job_id, "COMPLETED", "FAILED")
    assert job["state"] == "COMPLETED" and job["exit_code"] == 0 and job["runs"] == 1
    words = server.logs(job_id).split()
    node, cvd = words[1], words[2].removeprefix("CVD=")
    assert len(cvd.split(",")) == 3  # Slurm gave exactly the GPU count gpushepherd placed
    assert node in ("fake1", "fake2")
    assert wait_for("the GPUs back", lambda: all_free(server))


def test_the_engine_nodes_are_shown(server):
    nodes = {n["name"]: n for n in httpx.get(server.url + "/nodes", timeout=60).json()}
    assert nodes["fake1"]["engine"]["gpu_type"] == "a100" and nodes["fake1"]["engine"]["gpus"] == 8
    assert "rack1" in nodes["fake1"]["engine"]["labels"] and nodes["fake2"]["engine"]["state"].startswith("idle")
    out = subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", "nodes", "--server", server.url],
                         capture_output=True, text=True, timeout=60).stdout
    assert "gpu:a100:8" in out and "slurm" in out and "rack1" in out


def test_a_placed_node_reaches_the_job(server, tmp_path):
    placed_node_case(server, tmp_path, where("second"), lambda word: word, all_free)


def test_a_two_node_gang_is_one_slurm_job_over_both_nodes(server):
    code = ("import subprocess; subprocess.run(['srun', 'sh', '-c', "
            "'echo gang $SLURMD_NODENAME CVD=$CUDA_VISIBLE_DEVICES'], check=True)")
    job_id = server.submit(code, gpus=16)
    job = server.wait_state(job_id, "COMPLETED", "FAILED")
    assert job["state"] == "COMPLETED", server.logs(job_id, stream="stderr")
    lines = sorted(line for line in server.logs(job_id).splitlines() if line.startswith("gang "))
    assert [line.split()[1] for line in lines] == ["fake1", "fake2"]
    assert all(len(line.split("CVD=")[1].split(",")) == 8 for line in lines)
    assert wait_for("the GPUs back", lambda: all_free(server))


def test_preemption_of_a_checkpointable_job_resumes_it_from_its_checkpoint(server):
    preemption_case(server, where("urgent"), 1, all_free)


def test_a_preempted_job_whose_handler_exits_0_is_requeued_through_slurm(server):
    preemption_case(server, where("urgent"), 1, all_free, exit_code=0)


def test_a_team_quota_holds_across_the_cluster(server, tmp_path):
    quota_case(server, tmp_path, lambda b: any(j["name"] == f"shepherd-{b}" for j in slurm_live()), all_free)


def test_cancel_ends_the_slurm_job(server, tmp_path):
    cancel_case(server, tmp_path, lambda job: any(j["name"] == f"shepherd-{job}" for j in slurm_live()), all_free)


def test_a_policy_that_does_not_match_the_cluster_is_refused(cluster, tmp_path):
    refused_case(POLICY, tmp_path, ("--backend", "slurm"))


def test_a_run_submitted_but_never_recorded_is_found_by_its_comment(cluster, tmp_path):
    # the server died between sbatch and recording the Slurm job id: a new backend finds it
    from gpushepherd.backends.slurm import SlurmBackend
    from gpushepherd.model.placement import Placement

    first = SlurmBackend(tmp_path)
    first.discover()
    flag = tmp_path / "go"
    h = first.start("x9", 1, [sys.executable, "-c", wait_for_file(flag) + "; raise SystemExit(85)"], shell=False,
                    env={}, cwd=str(tmp_path), placement=Placement((("fake2", (0, 1)),)))
    again = SlurmBackend(tmp_path)
    found = again.attach("x9", 1, None, None)
    assert found is not None and found.pid == h.pid
    assert again.attach("x9", 2, None, None) is None  # a run never submitted: nothing to find
    wait_for("x9 running in Slurm", lambda: again.running("x9"))
    flag.touch()
    got = []
    wait_for("x9's exit", lambda: got.extend(again.exits()) or got)
    assert got == [("x9", 85)]  # the checkpoint code, through Slurm
    wait_for("x9 gone from Slurm", lambda: not [j for j in slurm_live() if j["job_id"] == h.pid])


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request):
    return request.getfixturevalue("pg_url") if request.param == "postgresql" else None


def test_a_controller_restart_mid_run_loses_nothing_and_starts_nothing_twice(cluster, server, tmp_path, db):
    # a server of its own (the module's one stays idle meanwhile: it holds no job)
    def live() -> list[str]:
        return sorted(j["name"].removeprefix("shepherd-") for j in slurm_live())

    def the_run_slurm_ran_is_the_one_it_was_given(_a, b):
        assert comment_of(b, 1) in {j["comment"] for j in slurm_jobs()}
    restart_case(POLICY, db, tmp_path, ("--backend", "slurm"), lambda a: a not in live(), live, all_free,
                 the_run_slurm_ran_is_the_one_it_was_given)


def test_a_signal_to_a_run_slurm_has_not_started_cancels_it_without_scancel_signal(cluster, tmp_path):
    # `scancel --signal` on a PENDING job sleeps 5 s and retries (the daemon's loop would
    # wait): a run that has not started is cancelled instead - it ran nothing
    from gpushepherd.backends.slurm import SlurmBackend
    from gpushepherd.model.placement import Placement

    b = SlurmBackend(tmp_path)
    b.discover()
    flag = tmp_path / "go"
    b.start("full", 1, [sys.executable, "-c", wait_for_file(flag)], shell=False, env={}, cwd=str(tmp_path),
            placement=Placement((("fake2", tuple(range(8))),)))
    full = b.runs["full"].pid
    wait_for("the node full", lambda: [j["job_state"] for j in slurm_jobs() if j["job_id"] == full] == ["RUNNING"])
    h = b.start("late", 1, [sys.executable, "-c", "print('ran')"], shell=False, env={}, cwd=str(tmp_path),
                placement=Placement((("fake2", (0,)),)))
    wait_for("late pending in Slurm", lambda: [j["job_state"] for j in slurm_jobs() if j["job_id"] == h.pid]
             == ["PENDING"])
    calls = []
    run = b._slurm
    b._slurm = lambda *args, **kw: calls.append(args) or run(*args, **kw)
    b.signal("late", signal.SIGTERM)
    assert ("scancel", str(h.pid)) in calls and not [c for c in calls if "--signal=TERM" in c]
    got = []
    wait_for("late's end", lambda: got.extend(e for e in b.exits() if e[0] == "late") or got)
    assert got == [("late", None)]  # cancelled before it ran: lost, the daemon requeues it
    flag.touch()
    wait_for("full gone from Slurm", lambda: not [j for j in slurm_live() if j["job_id"] in (h.pid,)]
             and not b.running("full"))
