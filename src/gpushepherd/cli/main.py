"""gpushepherd: who gets the next free GPU, and by what rule.

Replay GPU-cluster job traces through the scheduler (`simulate`), run scenario files
with an expected outcome (`scenario run`), and validate policy files (`policy check`).

Bad input - a policy, trace, scenario or option the program cannot use - prints one
line `error: ...` naming the file, field, value and what is allowed, and exits with
code 2; no traceback, and no output file is written.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from datetime import datetime
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.progress import (BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)
from rich.table import Table
from rich.text import Text

from gpushepherd import __version__
from gpushepherd.baselines import BF_DEPTH, NAMES as BASELINE_NAMES, NOT_CORE
from gpushepherd.cli.daemon import duration_param, path_param
from gpushepherd.extras import MissingExtra, require

if TYPE_CHECKING:
    from gpushepherd.sim.engine import SimProgress

# The policy loader, the core, the baselines and the simulator are imported by the
# commands that use them, not here: every command, --help included, starts without them
# (design note 028; tests/test_install.py checks what this module imports).

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, help=__doc__.split("\n\n")[0] if __doc__ else None,
                  context_settings={"help_option_names": ["-h", "--help"]})  # every command: -h as well
scenario_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                           help="Run scenario files: a cluster, a policy, jobs and the expected outcome.")
policy_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Check policy files; apply, show and list the versions of a running server's policy; print the policy reference.")
app.add_typer(scenario_app, name="scenario")
app.add_typer(policy_app, name="policy")


def _console(stderr: bool = False, markup: bool = False) -> Console:
    # Text from users (job ids, paths, team names) is printed as is: no rich markup
    # (unless the caller prints only its own text: ``markup``), no :emoji: codes, no
    # highlighting. Pipes and CI logs get a wide table (rich's default there is 80).
    con = Console(stderr=stderr, markup=markup, emoji=False, highlight=False)
    if not con.is_terminal:
        con = Console(stderr=stderr, markup=markup, emoji=False, highlight=False, width=160)
    return con


out = _console()
err = _console(stderr=True)

#: the bundled excerpt and its policy (see gpushepherd/data/NOTICE.md)
EXCERPT = "philly-excerpt.csv.gz"
DEMO_POLICY = "demo-policy.yaml"


def data_path(name: str) -> Path:
    return Path(str(resources.files("gpushepherd") / "data" / name))


class UsageError(ValueError):
    """A command-line option the program cannot use."""


# Typer's own usage errors (an unknown option, "abc" for a number): typer >= 0.2x raises
# its vendored click's exceptions, older typer plain click's; catch whichever exists.
_USAGE_ERRORS: tuple[type[BaseException], ...] = (typer.TyperException,)
_ABORTS: tuple[type[BaseException], ...] = (typer.Abort,)
try:  # pragma: no cover - depends on the installed typer
    import click

    _USAGE_ERRORS += (click.ClickException,)
    _ABORTS += (click.Abort,)
except ImportError:  # pragma: no cover
    pass


#: the errors of bad input that ``_errors`` prints as one line: (module, class name)
USER_ERRORS = (("gpushepherd.policy.load", "PolicyError"), ("gpushepherd.sim.traces", "TraceError"),
               ("gpushepherd.sim.scenario", "ScenarioError"), ("gpushepherd.core.scheduler", "SpecError"))


def _user_errors() -> tuple[type[BaseException], ...]:
    """``UsageError`` and those of ``USER_ERRORS`` whose module is imported: an error
    class whose module was never imported cannot have been raised, and looking it up
    here imports nothing."""
    found = [getattr(sys.modules[m], name) for m, name in USER_ERRORS if m in sys.modules]
    return (UsageError, *found)


@contextmanager
def _errors():
    try:
        yield
    except MissingExtra as exc:  # an install to complete, not bad input: exit 1
        err.print(f"error: {exc}", soft_wrap=True)
        raise typer.Exit(1) from None
    except Exception as exc:
        if not isinstance(exc, _user_errors()):
            raise
        err.print(f"error: {exc}", soft_wrap=True)
        raise typer.Exit(2) from None


#: what an option's type allows, by the error type of typer's (pydantic) coercion
_COERCION_ALLOWS = {"float_parsing": "a number", "float_type": "a number", "int_parsing": "a whole number",
                    "int_from_float": "a whole number", "int_type": "a whole number",
                    "bool_parsing": "true or false (yes/no, 1/0)"}


def _usage_message(exc: BaseException) -> str:
    """click's message; for a value typer's coercion refused (typer >= 0.2x checks types
    with pydantic, whose message names neither the value nor the option's form:
    "Invalid value for '--load': Input should be a valid number, ..."),
    ``--load: '2h' is not allowed: a number``."""
    message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    param, cause = getattr(exc, "param", None), exc.__cause__
    if param is None or type(cause).__name__ != "ValidationError" or not callable(getattr(cause, "errors", None)):
        return message
    try:
        first = cause.errors()[0]
    except (IndexError, TypeError, ValueError):
        return message
    if "input" not in first:
        return message
    opts = [o for o in (getattr(param, "opts", None) or []) if o.startswith("--")]
    name = opts[0] if opts and getattr(param, "param_type_name", "") == "option" else param.human_readable_name
    msg = str(first.get("msg", "")).split(",")[0]
    allowed = _COERCION_ALLOWS.get(str(first.get("type")), msg[:1].lower() + msg[1:])
    return f"{name}: {first['input']!r} is not allowed: {allowed}"


def run() -> None:
    """Console entry point: click's own usage errors become one ``error:`` line, exit 2."""
    try:
        code = app(standalone_mode=False)
    except _ABORTS:
        err.print("error: aborted")
        sys.exit(1)
    except _USAGE_ERRORS as exc:
        err.print(f"error: {_usage_message(exc)} (see --help)", soft_wrap=True)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)


