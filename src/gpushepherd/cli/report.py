"""``shepherd report`` (showback/chargeback, the weekly report) and ``shepherd whatif``
(a proposed policy on the store's own history), note 010. Both read the daemon's
database directly and only read it: they take no server lock and run beside a live
server."""

from __future__ import annotations

import math
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from gpushepherd.cli.daemon import path_param

WEEK_S = 7 * 86400.0
#: 9999-12-31T23:59:59 UTC, the last time ``--from`` / ``--to`` accept (epoch seconds)
LAST_TIME = datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc).timestamp()


def parse_since(text: str, option: str = "--since") -> float:
    """``7d``, ``36h``, ``90m``, ``2w``, ``600s`` or Slurm's ``D-HH:MM:SS`` forms -> seconds
    (``gpushepherd.durations``; a bare number is refused: it needs its unit).

    Raises:
        ValueError: anything else, naming ``option``, the value and what is allowed.
    """
    from gpushepherd.durations import parse_duration

    try:
        return parse_duration(text or "", bare=None, maximum=LAST_TIME)
    except ValueError as exc:
        raise ValueError(f"{option}: {exc}") from None


def parse_when(text: str, option: str, tz) -> float:
    """Epoch seconds from ``text``: a number (epoch seconds) or an ISO 8601 date or date
    and time (``2026-11-30``, ``2026-11-30T08:00``), local time of ``tz`` unless it
    names its offset.

    Raises:
        ValueError: naming ``option``, the value and what is allowed: NaN, infinities and
            times before 1970-01-01 or after 9999-12-31 (UTC) are refused too.
    """
    allowed = ("an ISO date or date-time (2026-11-30, 2026-11-30T08:00, local time of the policy's clock) "
               "or epoch seconds")
    try:
        t = float(text)
    except ValueError:
        try:
            d = datetime.fromisoformat(text.strip())
        except ValueError:
            raise ValueError(f"{option}: {text!r} is not allowed: {allowed}") from None
        try:
            t = (d.replace(tzinfo=tz) if d.tzinfo is None else d).timestamp()
        except (OverflowError, OSError, ValueError):  # year 1 on a machine clock: before 1970 anyway
            t = -1.0
    if math.isnan(t):
        raise ValueError(f"{option}: {text!r} is not allowed: NaN is not a time; {allowed}")
    if not 0.0 <= t <= LAST_TIME:
        raise ValueError(f"{option}: {text!r} is not allowed: a time from 1970-01-01 to 9999-12-31 ({allowed})")
    return t


def time_range(t_first: float, t_last: float, tz, *, week: bool = False, since: str | None = None,
               t_from: str | None = None, t_to: str | None = None) -> tuple[float, float]:
    """The range ``[from, to)`` the options ask for, epoch seconds. Default: the whole log
    (``to`` its last event: give ``build_report`` ``through_end`` then, so the jobs'
    events at it count).

    Raises:
        ValueError: options that do not go together, a bad value, ``from`` not before ``to``.
    """
    if week and since:
        raise ValueError("--week and --since are not allowed together: --week is --since 7d")
    if (week or since) and t_from is not None:
        raise ValueError("--from is not allowed with --week or --since (they count back from --to, or from "
                         "the last event)")
    end = parse_when(t_to, "--to", tz) if t_to is not None else t_last
    if week or since:
        return end - (WEEK_S if week else parse_since(since)), end
    start = parse_when(t_from, "--from", tz) if t_from is not None else t_first
    if not start < end and t_from is None and t_to is not None:  # --to alone, at or before the log's start
        first = datetime.fromtimestamp(t_first, tz).isoformat(timespec="seconds")
        raise ValueError(f"--to: {t_to!r} is not allowed: a time after the event log's first event ({first})")
    if not start < end:
        raise ValueError(f"--from: {t_from or start!r} is not allowed: a time before --to "
                         f"({t_to if t_to is not None else 'the last event'})")
    if end <= t_first or start > t_last:
        span = " to ".join(datetime.fromtimestamp(t, tz).isoformat(timespec="seconds") for t in (t_first, t_last))
        raise ValueError(f"--from/--to: the range is not allowed: it must overlap the event log ({span})")
    return start, end


def open_store(data_dir: Path, db: str | None):
    """The daemon's store, read only: refuses to create a database that is not there.

    Raises:
        ValueError: no database at ``--data-dir``.
    """
    from gpushepherd.daemon.store import Store

    if db is None:
        path = Path(data_dir) / "shepherd.db"
        if not path.is_file():
            raise ValueError(f"--data-dir: {str(data_dir)!r} is not allowed: a folder with a shepherd.db "
                             "(the server's --data-dir; a server's first start, or `shepherd db upgrade --data-dir DIR`, "
                             "creates it), or give --db URL")
        db = Store.sqlite_url(data_dir)
    return Store(db)


