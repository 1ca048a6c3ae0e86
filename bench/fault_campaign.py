"""The daemon under faults and hostile clients, one command (issue 19's acceptance,
design note 017).

``.venv/bin/python bench/fault_campaign.py [--kills 100] [--startup-kills 20] [--calls 10000]``

Part 1 - kill -9 campaign. A real ``shepherd server`` (loopback, static 8-GPU inventory)
under mixed load from two clients (plain jobs, checkpointing jobs that exit 85 once,
failing jobs, inference jobs that preempt batch, small arrays, cancels); every
submission carries an ``Idempotency-Key`` and is retried with it until acknowledged.
Meanwhile ``--kills`` random ``kill -9`` points: the server (restarted at once; of
those, ``--startup-kills`` again during its start and replay), a job's runner, its
keeper, the job itself, or its whole process group (a lost run). Then every job is let
finish and the campaign reports: submissions acknowledged, lost (acknowledged, not in
the server) and doubled (one client submission, two jobs); runs per job; jobs that ran
again after completing (their own marker file says so); relaunch loops (more runs than
1 + preemptions + requeue limit + its checkpoint requeue: must be 0); jobs stuck not
ended; and the seconds from each server start to its first answer.

Part 2 - schemathesis (``pip install -e '.[bench]'``): >= ``--calls`` generated calls
against the server's OpenAPI schema, without tokens (the API open) and, once tokens
exist, with an admin token and with none or a bad one; every 5xx is counted (must be
0). That server's policy gives every team a quota of 0 GPUs, so no generated command
ever runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
MAX_REQUEUES = 3

POLICY = """\
name: fault-campaign
cluster:
  nodes:
    - {name: local, gpus: 8, gpu_type: FAKE, gpu_mem_mib: 16384}
classes:
  batch: {grace_period_s: 1}
  production-inference: {grace_period_s: 1}
teams:
  ml: {}
  data: {}
preemption: {enabled: true}
"""

FUZZ_POLICY = """\
name: fuzz
cluster:
  nodes:
    - {name: local, gpus: 4, gpu_type: FAKE, gpu_mem_mib: 16384}
teams:
  ml: {max_gpus: 0}
  data: {max_gpus: 0}
"""

JOB = """\
import os, sys, time
j, r = os.environ['SHEPHERD_JOB_ID'], os.environ['SHEPHERD_RUN']
m = os.path.join({marks!r}, j)
with open(m, 'a') as f:
    f.write(f'start {{r}}\\n')
kind, dur = sys.argv[1], float(sys.argv[2])
if kind == 'ckpt':
    c = os.path.join(os.environ['SHEPHERD_CHECKPOINT_DIR'], 'c')
    if not os.path.exists(c):
        open(c, 'w').write('1')
        time.sleep(dur / 2)
        sys.exit(85)
time.sleep(dur)
if kind == 'fail':
    sys.exit(3)
with open(m, 'a') as f:
    f.write(f'done {{r}}\\n')
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One ``shepherd server`` process, restarted on the same data directory."""

    def __init__(self, base: Path, policy: str, extra: tuple[str, ...] = ()):
        base.mkdir(parents=True, exist_ok=True)
        self.data, self.log = base / "data", base / "server.log"
        self.policy = base / "policy.yaml"
        self.policy.write_text(policy)
        self.extra = extra
        self.proc: subprocess.Popen | None = None
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.first = True
        self.token = ""
        self.cpu: list[float] = []

    def spawn(self) -> float:
        args = [sys.executable, "-m", "gpushepherd.cli.main", "server", "--data-dir", str(self.data), "--port",
                str(self.port), "--inventory", "static", "--sample-every", "2", *self.extra]
        if self.first:
            args += ["--policy", str(self.policy)]
            self.first = False
        self.proc = subprocess.Popen(args, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        return time.monotonic()

    def wait_up(self, t0: float, deadline_s: float = 180.0) -> float:
        """Seconds from ``t0`` (the spawn) to the first answer; the CPU seconds the server
        used until then are appended to ``self.cpu`` (what a start costs, whatever else
        the machine runs)."""
        end = t0 + deadline_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise SystemExit(f"the server exited ({self.proc.returncode}); log: {self.log.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/nodes", timeout=5, headers=self.headers).status_code == 200:
                    fields = open(f"/proc/{self.proc.pid}/stat").read().rsplit(")", 1)[1].split()
                    self.cpu.append((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise SystemExit(f"the server did not answer within {deadline_s} s; log: {self.log.read_text()[-3000:]}")

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill9()


def _exit_code(path: Path) -> int | None:
    try:
        return int(json.loads(path.read_text())["code"])
    except (OSError, ValueError, KeyError):
        return None


def processes(data: Path, marks: Path) -> dict[str, list[int]]:
    """The campaign's processes by role: runners (group leaders), keepers, jobs."""
    out: dict[str, list[int]] = {"runner": [], "keeper": [], "job": []}
    d, m = os.fsencode(str(data)), os.fsencode(str(marks))
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
            stat = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if stat[0] in "ZX":
            continue
        if b"gpushepherd.daemon.runner" in argv and any(a.startswith(d) for a in argv):
            out["runner" if stat[2] == entry else "keeper"].append(int(entry))
        elif any(m in a for a in argv) and b"gpushepherd.daemon.runner" not in argv:
            out["job"].append(int(entry))
    return out


