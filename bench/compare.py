"""gpushepherd's default trace policy against four baselines, in one run.

    .venv/bin/pip install -e '.[bench]'
    .venv/bin/python bench/compare.py                  # both traces (about 15 minutes, 2 cores)
    .venv/bin/python bench/compare.py --only philly    # one trace

Traces (read from ../shared/traces, never copied):

* Philly (Microsoft, Jeon et al. ATC'19): jobs submitted in days [40, 70) on 192 x 8 =
  1,536 GPUs (the first busy month; the first 40 days hold only ~300 jobs);
* Microsoft ITP cluster04 (ElasticFlow, ASPLOS'23), the largest of the ten clusters
  (15,802 jobs, 59.5 days), on 64 x 8 = 512 GPUs (offered load about 0.95). On the
  1,024 GPUs ElasticFlow simulated it on it hardly queues: strict FIFO is within 1.01x
  of the lower bound there, so no policy can differ.

Both run under ``examples/policies/philly.yaml`` (teams and classes from the seeded
mapping of ``gpushepherd.sim.mapping``: time limits are a documented over-estimate of
the true duration, which no policy sees). Policies: ``gpushepherd`` (the policy file
as written) and the baselines of ``gpushepherd.baselines`` (fifo, slurm, tiresias,
kueue). With ``--perfect``, the policies that use runtime estimates (gpushepherd,
slurm) also run with perfect estimates, for reference only.

Figures per run: average JCT (and over the lower bound, the mean duration), p99
queueing delay, utilisation, fairness (max / min over teams of their mean slowdown,
slowdown = JCT / duration, teams with >= 20 finished jobs), preemptions, and
preemptions of jobs that the policy says may not be preempted. Writes
``bench/results/compare.md`` and ``bench/results/compare.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "traces"
POLICY = ROOT / "examples" / "policies" / "philly.yaml"
TRACES = {
    "philly": dict(label="Philly days 40-70, 192x8", path=SHARED / "philly_rfold" / "philly_trace.csv.gz",
                   fmt="philly", cluster="192x8", days="40:70"),
    "itp": dict(label="ITP cluster04, 64x8", path=SHARED / "elasticflow_itp" / "raw" / "cluster04.csv.gz",
                fmt="itp", cluster="64x8", days=None),
}
POLICIES = ("gpushepherd", "slurm", "kueue", "fifo", "tiresias")
USES_ESTIMATES = ("gpushepherd", "slurm")


def one(trace: str, policy: str, estimates: str) -> dict:
    """One run in this process; returns its figures."""
    import numpy as np

    from gpushepherd.baselines import BASELINES
    from gpushepherd.policy import override_cluster, policy_from_dict, read_policy_dict
    from gpushepherd.sim.engine import Simulator
    from gpushepherd.sim.mapping import to_sim_jobs
    from gpushepherd.sim.metrics import job_table, summarize
    from gpushepherd.sim.traces import parse_days, read_trace, select

    cfg = TRACES[trace]
    pol = policy_from_dict(override_cluster(read_policy_dict(str(POLICY)), cfg["cluster"]), str(POLICY))
    rows = read_trace(cfg["path"], cfg["fmt"])
    if cfg["days"]:
        rows = select(rows, parse_days(cfg["days"]))
    jobs = to_sim_jobs(rows, pol.rules, estimates=estimates)
    rules, factory = BASELINES[policy](pol.rules)
    t0 = time.perf_counter()
    result = Simulator(rules, jobs, scheduler=factory).run()
    wall = time.perf_counter() - t0
    df = job_table(result)
    o = summarize(result, df)["overall"]
    done = df[df["jct"].notna() & (df["duration"] > 0)]
    slow = (done["jct"] / done["duration"]).groupby(done["team"])
    per_team = slow.mean()[slow.size() >= 20]
    may_not = 0
    for rec in result.records.values():
        if rec.preempted_at:
            cls = pol.rules.classes[rec.spec.workload_class]
            preemptible = cls.preemptible if rec.spec.preemptible is None else rec.spec.preemptible
            if not preemptible:
                may_not += 1
    return {
        "trace": trace, "policy": policy, "estimates": estimates, "jobs": len(jobs), "wall_s": wall,
        "avg_jct_h": o["jct_s"]["mean"] / 3600, "jct_over_bound": o["jct_over_lower_bound"],
        "p99_wait_h": o["queueing_delay_s"]["p99"] / 3600, "utilisation": o["utilisation"],
        "fairness": float(per_team.max() / per_team.min()) if len(per_team) > 1 else float("nan"),
        "preemptions": int(df["preemptions"].sum()), "nonpreemptible_preempted": may_not,
        "unfinished": int(df["jct"].isna().sum()), "p50_wait_h": float(np.nan_to_num(o["queueing_delay_s"]["p50"])) / 3600,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=sorted(TRACES), action="append", help="run this trace only (repeatable)")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--perfect", action="store_true", help="also run with perfect estimates (reference)")
    ap.add_argument("--jobs", type=int, default=2, help="runs in parallel (default 2)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--merge", action="store_true",
                    help="keep the rows of an earlier compare.json that this run does not redo")
    ap.add_argument("--one", nargs=3, metavar=("TRACE", "POLICY", "ESTIMATES"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        trace, policy, estimates = args.one
        if trace not in TRACES or policy not in POLICIES or estimates not in ("limit", "perfect"):
            print(f"compare: --one: {args.one} is not allowed: TRACE in {', '.join(TRACES)}, POLICY in "
                  f"{', '.join(POLICIES)}, ESTIMATES limit or perfect", file=sys.stderr)
            return 2
        print(json.dumps(one(*args.one)))
        return 0
    traces = args.only or list(TRACES)
    for t in traces:
        if not TRACES[t]["path"].exists():
            print(f"compare: trace {TRACES[t]['path']} not found (it lives in ../shared/traces)", file=sys.stderr)
            return 2
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICIES] or ([] if policies else [args.policies])
    if bad:
        print(f"compare: --policies: {bad[0]!r} is not allowed: a comma-separated list of {', '.join(POLICIES)}",
              file=sys.stderr)
        return 2
    if args.jobs < 1:
        print(f"compare: --jobs: {args.jobs} is not allowed: at least 1", file=sys.stderr)
        return 2
    policies = list(dict.fromkeys(policies))
    out = Path(args.out)
    try:  # the output folder must be writable before minutes of runs
        out.mkdir(parents=True, exist_ok=True)
        (out / ".write-test").write_text("")
        (out / ".write-test").unlink()
    except OSError as exc:
        print(f"compare: --out: {args.out!r} is not allowed: a folder that can be written ({exc.strerror})",
              file=sys.stderr)
        return 2
    runs = [(t, p, "limit") for t in traces for p in policies]
    if args.perfect:
        runs += [(t, p, "perfect") for t in traces for p in policies if p in USES_ESTIMATES]

    def launch(run):
        cmd = [sys.executable, __file__, "--one", *run]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
        if proc.returncode != 0:
            raise RuntimeError(f"{run}: {proc.stderr.strip().splitlines()[-1:]}")
        row = json.loads(proc.stdout)
        print(f"  done {row['trace']:>7} {row['policy']:>12} {row['estimates']:>8}: "
              f"JCT/bound {row['jct_over_bound']:.2f} in {row['wall_s']:.0f} s", flush=True)
        return row

    print(f"{len(runs)} runs, {args.jobs} at a time")
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(TextColumn("runs"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("ETA"),
                  TimeRemainingColumn(), refresh_per_second=4) as bar, \
            ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        task = bar.add_task("runs", total=len(runs))

        def tracked(run):
            row = launch(run)
            bar.advance(task)
            return row
        rows = list(pool.map(tracked, runs))
    if args.merge and (out / "compare.json").exists():
        redone = {(r["trace"], r["policy"], r["estimates"]) for r in rows}
        old = [r for r in json.loads((out / "compare.json").read_text())
               if (r["trace"], r["policy"], r["estimates"]) not in redone]
        order = {p: i for i, p in enumerate(POLICIES)}
        rows = sorted(old + rows, key=lambda r: (r["estimates"] != "limit", order.get(r["policy"], 99)))
    md = table(rows)
    (out / "compare.md").write_text(md)
    (out / "compare.json").write_text(json.dumps(rows, indent=1))
    plot(rows, out / "compare.png")
    print(md)
    print(f"wrote {out / 'compare.md'}, {out / 'compare.png'}")
    return 0


def table(rows: list[dict]) -> str:
    lines = ["| trace | policy | estimates | avg JCT h | JCT / bound | vs slurm | p99 wait h | util | "
             "fairness | preemptions | non-preemptible preempted | wall s |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for trace in TRACES:
        sel = [r for r in rows if r["trace"] == trace]
        if not sel:
            continue
        slurm = next((r for r in sel if r["policy"] == "slurm" and r["estimates"] == "limit"), None)
        for r in sel:
            vs = f"{slurm['avg_jct_h'] / r['avg_jct_h']:.2f}x" if slurm else "-"
            lines.append(f"| {TRACES[trace]['label']} | {r['policy']} | {r['estimates']} | {r['avg_jct_h']:.2f} | "
                         f"{r['jct_over_bound']:.2f} | {vs} | {r['p99_wait_h']:.1f} | {r['utilisation']:.1%} | "
                         f"{r['fairness']:.2f} | {r['preemptions']} | {r['nonpreemptible_preempted']} | "
                         f"{r['wall_s']:.0f} |")
    lines.append("")
    lines.append("JCT / bound: average JCT over the mean duration (no scheduler can do better than 1). "
                 "vs slurm: the Slurm-like baseline's average JCT over this row's (higher is better). "
                 "fairness: max / min team mean slowdown. Estimates `limit`: the user's time limit (realistic); "
                 "`perfect`: the true duration (reference only).")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("compare: matplotlib not installed (pip install -e '.[bench]'): no plot", file=sys.stderr)
        return
    traces = [t for t in TRACES if any(r["trace"] == t for r in rows)]
    fig, axes = plt.subplots(1, len(traces), figsize=(6 * len(traces), 4), squeeze=False)
    for ax, trace in zip(axes[0], traces):
        sel = [r for r in rows if r["trace"] == trace]
        labels = [r["policy"] + (" (perfect)" if r["estimates"] == "perfect" else "") for r in sel]
        vals = [r["jct_over_bound"] for r in sel]
        bars = ax.bar(range(len(sel)), vals, color=["#2b7bba" if r["policy"] == "gpushepherd" else "#999999"
                                                   for r in sel])
        ax.bar_label(bars, fmt="%.2f")
        ax.axhline(1.5, color="#c0392b", linestyle="--", linewidth=1, label="target 1.5x")
        ax.set_xticks(range(len(sel)), labels, rotation=30, ha="right")
        ax.set_ylabel("average JCT / lower bound")
        ax.set_title(TRACES[trace]["label"])
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