DataDir = Annotated[Path, typer.Option("--data-dir", help="The server's --data-dir (its SQLite database).", parser=path_param)]
Db = Annotated[Optional[str], typer.Option("--db", help="SQLAlchemy URL of the server's database "
                                           "(default: SQLite in --data-dir).")]
From = Annotated[Optional[str], typer.Option("--from", help="Start: ISO date/time (policy's time zone) or "
                                             "epoch seconds.")]
To = Annotated[Optional[str], typer.Option("--to", help="End (excluded); default: the last event (included).")]
Csv = Annotated[Optional[Path], typer.Option("--csv", metavar="DIR", help="Write one CSV per table here.", parser=path_param)]
Html = Annotated[Optional[str], typer.Option("--html", metavar="FILE", help="Write one self-contained HTML "
                                             "page with interactive plots (plotly, inlined: nothing fetched "
                                             "when viewed; needs the 'report' extra; its folder is made "
                                             "if missing, when the file is written).")]


def register(app: typer.Typer) -> None:
    """Add ``report`` and ``whatif`` to ``app``."""
    from gpushepherd.cli.main import UsageError, _console, _errors, _output_path, _write_atomically, err
    from gpushepherd.extras import require

    def load(data_dir: Path, db: str | None, bar=None):
        from gpushepherd.report import HistoryError, replay

        from sqlalchemy.exc import SQLAlchemyError

        from gpushepherd.cli.daemon import db_failure
        try:
            store = open_store(data_dir, db)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        except SQLAlchemyError as exc:
            raise UsageError(db_failure(data_dir, db, exc)) from None
        try:
            batches = store.batches()
            return replay(bar.track(batches, "reading the event log (batches)", store.last_batch) if bar else batches)
        except HistoryError as exc:
            raise UsageError(f"{store.display_url}: {exc}") from None
        finally:
            store.close()

    @app.command("report")
    def report(data_dir: DataDir = Path("shepherd-data"), db: Db = None,
               week: Annotated[bool, typer.Option("--week", help="The 7 days up to --to (default: the last "
                                                  "event).")] = False,
               t_from: From = None, t_to: To = None, csv: Csv = None, html: Html = None,
               progress: ProgressOpt = True) -> None:
        """Showback/chargeback: GPU-hours and cost per team, project, user and class, waits per
        class (p50/p95), top pending reasons, idle gaps, allocated-but-idle GPU-hours,
        utilisation and queue length over time (R15).

        Waits per class count the jobs submitted in the range: submitted = started (first
        started before the end, once each) + rejected + cancelled_before_start +
        still_pending (never started, pending at the end); requeued_pending: of started,
        those pending again at the end (preempted and requeued)."""
        with _errors():
            require("report", "shepherd report" + (" --html" if html else ""),
                    ("pandas", "plotly") if html else ("pandas",))
            from gpushepherd.report import build_report

            html_file = _output_path("--html", html, (".html", ".htm"))
            _check_csv(csv, UsageError)
            with _bar(progress) as bar:
                rp = load(data_dir, db, bar)
            clock = rp.rules.clock
            try:
                a, b = time_range(rp.t_first, rp.t_last, clock.tz if clock else None, week=week,
                                  t_from=t_from, t_to=t_to)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
            rep = build_report(rp.history(), a, b, title="gpushepherd report", through_end=t_to is None)
            emit(rep, csv, html_file)

    @app.command("whatif")
    def whatif(policy: Annotated[Path, typer.Option("--policy", metavar="FILE", help="The proposed policy.", parser=path_param)],
               data_dir: DataDir = Path("shepherd-data"), db: Db = None,
               since: Annotated[Optional[str], typer.Option("--since", metavar="DURATION",
                                                            help="Jobs submitted in this long up to --to, with "
                                                                 "its unit (7d, 36h, 90m, 2w) or as D-HH:MM; "
                                                                 "default 7d without --from.")] = None,
               t_from: From = None, t_to: To = None, csv: Csv = None,
               html: Annotated[Optional[str], typer.Option("--html", metavar="FILE", help=(
                   "Write the what-if page: per team and class measured (the log) beside the baseline "
                   "(simulated under the current policy) beside the proposed policy, as a table and "
                   "interactive plots; one self-contained file (needs the 'report' extra: plotly; its folder is made "
                   "if missing, when the file is written)."))] = None,
               html_current: Annotated[Optional[str], typer.Option("--html-current", metavar="FILE",
                                                                   help="The baseline run's report page (its folder is "
                                                                   "made if missing, when the file is written).")] = None,
               html_proposed: Annotated[Optional[str], typer.Option("--html-proposed", metavar="FILE",
                                                                    help="The proposed run's report page (its folder is "
                                                                    "made if missing, when the file is written).")] = None,
               progress: ProgressOpt = True) -> None:
        """Replay the jobs the store recorded through the simulator under the current
        policy (the log's last) and a proposed one; print per class and team waits
        (mean, p95), mean JCT and GPU-hours side by side (R19), and beside them what the
        log measured for the same jobs (how well the baseline reproduces it)."""
        from gpushepherd.policy.load import load_policy

        with _errors():
            require("report", "shepherd whatif" + (" --html" if html or html_current or html_proposed else ""),
                    ("pandas", "plotly") if html or html_current or html_proposed else ("pandas",))
            from gpushepherd.report import build_report
            from gpushepherd.report.whatif import run_whatif

            html_file = _output_path("--html", html, (".html", ".htm"))
            html_cur = _output_path("--html-current", html_current, (".html", ".htm"))
            html_prop = _output_path("--html-proposed", html_proposed, (".html", ".htm"))
            _check_csv(csv, UsageError)
            proposed = load_policy(policy)
            with _bar(progress) as bar:
                rp = load(data_dir, db, bar)
                clock = rp.rules.clock
                try:
                    a, b = time_range(rp.t_first, rp.t_last, clock.tz if clock else None,
                                      since=since or (None if t_from else "7d"), t_from=t_from, t_to=t_to)
                    wi = run_whatif(rp, proposed.rules, a, b, source=str(policy),
                                    record_reasons=html_cur is not None or html_prop is not None,
                                    progress=bar.replay if bar else None)
                except ValueError as exc:
                    if type(exc) is not ValueError:
                        raise
                    raise UsageError(str(exc)) from None
            out = _console()
            out.print(whatif_table(wi.table))
            out.print(baseline_table(wi.table))
            for line in rejected_lines(wi.rejected):
                out.print(line, markup=False, highlight=False)
            if wi.not_replayed:
                out.print(f"{len(wi.not_replayed)} job(s) of the range left out of both runs:", markup=False)
            for job_id, why in wi.not_replayed:
                out.print(f"  job {job_id}: not replayed: {why}", markup=False, highlight=False)
            out.print("wait = first start - submit; JCT = end - submit of jobs that ran to their end; both runs "
                      "are simulated from the log's jobs (note 010: what the baseline may not reproduce).")
            if csv is not None:
                csv.mkdir(parents=True, exist_ok=True)
                wi.table.to_csv(csv / "whatif.csv", index=False, lineterminator="\n")
                wi.rejected.to_csv(csv / "whatif_rejected.csv", index=False, lineterminator="\n")
                err.print(f"CSV files: {csv / 'whatif.csv'}, {csv / 'whatif_rejected.csv'}")
            if html_file is not None:
                from gpushepherd.report.interactive import whatif_page

                text = whatif_page(wi)
                _write_atomically(html_file, "--html", lambda p: p.write_text(text, encoding="utf-8"))
                err.print(f"HTML what-if: {html_file}")
            for which, path in (("proposed", html_prop), ("current", html_cur)):
                if path is not None:
                    res = wi.proposed if which == "proposed" else wi.current
                    rep = build_report(wi.history(which), a, max(b, res.t_last + 1),
                                       title=f"what-if, {which} policy")
                    emit(rep, None, path, tables=False)