class Load:
    """Two clients submitting a mix of jobs with Idempotency-Keys until stopped."""

    def __init__(self, server: Server, marks: Path, cwd: str, seed: int):
        self.s, self.marks, self.cwd = server, marks, cwd
        self.code = JOB.format(marks=str(marks))
        self.acked: dict[str, dict] = {}  # client key -> {"id", "kind", "array"}
        self.cancels = 0
        self.refused: list[str] = []  # submissions the server refused (4xx): the campaign is void
        self.retries = 0
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.rng = random.Random(seed)

    def _body(self, kind: str, key: str) -> dict:
        dur = round(self.rng.uniform(0.3, 2.5), 2)
        body = {"class": "batch", "team": self.rng.choice(["ml", "data"]), "user": "campaign",
                "command": [sys.executable, "-c", self.code, "ckpt" if kind == "ckpt" else
                            "fail" if kind == "fail" else "plain", str(dur), key],
                "cwd": self.cwd, "gpus": self.rng.choice([1, 1, 1, 2])}
        if kind == "inference":
            body.update({"class": "production-inference", "gpus": 2})
        if kind == "array":
            body["array"] = "0-3%2"
        return body

    def _submit(self, body: dict, key: str) -> str | None:
        end = time.monotonic() + 180
        while time.monotonic() < end:
            try:
                r = httpx.post(self.s.url + "/jobs", json=body, headers={"Idempotency-Key": key}, timeout=30)
                if r.status_code in (200, 201):
                    return r.json()["id"]
                if r.status_code < 500:
                    with self.lock:
                        self.refused.append(f"{r.status_code} {r.text[:300]}")
                    return None
            except httpx.HTTPError:
                pass
            with self.lock:
                self.retries += 1
            time.sleep(0.2)
        return None

    def client(self) -> None:
        while not self.stop.is_set():
            kind = self.rng.choices(["plain", "ckpt", "fail", "inference", "array", "cancel"],
                                    [45, 15, 10, 10, 10, 10])[0]
            if kind == "cancel":
                with self.lock:
                    ids = [a["id"] for a in self.acked.values()]
                if ids:
                    try:
                        httpx.post(f"{self.s.url}/jobs/{self.rng.choice(ids)}/cancel", timeout=30)
                        self.cancels += 1
                    except httpx.HTTPError:
                        pass
                continue
            key = uuid.uuid4().hex
            job_id = self._submit(self._body(kind, key), key)
            if job_id is not None:
                with self.lock:
                    self.acked[key] = {"id": job_id, "kind": kind}
            time.sleep(self.rng.uniform(0.05, 0.4))


