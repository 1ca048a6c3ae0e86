"""The oracle on a large seeded batch (issue 20, item 4; design note 015, section 8).

    .venv/bin/python bench/oracle.py                     # 100,000 workloads, 2 processes
    .venv/bin/python bench/oracle.py --n 10000 --jobs 2 --seed 0
    .venv/bin/python bench/oracle.py --seed 296 --n 1 -v # one workload, its policy, jobs and failures

Each seed is one workload of ``tests/oracle_workloads.py`` (``workload_from_seed``), checked
by ``tests/oracle_checks.py`` - the same checks as ``tests/test_oracle.py``: fast core ==
reference core decision by decision and reason by reason (a), work conservation (b),
reasons that name the real blocker (c), class reservations and limits (d), a preemptor
starts when its victims are gone (e), restarts change nothing (f), liveness and wake-ups
(g). Prints progress, how many times each property was checked, and every failure with
its seed and a one-line command that reruns it; exits 1 on any failure.

Timing is printed beside a baseline measured in the same run: the plain fast simulation
of the same workloads (one of the runs the checks make), so the ratio is the cost of the
checks on this machine; the CPU seconds of the checks (``time.process_time`` in the process
that checked the workload) are printed too: on a shared machine the wall time grows with
the load, the CPU time much less (design note 056).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import Counter
from multiprocessing import Pool
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from oracle_checks import PROPERTIES, check
from oracle_workloads import workload_from_seed

CHUNK = 25


def _one(args: tuple[int, int | None]) -> tuple[int, Counter, list[tuple[str, str]], float, float, float]:
    """Check one seed: ``(seed, counts, [(property, text)], seconds, plain seconds, CPU seconds)``."""
    seed, horizon = args
    t0, c0 = time.perf_counter(), time.process_time()
    rep = check(workload_from_seed(seed), horizon=horizon)
    return (seed, rep.counts, [(f.prop, f.text) for f in rep.failures], time.perf_counter() - t0, rep.plain_s,
            time.process_time() - c0)


def kind_of(prop: str, text: str) -> str:
    """A failure with its numbers, times and job ids folded, to group failures of one kind."""
    text = re.sub(r"\bj\d+\b", "J", text)
    text = re.sub(r"\d+(\.\d+)?(e[+-]?\d+)?", "N", text)
    return f"{prop}: {text[:110]}"


def reproducer(seed: int) -> str:
    return f".venv/bin/python bench/oracle.py --seed {seed} --n 1 -v"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000, help="workloads to check (default 100,000)")
    ap.add_argument("--seed", type=int, default=0, help="the first seed (default 0): seeds SEED .. SEED+N-1")
    ap.add_argument("--jobs", type=int, default=2, help="processes (default 2)")
    ap.add_argument("--horizon", type=int, default=8,
                    help="calls a restored core is followed for after each cut (default 8; 0: to the end)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each failing workload in full")
    args = ap.parse_args()
    if args.n < 1 or args.jobs < 1:
        print("bench/oracle.py: --n and --jobs are at least 1", file=sys.stderr)
        return 2
    console = Console(stderr=True)
    horizon = None if args.horizon == 0 else args.horizon
    seeds = [(s, horizon) for s in range(args.seed, args.seed + args.n)]
    counts: Counter = Counter()
    failures: dict[int, list[tuple[str, str]]] = {}
    spent = plain = cpu = 0.0
    t0 = time.perf_counter()
    progress = Progress(TextColumn("oracle"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[bad]}"),
                        TimeElapsedColumn(), console=console, transient=False)
    with progress:
        task = progress.add_task("oracle", total=args.n, bad="no failure")
        if args.jobs == 1:
            results = map(_one, seeds)
            pool = None
        else:
            pool = Pool(args.jobs)
            results = pool.imap_unordered(_one, seeds, chunksize=CHUNK)
        try:
            for seed, c, fails, secs, psecs, csecs in results:
                counts.update(c)
                spent += secs
                cpu += csecs
                plain += psecs
                if fails:
                    failures[seed] = fails
                progress.update(task, advance=1,
                                bad=f"[red]{len(failures)} failing seed(s)[/red]" if failures else "no failure")
        finally:
            if pool is not None:
                pool.close()
                pool.join()
    wall = time.perf_counter() - t0

    out = Console(width=None if sys.stdout.isatty() else 200)
    table = Table(title=f"oracle: {args.n:,} workloads (seeds {args.seed}..{args.seed + args.n - 1})")
    table.add_column("property")
    table.add_column("checked", justify="right")
    table.add_column("failing seeds", justify="right")
    for prop in (*PROPERTIES, "crash"):
        bad = sum(1 for fails in failures.values() if any(p == prop for p, _t in fails))
        table.add_row(prop, f"{counts[prop]:,}" if prop != "crash" else "-", f"{bad:,}")
    for key in sorted(k for k in counts if k not in PROPERTIES):
        table.add_row(f"  {key}", f"{counts[key]:,}", "")
    out.print(table)
    per = spent / args.n
    out.print(f"wall {wall:,.1f} s with {args.jobs} process(es): {args.n / wall:,.1f} workloads/s; "
              f"{per * 1000:,.1f} ms of checks per workload ({cpu / args.n * 1000:,.1f} ms CPU: the figure to compare on "
              f"a shared machine) beside {plain / args.n * 1000:,.1f} ms for its plain fast "
              f"simulation (baseline, same run): x{spent / plain if plain else float('nan'):,.1f}")
    kinds: dict[str, list[int]] = {}
    for seed in sorted(failures):
        for prop, text in failures[seed]:
            kinds.setdefault(kind_of(prop, text), []).append(seed)
    if kinds:
        ktab = Table(title="failure kinds (numbers and job ids folded)")
        ktab.add_column("kind")
        ktab.add_column("failures", justify="right")
        ktab.add_column("first seed", justify="right")
        for kind, where in sorted(kinds.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            ktab.add_row(kind, f"{len(where):,}", str(where[0]))
        out.print(ktab)
    for seed in sorted(failures):
        fails = failures[seed]
        if args.verbose:
            for prop, text in fails:
                out.print(f"seed {seed} {prop}: {text}", highlight=False, soft_wrap=True)
            out.print(repr(workload_from_seed(seed)), highlight=False, soft_wrap=True)
        else:
            prop, text = fails[0]
            more = f" (+{len(fails) - 1} more)" if len(fails) > 1 else ""
            out.print(f"seed {seed} {prop}{more}: {text}", highlight=False, soft_wrap=True)
        out.print(f"  rerun: {reproducer(seed)}", highlight=False)
    if failures:
        out.print(f"[red]{len(failures):,} of {args.n:,} workloads failed[/red]")
        return 1
    out.print("no failure")
    return 0


if __name__ == "__main__":
    sys.exit(main())
