"""gpushepherd's policy against the baselines of ``gpushepherd.baselines``, on any trace,
in one run (design notes 006 and 024).

    .venv/bin/pip install -e '.[bench]'
    .venv/bin/python bench/compare.py --only philly --jsonl rows.jsonl   # Philly days 40-70 at 192x8
    .venv/bin/python bench/compare.py --trace T.csv --format csv --map submit=t,gpus=n,duration=d \\
        --cluster 64x8 --load 1.5 --schedulers gpushepherd,slurm,kueue

A trace is given as ``shepherd simulate`` takes one (``--trace/--format/--map/--days/
--cluster/--load/--seed/--estimates/--skip-bad-rows``, the same mapping of
``gpushepherd.sim.mapping``: time limits are a documented over-estimate of the true
duration, which no scheduler sees), or as a preset (``--only``; without ``--trace``
all three presets run, in one run), the two traces read from ../shared/traces, never
copied:

* ``philly`` - Philly (Microsoft, Jeon et al. ATC'19): jobs submitted in days [40, 70)
  on 192 x 8 = 1,536 GPUs (the first busy month; the first 40 days hold ~300 jobs);
* ``itp`` - Microsoft ITP cluster04 (ElasticFlow, ASPLOS'23), the largest of the ten
  clusters (15,802 jobs, 59.5 days), on 64 x 8 = 512 GPUs (offered load about 0.95);
* ``week`` - the synthetic week of ``gpushepherd.sim.synthetic`` (requirement R4's small
  team on one 8-GPU server), ``WEEKS`` = 10 of them back to back (seeds ``--seed`` to
  ``--seed`` + 9; one week holds about 60 jobs, too few to rank by), under
  ``examples/policies/small-team.yaml``, the clock starting on the first Monday
  (``--cluster``, ``--days`` and ``--load`` do not apply to it). A baseline
  keeps the policy's quotas, reservations, windows and limits (they are rules of the
  core it runs on); the Slurm and Kueue rows do not preempt (their defaults) and
  ``tiresias`` preempts by attained service alone, not by class.

Every run is under ``--policy`` (default ``examples/policies/philly.yaml``, for ``week``
``small-team.yaml``; both carry the default order of design note 045), each in
its own process (``--jobs`` at a time); ``--schedulers`` picks the rows (default: all
but ``bestfit``, which differs only for GPU shares), ``--bf-depth`` the reservation
depth of the Slurm rows. With ``--perfect`` the schedulers that use runtime estimates
also run with perfect ones, for reference only (under submit order or the ``slurm`` row's
class order a perfect row may be worse: design note 044, ``bench/estimate_accuracy.py``).

Each row is printed as it finishes, and appended to ``--jsonl FILE`` (one JSON object
a line, flushed) so that a long run keeps what it did. Figures per row: average JCT
(and over the lower bound, the mean duration), p99 queueing delay, the longest wait of
a job of 8 or more GPUs, utilisation, fairness across users (Jain's index over each
user's mean slowdown, ``gpushepherd.tails``, design note 030; also kept: max / min over
teams of their mean slowdown, teams with >= 20 finished jobs), preemptions, and
preemptions of jobs that the policy says may not be preempted; and per size class (1,
2-4, 5-8, 9-15, 16+ GPUs) mean / p90 / p99 / max wait and slowdown (``size_classes``, the
figures of ``shepherd simulate``); with deadlines in the trace (``--map
deadline=COL`` or ``deadline_after=COL``), the share of them met (``deadlines``). At the end ``--out`` (default ``bench/results``)
gets ``compare.md`` (the rows, then the size classes), ``compare.json`` and
``compare.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import replace
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "traces"
POLICY = ROOT / "examples" / "policies" / "philly.yaml"
WEEK_POLICY = ROOT / "examples" / "policies" / "small-team.yaml"
PRESETS = {
    "philly": dict(label="Philly days 40-70, 192x8", trace=str(SHARED / "philly_rfold" / "philly_trace.csv.gz"),
                   format="philly", cluster="192x8", days="40:70"),
    "itp": dict(label="ITP cluster04, 64x8", trace=str(SHARED / "elasticflow_itp" / "raw" / "cluster04.csv.gz"),
                format="itp", cluster="64x8", days=None),
    "week": dict(label="synthetic weeks x10, small-team.yaml", trace=None, format="week", cluster=None, days=None),
}


def _preset(name: str, cluster: str | None, days: str | None) -> dict:
    """A preset with ``--cluster`` / ``--days`` applied, its label naming what was run
    (``Philly days 40-50, 32x8``), not the preset's defaults."""
    p = dict(PRESETS[name])
    if name == "week":
        return p
    p["cluster"] = cluster or p["cluster"]
    p["days"] = days or p["days"]
    name_part = {"philly": "Philly", "itp": "ITP cluster04"}[name]
    span = f" days {p['days'].replace(':', '-')}" if p["days"] else ""
    p["label"] = f"{name_part}{span}, {p['cluster']}"
    return p


