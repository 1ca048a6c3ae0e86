"""The Ray backend (design note 013, "Ray").

The pure parts (node inventory, run codes) run everywhere. The rest runs a real
`shepherd server --backend ray` against a real local Ray cluster of two fake 8-GPU nodes
(`ray start --block`, one fixture for the module) and asserts from the jobs' own output.

Ray registers its nodes on the machine's non-loopback address (`engines.md`), so the
cluster tests run only inside a network namespace that has nothing but `lo`:
`test_the_ray_tests_in_a_network_namespace` re-runs this file under `unshare --net --pid
--fork --mount-proc` (root; the PID namespace also ends every Ray process with the run)
with SHEPHERD_RAY_INNER=1. It skips, saying why, where `ray` is not installed
(`pip install 'gpushepherd[ray]'`), the tests are not root or `unshare`/`ip` are missing.

Every wait is a poll with a generous deadline; jobs wait for flag files, not for time.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import httpx
import pytest
from engine_cases import (cancel_case, engine_policy, placed_node_case, preemption_case, quota_case,
                          refused_case, restart_case)
from test_daemon import Server, free_port, wait_for, wait_for_file

from gpushepherd.backends import make_backend
from gpushepherd.backends.ray import actor_name, node_of, run_code

ROOT = Path(__file__).resolve().parent.parent
INNER = os.environ.get("SHEPHERD_RAY_INNER") == "1"
HAVE_RAY = importlib.util.find_spec("ray") is not None

POLICY = engine_policy("ray-test")


# ------------------------------------------------------------------ pure parts
def test_a_ray_node_is_named_by_its_shepherd_resource_else_its_hostname():
    info = {"NodeID": "ab12", "Alive": True, "NodeManagerHostname": "gpu-7", "NodeManagerAddress": "10.0.0.7",
            "Resources": {"GPU": 8.0, "memory": 64 * 2**30, "shepherd-node:fake1": 1.0, "accelerator_type:H100": 1.0},
            "Labels": {"ray.io/node-id": "ab12", "rack": "r1"}}
    n = node_of(info)
    assert (n.name, n.gpu_type, n.gpus, n.memory_mib) == ("fake1", "H100", 8, 65536)
    assert n.labels == (("rack", "r1"), ("ray.io/node-id", "ab12"))
    plain = dict(info, Resources={"GPU": 4.0, "gpu_type:A100": 4.0}, Labels={})
    assert (node_of(plain).name, node_of(plain).gpu_type, node_of(plain).gpus) == ("gpu-7", "A100", 4)
    both = dict(info, Resources={**info["Resources"], "gpu_type:H100-80GB": 8.0})
    assert node_of(both).gpu_type == "H100-80GB"  # the operator's name wins over Ray's
    assert node_of(dict(info, Alive=False)) is None


def test_a_runs_code_is_its_first_failing_rank_else_zero_else_lost():
    assert run_code([0, 0]) == 0
    assert run_code([0, 3, 85]) == 3
    assert run_code([85, None]) == 85  # a checkpointed rank: the others were killed
    assert run_code([0, None]) is None  # a rank that left no code: lost


def test_without_ray_the_backend_says_how_to_get_it(tmp_path, monkeypatch):
    from gpushepherd.backends import BackendError

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else object())
    with pytest.raises(BackendError, match=r"pip install 'gpushepherd\[ray\]'"):
        make_backend("ray", tmp_path).discover()


# ------------------------------------------------------------------ the namespace
def _outer_unavailable() -> str:
    if not HAVE_RAY:
        return "the `ray` package is not installed (pip install 'gpushepherd[ray]')"
    if os.geteuid() != 0:
        return "a network namespace needs root (unshare --net); these tests are not root"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "no `unshare` or `ip` on PATH (util-linux, iproute2)"
    return ""


@pytest.mark.skipif(INNER, reason="already inside the network namespace")
def test_the_ray_tests_in_a_network_namespace(tmp_path):
    why = _outer_unavailable()
    if why:
        pytest.skip(f"Ray: {why}")
    env = {**os.environ, "SHEPHERD_RAY_INNER": "1", "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)}
    report = tmp_path / "inner.xml"
    cmd = (f"ip link set lo up && exec {sys.executable} -m pytest -q -p no:cacheprovider -n 0 -x -rs "
           f"{Path(__file__).resolve()} -k 'not in_a_network_namespace' --basetemp={tmp_path / 'inner'} "
           f"--junitxml={report}")
    p = subprocess.run(["unshare", "--net", "--pid", "--fork", "--mount-proc", "sh", "-c", cmd], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=1200)
    if p.returncode != 0 and "cannot" in p.stderr[:300] and "unshare" in p.stderr[:300]:
        pytest.skip(f"Ray: no network namespace here: {p.stderr.strip()[:300]}")
    assert p.returncode == 0, p.stdout[-8000:] + p.stderr[-4000:]
    cases = ElementTree.parse(report).getroot().iter("testcase")
    skipped = {c.get("name"): c.find("skipped").get("message", "") for c in cases if c.find("skipped") is not None}
    # every cluster test ran (PostgreSQL may be missing: that one skips, saying so)
    assert all(why.startswith("PostgreSQL:") for why in skipped.values()), skipped


# ------------------------------------------------------------------ a real cluster
def _isolated() -> bool:
    return [name for _i, name in socket.if_nameindex()] == ["lo"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if not INNER:
        pytest.skip("Ray cluster tests run inside a network namespace (test_the_ray_tests_in_a_network_namespace)")
    if not HAVE_RAY or not _isolated():
        pytest.skip("Ray: needs `ray` and a network namespace with only `lo`")
    import ray

    tmp = tmp_path_factory.mktemp("ray").resolve()
    temp_dir = Path("/tmp") / f"shepherd-ray-{os.getpid()}"  # Ray's socket paths must stay short
    port = free_port()
    os.environ.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    ray_bin = str(Path(sys.executable).with_name("ray"))
    common = ["--block", "--num-cpus=4", "--num-gpus=8", "--disable-usage-stats", "--node-ip-address=127.0.0.1",
              f"--object-store-memory={100 * 2**20}"]
    procs = [subprocess.Popen([ray_bin, "start", "--head", f"--port={port}", "--include-dashboard=false",
                               f"--temp-dir={temp_dir}", *common,
                               "--resources=" + json.dumps({"shepherd-node:fake1": 1, "gpu_type:A100": 8})],
                              stdout=open(tmp / "head.log", "ab"), stderr=subprocess.STDOUT)]
    address = f"127.0.0.1:{port}"
    try:
        ray.init(address=address, namespace="gpushepherd", log_to_driver=False, logging_level="WARNING")
    except Exception:
        wait_for("the Ray head", lambda: procs[0].poll() is None and _can_connect(address), timeout=120)
        ray.init(address=address, namespace="gpushepherd", log_to_driver=False, logging_level="WARNING")
    procs.append(subprocess.Popen([ray_bin, "start", f"--address={address}", *common,
                                   f"--dashboard-agent-listen-port={free_port()}",
                                   f"--metrics-export-port={free_port()}",
                                   "--resources=" + json.dumps({"shepherd-node:fake2": 1, "gpu_type:A100": 8})],
                                  stdout=open(tmp / "worker.log", "ab"), stderr=subprocess.STDOUT))
    wait_for("two alive Ray nodes", lambda: len([n for n in ray.nodes() if n["Alive"]]) == 2, timeout=120)
    yield address
    ray.shutdown()
    for p in reversed(procs):
        p.terminate()
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
    shutil.rmtree(temp_dir, ignore_errors=True)


def _can_connect(address: str) -> bool:
    host, port = address.split(":")
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def server(cluster, tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("ray-server"))
    s.policy.write_text(POLICY)
    s.start(extra=("--backend", "ray", "--ray-address", cluster))
    yield s
    s.stop()


def live_actors(prefix: str = "shepherd-") -> list[str]:
    import ray

    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["namespace"] == "gpushepherd" and a["name"].startswith(prefix))


def all_free(server) -> bool:
    return server.free_gpus() == 16 and not live_actors()


def node_ids(server) -> dict[str, str]:
    """Ray node id -> policy node name, from `GET /nodes` (the engine's labels)."""
    out = {}
    for n in httpx.get(server.url + "/nodes", timeout=60).json():
        for label in n["engine"]["labels"]:
            if label.startswith("ray.io/node-id="):
                out[label.split("=", 1)[1]] = n["name"]
    return out


def where(tag: str) -> str:
    """Code printing the job's Ray node, its CUDA_VISIBLE_DEVICES, rank and run, flushed."""
    return (f"import os; print({tag!r}, os.environ.get('SHEPHERD_RAY_NODE_ID'), "
            f"'CVD=' + os.environ.get('CUDA_VISIBLE_DEVICES', ''), 'rank', os.environ['SHEPHERD_NODE_RANK'], "
            f"'run', os.environ['SHEPHERD_RUN'], flush=True)")


def test_a_job_runs_on_the_chosen_node_with_its_gpu_count(server):
    job_id = server.submit(where("hello"), gpus=3)
    job = server.wait_state(job_id, "COMPLETED", "FAILED")
    assert job["state"] == "COMPLETED" and job["exit_code"] == 0 and job["runs"] == 1, server.logs(job_id,
                                                                                                   stream="stderr")
    words = server.logs(job_id).split()
    node, cvd = words[1], words[2].removeprefix("CVD=")
    assert len(cvd.split(",")) == 3  # Ray gave exactly the GPU count gpushepherd placed
    assert node_ids(server)[node] in ("fake1", "fake2")
    assert wait_for("the GPUs back", lambda: all_free(server))


def test_the_engine_nodes_are_shown(server):
    nodes = {n["name"]: n for n in httpx.get(server.url + "/nodes", timeout=60).json()}
    assert nodes["fake1"]["engine"]["gpu_type"] == "A100" and nodes["fake1"]["engine"]["gpus"] == 8
    assert nodes["fake2"]["engine"]["state"] == "alive" and nodes["fake2"]["engine"]["kind"] == "ray"
    out = subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", "nodes", "--server", server.url],
                         capture_output=True, text=True, timeout=60).stdout
    assert "gpu:A100:8" in out and "ray" in out and "ray.io/node-id=" in out