def _print_version(value: bool) -> None:
    if value:
        out.print(f"gpushepherd {__version__}")
        raise typer.Exit()


@app.callback()
def main(version: Annotated[bool, typer.Option("--version", "-V", is_eager=True, callback=_print_version,
                                               help="Print the version and exit.")] = False) -> None:
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


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def _safe(v) -> str:
    """``str(v)`` with control characters escaped (``gpushepherd.cli.daemon._safe``)."""
    from gpushepherd.cli.daemon import _safe as safe

    return safe(v)


def _summary_table(summary: dict, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("group", "jobs", "ended", "JCT avg", "JCT p50", "JCT p95", "JCT p99", "wait avg", "wait p50",
                "wait p95", "wait p99", "preemptions"):
        table.add_column(col, justify="left" if col == "group" else "right")

    def row(name: str, g: dict) -> None:
        j, q = g["jct_s"], g["queueing_delay_s"]
        # names come from the trace: escaped, never read as markup or a terminal escape (issue 19)
        table.add_row(Text(_safe(name)), f"{g['jobs']:,}", f"{g['finished']:,}", _hours(j["mean"]), _hours(j["p50"]),
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


LEGEND = ("JCT = end - submit of jobs that ended; wait = queueing delay, first start - submit; "
          "preemptions = preemption events; times in s/m/h/d.")


def _size_table(summary: dict) -> Table:
    """The tails per size class (``gpushepherd.tails``, design note 030)."""
    from gpushepherd.tails import tail_rows

    table = Table(title="Per size class (GPUs): wait of the jobs that started, slowdown of those that ended",
                  title_justify="left")
    for col in ("GPUs", "jobs", "not started", "wait avg", "wait p90", "wait p99", "wait max", "ended", "slowdown avg",
                "slowdown p99", "slowdown max"):
        table.add_column(col, justify="left" if col == "GPUs" else "right")

    def x(v: float | None) -> str:
        return "-" if v is None else f"{v:,.2f}"

    for r in tail_rows(summary):
        table.add_row(r["size_gpus"], f"{r['jobs']:,}", f"{r['not_started']:,}", _hours(r["wait_mean_s"]),
                      _hours(r["wait_p90_s"]), _hours(r["wait_p99_s"]), _hours(r["wait_max_s"]), f"{r['ended']:,}", x(r["slowdown_mean"]),
                      x(r["slowdown_p99"]), x(r["slowdown_max"]))
    return table


@contextmanager
def _nothing():
    yield


class SimBar:
    """A rich progress display on ``console`` for long work (design note 020): tasks
    that move at least every second (``refresh_per_second``), with rate and ETA.
    ``reading`` is an indeterminate task (a trace or a log being read); ``replay`` makes
    a task for one simulator run and returns its ``on_progress`` callback, which
    advances it by submissions plus ends (out of twice the jobs) and says where the
    simulated clock is."""

    def __init__(self, console: Console):
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("ETA"),
                                 TimeRemainingColumn(), console=console, transient=True, refresh_per_second=4)

    def __enter__(self) -> SimBar:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def reading(self, what: str):
        return self.progress.add_task(what, total=None, info="")

    def read(self, task, rows: int) -> None:
        self.progress.update(task, total=1, completed=1, info=f"{rows:,} jobs")

    def track(self, items, what: str, total: int | None):
        """Yield ``items``, advancing a task ``what`` by one each (of ``total``)."""
        task = self.progress.add_task(what, total=total, info="")
        n = 0
        for n, item in enumerate(items, 1):
            yield item
            self.progress.update(task, completed=n)
        self.progress.update(task, total=n, completed=n, info=f"{n:,} read")

    def replay(self, what: str, jobs: int) -> Callable[[SimProgress], None]:
        task = self.progress.add_task(what, total=2 * max(jobs, 1), info="")
        begun = time.monotonic()

        def update(p: SimProgress) -> None:
            elapsed = time.monotonic() - begun
            rate = p.finished / elapsed if elapsed > 0 else 0.0
            self.progress.update(task, completed=p.done, info=(
                f"t {_hours(p.t - p.t_first)}/{_hours(p.t_last_submit - p.t_first)}, "
                f"ended {p.finished:,}/{p.total:,} ({rate:,.0f}/s)"))
        return update


#: what every output flag's --help says of its folder (``_output_path``)
FOLDER_MADE = "its folder is made if missing, when the file is written"


def _output_path(option: str, value: str | None, suffixes: tuple[str, ...]) -> Path | None:
    """Check an output path before any work is done: a file ending in one of
    ``suffixes``, not a folder, whose folder takes a new file - or, where folders are
    missing, whose nearest existing folder does (a file is created there and removed
    to see it; a folder with no write permission, a read-only file system, ``/proc``
    and a file where a folder should be are refused). Missing folders are made by
    ``_write_atomically`` when the file is written, never before: a run refused or
    stopped earlier leaves no folder behind.

    Raises:
        UsageError: naming ``option``, the value and what is allowed.
    """
    if value is None:
        return None
    if not value.strip():
        raise UsageError(f"{option}: '' is not allowed: a file path")
    path = Path(value)
    if not str(path).lower().endswith(suffixes):
        raise UsageError(f"{option}: {value!r} is not allowed: a file ending in {', '.join(suffixes)}")
    if path.is_dir():
        raise UsageError(f"{option}: {value!r} is not allowed: a file, not a folder")
    why = folder_refusal(path.parent)
    if why is not None:
        raise UsageError(f"{option}: {value!r} is not allowed: {why}; a path in a folder you can write to")
    return path


def folder_refusal(start: Path) -> str | None:
    """Why no new file can be made in ``start``, or - where folders are missing - in its
    nearest existing folder (a file is created there and removed to see it: ``/proc``,
    a read-only file system, no write permission); ``None``: it can. For checking an
    output path before any work is done (``_output_path``, ``report --csv``)."""
    folder = next(p for p in (start, *start.parents) if p.exists() or p == p.parent)
    if not folder.is_dir():
        return f"{str(folder)!r} is a file, not a folder"
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".shepherd-probe.")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"{str(folder)!r} takes no new file ({exc.strerror})"
    return None


