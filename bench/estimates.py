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
* *never now, never past*: estimates at or before the submit instant (must be 0).

The plan assumes no new submissions: jobs that arrive later with a higher priority
start before a waiting job and make its estimate early; that is the main error with
true durations, and it is printed, not hidden.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "philly_rfold" / "philly_trace.csv.gz"


def run(kind: str, trace: str, policy: str, cluster: str, days: str, sample: int) -> dict:
    from gpushepherd.model.events import JobSubmitted
    from gpushepherd.policy import override_cluster, policy_from_dict, read_policy_dict
    from gpushepherd.sim.engine import Simulator
    from gpushepherd.sim.mapping import to_sim_jobs
    from gpushepherd.sim.traces import parse_days, read_trace, select

    raw = override_cluster(read_policy_dict(policy), cluster)
    if kind == "prediction":
        raw = {**raw, "prediction": {"enabled": True}}
    pol = policy_from_dict(raw, policy)
    jobs = to_sim_jobs(select(read_trace(trace, "philly"), parse_days(days)), pol.rules,
                       estimates="perfect" if kind == "perfect" else "limit")
    sim = Simulator(pol.rules, jobs)
    sched = sim.sched
    inner = sched.handle
    asked: dict[str, tuple[float, float | None, str | None]] = {}  # job -> (submit, estimate, basis)
    counter = {"n": 0, "planning_s": 0.0}

    def handle(events):
        batch = list(events)
        out = inner(batch)
        for e in batch:
            if isinstance(e, JobSubmitted):
                counter["n"] += 1
                if counter["n"] % sample:
                    continue
                job = sched.jobs[e.spec.id]
                if job.state.value != "PENDING":
                    continue
                t0 = time.process_time()
                est = sched.estimated_starts().get(job.id)
                counter["planning_s"] += time.process_time() - t0
                asked[job.id] = (e.t, est.t if est else None, est.basis if est else None)
        return out

    sched.handle = handle
    t0 = time.process_time()
    result = sim.run()
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
    return {"kind": kind, "waiting": waits, "with_estimate": with_est / waits if waits else 0.0,
            "within_20": within / with_est if with_est else 0.0,
            "median_rel": statistics.median(rel) if rel else float("nan"), "p90_rel": q[8],
            "upper_bound_held": upper / with_est if with_est else 0.0, "never_now": bad,
            "planning_cpu_s": counter["planning_s"], "sim_cpu_s": cpu}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--policy", default=str(ROOT / "examples" / "policies" / "philly.yaml"))
    ap.add_argument("--cluster", default="192x8")
    ap.add_argument("--days", default="40:70")
    ap.add_argument("--sample", type=int, default=10, help="ask for every Nth submission's estimate")
    ap.add_argument("--kinds", default="perfect,limit,prediction")
    args = ap.parse_args()
    if not Path(args.trace).exists():
        print(f"bench: trace {args.trace} not found (it lives in ../shared/traces)", file=sys.stderr)
        return 2
    print(f"Philly days {args.days} at {args.cluster}, every {args.sample}th submission that waits")
    print(f"{'estimates':>11} {'waiting':>8} {'with est.':>9} {'+-20%':>7} {'median':>7} {'p90':>7} "
          f"{'start<=est':>10} {'at/before submit':>16} {'plan CPU s':>10}")
    for kind in args.kinds.split(","):
        r = run(kind, args.trace, args.policy, args.cluster, args.days, args.sample)
        print(f"{r['kind']:>11} {r['waiting']:>8} {r['with_estimate']:>9.1%} {r['within_20']:>7.1%} "
              f"{r['median_rel']:>7.2f} {r['p90_rel']:>7.2f} {r['upper_bound_held']:>10.1%} {r['never_now']:>16} "
              f"{r['planning_cpu_s']:>10.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
