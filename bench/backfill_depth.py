"""Benchmark: backfill reservation depth (Slurm's bf_max_job_test) on the core v2 planner.

    .venv/bin/python bench/backfill_depth.py                 # depths 1, 10, 30, 100
    .venv/bin/python bench/backfill_depth.py --depths 1,500 --cluster 32x8

The bundled Philly excerpt (``src/gpushepherd/data/philly-excerpt.csv.gz``, 1,966 jobs)
under ``examples/policies/philly.yaml`` with ``backfill.reservations`` set to each depth,
each run in this process, printed beside a baseline measured in the same run: the
count-only FIFO loop of ``bench/one.py`` over the same jobs (the floor of any Python event
loop over them). CPU seconds (``time.process_time``); the digest of every job's starts and
end shows two runs decided the same.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    from one import baseline

    from gpushepherd.policy import override_cluster, policy_from_dict, read_policy_dict
    from gpushepherd.sim.engine import Simulator
    from gpushepherd.sim.mapping import to_sim_jobs
    from gpushepherd.sim.traces import read_trace

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--depths", default="1,10,30,100")
    ap.add_argument("--cluster", default="32x8")
    args = ap.parse_args()
    path = ROOT / "examples" / "policies" / "philly.yaml"
    trace = ROOT / "src" / "gpushepherd" / "data" / "philly-excerpt.csv.gz"
    raw = override_cluster(read_policy_dict(path), args.cluster)
    base_rules = policy_from_dict(raw, str(path)).rules
    jobs = to_sim_jobs(read_trace(str(trace), "philly"), base_rules)
    t0 = time.process_time()
    baseline(jobs, sum(n.gpus for n in base_rules.nodes))
    floor = time.process_time() - t0
    print(f"{len(jobs):,} jobs on {args.cluster}; baseline (count-only FIFO loop): {floor:.3f} s CPU")
    print(f"{'depth':>6} {'CPU s':>8} {'jobs/s':>9} {'x baseline':>10} {'JCT/bound':>9}  digest")
    from gpushepherd.sim.metrics import summarize
    for depth in (int(d) for d in args.depths.split(",")):
        raw["backfill"] = {"enabled": True, "reservations": depth}
        rules = policy_from_dict(raw, str(path)).rules
        t0 = time.process_time()
        result = Simulator(rules, to_sim_jobs(read_trace(str(trace), "philly"), rules)).run()
        cpu = time.process_time() - t0
        h = hashlib.sha256()
        for jid in sorted(result.records):
            r = result.records[jid]
            h.update(f"{jid}:{[s[0] for s in r.starts]}:{r.end}\n".encode())
        ratio = summarize(result)["overall"]["jct_over_lower_bound"]
        print(f"{depth:>6} {cpu:>8.2f} {len(jobs) / cpu:>9,.0f} {cpu / max(floor, 1e-9):>10.0f} {ratio:>9.2f}  "
              f"{h.hexdigest()[:16]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
