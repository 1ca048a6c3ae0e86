"""GPU inventory and samples in the daemon (note 008, "GPU inventory and samples"),
against a real `shepherd server` scripting the static inventory through
``<data>/gpu-samples.json``; and, marked ``gpu``, NVML and a real CUDA job where NVML
finds a GPU (skipped elsewhere, saying why).

No test here depends on what the core does with the samples (idle auto-stop, the
memory-overrun policy): only on what the daemon produces, logs and shows.
"""

from __future__ import annotations

import json
import os
import pwd
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from test_daemon import Server, wait_for

from gpushepherd.daemon.local import LocalBackend, unresolved_mig, visible_devices
from gpushepherd.daemon.store import event_from_row, event_row
from gpushepherd.gpu.inventory import Discovery, GpuInfo, JobDevices, MigDevice
from gpushepherd.gpu.nvml import NvmlInventory, nvml_unavailable
from gpushepherd.gpu.static import SAMPLE_FILE
from gpushepherd.model.events import GpuUnmanaged, UsageSample
from gpushepherd.model.placement import Placement

POLICY = """\
name: gpu-daemon-test
cluster:
  nodes:
    - {name: local, gpus: 4, gpu_type: FAKE, gpu_mem_mib: 16384,
       gpu_uuids: [GPU-f0, GPU-f1, GPU-f2, GPU-f3]}
classes:
  batch: {grace_period_s: 2}
teams:
  ml: {}
"""
ME = pwd.getpwuid(os.getuid()).pw_name


def script(data: Path, content: dict) -> None:
    """Write the static inventory's sample file atomically (the server re-reads it)."""
    tmp = data / (SAMPLE_FILE + ".tmp")
    tmp.write_text(json.dumps(content))
    os.replace(tmp, data / SAMPLE_FILE)


def logged(data: Path, kind: str) -> list[tuple]:
    """``(job_id, payload dict)`` of the logged events of ``kind``, in log order."""
    with sqlite3.connect(f"file:{data / 'shepherd.db'}?mode=ro", uri=True) as c:
        rows = c.execute("SELECT job_id, payload FROM events WHERE kind = ? ORDER BY seq", (kind,)).fetchall()
    return [(j, json.loads(p)) for j, p in rows]


def gpu(server: Server, index: int) -> dict:
    [node] = httpx.get(server.url + "/nodes", timeout=60).json()
    return node["gpu"][index]


@pytest.fixture
def srv(tmp_path):
    s = Server(tmp_path)
    s.policy.write_text(POLICY)
    s.data.mkdir(parents=True)
    yield s.start(extra=("--inventory", "static", "--sample-every", "0.2"))
    s.stop()


def test_a_foreign_process_makes_its_gpu_unmanaged_shown_and_logged_until_it_is_gone(srv, tmp_path):
    foreign = subprocess.Popen(["sleep", "120"])
    # until it has exec'd, /proc shows the forked python (seen in CI: command '[python]')
    wait_for("the foreign process exec'd", lambda: Path(f"/proc/{foreign.pid}/cmdline").read_bytes().startswith(b"sleep"))
    try:
        script(srv.data, {"gpus": {"0": {"util_pct": 80, "mem_used_mib": 900, "temperature_c": 55, "power_w": 210,
                                         "processes": [{"pid": foreign.pid, "used_mib": 900}]}}})
        g0 = wait_for("GPU 0 unmanaged", lambda: (g := gpu(srv, 0))["unmanaged"] and g)
        [p] = g0["unmanaged_processes"]
        assert (p["pid"], p["owner"], p["command"], p["used_mib"]) == (foreign.pid, ME, "sleep 120", 900)
        assert (g0["uuid"], g0["util_pct"], g0["mem_used_mib"], g0["mem_total_mib"], g0["temperature_c"],
                g0["power_w"]) == ("GPU-f0", 80, 900, 16384, 55, 210)
        assert not gpu(srv, 1)["unmanaged"]
        assert logged(srv.data, "unmanaged") == [(None, {"node": "local", "gpu": 0, "unmanaged": True})]
        res = subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", "nodes", "--server", srv.url],
                             capture_output=True, text=True, timeout=60)
        assert f"pid {foreign.pid} ({ME}: sleep 120)" in res.stdout and "80%" in res.stdout, res.stdout
        # a restart replays the flag: the GPU stays unmanaged, nothing is logged twice
        srv.stop()
        srv.start(policy=False, extra=("--inventory", "static", "--sample-every", "0.2"))
        wait_for("GPU 0's process shown after the restart", lambda: gpu(srv, 0)["unmanaged_processes"])
        assert gpu(srv, 0)["unmanaged"]
        script(srv.data, {})
        wait_for("GPU 0 free again", lambda: not gpu(srv, 0)["unmanaged"])
        assert gpu(srv, 0)["unmanaged_processes"] == []
        assert [p["unmanaged"] for _, p in logged(srv.data, "unmanaged")] == [True, False]
    finally:
        foreign.kill()
        foreign.wait()


