"""Submissions over the daemon's HTTP API (issue 5): sustained submissions/s and the
latency from the submit request to the job's start decision.

``.venv/bin/python bench/api_submit.py [--jobs 10000] [--clients 8] [--db URL]
[--hold-s 0] [--warmup 200] [--loadgen raw|httpx] [--http auto|h11|httptools]
[--loop auto|asyncio|uvloop] [--switch-interval S] [--gc tuned|default]`` starts a real
``shepherd server`` (the product's ``Daemon`` and ``make_app`` under uvicorn on
127.0.0.1, with the server command's process settings, ``tune_server_process``;
``--switch-interval`` and ``--gc default`` override them), a free port, SQLite with WAL
and ``synchronous=FULL`` in a temporary data directory, or ``--db
postgresql+psycopg://...``) under a static 64-GPU cluster (8 nodes x 8 GPUs), then 8
concurrent clients submit the jobs (1, 1, 2 or 4 GPUs in turn) over HTTP.

No process is forked per job: the server runs in a child process of this script
(``serve`` below) whose ``Daemon.backend`` is replaced, before it starts, by
``StubBackend``: a job "runs" without a process and ends with exit code 0 at the first
loop step ``--hold-s`` seconds after its start (default 0: the next step). Everything
else is the product's path: the API's validation, the submission committed to the
event log before it is acknowledged, the core's decisions, the jobs-table writes of a
launch and of an exit. No product flag exists for this; the stub is injected here only.

Figures, defined as printed:

* **submit round trip**: the client sends ``POST /jobs`` until it has the response,
  which comes after the submission is committed to the event log, the core has
  handled it and the loop step ended (the response shows the job's state after it).
* **submit -> start decision, started at once**: for a job whose ``Start`` the core
  emitted in the same ``Scheduler.handle`` call as its submission (GPUs were free),
  the time from the client sending the request to that call returning (server and
  client read the same ``CLOCK_MONOTONIC``). Scheduler latency.
* **queueing delay**: for a job whose ``Start`` came in a later call (it waited for
  GPUs), the same time; this is waiting for capacity, not scheduler latency, and is
  reported apart. With ``--hold-s 0`` and 8 clients few or none wait.
* **sustained submissions/s**: measured jobs / (last response - first request), warm-up
  excluded.

Baselines in the same run, the same submissions (and the exits the stub produces) in
batches of ``--clients`` events: **core** (``Scheduler.handle`` only) and **store +
core** (``Store.append``, one commit per batch, then ``handle``, as the loop does) - the
floor under the HTTP figure. The CPU time of the server process and of the load
generator (one asyncio process with one keep-alive connection per client) during the
measured window is printed too, as a share of this machine's cores.

The load generator (``--loadgen raw``, the default) is cheap, like ``wrk``: asyncio
streams, requests encoded before the measured window, each response parsed (status,
``content-length``, the body's ``id`` and ``state``) before the client's next request;
``--loadgen httpx`` uses ``httpx.AsyncClient`` (about 20x its CPU per submission).
``--http`` and ``--loop`` are passed to ``uvicorn.run`` (``auto``: httptools and uvloop
when installed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

POLICY = {
    "name": "api-bench",
    "cluster": {"nodes": [{"name": f"n{i}", "gpus": 8, "gpu_type": "FAKE", "gpu_mem_mib": 16384} for i in range(8)]},
    "classes": {"batch": {"grace_period_s": 1}},
    "teams": {"ml": {}, "vision": {}},
}
GPUS = (1, 1, 2, 4)


def job_body(i: int, cwd: str) -> dict:
    return {"class": "batch", "team": ("ml", "vision")[i % 2], "user": f"u{i % 8}", "gpus": GPUS[i % len(GPUS)],
            "command": ["true"], "cwd": cwd}


# ---------------------------------------------------------------- the server side
def serve(data: Path, port: int, db: str | None, hold_s: float, out: Path, http: str = "auto",
          loop: str = "auto", switch_interval: float | None = None, gc_mode: str = "tuned") -> None:
    """The server process: the product's daemon and API with ``StubBackend``, the
    product's process settings (``tune_server_process``; ``switch_interval`` seconds
    and ``gc_mode="default"`` override them for comparisons); at SIGINT writes what it
    recorded to ``out`` (JSON)."""
    import uvicorn

    from gpushepherd.daemon.api import make_app
    from gpushepherd.daemon.local import LocalBackend, Proc
    from gpushepherd.daemon.server import Daemon
    from gpushepherd.daemon.tuning import SWITCH_INTERVAL_S, tune_server_process
    from gpushepherd.model.decisions import Start
    from gpushepherd.model.events import JobSubmitted

    class StubBackend(LocalBackend):
        """Runs nothing: a started job ends with code 0 at the first ``exits()`` call
        at least ``hold_s`` seconds after its start; a signal ends it with ``-sig``."""

        def __init__(self, data_dir: Path):
            super().__init__(data_dir)
            self.started: dict[str, float] = {}
            self.codes: dict[str, int] = {}

        def start(self, job_id, run, argv, *, shell, env, cwd, placement, **_more):
            proc = Proc(job_id, run, 0, None, self.run_dir(job_id, run) / "exit")
            self.procs[job_id] = proc
            self.started[job_id] = time.monotonic()
            return proc

        def exits(self):
            now = time.monotonic()
            done = [j for j in self.procs if j in self.codes or now - self.started[j] >= hold_s]
            for j in done:
                del self.procs[j]
            return [(j, self.codes.pop(j, 0)) for j in done]

        def signal(self, job_id, sig):
            if job_id in self.procs:
                self.codes[job_id] = -int(sig)

    # the stub runs nothing, so every job "runs" as the server's user; as root the server
    # would otherwise run jobs per user (note 023) and refuse the bench's token-less clients
    os.environ.setdefault("SHEPHERD_RUN_AS", "server")
    daemon = Daemon(data, db, data / "policy.yaml")
    daemon.backend = StubBackend(daemon.data_dir)
    daemon.start()
    rec = {"start": {}, "at_once": [], "steps": [], "appends": [], "handles": [], "loop_cpu_s": 0.0}
    loop_clock = time.pthread_getcpuclockid(daemon._thread.ident)  # the loop thread's CPU, read at the end
    loop_cpu0 = time.clock_gettime(loop_clock)
    handle, step, append = daemon.sched.handle, daemon.step, daemon.store.append

    def timed_handle(events):
        t0 = time.monotonic()
        decisions = handle(events)
        t1 = time.monotonic()
        rec["handles"].append(t1 - t0)
        submitted = {e.spec.id for e in events if isinstance(e, JobSubmitted)}
        for d in decisions:
            if isinstance(d, Start) and d.job_id not in rec["start"]:
                rec["start"][d.job_id] = t1
                if d.job_id in submitted:
                    rec["at_once"].append(d.job_id)
        return decisions

    def timed_step():
        t0, n0 = time.monotonic(), len(rec["handles"])
        out = step()
        if len(rec["handles"]) > n0:  # a step that handled a batch
            rec["steps"].append(time.monotonic() - t0)
        return out

    def timed_append(t, batch, *a, **kw):
        t0 = time.monotonic()
        n = append(t, batch, *a, **kw)
        rec["appends"].append((time.monotonic() - t0, sum(1 for e in batch if isinstance(e, JobSubmitted))))
        return n

    daemon.sched.handle, daemon.step, daemon.store.append = timed_handle, timed_step, timed_append
    tune_server_process(SWITCH_INTERVAL_S if switch_interval is None else switch_interval, gc_mode == "tuned")
    rec["settings"] = {"switch_interval_s": sys.getswitchinterval(), "gc_threshold": gc_threshold()}
    try:
        uvicorn.run(make_app(daemon), host="127.0.0.1", port=port, log_level="warning", access_log=False, http=http,
                    loop=loop)
    except KeyboardInterrupt:
        pass
    finally:
        rec["loop_cpu_s"] = time.clock_gettime(loop_clock) - loop_cpu0 if daemon._thread.is_alive() else float("nan")
        daemon.stop()
        out.write_text(json.dumps(rec))


def gc_threshold() -> list[int]:
    import gc

    return list(gc.get_threshold())


# ---------------------------------------------------------------- the load generator
def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def load(url: str, n: int, first: int, clients: int, cwd: str) -> list[tuple[float, float, str, str]]:
    """Submit jobs ``first .. first+n-1`` from ``clients`` concurrent connections;
    returns ``(sent, answered, job id, state)`` per job (monotonic seconds)."""
    import httpx

    bodies = [json.dumps(job_body(i, cwd)).encode() for i in range(first, first + n)]
    out: list = []
    it = iter(bodies)
    headers = {"content-type": "application/json"}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async def client(http):
        for body in it:
            t0 = time.monotonic()
            r = await http.post("/jobs", content=body, headers=headers)
            t1 = time.monotonic()
            if r.status_code != 201:
                raise RuntimeError(f"POST /jobs: {r.status_code} {r.text}")
            v = r.json()
            out.append((t0, t1, v["id"], v["state"]))

    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    return out


async def load_raw(port: int, n: int, first: int, clients: int, cwd: str,
                   token: str | None = None) -> list[tuple[float, float, str, str]]:
    """As ``load``, without an HTTP library (like ``wrk``): ``clients`` asyncio
    streams to 127.0.0.1:``port``, HTTP/1.1 keep-alive, each request pre-encoded;
    each response is parsed (status line, ``content-length``, the JSON body's ``id``
    and ``state``) before the client sends its next request.

    Raises:
        RuntimeError: a response other than 201, or without ``content-length``.
    """
    auth = f"authorization: Bearer {token}\r\n" if token else ""
    reqs = []
    for i in range(first, first + n):
        body = json.dumps(job_body(i, cwd)).encode()
        reqs.append(f"POST /jobs HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
                    f"{auth}content-length: {len(body)}\r\n\r\n".encode() + body)
    out: list = []
    it = iter(reqs)

    async def client():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for req in it:
                t0 = time.monotonic()
                writer.write(req)
                head = await reader.readuntil(b"\r\n\r\n")
                status, length = int(head[9:12]), None
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                if length is None:
                    raise RuntimeError(f"POST /jobs: no content-length in {head!r}")
                data = await reader.readexactly(length)
                t1 = time.monotonic()
                if status != 201:
                    raise RuntimeError(f"POST /jobs: {status} {data!r}")
                v = json.loads(data)
                out.append((t0, t1, v["id"], v["state"]))
        finally:
            writer.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    return out


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * len(xs) + 0.5) - 1))] if xs else float("nan")


def ms(xs: list[float]) -> str:
    if not xs:
        return "n=0"
    return (f"p50 {pct(xs, 50) * 1e3:7.2f}  p95 {pct(xs, 95) * 1e3:7.2f}  p99 {pct(xs, 99) * 1e3:7.2f}  "
            f"max {max(xs) * 1e3:7.2f} ms  (n={len(xs)})")


# ---------------------------------------------------------------- baselines
def baseline(n: int, batch: int, store_url: str | None) -> float:
    """Seconds for ``n`` submissions (and the stub's exits) fed to the core in batches
    of ``batch`` events, each batch committed first when ``store_url`` is given."""
    from gpushepherd.core.scheduler import Scheduler
    from gpushepherd.daemon.store import Store
    from gpushepherd.model.decisions import Start
    from gpushepherd.model.events import JobFinished, JobSubmitted
    from gpushepherd.model.job import JobSpec
    from gpushepherd.policy.load import policy_from_dict

    sched = Scheduler(policy_from_dict(POLICY).rules)
    store = Store(store_url) if store_url else None
    if store:
        store.append_policy(0.0, POLICY)
    running: list[str] = []
    t, i = 1.0, 0
    start = time.perf_counter()
    while i < n or running:
        events = [JobFinished(t, j) for j in running]
        for k in range(i, min(n, i + batch)):
            b = job_body(k, "/")
            events.append(JobSubmitted(t, JobSpec(id=str(k + 1), team=b["team"], workload_class=b["class"],
                                                  user=b["user"], gpus=b["gpus"], submit_time=t)))
        i = min(n, i + batch)
        if store:
            store.append(t, events)
        running = [d.job_id for d in sched.handle(events) if isinstance(d, Start)]
        t += 0.001
    took = time.perf_counter() - start
    if store:
        store.close()
    return took


# ---------------------------------------------------------------- main
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=10_000, help="measured submissions")
    ap.add_argument("--clients", type=int, default=8, help="concurrent HTTP connections")
    ap.add_argument("--warmup", type=int, default=200, help="submissions before the measured ones")
    ap.add_argument("--db", default=None, help="SQLAlchemy URL (default: SQLite in a temporary data dir)")
    ap.add_argument("--hold-s", type=float, default=0.0, help="seconds a stub job holds its GPUs")
    ap.add_argument("--loadgen", choices=("raw", "httpx"), default="raw",
                    help="raw: asyncio streams, pre-encoded requests (like wrk); httpx: httpx.AsyncClient")
    ap.add_argument("--http", choices=("auto", "h11", "httptools"), default="auto", help="uvicorn's HTTP parser")
    ap.add_argument("--loop", choices=("auto", "asyncio", "uvloop"), default="auto", help="uvicorn's event loop")
    ap.add_argument("--switch-interval", type=float, default=None,
                    help="the server's sys.setswitchinterval, seconds (default: the product's, note 032)")
    ap.add_argument("--gc", choices=("tuned", "default"), default="tuned",
                    help="the server's garbage collector: the product's settings (note 032) or Python's defaults")
    ap.add_argument("--serve", nargs=4, metavar=("DATA", "PORT", "HOLD_S", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        data, port, hold_s, out = args.serve
        serve(Path(data), int(port), args.db, float(hold_s), Path(out), args.http, args.loop, args.switch_interval,
              args.gc)
        return

    import httpx
    import yaml

    with tempfile.TemporaryDirectory(prefix="api-bench-") as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        (data / "policy.yaml").write_text(yaml.safe_dump(POLICY))
        port, out = free_port(), Path(tmp) / "server.json"
        url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, __file__, "--serve", str(data), str(port), str(args.hold_s), str(out),
               "--http", args.http, "--loop", args.loop, "--gc", args.gc] \
            + (["--switch-interval", str(args.switch_interval)] if args.switch_interval is not None else [])
        server = subprocess.Popen(cmd + (["--db", args.db] if args.db else []))
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(url + "/nodes", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"the server did not start (exit {server.poll()})")
                time.sleep(0.1)
            def run_load(n: int, first: int):
                if args.loadgen == "raw":
                    return asyncio.run(load_raw(port, n, first, args.clients, tmp))
                return asyncio.run(load(url, n, first, args.clients, tmp))

            run_load(args.warmup, 0)
            srv_cpu0, cli_cpu0, wall0 = cpu_s(server.pid), time.process_time(), time.monotonic()
            res = run_load(args.jobs, args.warmup)
            wall = time.monotonic() - wall0
            srv_cpu, cli_cpu = cpu_s(server.pid) - srv_cpu0, time.process_time() - cli_cpu0
        finally:
            server.send_signal(signal.SIGINT)  # uvicorn re-raises it after its shutdown: KeyboardInterrupt
            server.wait(timeout=60)
        rec = json.loads(out.read_text())
        ids = {job_id for _t0, _t1, job_id, _s in res}
        sent = {job_id: t0 for t0, _t1, job_id, _s in res}
        at_once = set(rec["at_once"]) & ids
        started = {j: t for j, t in rec["start"].items() if j in ids}
        span = max(t1 for _t0, t1, _j, _s in res) - min(t0 for t0, _t1, _j, _s in res)
        base_core = baseline(args.jobs, args.clients, None)
        base_store = baseline(args.jobs, args.clients, f"sqlite:///{Path(tmp) / 'base.db'}")

    n = len(res)
    cores = os.cpu_count() or 1
    db = args.db or "SQLite (WAL, synchronous=FULL)"
    steps = rec["steps"]
    subs_per_commit = [k for _s, k in rec["appends"] if k]
    print(f"{n} submissions from {args.clients} clients over HTTP, 64 GPUs (8 x 8), {db}, stub jobs "
          f"held {args.hold_s:g} s; {cores} cores; warm-up {args.warmup} not counted; load generator "
          f"{args.loadgen}, uvicorn http={args.http} loop={args.loop}; server switch interval "
          f"{rec['settings']['switch_interval_s'] * 1e3:g} ms, gc threshold {rec['settings']['gc_threshold']}"
          f"{' (frozen at start)' if args.gc == 'tuned' else ''}; load average {os.getloadavg()[0]:.1f}")
    print("definitions: round trip = POST /jobs sent -> response (after the event-log commit and the core's "
          "handling); start decision = POST sent -> the Scheduler.handle call that emitted the job's Start "
          "returned (same call as its submission: 'at once'; a later call: queueing, not scheduler latency)")
    print(f"  sustained:                      {n / span:8.0f} submissions/s   "
          "(target >= 2,000, issue 16; Slurm documents 500)")
    print(f"  submit round trip:              {ms([t1 - t0 for t0, t1, _j, _s in res])}")
    print(f"  submit -> start, at once:       {ms([started[j] - sent[j] for j in at_once])}   "
          "(target p99 <= 50 ms, issue 16)")
    print(f"  submit -> start, queued:        {ms([started[j] - sent[j] for j in started if j not in at_once])}")
    print(f"  not started by the end:         {n - len(started)}")
    print(f"  server CPU {srv_cpu / wall * 100:5.0f}% of one core ({srv_cpu / n * 1e3:.2f} ms per submission), "
          f"load generator {cli_cpu / wall * 100:5.0f}% ({cli_cpu / n * 1e3:.2f} ms), of {cores} cores; "
          f"{wall:.1f} s wall")
    print(f"  server loop: {rec['loop_cpu_s']:.1f} CPU s in all (warm-up included); {len(rec['handles'])} steps with "
          f"a batch, step {ms(steps)}")
    print(f"               commit {ms([s for s, _k in rec['appends']])}")
    print(f"               core   {ms(rec['handles'])}")
    if subs_per_commit:
        print(f"               submissions per commit: mean {statistics.mean(subs_per_commit):.1f}, "
              f"max {max(subs_per_commit)}")
    print(f"baseline, same run, batches of {args.clients}: core only {args.jobs / base_core:8.0f} submissions/s; "
          f"store (SQLite, as above) + core {args.jobs / base_store:8.0f} submissions/s")


if __name__ == "__main__":
    main()