#: the synthetic weeks the ``week`` preset replays back to back
WEEKS = 10
SCHEDULERS = ("gpushepherd", "slurm-default", "slurm", "slurm-timelimit", "kueue", "kueue-strict", "tiresias",
              "fifo")
USES_ESTIMATES = ("gpushepherd", "slurm-default", "slurm", "slurm-timelimit")


def one(run: dict) -> dict:
    """One run in this process (``run``: a trace as ``main`` builds it, plus
    ``scheduler``, ``estimates`` and ``bf_depth``); returns its figures."""
    import numpy as np

    from gpushepherd.baselines import BF_DEPTH, build
    from gpushepherd.policy import override_cluster, policy_from_dict, read_policy_dict
    from gpushepherd.sim.engine import Simulator
    from gpushepherd.sim.mapping import to_sim_jobs
    from gpushepherd.sim.metrics import job_table, summarize
    from gpushepherd.sim.traces import load_trace, parse_days, select

    raw = read_policy_dict(run["policy"])
    if run["cluster"]:
        raw = override_cluster(raw, run["cluster"])
    if run["format"] == "week":  # the synthetic week: t = 0 is its Monday 00:00 local time
        from gpushepherd.sim.synthetic import WEEK_START, weeks_workload

        raw.setdefault("clock", {})["start"] = WEEK_START
        pol = policy_from_dict(raw, run["policy"])
        jobs, skipped = weeks_workload(run["seed"], WEEKS, WEEK_START), []
        if run["estimates"] == "perfect":  # as the trace mapping's: the true duration as the estimate
            jobs = [replace(j, spec=replace(j.spec, runtime_estimate_s=j.duration)) for j in jobs]
    else:
        pol = policy_from_dict(raw, run["policy"])
        loaded = load_trace(run["trace"], run["format"], run["map"], skip_bad_rows=run["skip_bad_rows"])
        rows = select(loaded.rows, parse_days(run["days"]) if run["days"] else None, run["load"])
        refused: list = []  # rows the policy cannot take, skipped as shepherd simulate skips them
        jobs = to_sim_jobs(rows, pol.rules, seed=run["seed"], estimates=run["estimates"],
                           skipped=refused if run["skip_bad_rows"] else None)
        skipped = (*loaded.skipped, *refused)
    name = run["scheduler"]
    rules, factory = build(name, pol.rules, run["bf_depth"])
    t0 = time.perf_counter()
    result = Simulator(rules, jobs, scheduler=factory).run()
    wall = time.perf_counter() - t0
    df = job_table(result)
    summary = summarize(result, df)
    o = summary["overall"]
    done = df[df["jct"].notna() & (df["duration"] > 0)]
    slow = (done["jct"] / done["duration"]).groupby(done["team"])
    per_team = slow.mean()[slow.size() >= 20]
    big = df[df["gpus"] >= 8]
    may_not = 0
    for rec in result.records.values():
        if rec.preempted_at:
            cls = pol.rules.classes[rec.spec.workload_class]
            if not (cls.preemptible if rec.spec.preemptible is None else rec.spec.preemptible):
                may_not += 1
    return {
        "trace": run["label"], "scheduler": name, "estimates": run["estimates"],
        "bf_depth": rules.backfill_reservations if name in BF_DEPTH else None, "jobs": len(jobs),
        "skipped_rows": len(skipped), "wall_s": wall,
        "avg_jct_h": o["jct_s"]["mean"] / 3600, "jct_over_bound": o["jct_over_lower_bound"],
        "p50_wait_h": float(np.nan_to_num(o["queueing_delay_s"]["p50"])) / 3600,
        "p99_wait_h": o["queueing_delay_s"]["p99"] / 3600,
        "max_wait_8plus_h": float(np.nan_to_num(big["queueing_delay"].max())) / 3600,
        "jobs_8plus": int(len(big)), "never_started_8plus": int(big["start"].isna().sum()),
        "utilisation": o["utilisation"],
        "fairness_users_jain": summary["fairness"]["value"],
        "fairness_teams_max_min": float(per_team.max() / per_team.min()) if len(per_team) > 1 else float("nan"),
        "size_classes": summary["size_classes"], "deadlines": summary["deadlines"],
        "preemptions": int(df["preemptions"].sum()), "nonpreemptible_preempted": may_not,
        "unfinished": int(df["jct"].isna().sum()),
    }