def test_a_placed_node_reaches_the_job(server, tmp_path):
    placed_node_case(server, tmp_path, where("second"), lambda word: node_ids(server)[word], all_free)


def test_a_two_node_gang_is_a_placement_group_over_both_nodes(server):
    job_id = server.submit(where("gang"), gpus=16)
    job = server.wait_state(job_id, "COMPLETED", "FAILED")
    assert job["state"] == "COMPLETED", server.logs(job_id, stream="stderr")
    lines = sorted(line.split() for line in server.logs(job_id).splitlines() if line.startswith("gang "))
    ids = node_ids(server)
    assert sorted(ids[w[1]] for w in lines) == ["fake1", "fake2"]  # one rank on each node
    assert sorted(w[4] for w in lines) == ["0", "1"]
    assert all(len(w[2].removeprefix("CVD=").split(",")) == 8 for w in lines)
    assert wait_for("the GPUs back", lambda: all_free(server))


def test_preemption_of_a_checkpointable_job_resumes_it_from_its_checkpoint(server):
    # the victim (a 2-node gang: both ranks get SIGTERM) checkpoints and exits 85
    preemption_case(server, where("urgent"), 2, all_free)


def test_a_preempted_job_whose_handler_exits_0_is_requeued_through_ray(server):
    preemption_case(server, where("urgent"), 2, all_free, exit_code=0)


