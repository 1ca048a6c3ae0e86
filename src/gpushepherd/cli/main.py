"""The ``shepherd`` command line (typer + rich).

Bad input - a policy, trace, scenario or option the program cannot use - prints one
line ``error: ...`` naming the file, field, value and what is allowed, and exits with
code 2; no traceback.
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpushepherd import __version__
from gpushepherd.core.scheduler import SpecError
from gpushepherd.policy.load import PolicyError, load_policy, override_cluster, policy_from_dict, read_policy_dict
from gpushepherd.sim.engine import Simulator
from gpushepherd.sim.mapping import to_sim_jobs
from gpushepherd.sim.metrics import job_table, summarize, write_jobs
from gpushepherd.sim.scenario import ScenarioError, load_scenario, run_scenario
from gpushepherd.sim.traces import TraceError, parse_days, read_trace, select

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.splitlines()[0] if __doc__ else None,
                  pretty_exceptions_enable=False)
scenario_app = typer.Typer(no_args_is_help=True, help="Run scenario files (cluster, policy, jobs, expected outcome).")
policy_app = typer.Typer(no_args_is_help=True, help="Check policy files.")
app.add_typer(scenario_app, name="scenario")
app.add_typer(policy_app, name="policy")

out = Console()
if not out.is_terminal:  # pipes and CI logs: wide enough for the summary table
    out = Console(width=160)
err = Console(stderr=True)
if not err.is_terminal:
    err = Console(stderr=True, width=160)

#: the bundled excerpt and its policy (see gpushepherd/data/NOTICE.md)
EXCERPT = "philly-excerpt.csv.gz"
DEMO_POLICY = "demo-policy.yaml"


def data_path(name: str) -> Path:
    return Path(str(resources.files("gpushepherd") / "data" / name))


class UsageError(ValueError):
    """A command-line option the program cannot use."""


@contextmanager
def _errors():
    try:
        yield
    except (PolicyError, TraceError, ScenarioError, SpecError, UsageError) as exc:
        err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


@app.callback()
def main() -> None:
    """gpushepherd: who gets the next free GPU, and by what rule."""


@app.command()
def version() -> None:
    """Print the version."""
    out.print(f"gpushepherd {__version__}")


def _hours(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def _summary_table(summary: dict, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("group", "jobs", "ended", "avg JCT", "p50", "p95", "p99", "avg wait", "p50", "p95", "p99", "preempt."):
        table.add_column(col, justify="left" if col == "group" else "right")

    def row(name: str, g: dict) -> None:
        j, q = g["jct_s"], g["queueing_delay_s"]
        table.add_row(name, f"{g['jobs']:,}", f"{g['finished']:,}", _hours(j["mean"]), _hours(j["p50"]),
                      _hours(j["p95"]), _hours(j["p99"]), _hours(q["mean"]), _hours(q["p50"]), _hours(q["p95"]),
                      _hours(q["p99"]), f"{g['preemptions']:,}")

    row("all", summary["overall"])
    table.add_section()
    for name, g in summary["by_class"].items():
        row(f"class {name}", g)
    table.add_section()
    for name, g in summary["by_team"].items():
        row(f"team {name}", g)
    return table


@app.command()
def simulate(
    trace: Annotated[Optional[Path], typer.Option(help="Trace file; default: the bundled Philly excerpt.")] = None,
    fmt: Annotated[str, typer.Option("--format", help="philly, itp or csv.")] = "philly",
    mapping: Annotated[Optional[str], typer.Option("--map", help="csv columns: submit=COL,gpus=COL,duration=COL[,id=,team=,class=,user=]")] = None,
    policy: Annotated[Optional[Path], typer.Option(help="Policy file; default: the bundled demo policy.")] = None,
    cluster: Annotated[Optional[str], typer.Option(help="Replace the policy's nodes: NODESxGPUS[:TYPE[:MEM_MIB]].")] = None,
    days: Annotated[Optional[str], typer.Option(help="Jobs submitted in the first N days, or in days A:B.")] = None,
    load: Annotated[float, typer.Option(help="Arrival-rate factor (2.0 = twice as many jobs per hour).")] = 1.0,
    seed: Annotated[int, typer.Option(help="Seed of the team/class/limit mapping.")] = 0,
    estimates: Annotated[str, typer.Option(help="limit (users' time limits) or perfect (true durations; reference only).")] = "limit",
    out_path: Annotated[Optional[Path], typer.Option("--out", help="Per-job results: .csv, .csv.gz or .parquet.")] = None,
    json_path: Annotated[Optional[str], typer.Option("--json", help="Write the figures as JSON to this file ('-': stdout).")] = None,
    explain: Annotated[Optional[list[str]], typer.Option(help="Print this job's history and reasons (repeatable).")] = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Replay a job trace through the scheduler and print JCT, queueing delay, utilisation."""
    with _errors():
        if out_path is not None and not str(out_path).lower().endswith((".csv", ".csv.gz", ".parquet")):
            raise UsageError(f"--out: {str(out_path)!r} is not allowed: a .csv, .csv.gz or .parquet file")
        if json_path not in (None, "-") and out_path is not None and Path(json_path) == out_path:
            raise UsageError("--json and --out name the same file")
        bundled = trace is None
        trace_path = data_path(EXCERPT) if bundled else trace
        policy_path = policy or data_path(DEMO_POLICY)
        raw = read_policy_dict(policy_path)
        if cluster:
            raw = override_cluster(raw, cluster)
        pol = policy_from_dict(raw, str(policy_path))
        rows = read_trace(trace_path, "philly" if bundled else fmt, mapping)
        rows = select(rows, parse_days(days) if days else None, load)
        if not rows:
            raise UsageError("no jobs to simulate: the trace (or the --days window) is empty")
        jobs = to_sim_jobs(rows, pol.rules, seed=seed, estimates=estimates)
        gpus = sum(n.gpus for n in pol.rules.nodes)
        what = "the bundled Philly excerpt (days 45-47)" if bundled else str(trace_path)
        err.print(f"Replaying {len(jobs):,} jobs of {what} on {len(pol.rules.nodes):,} nodes / {gpus:,} GPUs "
                  f"under {policy_path.name}", highlight=False)
        if progress and err.is_terminal:
            with Progress(TextColumn("simulating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=err, transient=True) as bar:
                task = bar.add_task("sim", total=len(jobs))
                result = Simulator(pol.rules, jobs, progress=lambda d, t: bar.update(task, completed=d)).run()
        else:
            result = Simulator(pol.rules, jobs).run()
        df = job_table(result)
        summary = summarize(result, df)
        o = summary["overall"]
        title = (f"utilisation {o['utilisation']:.1%}  makespan {_hours(o['makespan_s'])}  "
                 f"lower bound (mean duration) {_hours(o['lower_bound_jct_s'])}  "
                 f"avg JCT / bound {o['jct_over_lower_bound']:.2f}" if o["jct_over_lower_bound"] else
                 f"utilisation {o['utilisation']:.1%}")
        if json_path != "-":
            out.print(_summary_table(summary, title))
        payload = {"trace": str(trace_path), "policy": str(policy_path), "jobs": len(jobs),
                   "gpus": gpus, "nodes": len(pol.rules.nodes), "seed": seed, "estimates": estimates,
                   "days": days, "load": load, **summary}
        if json_path == "-":
            sys.stdout.write(json.dumps(payload, indent=2, sort_keys=True) + "\n")
        elif json_path:
            Path(json_path).write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        if out_path is not None:
            write_jobs(df, out_path)
            err.print(f"per-job results: {out_path}", highlight=False)
        for job_id in explain or []:
            _explain(result, job_id)


def _explain(result, job_id: str) -> None:
    job = result.scheduler.jobs.get(job_id)
    if job is None:
        raise UsageError(f"--explain: job {job_id!r} is not allowed: a job id of the trace")
    rec = result.records[job_id]
    spec = job.spec
    out.print(f"[bold]{job_id}[/bold]  team {spec.team}  user {spec.user}  class {spec.workload_class}  "
              f"gpus {spec.gpus}  limit {_hours(job.time_limit_s)}  duration {_hours(rec.duration)}")
    table = Table(show_header=True)
    for col in ("t (s)", "from", "to", "why"):
        table.add_column(col)
    for tr in job.history:
        table.add_row(f"{tr.t:.1f}".removesuffix(".0"), tr.from_state, tr.to_state, tr.reason)
    out.print(table)


@scenario_app.command("run")
def scenario_run(
    files: Annotated[list[Path], typer.Argument(help="Scenario YAML files.")],
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only PASS/FAIL lines.")] = False,
) -> None:
    """Run scenarios and check their expected outcome; exit 1 if any expectation fails."""
    failed = 0
    with _errors():
        for path in files:
            spec = load_scenario(path)
            for outcome in run_scenario(spec, str(path)):
                if not quiet:
                    _print_timeline(outcome)
                if outcome.passed:
                    out.print(f"[green]PASS[/green] {outcome.name}", highlight=False)
                else:
                    failed += 1
                    out.print(f"[red]FAIL[/red] {outcome.name}", highlight=False)
                    for line in outcome.failures:
                        out.print(f"  - {line}", highlight=False, markup=False)
    if failed:
        raise typer.Exit(1)


def _print_timeline(outcome) -> None:
    table = Table(title=outcome.name, title_justify="left")
    for col in ("job", "class", "gpus", "submit", "starts (t@placement)", "end", "state", "preempted", "waited (from-to reason)"):
        table.add_column(col)
    for rec in outcome.result.records.values():
        starts = "; ".join(f"{t:g}@{p}" for t, p in rec.starts)
        waits = "; ".join(f"{a:g}-{'' if b is None else f'{b:g}'} {r}" for a, b, r in rec.reasons if b is None or b > a)
        table.add_row(rec.spec.id, rec.spec.workload_class, str(rec.spec.gpus), f"{rec.spec.submit_time:g}", starts,
                      "-" if rec.end is None else f"{rec.end:g}", rec.state,
                      ",".join(f"{t:g}" for t in rec.preempted_at), waits)
    out.print(table)


@policy_app.command("check")
def policy_check(files: Annotated[list[Path], typer.Argument(help="Policy YAML files.")]) -> None:
    """Validate policy files; print a summary of each."""
    with _errors():
        for path in files:
            pol = load_policy(path)
            r = pol.rules
            gpus = sum(n.gpus for n in r.nodes)
            out.print(f"{path}: OK - {len(r.nodes)} nodes, {gpus} GPUs, {len(r.classes)} classes, "
                      f"{len(r.teams)} teams, {len(r.limits)} limits", highlight=False)


if __name__ == "__main__":  # pragma: no cover
    app()