def _fail(option: str, value, allowed: str) -> int:
    print(f"compare: {option}: {value!r} is not allowed: {allowed}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", metavar="FILE", help="a trace file (else the presets)")
    ap.add_argument("--format", default="philly", help="of --trace: philly (default), itp or csv")
    ap.add_argument("--map", help="for --format csv: submit=COL,gpus=COL,duration=COL[,...]")
    ap.add_argument("--days", metavar="N|A:B", help="only jobs submitted in days [0, N) or [A, B), counted "
                    "from the trace's time origin (submit time 0), not from its first job")
    ap.add_argument("--cluster", metavar="NxG", help="replace the policy's nodes, e.g. 192x8")
    ap.add_argument("--load", type=float, default=1.0, help="arrival-rate factor (default 1)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the trace mapping (default 0)")
    ap.add_argument("--skip-bad-rows", action="store_true", help="skip and count invalid trace rows")
    ap.add_argument("--policy", help="policy file (default examples/policies/philly.yaml; for the week preset "
                    "small-team.yaml)")
    ap.add_argument("--only", choices=sorted(PRESETS), action="append", help="run this preset only (repeatable)")
    ap.add_argument("--schedulers", default=",".join(SCHEDULERS), help="comma-separated (default: %(default)s)")
    ap.add_argument("--bf-depth", type=int, help="backfill reservations of the Slurm rows (default 1)")
    ap.add_argument("--perfect", action="store_true", help="also run with perfect estimates (reference)")
    ap.add_argument("--jobs", type=int, default=2, help="runs in parallel (default 2)")
    ap.add_argument("--jsonl", metavar="FILE", help="append each row to FILE as it finishes")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"), help="folder of compare.md/.json/.png")
    ap.add_argument("--merge", action="store_true",
                    help="keep the rows of an earlier compare.json that this run does not redo")
    ap.add_argument("--one", metavar="RUN_JSON", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(json.loads(args.one))))
        return 0
    from gpushepherd.baselines import BASELINES

    names = list(dict.fromkeys(p.strip() for p in args.schedulers.split(",") if p.strip()))
    bad = [p for p in names if p not in BASELINES] or ([] if names else [args.schedulers])
    if bad:
        return _fail("--schedulers", bad[0], f"a comma-separated list of {', '.join(BASELINES)}")
    if args.jobs < 1:
        return _fail("--jobs", args.jobs, "at least 1")
    if args.bf_depth is not None and args.bf_depth < 1:
        return _fail("--bf-depth", args.bf_depth, "a reservation depth >= 1")
    if args.trace and args.only:
        return _fail("--only", args.only[0], "a preset, without --trace")
    common = dict(policy=args.policy or str(POLICY), seed=args.seed, map=args.map, skip_bad_rows=args.skip_bad_rows,
                  load=args.load, bf_depth=args.bf_depth)
    if args.trace:
        traces = [dict(common, label=Path(args.trace).name + (f" {args.cluster}" if args.cluster else ""),
                       trace=args.trace, format=args.format, cluster=args.cluster, days=args.days)]
    else:
        traces = [dict(common, **_preset(t, args.cluster, args.days)) for t in (args.only or PRESETS)]
        for tr in traces:
            if tr["format"] == "week" and not args.policy:
                tr["policy"] = str(WEEK_POLICY)
    for tr in traces:
        if tr["trace"] is not None and not Path(tr["trace"]).exists():
            return _fail("--trace", tr["trace"], "a trace file that exists (the presets read ../shared/traces)")
    out = Path(args.out)
    try:  # the output folder and the jsonl file must be writable before minutes of runs
        out.mkdir(parents=True, exist_ok=True)
        (out / ".write-test").write_text("")
        (out / ".write-test").unlink()
        if args.jsonl:
            Path(args.jsonl).parent.mkdir(parents=True, exist_ok=True)
            Path(args.jsonl).open("a").close()
    except OSError as exc:
        return _fail("--out/--jsonl", args.jsonl or args.out, f"a path that can be written ({exc.strerror})")
    runs = [dict(tr, scheduler=s, estimates="limit") for tr in traces for s in names]
    if args.perfect:
        runs += [dict(tr, scheduler=s, estimates="perfect") for tr in traces for s in names if s in USES_ESTIMATES]
    print(f"{len(runs)} runs, {args.jobs} at a time", flush=True)

    def launch(run: dict) -> dict:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--one", json.dumps(run)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
        if proc.returncode != 0:
            raise RuntimeError(f"{run['label']} / {run['scheduler']}: "
                               f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
        return json.loads(proc.stdout)

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    rows, failed = [], 0
    with Progress(TextColumn("runs"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  refresh_per_second=4) as bar, ThreadPoolExecutor(max_workers=args.jobs) as pool:
        task = bar.add_task("runs", total=len(runs))
        futures = [pool.submit(launch, r) for r in runs]
        for fut in as_completed(futures):
            bar.advance(task)
            try:
                row = fut.result()
            except RuntimeError as exc:
                print(f"compare: {exc}", file=sys.stderr, flush=True)
                failed += 1
                continue
            rows.append(row)
            bar.console.print(f"  {row['trace']} | {row['scheduler']:>15} {row['estimates']:>7}: JCT/bound "
                              f"{row['jct_over_bound']:.2f}, max wait 8+ GPUs {row['max_wait_8plus_h']:.1f} h, "
                              f"p99 wait {row['p99_wait_h']:.1f} h, fairness (users) "
                              f"{_num(row.get('fairness_users_jain'), '.3f')} in {row['wall_s']:.0f} s", markup=False,
                              highlight=False, soft_wrap=True)
            if args.jsonl:
                with open(args.jsonl, "a", encoding="utf-8") as f:
                    f.write(json.dumps(row) + "\n")
    order = {s: i for i, s in enumerate(BASELINES)}
    key = (lambda r: (r["trace"], r["estimates"] != "limit", order.get(r["scheduler"], 99)))
    if args.merge and (out / "compare.json").exists():
        redone = {(r["trace"], r["scheduler"], r["estimates"]) for r in rows}
        rows += [r for r in json.loads((out / "compare.json").read_text())
                 if (r.get("trace"), r.get("scheduler"), r.get("estimates")) not in redone]
    rows.sort(key=key)
    md = table(rows)
    (out / "compare.md").write_text(md)
    (out / "compare.json").write_text(json.dumps(rows, indent=1))
    if rows:
        plot(rows, out / "compare.png")
    print(md)
    print(f"wrote {out / 'compare.md'}, {out / 'compare.json'}, {out / 'compare.png'}")
    if failed:
        print(f"compare: {failed} of {len(runs)} runs failed (above)", file=sys.stderr)
    return 1 if failed else 0


def _num(v, fmt: str, scale: float = 1.0) -> str:
    """``v / scale`` formatted, ``-`` for none (a row of an older compare.json may lack it)."""
    return "-" if v is None or math.isnan(v) else format(v / scale, fmt)


def _name(r: dict) -> str:
    return r["scheduler"] + (f" (depth {r['bf_depth']})" if r.get("bf_depth") else "")


def table(rows: list[dict]) -> str:
    lines = ["| trace | scheduler | estimates | avg JCT h | JCT / bound | max wait 8+ GPUs h | p99 wait h | util | "
             "fairness (users, Jain) | fairness (teams, max/min) | preemptions | non-preemptible preempted | wall s |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        teams = r.get("fairness_teams_max_min", r.get("fairness"))  # "fairness": rows before note 030
        lines.append(f"| {r['trace']} | {_name(r)} | {r['estimates']} | {r['avg_jct_h']:.2f} | "
                     f"{r['jct_over_bound']:.2f} | {r['max_wait_8plus_h']:.1f} | {r['p99_wait_h']:.1f} | "
                     f"{r['utilisation']:.1%} | {_num(r.get('fairness_users_jain'), '.3f')} | {_num(teams, '.2f')} | "
                     f"{r['preemptions']} | {r['nonpreemptible_preempted']} | {r['wall_s']:.0f} |")
    dl = [r for r in rows if (r.get("deadlines") or {}).get("jobs")]
    if dl:
        lines += ["", "| trace | scheduler | estimates | jobs with a deadline | met | met % | missed | not ended | "
                  "flagged at risk | flagged, then met |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in dl:
            d = r["deadlines"]
            lines.append(f"| {r['trace']} | {_name(r)} | {r['estimates']} | {d['jobs']} | {d['met']} | "
                         f"{d['met_share']:.1%} | {d['missed']} | {d['not_ended']} | {d['flagged']} | "
                         f"{d['flagged_met']} |")
    lines.append("")
    lines.append("JCT / bound: average JCT over the mean duration (no scheduler can do better than 1). "
                 "max wait 8+ GPUs: the longest queueing delay of a job of 8 or more GPUs. "
                 "fairness (users): Jain's index over each user's mean bounded slowdown (1 = alike; users with 5 or "
                 "more ended jobs); (teams): max / min team mean slowdown. Estimates `limit`: the user's time limit "
                 "(realistic); `perfect`: the true duration (reference only).")
    sized = [r for r in rows if r.get("size_classes")]
    if sized:
        head = ("| trace | scheduler | estimates | GPUs | jobs | not started | wait mean | wait p90 | wait p99 | "
                "wait max | slowdown mean | slowdown p99 | slowdown max |")
        lines += ["", "Per size class (GPUs): wait of the jobs that started (h), bounded slowdown of those that ended.",
                  "", head, "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in sized:
            for label, f in r["size_classes"].items():
                if not f["jobs"]:
                    continue
                w, s = f["wait_s"], f["slowdown"]
                lines.append(f"| {r['trace']} | {_name(r)} | {r['estimates']} | {label} | {f['jobs']} | "
                             f"{f['not_started']} | {_num(w['mean'], '.2f', 3600)} | {_num(w['p90'], '.1f', 3600)} | "
                             f"{_num(w['p99'], '.1f', 3600)} | "
                             f"{_num(w['max'], '.1f', 3600)} | {_num(s['mean'], '.2f')} | {_num(s['p99'], '.1f')} | "
                             f"{_num(s['max'], '.1f')} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("compare: matplotlib not installed (pip install -e '.[bench]'): no plot", file=sys.stderr)
        return
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    fig, axes = plt.subplots(1, len(traces), figsize=(7 * len(traces), 4), squeeze=False)
    for ax, trace in zip(axes[0], traces):
        sel = [r for r in rows if r["trace"] == trace]
        labels = [r["scheduler"] + (" (perfect)" if r["estimates"] == "perfect" else "") for r in sel]
        bars = ax.bar(range(len(sel)), [r["jct_over_bound"] for r in sel],
                      color=["#2b7bba" if r["scheduler"] == "gpushepherd" else "#999999" for r in sel])
        ax.bar_label(bars, fmt="%.2f")
        ax.set_yscale("log")
        ax.set_xticks(range(len(sel)), labels, rotation=30, ha="right")
        ax.set_ylabel("average JCT / lower bound (log)")
        ax.set_title(trace)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
