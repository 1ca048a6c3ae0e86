"""How long `shepherd server` takes to serve again after a restart, by the length of
its log (issue 19 point 9, design note 017).

``.venv/bin/python bench/restart.py [JOBS] [--policies N]`` writes a data directory
whose event log holds JOBS jobs (default 100,000) submitted and completed (batches of 50
on a 64-GPU node, as the loop logs them, with their jobs rows) and N policy versions
(default 52) spread through it, then starts a real `shepherd server` on it three
times and prints, for each, the seconds from the process's start to its first answer
(`GET /nodes` 200):

1. **full replay** - no snapshot yet: every batch replayed (and every policy version
   restored), as every start did before note 017; this is the baseline. It then writes
   its first snapshot (timed too: the once-only cost of archiving every ended job);
2. **from the snapshot** after a clean stop;
3. **after kill -9**, with jobs submitted after the snapshot (the tail replayed).

Target (issue 19): <= 5 s at 100,000 logged jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from gpushepherd.daemon.store import Store, spec_to_dict  # noqa: E402
from gpushepherd.model.events import JobFinished, JobSubmitted  # noqa: E402
from gpushepherd.model.job import JobSpec  # noqa: E402

PER_BATCH = 50


def policy(version: int) -> dict:
    return {"name": "restart-bench", "teams": {"ml": {"max_gpus": 64 - version % 2}, "data": {}},
            "cluster": {"nodes": [{"name": "n", "gpus": 64, "gpu_type": "FAKE", "gpu_mem_mib": 16384}]}}


def build(data: Path, jobs: int, policies: int) -> None:
    """The data directory: JOBS jobs logged and completed, POLICIES policy versions."""
    data.mkdir(parents=True)
    store = Store(Store.sqlite_url(data))
    t = time.time() - 86400
    store.append_policy(t, policy(1), by="bench")
    # no core here: 50 one-GPU jobs per batch always start at once on the 64 GPUs (the
    # server's replay decides, as it would for a log the loop wrote)
    every = max(1, jobs // PER_BATCH // max(1, policies - 1))
    version, num = 1, 0
    for b in range(0, jobs, PER_BATCH):
        if version < policies and (b // PER_BATCH) % every == every - 1:
            version += 1
            store.append_policy(t, policy(version), by="bench")
        t += 1
        specs = []
        for _ in range(min(PER_BATCH, jobs - b)):
            num += 1
            specs.append(JobSpec(id=str(num), team=("ml", "data")[num % 2], workload_class="batch", gpus=1,
                                 user="bench", submit_time=t))
        rows = [dict(id=s.id, num=int(s.id), spec=json.dumps(spec_to_dict(s)), argv='["true"]', shell=False,
                     env="{}", cwd="/", state="COMPLETED", run=1, exit_code=0) for s in specs]
        store.append(t, [JobSubmitted(t, s) for s in specs], rows)
        t += 1
        store.append(t, [JobFinished(t, s.id) for s in specs])
    store.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used: what a start costs, whatever
    else the machine runs."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve(data: Path, log: Path) -> tuple[subprocess.Popen, str, float, float]:
    """Start a server on ``data``; returns it, its URL, the seconds to its first answer
    and the CPU seconds it used until then."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "gpushepherd.cli.main", "server", "--data-dir", str(data),
                             "--port", str(port), "--inventory", "static"], stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode}): {log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/nodes", timeout=5).status_code == 200:
                return proc, url, time.monotonic() - t0, cpu_s(proc.pid)
        except httpx.TransportError:
            pass
        time.sleep(0.05)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("jobs", nargs="?", type=int, default=100_000)
    ap.add_argument("--policies", type=int, default=52)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data, log = Path(tmp) / "data", Path(tmp) / "server.log"
        t0 = time.monotonic()
        build(data, args.jobs, args.policies)
        print(f"log: {args.jobs:,} jobs, {args.policies} policy versions, "
              f"{(data / 'shepherd.db').stat().st_size / 1e6:.0f} MB (built in {time.monotonic() - t0:.0f} s)")
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (wall seconds grow with it; CPU "
              "seconds less)")
        proc, url, full, full_cpu = serve(data, log)
        print(f"1. full replay (the baseline: no snapshot)   {full:6.2f} s to serve ({full_cpu:5.2f} s CPU)")
        t0 = time.monotonic()
        while "snapshot of batch" not in log.read_text():
            time.sleep(0.1)
        print(f"   then its first snapshot, the server serving meanwhile ({args.jobs:,} ended jobs archived in "
              f"chunks, once)  {time.monotonic() - t0:6.2f} s more")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        proc, url, snap, snap_cpu = serve(data, log)
        print(f"2. from the snapshot, after a clean stop      {snap:6.2f} s to serve ({snap_cpu:5.2f} s CPU)")
        for _ in range(20):
            r = httpx.post(url + "/jobs", json={"class": "batch", "team": "ml", "user": "bench", "command": ["true"],
                                                "cwd": "/"}, timeout=60)
            assert r.status_code == 201, r.text
        time.sleep(1.0)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc, url, tail, tail_cpu = serve(data, log)
        print(f"3. after kill -9, 20 jobs after the snapshot   {tail:6.2f} s to serve ({tail_cpu:5.2f} s CPU)")
        one = httpx.get(url + "/jobs/1", timeout=60).json()
        assert one["state"] == "COMPLETED", one
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        worst = max(snap, tail)
        print(f"target <= 5 s at 100,000 jobs: {'met' if worst <= 5 else 'NOT met'} ({worst:.2f} s wall, "
              f"{max(snap_cpu, tail_cpu):.2f} s CPU; baseline {full:.2f} s wall, {full_cpu:.2f} s CPU; "
              f"{full / worst:.0f}x); load average now {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
