"""Pages of ``GET /jobs?state=PENDING`` with many pending jobs (issue 16 point 3,
design note 029): the time to answer one page of 500 beside the unpaged list that
``GET /jobs?state=PENDING`` answered before pages existed, in the same run.

``.venv/bin/python bench/api_pages.py [--jobs 100000] [--limit 500] [--pages 40]
[--db URL]`` starts the product's ``Daemon`` and FastAPI app in this process (SQLite
with WAL in a temporary data directory, or ``--db URL``) under one 8-GPU node, submits
``--jobs`` jobs of 1 GPU (4 teams, 16 users) through ``Daemon.submit_future`` (the
API's own path after validation, many in flight so the loop batches them): 8 run,
the rest pend. No process is forked: the backend is replaced by a stub whose jobs run
until the end (the bench's only change to the product; there is no product flag).

Then, through Starlette's test client (the whole HTTP stack but the socket):

* **page of N**: ``GET /jobs?state=PENDING&limit=N`` - the first page, then
  ``--pages`` pages spread over the queue (each asked with the cursor of the page
  before it, which the bench got by walking), p50 / p99 / max milliseconds;
* **walk**: every page from the first to the last (each job once), total seconds and
  pages;
* **baseline, unpaged**: ``GET /jobs?state=PENDING`` (the whole list, as before), 3
  calls, median seconds.

Goal (issue 16): <= 50 ms per page of 500 with 100,000 pending.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

GOAL_MS = 50.0
POLICY = """\
name: pages-bench
cluster:
  nodes:
    - {name: n0, gpus: 8, gpu_type: FAKE, gpu_mem_mib: 16384}
classes:
  batch: {grace_period_s: 1}
teams:
  ml: {}
  vision: {}
  nlp: {}
  speech: {}
"""
TEAMS = ("ml", "vision", "nlp", "speech")


def make_daemon(data: Path, db: str | None):
    from gpushepherd.daemon.local import LocalBackend, Proc
    from gpushepherd.daemon.server import Daemon

    class StubBackend(LocalBackend):
        """Runs nothing; a started job runs until the bench ends."""

        def start(self, job_id, run, argv, *, shell, env, cwd, placement, **_more):
            proc = Proc(job_id, run, 0, None, self.run_dir(job_id, run) / "exit")
            self.procs[job_id] = proc
            return proc

        def exits(self):
            return []

        def signal(self, job_id, sig):
            pass

        def check_job(self, user, mem_mib, cpus):  # any user: nothing runs as one
            return None

    data.mkdir(parents=True, exist_ok=True)
    (data / "policy.yaml").write_text(POLICY)
    daemon = Daemon(data, db, data / "policy.yaml")
    daemon.backend = StubBackend(daemon.data_dir)
    daemon.start()
    return daemon


def fill(daemon, jobs: int, cwd: str) -> float:
    """Submit ``jobs`` jobs, at most 2,000 in flight; returns the seconds it took."""
    from gpushepherd.model.job import JobSpec

    t0 = time.perf_counter()
    inflight = []
    for i in range(jobs):
        spec = JobSpec(id="", team=TEAMS[i % 4], workload_class="batch", gpus=1, user=f"u{i % 16}",
                       time_limit_s=3600.0)
        inflight.append(daemon.submit_future(spec, ["true"], cwd=cwd))
        if len(inflight) >= 2000:
            for f in inflight:
                f.result(timeout=600)
            inflight = []
            print(f"  submitted {i + 1:,} / {jobs:,} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    for f in inflight:
        f.result(timeout=600)
    return time.perf_counter() - t0


def timed(client, params: dict) -> tuple[float, dict | list]:
    t0 = time.perf_counter()
    r = client.get("/jobs", params=params)
    dt = time.perf_counter() - t0
    assert r.status_code == 200, r.text
    return dt, r.json()


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--limit", type=int, default=500)
    ap.add_argument("--pages", type=int, default=40, help="pages timed apart from the walk")
    ap.add_argument("--db", default=None, help="SQLAlchemy URL (default: SQLite in a temporary folder)")
    args = ap.parse_args(argv)

    from fastapi.testclient import TestClient

    from gpushepherd.daemon.api import make_app

    with tempfile.TemporaryDirectory(prefix="api-pages-") as tmp:
        daemon = make_daemon(Path(tmp) / "data", args.db)
        try:
            fill_s = fill(daemon, args.jobs, tmp)
            client = TestClient(make_app(daemon))
            pending_q = {"state": "PENDING"}
            with daemon.lock:
                pending = sum(1 for j in daemon.sched.jobs.values() if j.state.value == "PENDING")
            print(f"{args.jobs:,} jobs submitted in {fill_s:.1f} s; {pending:,} pending")

            # the walk: every page once, in order (the first call reads the index whole)
            t0 = time.perf_counter()
            first_s, body = timed(client, {**pending_q, "limit": args.limit})
            cursors, seen, page_s = [None], len(body["jobs"]), [first_s]
            while body["next"] is not None:
                cursors.append(body["next"])
                dt, body = timed(client, {**pending_q, "limit": args.limit, "cursor": body["next"]})
                page_s.append(dt)
                seen += len(body["jobs"])
            walk_s = time.perf_counter() - t0
            assert seen == pending, (seen, pending)

            # pages spread over the queue, each asked again by its cursor (index warm)
            step = max(1, len(cursors) // max(1, args.pages))
            spread = []
            for c in cursors[::step][:args.pages]:
                spread.append(timed(client, {**pending_q, "limit": args.limit, **({"cursor": c} if c else {})})[0])

            base = [timed(client, pending_q)[0] for _ in range(3)]
            assert len(timed(client, pending_q)[1]) == pending
        finally:
            daemon.stop()

    ms = [1000 * x for x in spread]
    print(f"\nGET /jobs?state=PENDING with {pending:,} pending (in-process, Starlette's test client)")
    print(f"{'figure':<46} {'value':>12}")
    print(f"{'page of ' + str(args.limit) + ', first call (index read whole)':<46} {1000 * first_s:>9.1f} ms")
    print(f"{'page of ' + str(args.limit) + ', p50 of ' + str(len(ms)) + ' spread pages':<46} "
          f"{statistics.median(ms):>9.1f} ms")
    print(f"{'page of ' + str(args.limit) + ', p99':<46} {pct(ms, 0.99):>9.1f} ms")
    print(f"{'page of ' + str(args.limit) + ', max':<46} {max(ms):>9.1f} ms")
    print(f"{'walk: ' + str(len(page_s)) + ' pages, every pending job once':<46} {walk_s:>10.2f} s")
    print(f"{'walk: max page':<46} {1000 * max(page_s):>9.1f} ms")
    print(f"{'baseline: the unpaged list, median of 3':<46} {statistics.median(base):>10.2f} s")
    print(f"{'goal (issue 16): page of 500 at 100,000 pending':<46} {'<= ' + format(GOAL_MS, '.0f'):>9} ms")
    print(f"page p99 / goal: {pct(ms, 0.99) / GOAL_MS:.2f}; unpaged / page p50: "
          f"{statistics.median(base) / (statistics.median(ms) / 1000):.0f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