def _h(v) -> str:
    """Seconds as ``_hours`` writes them, signed; ``-`` for none."""
    from gpushepherd.cli.main import _hours

    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else _hours(abs(v)) if v >= 0 else \
        "-" + _hours(-v)


def _gh(v) -> str:
    """GPU-hours to one decimal; ``-`` for none."""
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:,.1f}"


#: the figures of a what-if row and how the terminal writes them
FORMATS = (("wait_mean_s", _h), ("wait_p95_s", _h), ("jct_mean_s", _h), ("gpu_hours", _gh))


def _by_group(title: str, columns: tuple[str, ...], table, cells) -> Table:
    """A rich table of ``WhatIf.table``'s rows (one section per ``by``), each row's
    cells from ``cells(row)``."""
    out = Table(title=title, title_justify="left")
    for col in columns:
        out.add_column(col, justify="left" if col == "group" else "right")
    last = None
    for r in table.itertuples(index=False):
        if last is not None and r.by != last:
            out.add_section()
        last = r.by
        out.add_row(*cells(r))
    return out


def baseline_table(table) -> Table:
    """How well the baseline reproduces the log (note 040): per group, each figure as
    ``measured | baseline`` (``WhatIf.table``'s ``_measured`` and ``_current``)."""
    return _by_group("Baseline against the log: measured | simulated under the current policy",
                     ("group", "wait mean", "wait p95", "JCT mean", "GPU-hours"), table,
                     lambda r: [f"{r.by} {r.group}"] + [f"{fmt(getattr(r, f'{col}_measured'))} | "
                                                        f"{fmt(getattr(r, f'{col}_current'))}" for col, fmt in FORMATS])