def test_jobs_get_gpu_uuids_and_their_samples_are_logged_and_shown(srv, tmp_path):
    flag = tmp_path / "go"
    code = (f"import os, time\nprint(os.environ['CUDA_VISIBLE_DEVICES'], flush=True)\n"
            f"while not os.path.exists({str(flag)!r}): time.sleep(0.05)\n")
    job = srv.submit(code, gpus=2, gpu_mem_mib=256)
    j = srv.wait_state(job, "RUNNING")
    script(srv.data, {"jobs": {job: {"util_pct": 0, "mem_used_mib": 700}}})
    j = wait_for("the job's sample", lambda: (v := srv.job(job))["gpu_mem_mib"] == 700 and v)
    assert (j["gpu_util_pct"], j["peak_gpu_mem_mib"], j["declared_gpu_mem_mib"], j["over_declared_mem"]) == \
        (0, 700, 512, True)
    script(srv.data, {"jobs": {job: {"util_pct": 0, "mem_used_mib": 300}}})
    wait_for("the lower sample", lambda: srv.job(job)["gpu_mem_mib"] == 300)
    assert srv.job(job)["peak_gpu_mem_mib"] == 700  # the peak stays
    usage = [p for j_id, p in logged(srv.data, "usage") if j_id == job]
    assert {"gpu_util_pct": 0.0, "mem_used_mib": 700} in usage
    assert max(p["mem_used_mib"] for p in usage) == 700
    res = subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", "show", job, "--server", srv.url],
                         capture_output=True, text=True, timeout=60)
    assert "memory 300 MiB, peak 700 of 512 MiB declared  OVER DECLARED" in res.stdout, res.stdout
    flag.write_text("")
    srv.wait_state(job, "COMPLETED")
    gpus = [int(g) for g in j["placement"].split(":")[1].split(",")]
    assert srv.logs(job).split() == [",".join(f"GPU-f{g}" for g in gpus)]


def test_an_unscripted_jobs_utilisation_is_its_cpu_use_on_a_machine_without_gpus(srv, tmp_path):
    flag = tmp_path / "stop"
    busy = srv.submit(f"import os\nwhile not os.path.exists({str(flag)!r}): pass\n")
    asleep = srv.submit(f"import os, time\nwhile not os.path.exists({str(flag)!r}): time.sleep(0.5)\n")
    srv.wait_state(busy, "RUNNING")
    srv.wait_state(asleep, "RUNNING")
    wait_for("the busy loop to read busy", lambda: (srv.job(busy)["gpu_util_pct"] or 0) > 20)
    wait_for("the sleeper sampled", lambda: srv.job(asleep)["gpu_util_pct"] is not None)
    assert srv.job(asleep)["gpu_util_pct"] < 20
    flag.write_text("")
    srv.wait_state(busy, "COMPLETED")
    srv.wait_state(asleep, "COMPLETED")