def campaign(base: Path, kills: int, startup_kills: int, seed: int) -> dict:
    rng = random.Random(seed)
    marks = base / "marks"
    marks.mkdir(parents=True)  # each job appends "start RUN" / "done RUN" to marks/<job>
    s = Server(base, POLICY, ("--requeue-backoff", "0.5", "--max-requeues", str(MAX_REQUEUES)))
    serve_times: list[float] = []
    serve_times.append(s.wait_up(s.spawn()))
    load = Load(s, marks, str(base), seed)
    clients = [threading.Thread(target=load.client, daemon=True) for _ in range(2)]
    for c in clients:
        c.start()
    done: Counter = Counter()
    startups_left = startup_kills
    while sum(done.values()) < kills:
        time.sleep(rng.uniform(0.3, 1.2))
        kind = rng.choices(["server", "runner", "keeper", "job", "group"], [35, 20, 15, 15, 15])[0]
        if kind == "server":
            s.kill9()
            done["server"] += 1
            t0 = s.spawn()
            if startups_left and rng.random() < 0.6:  # again during its start and replay
                time.sleep(rng.uniform(0.05, 2.5))
                s.kill9()
                done["server during start"] += 1
                startups_left -= 1
                t0 = s.spawn()
            serve_times.append(s.wait_up(t0))
            continue
        procs = processes(s.data, marks)
        pool = procs["runner" if kind == "group" else kind]
        if not pool:
            continue
        pid = rng.choice(pool)
        try:
            if kind == "group":
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
            done[kind] += 1
        except ProcessLookupError:
            pass
    while startups_left:  # the startup kills the random draw left
        s.kill9()
        t0 = s.spawn()
        time.sleep(rng.uniform(0.05, 2.5))
        s.kill9()
        done["server"] += 1
        done["server during start"] += 1
        startups_left -= 1
        serve_times.append(s.wait_up(s.spawn()))
    load.stop.set()
    for c in clients:
        c.join(timeout=200)
    # every job ends (they are short); then the ledger
    deadline = time.monotonic() + 600
    views: list[dict] = []
    while time.monotonic() < deadline:
        views = httpx.get(s.url + "/jobs", params={"children": "true"}, timeout=120).json()
        if all(v["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "REJECTED") for v in views):
            break
        time.sleep(1.0)
    s.stop()
    by_id = {v["id"]: v for v in views}
    keys: dict[str, list[str]] = {}
    for v in views:
        if "tasks" in v or "_" in v["id"]:
            continue  # an array's children share its command; the array entry itself has no command key
        keys.setdefault(v["command"][-1], []).append(v["id"])
    for v in views:
        if "tasks" in v:
            keys.setdefault(v["command"][-1], []).append(v["id"])
    acked = load.acked
    lost = [k for k, a in acked.items() if a["id"] not in by_id]
    doubled = {k: ids for k, ids in keys.items() if len(ids) > 1}
    jobs = [v for v in views if "tasks" not in v]
    runs = [v["runs"] for v in jobs]
    again, loops, stuck = [], [], []
    for v in jobs:
        # completed = a run whose exit file says 0 (the job exited 0, recorded by its keeper or
        # runner); a later run of the same job is a job run again after completing
        rdir = s.data / "runs" / v["id"]
        done_runs = sorted(int(r.name) for r in rdir.iterdir() if _exit_code(r / "exit") == 0) if rdir.exists() else []
        if done_runs and any(int(r.name) > done_runs[0] for r in rdir.iterdir()):
            again.append(v["id"])
        ckpt = 1 if "ckpt" in v["command"] else 0
        if v["runs"] > 1 + v["preemptions"] + MAX_REQUEUES + ckpt:
            loops.append(v["id"])
        if v["state"] not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "REJECTED"):
            stuck.append(v["id"])
    return {
        "kill_points": dict(done), "kill_points_total": sum(v for k, v in done.items() if k != "server during start")
        + done["server during start"],
        "acknowledged": len(acked), "refused": len(load.refused), "first_refused": load.refused[:1],
        "lost": len(lost), "doubled": len(doubled), "retried_calls": load.retries,
        "jobs": len(jobs), "states": dict(Counter(v["state"] for v in jobs)),
        "runs_per_job": {"mean": round(statistics.mean(runs), 3) if runs else 0, "max": max(runs, default=0),
                         "histogram": dict(sorted(Counter(runs).items()))},
        "lost_runs": sum(v.get("lost_runs", 0) for v in jobs),
        "failed_at_requeue_limit": sum(1 for v in jobs if v.get("failure")),
        "ran_again_after_completing": len(again), "relaunch_loops": len(loops), "stuck_not_ended": len(stuck),
        "time_to_serve_s": {"starts": len(serve_times), "median": round(statistics.median(serve_times), 2),
                            "max": round(max(serve_times), 2),
                            "cpu_s_median": round(statistics.median(s.cpu), 2), "cpu_s_max": round(max(s.cpu), 2),
                            "load_average_at_end": round(os.getloadavg()[0], 1), "cpus": os.cpu_count()},
        "examples": {"lost": lost[:5], "doubled": dict(list(doubled.items())[:5]), "again": again[:5],
                     "loops": loops[:5], "stuck": stuck[:5]},
    }


def fuzz(base: Path, calls: int, seed: int) -> dict:
    """schemathesis against a server whose policy lets nothing run."""
    try:
        import schemathesis
        from hypothesis import HealthCheck, given, settings
    except ImportError:
        return {"skipped": "schemathesis is not installed: pip install -e '.[bench]'"}
    s = Server(base, FUZZ_POLICY, ("--header-timeout", "10"))
    s.wait_up(s.spawn())
    schema = schemathesis.openapi.from_url(s.url + "/openapi.json")
    ops = [r.ok() for r in schema.get_all_operations()]
    statuses: Counter = Counter()
    errors: list[str] = []
    per_op = max(1, -(-calls // (2 * len(ops))))

    def run(headers: dict, label: str, n: int) -> None:
        for op in ops:
            @settings(max_examples=n, deadline=None, database=None, derandomize=False,
                      suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy())
            def one(case):
                try:
                    r = case.call(base_url=s.url, headers=headers, timeout=60)
                    code = r.status_code
                except Exception as exc:  # noqa: BLE001 - a transport error is counted, not fatal
                    code = f"transport:{type(exc).__name__}"
                statuses[(label, code)] += 1
                if isinstance(code, int) and code >= 500 and len(errors) < 20:
                    errors.append(f"{label} {op.method.upper()} {op.path}: {code}")
            one()

    run({}, "no tokens (open API)", per_op)
    from typer.testing import CliRunner

    from gpushepherd.cli.main import app

    out = CliRunner().invoke(app, ["token", "create", "--data-dir", str(s.data), "-u", "root", "--admin"]).output
    s.token = next(w for w in out.split() if w.startswith("shp_"))
    run(s.headers, "admin token", per_op)
    run({}, "tokens exist, none sent", max(1, per_op // 10))
    run({"Authorization": "Bearer shp_not-a-token"}, "tokens exist, bad token", max(1, per_op // 10))
    alive = s.proc.poll() is None
    s.stop()
    by_label: dict[str, dict] = {}
    for (label, code), n in statuses.items():
        by_label.setdefault(label, {})[str(code)] = n
    total = sum(statuses.values())
    fives = sum(n for (_l, code), n in statuses.items() if isinstance(code, int) and code >= 500)
    return {"calls": total, "operations": len(ops), "5xx": fives, "server_alive_after": alive,
            "by_mode_and_status": by_label, "first_5xx": errors}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=100, help="kill -9 points (default 100)")
    ap.add_argument("--startup-kills", type=int, default=20, help="of the server ones: during its start (20)")
    ap.add_argument("--calls", type=int, default=10_000, help="schemathesis calls at least (10,000)")
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--skip-fuzz", action="store_true")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    ap.add_argument("--keep", metavar="DIR", help="work in DIR (created) and keep it: DIR/kills is the kill "
                                                  "campaign's server data directory (`bench/reasons.py --db`)")
    args = ap.parse_args()
    # the clients submit token-less as the user running the bench: as root the server would
    # run jobs per Unix user (note 023) and refuse them (403 naming `user`), and a campaign
    # of refused submissions checks nothing (it once read "all held" with 0 jobs)
    os.environ.setdefault("SHEPHERD_RUN_AS", "server")
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
    with (contextlib.nullcontext(args.keep) if args.keep
          else tempfile.TemporaryDirectory(prefix="shepherd-campaign-")) as tmp:
        t0 = time.monotonic()
        part1 = campaign(Path(tmp) / "kills", args.kills, args.startup_kills, args.seed)
        part1["wall_s"] = round(time.monotonic() - t0)
        print("kill -9 campaign:", json.dumps(part1, indent=2))
        part2 = {"skipped": "--skip-fuzz"}
        if not args.skip_fuzz:
            t0 = time.monotonic()
            part2 = fuzz(Path(tmp) / "fuzz", args.calls, args.seed)
            part2["wall_s"] = round(time.monotonic() - t0)
        print("schemathesis:", json.dumps(part2, indent=2))
        ok = (part1["acknowledged"] > 0 and part1["refused"] == 0
              and part1["lost"] == 0 and part1["doubled"] == 0 and part1["relaunch_loops"] == 0
              and part1["ran_again_after_completing"] == 0 and part1["stuck_not_ended"] == 0
              and part2.get("5xx", 0) == 0)
        print(f"verdict: {'all held' if ok else 'FAULTS FOUND'}")
        if args.json:
            Path(args.json).write_text(json.dumps({"kills": part1, "fuzz": part2}, indent=2))
        sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