def whatif_table(table) -> Table:
    """The side-by-side figures as a rich table: current -> proposed (change)."""

    def cells(r) -> list[str]:
        out = []
        for col, fmt in FORMATS:
            cur, new, chg = (getattr(r, f"{col}_{s}") for s in ("current", "proposed", "change"))
            sign = "+" if chg is not None and not math.isnan(chg) and chg > 0 else ""
            out.append(f"{fmt(cur)} -> {fmt(new)} ({sign}{fmt(chg)})")
        if r.rejected_current != r.rejected_proposed:  # review issue 10a: not a saving
            out[-1] += " *"
        return [f"{r.by} {r.group}", str(r.jobs), f"{r.rejected_current} -> {r.rejected_proposed}", *out]

    return _by_group("What-if: current policy -> proposed policy (change)",
                     ("group", "jobs", "rejected", "wait mean", "wait p95", "JCT mean", "GPU-hours"), table, cells)


def rejected_lines(rejected) -> list[str]:
    """The jobs a run rejected (``WhatIf.rejected``), one line each, after a line saying
    that they explain a change in GPU-hours marked ``*``; no lines when none."""
    if rejected is None or rejected.empty:
        return []
    lines = ["* the change in GPU-hours includes jobs a policy rejects (they could never run under it):"]
    for r in rejected.itertuples(index=False):
        lines.append(f"  rejected by the {r.run} policy: job {r.job_id} (class {r[2]}, team {r.team}, "
                     f"{r.gpus} GPUs): {r.reason}")
    return lines


ProgressOpt = Annotated[bool, typer.Option(help="Show a progress bar on a terminal.")]


@contextmanager
def _bar(show: bool):
    """A ``SimBar`` on stderr while ``show`` and stderr is a terminal, else ``None``."""
    from gpushepherd.cli.main import SimBar, err

    if not (show and err.is_terminal):
        yield None
        return
    with SimBar(err) as bar:
        yield bar


def emit(rep, csv: Path | None, html_file: Path | None, tables: bool = True) -> None:
    """Print ``rep``'s tables; write its CSV files and HTML page where asked."""
    from gpushepherd.cli.main import _console, _write_atomically, err
    from gpushepherd.report.render import html_page, rich_tables, write_csv

    if tables:
        out = _console()
        if rep.clipped:
            out.print(rep.clipped)
        for table in rich_tables(rep):
            out.print(table)
    if csv is not None:
        write_csv(rep, csv)
        err.print(f"CSV files: {csv}")
    if html_file is not None:
        page = html_page(rep)
        _write_atomically(html_file, "--html", lambda p: p.write_text(page, encoding="utf-8"))
        err.print(f"HTML report: {html_file}")


def simulation_page(result, html_file: Path, title: str) -> None:
    """The report page of a simulator run (``shepherd simulate --html``), over the run."""
    from gpushepherd.report import History, build_report

    hist = History.from_sim(result)
    # trace time: days from the trace's start, not 1970 dates (issue 18 point 10)
    emit(build_report(hist, hist.t_first, hist.t_last + 1.0, title=title, time_axis="days"), None, html_file,
         tables=False)


def _check_csv(csv: Path | None, error: type[Exception]) -> None:
    """Check ``--csv DIR`` before any work is done, as ``--html`` is: a folder, or a
    missing one whose nearest existing folder takes a new file (a file is created there
    and removed to see it: ``/proc``, a read-only file system, no write permission and a
    file where a folder should be are refused). The folder is made when the CSVs are
    written, never before."""
    if csv is None:
        return
    if csv.exists() and not csv.is_dir():
        raise error(f"--csv: {str(csv)!r} is not allowed: a folder (made if missing), not a file")
    from gpushepherd.cli.main import folder_refusal

    why = folder_refusal(csv)
    if why is not None:
        raise error(f"--csv: {str(csv)!r} is not allowed: {why}; a folder you can write to (made if missing)")