def test_a_team_quota_holds_across_the_cluster(server, tmp_path):
    quota_case(server, tmp_path, lambda b: bool(live_actors(f"shepherd-{b}-")), all_free)


def test_cancel_ends_the_ray_actor_and_its_job(server, tmp_path):
    cancel_case(server, tmp_path, lambda job: bool(live_actors(f"shepherd-{job}-")), all_free)


def test_a_policy_that_does_not_match_the_cluster_is_refused(cluster, tmp_path):
    refused_case(POLICY, tmp_path, ("--backend", "ray", "--ray-address", cluster))


def test_a_run_started_but_never_recorded_is_found_by_its_name(cluster, tmp_path):
    # the server died between starting the actor and recording it: a new backend finds it
    from gpushepherd.backends.ray import RayBackend
    from gpushepherd.model.placement import Placement

    first = RayBackend(tmp_path, address=cluster)
    first.discover()
    flag = tmp_path / "go"
    h = first.start("x9", 1, [sys.executable, "-c", wait_for_file(flag) + "; raise SystemExit(85)"], shell=False,
                    env={}, cwd=str(tmp_path), placement=Placement((("fake2", (0, 1)),)))
    again = RayBackend(tmp_path, address=cluster)
    found = again.attach("x9", 1, None, None)
    assert found is not None and found.actors and live_actors("shepherd-x9-") == [actor_name("x9", 1, 0)]
    assert h.pid != 0
    assert again.attach("x9", 2, None, None) is None  # a run never started: nothing to find
    wait_for("x9 running in Ray", lambda: again.running("x9") and (tmp_path / "runs/x9/1/stdout").exists())
    flag.touch()
    got = []
    wait_for("x9's exit", lambda: got.extend(again.exits()) or got)
    assert got == [("x9", 85)]  # the checkpoint code, through Ray
    wait_for("x9's actor gone", lambda: not live_actors("shepherd-x9-"))


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request):
    return request.getfixturevalue("pg_url") if request.param == "postgresql" else None


def test_a_controller_restart_mid_run_loses_nothing_and_starts_nothing_twice(cluster, server, tmp_path, db):
    # a server of its own (the module's one stays idle meanwhile: it holds no job); the
    # actors are detached: they outlive the killed server, which finds them by name
    def live() -> list[str]:  # the jobs whose rank-0 actor lives
        return sorted(n.removeprefix("shepherd-").rsplit("-", 2)[0] for n in live_actors() if n.endswith("-0"))
    restart_case(POLICY, db, tmp_path, ("--backend", "ray", "--ray-address", cluster),
                 lambda a: (tmp_path / "data" / "runs" / a / "1" / "exit").exists(), live, all_free)