def test_server_refuses_an_unknown_node_and_nvml_without_gpus(tmp_path):
    s = Server(tmp_path)
    s.policy.write_text(POLICY)
    base = [sys.executable, "-m", "gpushepherd.cli.main", "server", "--data-dir", str(s.data), "--port", "1",
            "--policy", str(s.policy)]
    r = subprocess.run(base + ["--node", "elsewhere"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--node: 'elsewhere' is not allowed: a node of the policy (local)" in r.stderr
    r = subprocess.run(base + ["--inventory", "gpu"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--inventory: 'gpu' is not allowed" in r.stderr
    if nvml_unavailable() is None:
        return  # NVML finds a GPU here: the refusal below is not what happens
    r = subprocess.run(base + ["--inventory", "nvml"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "NVML finds no GPU" in r.stderr, r.stderr


def test_sample_events_round_trip_through_the_log_rows():
    for e in (UsageSample(5.0, "7", 12.5, 2048), GpuUnmanaged(6.0, "local", 3, False)):
        row = event_row(e)
        assert event_from_row(e.t, row["kind"], row["job_id"], row["payload"]) == e


def test_cuda_visible_devices_names_gpu_and_mig_uuids_else_indices():
    found = Discovery("nvml", "", "", (
        GpuInfo(0, "GPU-a", "X", 1), GpuInfo(1, "GPU-b", "X", 1, True, (MigDevice("MIG-1", "1g.10gb", 0),
                                                                          MigDevice("MIG-2", "1g.10gb", 3))),
        GpuInfo(2, "", "X", 1, True, (MigDevice("MIG-3", "3g.40gb", -1),))))
    assert visible_devices(Placement((("n", (1, 0)),)), "n", found) == "GPU-a,GPU-b"
    assert visible_devices(Placement((("m", (1, 0)),)), "n", found) == "0,1"  # another node: indices
    assert visible_devices(Placement((("n", (0, 1)),)), "n", None) == "0,1"
    mig = Placement((("n", (1,)),), share="mig:1g.10gb@3")
    assert (visible_devices(mig, "n", found), unresolved_mig(mig, "n", found)) == ("MIG-2", "")
    # starts unreadable (no permission): the one device of the profile
    assert visible_devices(Placement((("n", (2,)),), share="mig:3g.40gb@0"), "n", found) == "MIG-3"
    unknown = Placement((("n", (1,)),), share="mig:2g.20gb@4")
    assert (visible_devices(unknown, "n", found), unresolved_mig(unknown, "n", found)) == ("GPU-b", "2g.20gb@4")


CUDA_JOB = r'''
import ctypes, os, sys, time
flag = sys.argv[1]
print(os.environ["CUDA_VISIBLE_DEVICES"], flush=True)
try:
    import torch
    a = torch.randn(4096, 4096, device="cuda")
    open(flag + ".ready", "w").close()
    end = time.time() + 3
    while time.time() < end or not os.path.exists(flag):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
    sys.exit(0)
except ImportError:
    pass
cuda = ctypes.CDLL("libcuda.so.1")
def ok(r, what):
    if r != 0:
        sys.exit(f"{what}: CUDA error {r}")
ok(cuda.cuInit(0), "cuInit")
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
ok(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ok(cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), "cuCtxCreate")
ok(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(256 << 20)), "cuMemAlloc")
open(flag + ".ready", "w").close()
end = time.time() + 3
while time.time() < end or not os.path.exists(flag):
    ok(cuda.cuMemsetD8_v2(ptr, 7, ctypes.c_size_t(256 << 20)), "cuMemsetD8")
    ok(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
'''


@pytest.mark.gpu
def test_nvml_discovery_and_a_real_cuda_job_on_the_placed_gpu(tmp_path):
    why = nvml_unavailable()
    if why is not None:
        pytest.skip(f"needs an NVIDIA GPU: {why}")
    inv = NvmlInventory()
    try:
        found = inv.discover()
        assert found.gpus and found.driver
        g = found.gpus[0]
        assert g.uuid.startswith("GPU-") and g.name and g.memory_mib > 0
        if g.mig_enabled:
            pytest.skip("GPU 0 is in MIG mode: a whole-GPU CUDA job cannot run on it")
        backend = LocalBackend(tmp_path / "data")
        backend.node, backend.found = "local", found
        flag = tmp_path / "flag"
        proc = backend.start("1", 1, [sys.executable, "-c", CUDA_JOB, str(flag)], shell=False, env={},
                             cwd=str(tmp_path), placement=Placement((("local", (0,)),)))
        end = time.monotonic() + 120
        while not Path(str(flag) + ".ready").exists():
            assert time.monotonic() < end and not backend.exits(), \
                (backend.run_dir("1", 1) / "stderr").read_text()
            time.sleep(0.1)
        from gpushepherd.gpu import procs
        pids = procs.group_members([proc.pid])[proc.pid]
        seen = wait_for("the job's process in NVML's sample",
                        lambda: (u := inv.sample({"1": JobDevices((0,), pids)})).jobs["1"].mem_used_mib > 0 and u)
        assert seen.jobs["1"].util_pct is not None
        flag.write_text("")
        exits = wait_for("the CUDA job to end", backend.exits, timeout=120)
        assert exits == [("1", 0)], (backend.run_dir("1", 1) / "stderr").read_text()
        assert (backend.run_dir("1", 1) / "stdout").read_text().split() == [g.uuid]
    finally:
        inv.close()


def test_a_jobs_sample_is_logged_only_when_it_is_news_for_the_core():
    from types import SimpleNamespace

    from gpushepherd.daemon.server import Daemon

    def job(idle_stop) -> SimpleNamespace:
        return SimpleNamespace(id="1", cls=SimpleNamespace(idle_stop=idle_stop))

    d = SimpleNamespace(_logged_active={})
    rec = {"peak_gpu_mem_mib": 100}
    # a class with a 10 % threshold: the first sample, a crossing either way, a new peak
    j = job(SimpleNamespace(below_util_pct=10))
    seen = []
    for util, mem in ((50, 50), (60, 50), (5, 50), (3, 50), (3, 150), (40, 50)):
        news, active = Daemon._sample_is_news(d, j, util, mem, rec)
        seen.append(news)
        if news:
            d._logged_active[j.id] = active
            rec["peak_gpu_mem_mib"] = max(rec["peak_gpu_mem_mib"], mem)
    assert seen == [True, False, True, False, True, True]
    # a class without idle stop: the first sample and new peaks only
    d, j = SimpleNamespace(_logged_active={}), job(None)
    assert Daemon._sample_is_news(d, j, 0.0, 10, rec)[0]
    d._logged_active[j.id] = True
    assert not Daemon._sample_is_news(d, j, 0.0, 10, rec)[0]
    assert Daemon._sample_is_news(d, j, 0.0, 10_000, rec)[0]


def test_under_nvml_a_policy_node_unlike_the_machine_refuses_to_start(tmp_path, monkeypatch):
    from test_gpu import FakeNvml

    import gpushepherd.daemon.server as server_mod
    from gpushepherd.daemon.server import Daemon, DaemonError

    monkeypatch.setattr(server_mod, "open_inventory", lambda kind, node, data: NvmlInventory(FakeNvml()))
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    d = Daemon(tmp_path / "data", policy_path=policy, inventory="nvml")
    with pytest.raises(DaemonError) as exc:
        d.start()
    msg = str(exc.value)
    assert "the policy does not describe this machine" in msg and "gpus: 4" in msg and "NVML found 2" in msg
    assert "--inventory static" in msg
    d.store.acquire_lock(time.time())  # the refused start released the database lock
    d.store.release_lock()