def _file_mode(path: Path) -> int:
    """The permission bits ``open(path, "w")`` would leave: an existing file's own, a
    new file's 0666 less the process's umask (not ``mkstemp``'s 0600: teammates read
    shared reports)."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


def _write_atomically(path: Path, option: str, write: Callable[[Path], None]) -> None:
    """Write to a temporary file beside ``path``, then rename: all or nothing. Missing
    folders of ``path`` are made first; the file gets ``_file_mode``.

    Raises:
        UsageError: the folder or the file cannot be made or written (``option``, the
            path and why); nothing is left behind but the folders made.
    """
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
        os.close(fd)
        os.chmod(tmp, _file_mode(path))
        write(Path(tmp))
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise UsageError(f"{option}: {str(path)!r} cannot be written ({exc.strerror or exc}): a path in a folder "
                         "you can write to") from None
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise


@app.command()
def simulate(
    trace: Annotated[Optional[Path], typer.Option(metavar="FILE", help="Trace file; default: the bundled Philly excerpt (days 45-47 of Philly).", parser=path_param)] = None,
    fmt: Annotated[Optional[str], typer.Option("--format", metavar="FORMAT", help="Format of --trace: philly (default), itp or csv.")] = None,
    mapping: Annotated[Optional[str], typer.Option("--map", metavar="MAP", help="For --format csv: submit=COL,gpus=COL,duration=COL[,id=COL,team=COL,class=COL,user=COL,project=COL,deadline=COL|deadline_after=COL] (deadline: a time on the submit column's clock; deadline_after: seconds after submit).")] = None,
    policy: Annotated[Optional[Path], typer.Option(metavar="FILE", help="Policy file; default: the bundled demo policy (96 nodes x 8 GPUs).", parser=path_param)] = None,
    cluster: Annotated[Optional[str], typer.Option(metavar="NxG[:TYPE[:MIB]]", help="Replace the policy's nodes, e.g. 192x8.")] = None,
    days: Annotated[Optional[str], typer.Option(metavar="N|A:B", help="Only jobs submitted in days [0, N) or [A, B) of the trace, counted from its time origin (submit time 0; Philly's and ITP's: the start of collection), not from its first job: the bundled excerpt is days 45-47 (--days 45:46 is its first day); an empty window's error says which days the trace covers.")] = None,
    load: Annotated[float, typer.Option(metavar="FACTOR", help="Arrival-rate factor: 2.0 squeezes the inter-arrival times to half.")] = 1.0,
    seed: Annotated[int, typer.Option(metavar="N", help="Seed of the team/class/user/time-limit mapping (src/gpushepherd/sim/mapping.py).")] = 0,
    estimates: Annotated[str, typer.Option(metavar="limit|perfect", help="What the scheduler plans with: users' time limits (default) or true durations (reference only).")] = "limit",
    out_path: Annotated[Optional[str], typer.Option("--out", metavar="FILE", help="Per-job results: .csv, .csv.gz or .parquet (" + FOLDER_MADE + ").")] = None,
    json_path: Annotated[Optional[str], typer.Option("--json", metavar="FILE", help="The figures as JSON to this file ('-': stdout instead of the table; " + FOLDER_MADE + ").")] = None,
    explain: Annotated[Optional[list[str]], typer.Option(metavar="JOB", help="Print this job's history and why it waited (repeatable).")] = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar on a terminal.")] = True,
    stranded_every: Annotated[Optional[float], typer.Option(metavar="DURATION", parser=duration_param(lo=1), help="Sample free GPUs that no pending job can use (stranded capacity) at the first scheduling event at or after every multiple of DURATION (at least 1 s: seconds, or with a unit: 30s, 10m, 2h; or MM:SS, HH:MM:SS) and report them by constraint (means over samples).")] = None,
    html: Annotated[Optional[str], typer.Option("--html", metavar="FILE", help="Also write the report page of `shepherd report` for this run (GPU-hours, waits, pending reasons, idle gaps, interactive plots with time in days from the trace's start): one self-contained file, plotly inlined, nothing fetched when viewed; needs the 'report' extra; " + FOLDER_MADE + ".")] = None,
    scheduler: Annotated[str, typer.Option(metavar="NAME", help="Who decides: gpushepherd (the policy as written, default) or a baseline under the same policy's cluster and quotas: " + ", ".join(n for n in BASELINE_NAMES if n != "gpushepherd") + " (src/gpushepherd/baselines/).")] = "gpushepherd",
    bf_depth: Annotated[Optional[int], typer.Option(metavar="N", help="Backfill reservations of the Slurm baselines (Slurm's bf_max_job_test; default 1).")] = None,
    skip_bad_rows: Annotated[bool, typer.Option("--skip-bad-rows", help="Skip bad trace rows and count them; without it such a file is refused. A bad row: a value out of range (e.g. num_gpu=0), a wrong column count, an empty or repeated job id, or (in the --days window) a row the policy cannot take: a team or class it does not have, a job its submit validation refuses. A job the policy takes but the scheduler rejects (more GPUs than the nodes it may use have) is not a bad row: it is replayed and counted as rejected.")] = False,
) -> None:
    """Replay a job trace through the scheduler.

    Prints, overall, per workload class and per team: jobs, jobs ended, mean / p50 /
    p95 / p99 JCT (end - submit) and queueing delay ("wait": first start - submit),
    preemption events; and utilisation (GPU-seconds held / healthy GPU-seconds) and
    makespan (first submit to last job event). Traces have no teams, classes, users or
    time limits: a documented, seeded mapping derives them.
    """
    from gpushepherd.baselines import build
    from gpushepherd.policy.load import override_cluster, policy_from_dict, read_policy_dict
    from gpushepherd.sim.engine import SimInterrupted, Simulator
    from gpushepherd.sim.mapping import to_sim_jobs
    from gpushepherd.sim.traces import DAYS_MEANING, load_trace, parse_days, select, trace_days

    with _errors():
        require("sim", "shepherd simulate")
        if html is not None:
            require("report", "shepherd simulate --html", ("pandas", "plotly"))
        # every option is checked before the (possibly long) simulation
        if trace is None and (fmt is not None or mapping is not None):
            raise UsageError("--format and --map describe a --trace file; give --trace too")
        fmt = fmt or "philly"
        if fmt not in ("philly", "itp", "csv"):  # before --map's check, which names the format
            raise UsageError(f"--format: {fmt!r} is not allowed: philly, itp or csv")
        if mapping is not None and fmt != "csv":
            raise UsageError(f"--map is not allowed with --format {fmt}: only with --format csv")
        if cluster is not None and not cluster.strip():
            raise UsageError("--cluster: '' is not allowed: NODESxGPUS, e.g. 192x8")
        if scheduler not in BASELINE_NAMES:
            raise UsageError(f"--scheduler: {scheduler!r} is not allowed: one of {', '.join(BASELINE_NAMES)}")
        if bf_depth is not None and (bf_depth < 1 or scheduler not in BF_DEPTH):
            raise UsageError(f"--bf-depth: {bf_depth!r} is not allowed: a depth >= 1, with --scheduler "
                             f"{' or '.join(sorted(BF_DEPTH))}")
        if scheduler in NOT_CORE:
            for option, value in (("--explain", explain), ("--html", html), ("--stranded-every", stranded_every)):
                if value:
                    raise UsageError(f"{option} is not allowed with --scheduler {scheduler}: it needs a scheduler "
                                     f"on gpushepherd's core (not {', '.join(sorted(NOT_CORE))})")
        out_file = _output_path("--out", out_path, (".csv", ".csv.gz", ".parquet"))
        json_file = None if json_path == "-" else _output_path("--json", json_path, (".json",))
        html_file = _output_path("--html", html, (".html", ".htm"))
        if out_file is not None and json_file is not None and out_file.resolve() == json_file.resolve():
            raise UsageError("--json and --out name the same file")
        window = parse_days(days) if days is not None else None  # "" is a bad window, not none
        bundled = trace is None
        trace_path = data_path(EXCERPT) if bundled else trace
        if not bundled and not trace_path.is_file():
            what = "is a directory" if trace_path.is_dir() else "does not exist"
            raise UsageError(f"--trace: {str(trace_path)!r} {what}: a trace file is needed")
        policy_path = policy or data_path(DEMO_POLICY)
        raw = read_policy_dict(policy_path)
        pol = policy_from_dict(raw, str(policy_path))
        if cluster:
            pol = policy_from_dict(override_cluster(raw, cluster), f"--cluster {cluster}")
        from gpushepherd.sim.metrics import job_table, not_run, stranded_summary, summarize, write_jobs  # pandas: only here
        from gpushepherd.tails import fairness_line

        bar = SimBar(err) if progress and err.is_terminal else None
        with bar or _nothing():
            read = bar.reading(f"reading {trace_path.name}") if bar else None
            loaded = load_trace(trace_path, fmt, mapping, skip_bad_rows=skip_bad_rows)
            rows = select(loaded.rows, window, load)
            if read is not None:
                bar.read(read, len(rows))
        name = "the bundled Philly excerpt" if bundled else str(trace_path)
        if not loaded.rows:
            raise UsageError(f"no jobs to simulate: {name} has no valid job rows")
        if not rows:
            raise UsageError(f"no jobs to simulate: --days {days!r} selects none of {name}: {DAYS_MEANING}, and "
                             f"the trace covers {trace_days(loaded.rows)}")
        refused: list = []
        jobs = to_sim_jobs(rows, pol.rules, seed=seed, estimates=estimates,
                           skipped=refused if skip_bad_rows else None)
        skipped = sorted((*loaded.skipped, *refused), key=lambda e: e.line or 0)
        if skipped:
            err.print(f"--skip-bad-rows: skipped {_plural(len(skipped), 'bad row')} of {trace_path}"
                      f"{f', {len(refused):,} of them rows the policy cannot take' if refused else ''} (the first: "
                      f"{skipped[0]})", soft_wrap=True)
        if not jobs:
            raise UsageError(f"no jobs to simulate: every selected row of {name} is a bad row")
        known = {j.spec.id for j in jobs}
        for job_id in explain or []:
            if job_id not in known:
                raise UsageError(f"--explain: job {job_id!r} is not allowed: a job id of the (selected) trace")
        gpus = sum(n.gpus for n in pol.rules.nodes)
        what = "the bundled Philly excerpt (days 45-47)" if bundled else str(trace_path)
        banner = (f"Replaying {_plural(len(jobs), 'job')} of {what} on {_plural(len(pol.rules.nodes), 'node')} / "
                  f"{_plural(gpus, 'GPU')} under {policy_path.name}")
        if scheduler != "gpushepherd":
            banner += f", scheduled by the {scheduler} baseline"
        rules, factory = build(scheduler, pol.rules, bf_depth)
        if json_path == "-":
            err.print(banner)  # stdout carries the JSON
        watch: set[str] | bool = set(explain or ()) if html_file is None else True  # the page's reasons: all jobs
        stopped: SimProgress | None = None
        try:
            with bar or _nothing():
                result = Simulator(rules, jobs, record_reasons=watch,
                                   stranded_every_s=stranded_every, scheduler=factory,
                                   on_progress=bar.replay("simulating", len(jobs)) if bar else None).run()
        except SimInterrupted as exc:  # Ctrl-C: what ran until then is summarised and written
            result, stopped = exc.result, exc.progress
            err.print(f"interrupted: simulated up to {_hours(stopped.t - stopped.t_first)} of the trace "
                      f"(submits span {_hours(stopped.t_last_submit - stopped.t_first)}), {stopped.finished:,} of "
                      f"{stopped.total:,} jobs ended; the figures and files below are PARTIAL: they cover only "
                      "that", soft_wrap=True)
        df = job_table(result)
        summary = summarize(result, df)
        summary["not_run"] = not_run(result)
        if stranded_every is not None:
            summary["stranded"] = stranded_summary(result)
        o = summary["overall"]
        title = f"{banner}\nutilisation {o['utilisation']:.1%}, makespan {_hours(o['makespan_s'])}"
        nr = summary["not_run"]
        if nr["rejected"] or nr["never_started"]:
            title += (f"; {_plural(nr['rejected'], 'job')} rejected, {_plural(nr['never_started'], 'job')} never "
                      "started (see below)")
        if o["jct_over_lower_bound"]:
            title += (f"; mean duration {_hours(o['lower_bound_jct_s'])} (no scheduler's mean JCT can be lower): "
                      f"mean JCT is {o['jct_over_lower_bound']:.2f}x that")
        payload = {"trace": str(trace_path), "policy": str(policy_path), "jobs": len(jobs),
                   "gpus": gpus, "nodes": len(pol.rules.nodes), "seed": seed, "estimates": estimates,
                   "days": days, "load": load, "scheduler": scheduler, "skipped_rows": len(skipped),
                   **summary}
        if stopped is not None:
            payload["interrupted"] = {"t": stopped.t, "jobs_ended": stopped.finished, "jobs_submitted":
                                      stopped.submitted, "jobs": stopped.total}
            title = f"PARTIAL (interrupted) - {title}"
        text = json.dumps(payload, indent=2, sort_keys=True) + "\n"
        if json_path == "-":
            sys.stdout.write(text)
        else:
            out.print(_summary_table(summary, title))
            out.print(LEGEND)
            out.print(_size_table(summary))
            out.print(Text(_safe(fairness_line(summary["fairness"]))), soft_wrap=True)
            out.print("slowdown = max(1, JCT / max(true duration, 10 s)) (bounded slowdown; design note 030).",
                      soft_wrap=True)
            for line in _not_run_lines(summary["not_run"]):
                out.print(Text(_safe(line)), soft_wrap=True)
            dl = summary["deadlines"]
            if dl["jobs"]:
                out.print(f"deadlines: {dl['met']:,} of {_plural(dl['jobs'], 'job')} with a deadline met it "
                          f"({dl['met_share']:.1%}), {dl['missed']:,} ended after it, {dl['not_ended']:,} did not end; "
                          f"flagged at risk {dl['flagged']:,}, of which {dl['flagged_met']:,} met it", soft_wrap=True)
            if "stranded" in summary:
                st = summary["stranded"]
                by = ", ".join(f"{k} {v:.1f}" for k, v in st["mean_by_constraint"].items()) or "none"
                out.print(f"stranded capacity ({st['samples']} samples, taken at scheduling events; means over "
                          f"samples): mean free {st['mean_free_gpus']:.1f} GPUs, "
                          f"of which stranded {st['mean_stranded_gpus']:.1f} (max {st['max_stranded_gpus']:.1f}); "
                          f"mean by constraint: {by}")
        if json_file is not None:
            _write_atomically(json_file, "--json", lambda p: p.write_text(text, encoding="utf-8"))
            err.print(f"figures: {json_file}")
        if out_file is not None:
            _write_atomically(out_file, "--out", lambda p: write_jobs(df, p, like=out_file))
            err.print(f"per-job results: {out_file}")
        if html_file is not None:
            _report_cli.simulation_page(result, html_file, f"simulation of {what} under {policy_path.name}")
        for job_id in explain or []:
            _explain(result, job_id)
        if stopped is not None:
            raise typer.Exit(130)  # as a shell reports SIGINT


def _not_run_lines(nr: dict) -> list[str]:
    """The text summary's lines on the jobs that never ran (``metrics.not_run``): how
    many were rejected at submit and how many never started, with their top reasons."""
    def reasons(pairs: list) -> str:
        return "; ".join(f"{n:,} x {why}" for why, n in pairs)

    lines = []
    if nr["rejected"]:
        lines.append(f"rejected at submit: {_plural(nr['rejected'], 'job')}, never run; top reasons: "
                     f"{reasons(nr['rejected_reasons'])}")
    if nr["never_started"]:
        lines.append(f"never started by the end: {_plural(nr['never_started'], 'job')} still pending; top pending "
                     f"reasons: {reasons(nr['pending_reasons'])}")
    return lines


def _explain(result, job_id: str) -> None:
    rec = result.records[job_id]
    job = result.scheduler.jobs.get(job_id)
    if job is None:  # refused at submit: the core never took it (note 026)
        out.print(Text(_safe(f"{job_id}  team {rec.spec.team}  class {rec.spec.workload_class}  refused at submit "
                             f"(t={_num(rec.spec.submit_time)}): {rec.rejected or rec.state}"), style="bold"))
        return
    spec = job.spec
    out.print(Text(_safe(f"{job_id}  team {spec.team}  user {spec.user}  class {spec.workload_class}  gpus "
                         f"{spec.gpus}  time limit {_hours(job.time_limit_s)}  true duration {_hours(rec.duration)}"),
                   style="bold"))
    rules = result.scheduler.rules
    # the policy's local time beside t where it decides something: day/night windows or a set start
    clock = rules.clock if rules.clock is not None and (rules.clock.epoch or any(
        lim.windows for lim in rules.limits)) else None
    table = Table(show_header=True)
    cols = ("t (s)",) + ((f"local time ({clock.timezone})",) if clock is not None else ()) + ("from", "to", "why")
    for col in cols:
        table.add_column(col)
    lines = [(tr.t, 0, tr.from_state, tr.to_state, tr.reason) for tr in job.history]
    lines += [(a, 1, "PENDING", "PENDING", f"waiting: {r} (until {'-' if b is None else _num(b)})")
              for a, b, r in rec.reasons if b is None or b > a]
    for t, _k, a, b, why in sorted(lines, key=lambda x: (x[0], x[1])):
        when = (_wall(clock, t),) if clock is not None else ()
        table.add_row(_num(t), *when, a, b, Text(_safe(why)))
    out.print(table)


def _wall(clock, t: float) -> str:
    """Scheduler time ``t`` (seconds) as the policy clock's local wall time, which its
    day/night windows read (``clock.start``; none: ``t`` is Unix time)."""
    try:
        return datetime.fromtimestamp(clock.epoch + t, clock.tz).strftime("%a %Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return "-"


def _num(t: float) -> str:
    return f"{t:.1f}".removesuffix(".0")


@scenario_app.command("run")
def scenario_run(
    files: Annotated[list[Path], typer.Argument(metavar="FILE...", help="Scenario YAML files (format: docs/scenarios.md).", parser=path_param)],
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only PASS/FAIL lines.")] = False,
    explain: Annotated[Optional[list[str]], typer.Option("--explain", metavar="JOB",
                                                         help="Also print this job's history and pending reasons "
                                                              "(repeatable).")] = None,
) -> None:
    """Run scenarios and check their expected outcome; exit 1 if any expectation fails."""
    from gpushepherd.sim.scenario import ScenarioError, expand_ids, load_scenario, run_scenario

    failed = 0
    with _errors():
        specs = [(path, load_scenario(path)) for path in files]  # all files valid before any runs
        known = {j for _p, spec in specs for entry in spec.jobs for j in expand_ids(entry.id)}
        explain = list(dict.fromkeys(explain or []))
        for job_id in explain:
            if job_id not in known:
                shown = repr(job_id) if len(job_id) <= 60 else repr(job_id[:57] + "...")
                raise ScenarioError(f"--explain: {shown} is not allowed: a job of the scenarios "
                                    f"({', '.join(sorted(known)[:20])})")
        for path, spec in specs:
            for outcome in run_scenario(spec, str(path)):
                if not quiet:
                    _print_timeline(outcome)
                for job_id in explain:
                    if job_id in outcome.result.records:
                        out.print(Text(f"{outcome.name}:", style="bold"))
                        _explain(outcome.result, job_id)
                if outcome.passed:
                    out.print(Text("PASS", style="green") + Text(f" {outcome.name}"))
                else:
                    failed += 1
                    out.print(Text("FAIL", style="red") + Text(f" {outcome.name}"))
                    for line in outcome.failures:
                        out.print(f"  - {line}")
    if failed:
        raise typer.Exit(1)


def _print_timeline(outcome) -> None:
    table = Table(title=outcome.name, title_justify="left")
    for col in ("job", "class", "gpus", "submit", "starts (t@placement)", "end", "state", "preempted", "waited (from-to reason)"):
        table.add_column(col)
    for rec in outcome.result.records.values():
        starts = "; ".join(f"{t:g}@{p}" for t, p in rec.starts)
        waits = "; ".join(f"{a:g}-{'' if b is None else f'{b:g}'} {r}" for a, b, r in rec.reasons if b is None or b > a)
        if rec.rejected:
            waits = f"rejected: {rec.rejected}"
        table.add_row(rec.spec.id, rec.spec.workload_class, str(rec.spec.gpus), f"{rec.spec.submit_time:g}", starts,
                      "-" if rec.end is None else f"{rec.end:g}", rec.state,
                      ",".join(f"{t:g}" for t in rec.preempted_at), waits)
    out.print(table)


from gpushepherd.cli import daemon as _daemon_cli  # noqa: E402  (needs app, _console, _errors above)
from gpushepherd.cli import demo as _demo_cli  # noqa: E402

_daemon_cli.register(app)
_demo_cli.register(app)
from gpushepherd.cli import report as _report_cli  # noqa: E402

_report_cli.register(app)

from gpushepherd.cli import db as _db_cli  # noqa: E402

_db_cli.register(app)

from gpushepherd.cli import policy as _policy_cli  # noqa: E402

_policy_cli.register(policy_app)

from gpushepherd.cli import services as _services_cli  # noqa: E402

_services_cli.register(app)

from gpushepherd.cli import sbatch as _sbatch_cli  # noqa: E402

_sbatch_cli.register(app)

from gpushepherd.cli import interactive as _interactive_cli  # noqa: E402

_interactive_cli.register(app)

if __name__ == "__main__":  # pragma: no cover
    run()
