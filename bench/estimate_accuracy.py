"""Benchmark: average JCT against the accuracy of runtime estimates (issue 17, point 5;
design note 044).

    .venv/bin/python bench/estimate_accuracy.py                  # bundled Philly excerpt, 32x8
    .venv/bin/python bench/estimate_accuracy.py --trace ../shared/traces/elasticflow_itp/raw/cluster04.csv.gz \\
        --format itp --cluster 64x8 --factors limit,1,2 --schedulers slurm-default,gpushepherd

The same jobs (the trace mapping of ``gpushepherd.sim.mapping``, seed 0) replayed under
``examples/policies/philly.yaml`` once per scheduler and per estimate kind:

* ``limit`` - what the schedulers see by default: the users' time limits (a seeded
  1x-8x over-estimate of the duration, rounded up), no runtime estimate;
* a number ``k`` - a runtime estimate of ``k`` x the true duration for every job
  (``1``: perfect estimates, the ``--estimates perfect`` of ``shepherd simulate``), the
  time limit raised to it where it was lower (so that no run is stopped).

Printed per run: average JCT over the lower bound (the mean duration) and in hours, mean
wait of jobs under 8 GPUs and of jobs of 8 or more, the jobs that started while a job
submitted before them still waited (*out of submit order*: under submit order these are
the backfilled jobs), and CPU seconds. One run at a time, in this process.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXCERPT = ROOT / "src" / "gpushepherd" / "data" / "philly-excerpt.csv.gz"
POLICY = ROOT / "examples" / "policies" / "philly.yaml"


def with_factor(jobs, k: float):
    """``jobs`` with a runtime estimate of ``k`` x the duration (at least 1 s), the time
    limit raised to it where lower."""
    from gpushepherd.sim.engine import SimJob

    out = []
    for j in jobs:
        est = max(k * j.duration, 1.0)
        out.append(SimJob(replace(j.spec, runtime_estimate_s=est, time_limit_s=max(j.spec.time_limit_s, est)),
                          j.duration))
    return out


def out_of_order(result) -> int:
    """Jobs that started while a job submitted before them (submit time, then id) waited."""
    from gpushepherd.model.job import natural_key

    recs = sorted(result.records.values(), key=lambda r: (r.spec.submit_time, natural_key(r.spec.id)))
    latest, n = -1.0, 0
    for r in recs:
        start = r.starts[0][0] if r.starts else float("inf")
        if start < latest:
            n += 1
        latest = max(latest, start)
    return n


def main() -> int:
    from gpushepherd.baselines import build
    from gpushepherd.policy import override_cluster, policy_from_dict, read_policy_dict
    from gpushepherd.sim.engine import Simulator
    from gpushepherd.sim.mapping import to_sim_jobs
    from gpushepherd.sim.metrics import summarize
    from gpushepherd.sim.traces import load_trace, parse_days, select

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=str(EXCERPT))
    ap.add_argument("--format", default="philly")
    ap.add_argument("--days", metavar="N|A:B")
    ap.add_argument("--cluster", default="32x8")
    ap.add_argument("--schedulers", default="slurm-default,slurm,slurm-timelimit,gpushepherd")
    ap.add_argument("--factors", default="limit,1,1.5,2,4,8", help="limit and/or estimate factors k")
    ap.add_argument("--bf-depth", type=int, help="reservations of the Slurm rows (default 1)")
    args = ap.parse_args()
    raw = override_cluster(read_policy_dict(POLICY), args.cluster)
    pol = policy_from_dict(raw, str(POLICY))
    rows = select(load_trace(args.trace, args.format).rows, parse_days(args.days) if args.days else None, 1.0)
    base = to_sim_jobs(rows, pol.rules)
    print(f"{len(base):,} jobs on {args.cluster}")
    print(f"{'scheduler':<16} {'estimates':>9} {'JCT/bound':>9} {'JCT h':>7} {'wait <8 h':>9} {'wait 8+ h':>9} "
          f"{'out of order':>12} {'CPU s':>6}")
    for name in args.schedulers.split(","):
        rules, factory = build(name, pol.rules, args.bf_depth)
        for f in args.factors.split(","):
            jobs = base if f == "limit" else with_factor(base, float(f))
            t0 = time.process_time()
            result = Simulator(rules, jobs, scheduler=factory).run()
            cpu = time.process_time() - t0
            o = summarize(result)["overall"]
            waits = [(r.spec.gpus, r.starts[0][0] - r.spec.submit_time) for r in result.records.values() if r.starts]
            small = statistics.mean(w for g, w in waits if g < 8) / 3600
            big = statistics.mean([w for g, w in waits if g >= 8] or [0.0]) / 3600
            label = "limit" if f == "limit" else f"{float(f):g}x"
            print(f"{name:<16} {label:>9} {o['jct_over_lower_bound']:>9.3f} {o['jct_s']['mean'] / 3600:>7.2f} "
                  f"{small:>9.2f} {big:>9.2f} {out_of_order(result):>12,} {cpu:>6.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
