"""Benchmark: the full Philly trace through gpushepherd's simulator.

    .venv/bin/python bench/run.py                      # 352x8 and 192x8 GPUs, full trace
    .venv/bin/python bench/run.py --sizes 192x8 --days 40:70

Each configuration runs in its own process (so that peak memory is its own) and is
printed beside a baseline measured in the same run: a minimal count-only FIFO replay
(a heap of finish events and a free-GPU counter, no placement, no policy) - the floor
of what any Python event loop over this trace costs on this machine.

Target (issue #2): the full trace in <= 30 s wall and <= 2 GiB peak on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "philly_rfold" / "philly_trace.csv.gz"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--policy", default=str(ROOT / "examples" / "policies" / "philly.yaml"))
    ap.add_argument("--sizes", default="352x8,192x8")
    ap.add_argument("--days", default=None, help="A:B window of the trace (default: all of it)")
    args = ap.parse_args()
    if not Path(args.trace).exists():
        print(f"bench: trace {args.trace} not found (it lives in ../shared/traces)", file=sys.stderr)
        return 2
    rows = []
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    configs = [(size, mode) for size in args.sizes.split(",") for mode in ("baseline", "gpushepherd")]
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  refresh_per_second=4, transient=True) as bar:
        task = bar.add_task("runs", total=len(configs))
        for size, mode in configs:
            bar.update(task, description=f"{mode} on {size}")
            cmd = [sys.executable, str(Path(__file__).with_name("one.py")), mode, args.trace, args.policy, size]
            if args.days:
                cmd.append(args.days)
            proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
            if proc.returncode != 0:
                print(proc.stderr, file=sys.stderr)
                return 1
            rows.append(json.loads(proc.stdout))
            bar.advance(task)
    print(f"{'cluster':>9} {'simulator':>22} {'jobs':>8} {'wall s':>8} {'jobs/s':>9} {'peak MiB':>9} "
          f"{'avg JCT h':>10} {'JCT/bound':>9} {'util':>6}")
    for r in rows:
        print(f"{r['cluster']:>9} {r['mode']:>22} {r['jobs']:>8,} {r['wall_s']:>8.1f} {r['jobs_per_s']:>9,.0f} "
              f"{r['peak_mib']:>9.0f} {r['avg_jct_h']:>10.2f} {r['jct_over_bound']:>9.2f} {r['utilisation']:>6.1%}")
    print("target: full trace <= 30 s wall and <= 2048 MiB peak per run (2-core machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
