"""Benchmark: how good are the estimated starts (issue 20, design note 015 section 7)?

    .venv/bin/python bench/estimates.py                       # Philly days 40-70 at 192x8, three estimate kinds
    .venv/bin/python bench/estimates.py --days 40:45 --sample 5 --kinds perfect

Replays a Philly window through the simulator three times, with what the scheduler
plans with being (1) the true durations (``perfect``), (2) the users' time limits
(``limit``, the default of ``shepherd simulate``), (3) time limits plus the runtime
predictor (``prediction``: ``prediction.enabled``). After every ``--sample``-th
submission that does not start at once (a *waiting* job), it asks the core for that job's
estimated start (``Scheduler.estimated_start``: every pending job ahead of it planned on
the time profile) and, when the run is over, compares it with the job's actual first
start. Printed per kind:

* *with an estimate*: the share of waiting jobs that got one;
* *within +-20 %*: of those, the share whose estimate ``e`` is within 20 % of the wait,
  ``|e - start| <= 0.2 x (start - submit)``;
* median and p90 of ``(start - e) / (start - submit)`` (positive: the job started later
  than estimated);
* *upper bound held*: the share with ``start <= e`` (what a time-limit estimate promises
  unless higher-priority work arrives);
* *never now, never past*: estimates at or before the submit instant (must be 0);
* the CPU seconds per estimate request, and a digest of every job's starts and end
  (``--sample 0`` asks nothing: the same digest shows that asking decides nothing).

The plan assumes no new submissions: jobs that arrive later with a higher priority
start before a waiting job and make its estimate early; that is the main error with
true durations, and it is printed, not hidden.

``--order fifo`` replays with every priority weight 0 (the queue in submit order, so a
later submission never passes a waiting job in the queue; it may still backfill).
``--decompose`` splits the error (design note 043): for each sampled job the replay is
forked at that instant and goes on without the submissions still to come, once as it
is and once with the queue's order kept (no priority recalculation: nobody passes by
age); the job's start there is what an exact planner would have said. Printed: the
share of estimates equal to it, within +-20 % of it, and how far later submissions
moved the start (POSIX only: it needs ``os.fork``).

    .venv/bin/python bench/estimates.py --kinds perfect --sample 40 --decompose
    .venv/bin/python bench/estimates.py --kinds perfect --sample 40 --decompose --order fifo
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "philly_rfold" / "philly_trace.csv.gz"


def run(kind: str, trace: str, policy: str, cluster: str, days: str, sample: int, order: str = "policy",
        decompose: bool = False) -> dict:
    from gpushepherd.model.events import JobSubmitted
    from gpushepherd.policy import override_cluster, policy_from_dict, read_policy_dict
    from gpushepherd.sim.engine import Simulator
    from gpushepherd.sim.mapping import to_sim_jobs
    from gpushepherd.sim.traces import parse_days, read_trace, select

    raw = override_cluster(read_policy_dict(policy), cluster)
    if kind == "prediction":
        raw = {**raw, "prediction": {"enabled": True}}
    if order == "fifo":
        raw = {**raw, "priority": FIFO}
    pol = policy_from_dict(raw, policy)
    jobs = to_sim_jobs(select(read_trace(trace, "philly"), parse_days(days)), pol.rules,
                       estimates="perfect" if kind == "perfect" else "limit")
    sim = Simulator(pol.rules, jobs)
    sched = sim.sched
    inner = sched.handle
    asked: dict[str, tuple[float, float | None, str | None]] = {}  # job -> (submit, estimate, basis)
    counter = {"n": 0, "planning_s": 0.0}
    closed: dict[str, tuple[float | None, float | None]] = {}  # job -> closed-world starts (aging, frozen)

    def handle(events):
        batch = list(events)
        out = inner(batch)
        for e in batch:
            if isinstance(e, JobSubmitted):
                counter["n"] += 1
                if not sample or counter["n"] % sample:
                    continue
                job = sched.jobs[e.spec.id]
                if job.state.value != "PENDING":
                    continue
                t0 = time.process_time()
                est = sched.estimated_starts().get(job.id)
                counter["planning_s"] += time.process_time() - t0
                asked[job.id] = (e.t, est.t if est else None, est.basis if est else None)
                if decompose:
                    c = _closed_start(sim, job.id, False)
                    cf = CHILD if c == CHILD else _closed_start(sim, job.id, True)
                    if CHILD in (c, cf):
                        return out  # a forked copy: back to the replay, which it goes on with
                    closed[job.id] = (c, cf)
        return out

    sched.handle = handle
    t0 = time.process_time()
    result = sim.run()
    _child_done()  # a forked copy whose job never started
    cpu = time.process_time() - t0
    waits, rel, within, upper, bad = 0, [], 0, 0, 0
    with_est = 0
    for jid, (submit, est, _basis) in asked.items():
        start = result.records[jid].first_start
        if start is None:
            continue
        waits += 1
        if est is None:
            continue
        with_est += 1
        wait = start - submit
        if est <= submit:
            bad += 1
        if wait > 0:
            r = (start - est) / wait
            rel.append(r)
            within += abs(r) <= 0.2
        upper += start <= est + 1e-6
    q = statistics.quantiles(rel, n=10) if len(rel) >= 10 else [float("nan")] * 9
    digest = hashlib.sha256()  # every job's starts and end: asking for estimates decides nothing
    for jid in sorted(result.records):
        r = result.records[jid]
        digest.update(f"{jid}:{[s[0] for s in r.starts]}:{r.end}\n".encode())
    parts = _decomposition(asked, closed, result) if decompose else {}
    return {**parts, "kind": kind, "waiting": waits, "with_estimate": with_est / waits if waits else 0.0,
            "within_20": within / with_est if with_est else 0.0,
            "median_rel": statistics.median(rel) if rel else float("nan"), "p90_rel": q[8],
            "upper_bound_held": upper / with_est if with_est else 0.0, "never_now": bad,
            "planning_cpu_s": counter["planning_s"], "sim_cpu_s": cpu, "asked": len(asked),
            "digest": digest.hexdigest()[:16]}


#: ``--order fifo``: every priority weight 0 - the queue is in submit order (then job id),
#: so a later submission never passes a waiting job in the queue (it may still backfill)
FIFO = {"weights": {"class": 0.0, "fair_share": 0.0, "age": 0.0, "size": 0.0, "time_limit": 0.0, "deadline": 0.0}}


#: in a forked copy (``_closed_start``): the pipe to answer on and the job it waits for
_CHILD: dict = {}


def _closed_start(sim, job_id: str, frozen: bool) -> float | None:
    """The start ``job_id`` gets if nothing is submitted after now: the replay goes on
    in a forked copy of this process without the submissions still to come (``frozen``:
    and with the queue's order kept as it is now - no priority recalculation, so no job
    passes another by age). ``None``: it never starts, or the platform cannot fork.

    In the copy this returns ``CHILD`` at once: the caller returns to the replay's loop,
    which goes on until the job starts (the copy then answers and exits) or ends
    (``_child_done``)."""
    import os
    import struct

    if not hasattr(os, "fork"):
        return None
    r, w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(w)
        with os.fdopen(r, "rb") as f:
            data = f.read()
        os.waitpid(pid, 0)
        t = struct.unpack("d", data)[0] if len(data) == 8 else float("nan")
        return None if t != t else t
    import heapq

    from gpushepherd.core import priority
    from gpushepherd.model.decisions import Start

    os.close(r)
    _CHILD["out"] = os.fdopen(w, "wb")
    heap = sim._heap
    heap[:] = [x for x in heap if x[1] != 2]  # no submission after now
    heapq.heapify(heap)
    if frozen:
        priority.maybe_recalc = lambda book, t: None
        priority.recalc_matters = lambda book: False
    sched = sim.sched
    inner = sched.__class__.handle.__get__(sched)

    def handle(events):
        decisions = inner(events)
        for d in decisions:
            if isinstance(d, Start) and d.job_id == job_id:
                _child_done(d.t)
        return decisions

    sched.handle = handle
    return CHILD


CHILD = -1.0


def _child_done(t: float = float("nan")) -> None:
    """In a forked copy: answer ``t`` (NaN: the job never started) and exit."""
    import os
    import struct

    if _CHILD:
        _CHILD["out"].write(struct.pack("d", t))
        _CHILD["out"].flush()
        os._exit(0)


def _decomposition(asked: dict, closed: dict, result) -> dict:
    """Split the error of each estimate ``e`` (perfect estimates make the plan exact
    when nothing else changes) between the planner and what came after it: ``c`` is the
    start with no later submissions (``_closed_start``), ``a`` the actual one. The
    planner's share is ``e`` against ``c`` (``planner_exact``: equal within a second;
    ``planner_within_20``: within 20 % of the wait to ``c``), the later submissions'
    ``c`` against ``a``; ``frozen_exact``: ``e`` equal to the start with the queue's
    order also kept (no recalculation: ageing left out); ``exact_within_20``: the share an
    exact planner (``e == c``) would have within 20 % of the actual wait."""
    n = exact = exact_frozen = within_c = ceiling = 0
    late_arrivals = 0  # samples whose actual start is off by > 20 % only because of later submissions
    rel_c, rel_a = [], []
    for jid, (submit, est, _basis) in asked.items():
        start = result.records[jid].first_start
        c, cf = closed.get(jid, (None, None))
        if start is None or est is None or c is None:
            continue
        n += 1
        exact += abs(est - c) <= 1.0
        exact_frozen += cf is not None and abs(est - cf) <= 1.0
        if c > submit:
            within_c += abs(c - est) <= 0.2 * (c - submit)
            rel_c.append((c - est) / (c - submit))
        if start > submit:
            rel_a.append((start - c) / (start - submit))
            ceiling += abs(start - c) <= 0.2 * (start - submit)
            late_arrivals += abs(c - est) <= 0.2 * max(c - submit, 1e-9) and abs(start - est) > 0.2 * (start - submit)
    med = statistics.median
    return {"decomposed": n, "planner_exact": exact / n if n else 0.0,
            "frozen_exact": exact_frozen / n if n else 0.0,
            "planner_within_20": within_c / n if n else 0.0,
            "planner_median_rel": med(rel_c) if rel_c else float("nan"),
            "arrivals_median_rel": med(rel_a) if rel_a else float("nan"),
            "lost_to_arrivals": late_arrivals / n if n else 0.0, "exact_within_20": ceiling / n if n else 0.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--policy", default=str(ROOT / "examples" / "policies" / "philly.yaml"))
    ap.add_argument("--cluster", default="192x8")
    ap.add_argument("--days", default="40:70")
    ap.add_argument("--sample", type=int, default=10,
                    help="ask for every Nth submission's estimate (0: never - the digest of a replay that asks nothing)")
    ap.add_argument("--kinds", default="perfect,limit,prediction")
    ap.add_argument("--order", choices=("policy", "fifo"), default="policy",
                    help="the policy's queue order, or submit order (every priority weight 0)")
    ap.add_argument("--decompose", action="store_true",
                    help="also replay each sampled instant with no later submissions (a forked copy) and "
                         "split the error between the planner and later arrivals")
    args = ap.parse_args()
    if not Path(args.trace).exists():
        print(f"bench: trace {args.trace} not found (it lives in ../shared/traces)", file=sys.stderr)
        return 2
    print(f"Philly days {args.days} at {args.cluster}, every {args.sample}th submission that waits"
          + (", submit order" if args.order == "fifo" else ""))
    print(f"{'estimates':>11} {'waiting':>8} {'with est.':>9} {'+-20%':>7} {'median':>7} {'p90':>7} "
          f"{'start<=est':>10} {'at/before submit':>16} {'plan CPU s':>10}")
    for kind in args.kinds.split(","):
        r = run(kind, args.trace, args.policy, args.cluster, args.days, args.sample, args.order, args.decompose)
        print(f"{r['kind']:>11} {r['waiting']:>8} {r['with_estimate']:>9.1%} {r['within_20']:>7.1%} "
              f"{r['median_rel']:>7.2f} {r['p90_rel']:>7.2f} {r['upper_bound_held']:>10.1%} {r['never_now']:>16} "
              f"{r['planning_cpu_s']:>10.1f}", flush=True)
        print(f"{'':>11} {r['asked']} estimate requests, {r['planning_cpu_s'] / max(r['asked'], 1):.3f} CPU s each; "
              f"replay {r['sim_cpu_s']:.0f} CPU s; digest of every job's starts and end {r['digest']}", flush=True)
        if args.decompose:
            print(f"{'':>11} with no later submissions ({r['decomposed']} jobs): estimate = that start "
                  f"{r['planner_exact']:.1%} (order kept too: {r['frozen_exact']:.1%}), within +-20 % of it "
                  f"{r['planner_within_20']:.1%}, median {r['planner_median_rel']:.2f}; later submissions move "
                  f"the start by a median {r['arrivals_median_rel']:.2f} of the wait and put "
                  f"{r['lost_to_arrivals']:.1%} outside +-20 %; an exact planner would have "
                  f"{r['exact_within_20']:.1%} within +-20 %", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
