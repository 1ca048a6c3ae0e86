"""Trace readers: real GPU-cluster job traces -> ``TraceJob`` rows.

Formats:

* ``philly`` - the Microsoft Philly job list as flattened by RFold (Jeon et al., ATC'19;
  CC-BY-4.0): a ``#`` header line, then ``job id, arrival time (sec), topology, shape,
  size, duration (sec)``;
* ``itp`` - Microsoft ITP clusters (ElasticFlow, ASPLOS'23; MIT):
  ``job_id, submission_time, duration, num_gpu`` with a header; rows are not sorted;
* ``csv`` - any CSV with a header and a column mapping
  (``submit=col,gpus=col,duration=col[,id=col,team=col,class=col,user=col,project=col,
  deadline=col | deadline_after=col]``).

Deadlines (``csv`` only, design note 030): ``deadline=COL`` is an absolute time on the
trace's own clock, the clock of the ``submit`` column (seconds from the trace's start,
as ElasticFlow's ITP files give it);
``deadline_after=COL`` is seconds after the job's submit. An empty cell is no deadline.
A deadline not after its job's submit (a relative one not > 0), or not a number, makes
the row bad. Rows keep it relative (``TraceJob.deadline_after_s``), so ``--load``, which
moves submit times, keeps each job's slack.

Files ending in ``.gz`` are read compressed. Times are seconds from the trace's start.
A malformed row (a value out of range such as ``num_gpu=0``, a wrong column count, an
empty or repeated job id) makes the whole file refused: ``TraceError`` names the first
bad row (file, line, column, value, what is allowed) and counts the bad rows; nothing
of the file is used then. ``load_trace(..., skip_bad_rows=True)`` (``shepherd simulate
--skip-bad-rows``) skips them instead and returns them with the rows it kept. A file
that cannot be read at all (no such file, not CSV, a mapped column missing from the
header) is always refused.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from gpushepherd.model.job import first_control_char


class TraceError(ValueError):
    """A trace that cannot be read; ``str()`` is one line naming file, line, column and
    value. ``line``: the file's line of a bad row (``None``: not a row's error)."""

    def __init__(self, message: str, line: int | None = None):
        super().__init__(message)
        self.line = line


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace: submit time and duration in seconds, whole GPUs."""

    id: str
    submit: float
    gpus: int
    duration: float
    team: str | None = None
    workload_class: str | None = None
    user: str | None = None
    where: str = ""  # "FILE: line N", for error messages
    project: str = ""  # showback only (JobSpec.project); '': none
    deadline_after_s: float | None = None  # seconds after submit the job must be done by; None: no deadline
    line: int | None = None  # the file's line of the row (None: not from a file)


def _open(path: Path) -> io.TextIOBase:
    try:
        if path.suffix == ".gz":
            return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", newline="")
        return open(path, encoding="utf-8-sig", newline="")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror}") from None


@dataclass(frozen=True, slots=True)
class TraceFile:
    """What ``load_trace`` read: the valid rows and, one per skipped row, the error that
    row raised (in line order; empty unless bad rows were skipped)."""

    rows: list[TraceJob]
    skipped: tuple[TraceError, ...] = ()


class _Bad:
    """The bad rows of one file while it is read: ``(line, error)``."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, TraceError]] = []

    def add(self, lineno: int, exc: TraceError) -> None:
        if exc.line is None:
            exc.line = lineno
        self.rows.append((lineno, exc))

    def errors(self) -> tuple[TraceError, ...]:
        return tuple(e for _n, e in sorted(self.rows, key=lambda x: x[0]))


def _refuse(path: Path, bad: tuple[TraceError, ...]) -> None:
    """Raise for a file with bad rows: the first one, and how many there are."""
    if bad:
        n = len(bad)
        raise TraceError(f"{bad[0]} ({n:,} bad row{'' if n == 1 else 's'} in {path}, nothing of it is used; "
                         "--skip-bad-rows skips and counts them)")


def _rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    f = _open(path)
    try:
        for lineno, row in enumerate(csv.reader(f), start=1):
            yield lineno, row
    except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError, csv.Error) as exc:
        raise TraceError(f"{path}: not a readable CSV file: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    finally:
        f.close()


#: the largest time or GPU count a trace row may give (about 31 years in seconds)
MAX_VALUE = 1e9


def _num(path: Path, lineno: int, column: str, text: str, *, minimum: float = 0.0) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < minimum or value > MAX_VALUE:
        raise TraceError(f"{path}: line {lineno}: column {column!r}: {text[:40]!r} is not allowed: "
                         f"a number from {minimum:g} to {MAX_VALUE:g}")
    return value


def _gpus(path: Path, lineno: int, column: str, text: str) -> int:
    value = _num(path, lineno, column, text, minimum=1)
    if value != int(value):
        raise TraceError(f"{path}: line {lineno}: column {column!r}: {text!r} is not allowed: a whole number of GPUs >= 1")
    return int(value)


def read_philly(path: str | Path) -> list[TraceJob]:
    """Read the RFold Philly job list (``philly_trace.csv[.gz]``).

    Raises:
        TraceError: an unreadable file, or bad rows (the first, and their count).
    """
    return _strict(Path(path), _read_philly(Path(path)))


def _read_philly(path: Path) -> TraceFile:
    jobs: list[tuple[int, TraceJob]] = []
    bad = _Bad()
    header = ["job id", "arrival time (sec)", "topology", "shape", "size", "duration (sec)"]
    for lineno, row in _rows(path):
        if not row or (lineno == 1 and row[0].lstrip().startswith("#")):
            continue
        try:
            if len(row) != 6:
                raise TraceError(f"{path}: line {lineno}: {len(row)} columns is not allowed: 6 columns "
                                 f"({', '.join(header)})")
            jobs.append((lineno, TraceJob(
                id=row[0].strip(),
                submit=_num(path, lineno, header[1], row[1]),
                gpus=_gpus(path, lineno, header[4], row[4]),
                duration=_num(path, lineno, header[5], row[5]),
                where=f"{path}: line {lineno}",
                line=lineno,
            )))
        except TraceError as exc:
            bad.add(lineno, exc)
    return TraceFile(_check_ids(jobs, bad), bad.errors())


def _strict(path: Path, read: TraceFile) -> list[TraceJob]:
    _refuse(path, read.skipped)
    return read.rows


ITP_MAPPING = {"id": "job_id", "submit": "submission_time", "duration": "duration", "gpus": "num_gpu"}


def read_itp(path: str | Path) -> list[TraceJob]:
    """Read a raw ITP cluster file (``clusterNN.csv[.gz]``); rows are sorted by submit time."""
    return read_csv(path, ITP_MAPPING)


CSV_FIELDS = ("submit", "gpus", "duration", "id", "team", "class", "user", "project", "deadline", "deadline_after")


def parse_mapping(text: str) -> dict[str, str]:
    """``submit=ts,gpus=n,duration=d`` -> ``{"submit": "ts", ...}``.

    Raises:
        TraceError: an unknown field, a missing ``=`` or a missing required field.
    """
    mapping: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, col = part.partition("=")
        if not sep or not col:
            raise TraceError(f"--map: {part!r} is not allowed: FIELD=COLUMN")
        if key not in CSV_FIELDS:
            raise TraceError(f"--map: field {key!r} is not allowed: one of {', '.join(CSV_FIELDS)}")
        if key in mapping:
            raise TraceError(f"--map: field {key!r} is given twice: each field once")
        mapping[key] = col
    for key in ("submit", "gpus", "duration"):
        if key not in mapping:
            raise TraceError(f"--map: field {key!r} is missing: submit, gpus and duration are required")
    if "deadline" in mapping and "deadline_after" in mapping:
        raise TraceError("--map: deadline and deadline_after are not allowed together: deadline=COL (a time on the "
                         "submit column's clock) or deadline_after=COL (seconds after submit)")
    return mapping


def _deadline_after(path: Path, lineno: int, mapping: dict[str, str], text: str, submit: float) -> float | None:
    """A deadline cell as seconds after ``submit`` (``None``: an empty cell)."""
    text = text.strip()
    if not text:
        return None
    relative = "deadline_after" in mapping
    col = mapping["deadline_after" if relative else "deadline"]
    value = _num(path, lineno, col, text)
    after = value if relative else value - submit
    if not after > 0:
        allowed = "seconds > 0 after the job's submit" if relative else \
            f"a time after the job's submit ({submit:g}) on the submit column's clock"
        raise TraceError(f"{path}: line {lineno}: column {col!r}: {text[:40]!r} is not allowed: {allowed}")
    return after


def read_csv(path: str | Path, mapping: dict[str, str]) -> list[TraceJob]:
    """Read a CSV with a header; ``mapping`` names the column of each field (see
    ``CSV_FIELDS``). Without an ``id`` column the row number is the id.

    Raises:
        TraceError: an unreadable file, a mapped column the header lacks, or bad rows
            (the first, and their count).
    """
    return _strict(Path(path), _read_csv(Path(path), mapping))


def _read_csv(path: Path, mapping: dict[str, str]) -> TraceFile:
    rows = _rows(path)
    try:
        _, header = next(rows)
    except StopIteration:
        raise TraceError(f"{path}: empty file is not allowed: a CSV with a header line") from None
    names = [name.strip() for name in header]
    index = {name: i for i, name in enumerate(names)}
    for field, col in mapping.items():
        if col not in index:
            raise TraceError(f"{path}: line 1: column {col!r} (for {field}) is not allowed: one of the header's "
                             f"columns: {', '.join(index)}")
        at = [i + 1 for i, name in enumerate(names) if name == col]
        if len(at) > 1:  # which one is meant cannot be known: never the last one silently
            raise TraceError(f"{path}: line 1: column {col!r} (for {field}) is not allowed: the header names it "
                             f"{len(at)} times (columns {', '.join(map(str, at))}); a column the header names once")
    pos = {field: index[col] for field, col in mapping.items()}
    deadline_pos = pos.get("deadline", pos.get("deadline_after"))
    jobs: list[tuple[int, TraceJob]] = []
    bad = _Bad()
    for lineno, row in rows:
        if not row:
            continue
        try:
            if len(row) != len(header):
                raise TraceError(f"{path}: line {lineno}: {len(row)} columns is not allowed: {len(header)} columns "
                                 "as in the header")
            get = row.__getitem__
            submit = _num(path, lineno, mapping["submit"], get(pos["submit"]))
            jobs.append((lineno, TraceJob(
                id=get(pos["id"]).strip() if "id" in pos else str(lineno - 1),
                submit=submit,
                gpus=_gpus(path, lineno, mapping["gpus"], get(pos["gpus"])),
                duration=_num(path, lineno, mapping["duration"], get(pos["duration"])),
                team=get(pos["team"]).strip() or None if "team" in pos else None,
                workload_class=get(pos["class"]).strip() or None if "class" in pos else None,
                user=get(pos["user"]).strip() or None if "user" in pos else None,
                where=f"{path}: line {lineno}",
                line=lineno,
                project=_project(path, lineno, mapping["project"], get(pos["project"])) if "project" in pos else "",
                deadline_after_s=None if deadline_pos is None else
                _deadline_after(path, lineno, mapping, get(deadline_pos), submit),
            )))
        except TraceError as exc:
            bad.add(lineno, exc)
    kept = _check_ids(jobs, bad)
    kept.sort(key=lambda j: (j.submit, j.id))
    return TraceFile(kept, bad.errors())


def _project(path: Path, lineno: int, col: str, text: str) -> str:
    """A project cell: at most 255 characters, none a control character (as the API's names)."""
    text = text.strip()
    if first_control_char(text) is not None or len(text) > 255:
        raise TraceError(f"{path}: line {lineno}: column {col!r}: {text[:40]!r} is not allowed: a project of at most "
                         "255 characters without control characters")
    return text


def _check_ids(jobs: list[tuple[int, TraceJob]], bad: _Bad) -> list[TraceJob]:
    """The rows whose id is not empty and not seen on an earlier valid row; the others
    go to ``bad``."""
    seen: dict[str, str] = {}
    kept = []
    for lineno, j in jobs:
        if not j.id:
            bad.add(lineno, TraceError(f"{j.where}: an empty job id is not allowed: a non-empty id"))
        elif j.id in seen:
            bad.add(lineno, TraceError(f"{j.where}: job id {j.id[:40]!r} is not allowed: ids must be unique "
                                       f"(first at {seen[j.id].rsplit(': ', 1)[-1]})"))
        else:
            seen[j.id] = j.where
            kept.append(j)
    return kept


def read_trace(path: str | Path, fmt: str, mapping: str | None = None) -> list[TraceJob]:
    """Read ``path`` in format ``fmt`` (``philly``, ``itp`` or ``csv`` with ``mapping``).

    Raises:
        TraceError: see ``load_trace`` (without skipping bad rows).
    """
    return load_trace(path, fmt, mapping).rows


def load_trace(path: str | Path, fmt: str, mapping: str | None = None, skip_bad_rows: bool = False) -> TraceFile:
    """Read ``path`` in format ``fmt`` (``philly``, ``itp`` or ``csv`` with ``mapping``);
    with ``skip_bad_rows`` a bad row is left out and its error returned in
    ``TraceFile.skipped``.

    Raises:
        TraceError: an unknown format, a csv without a mapping, a file that cannot be
            read; bad rows unless ``skip_bad_rows`` (the first one named, all counted).
    """
    path = Path(path)
    if fmt == "philly":
        read = _read_philly(path)
    elif fmt in ("itp", "csv"):
        if fmt == "csv" and not mapping:
            raise TraceError("--format csv needs --map submit=COL,gpus=COL,duration=COL[,id=COL,team=COL,class=COL,"
                             "user=COL,project=COL,deadline=COL|deadline_after=COL]")
        read = _read_csv(path, ITP_MAPPING if fmt == "itp" else parse_mapping(mapping))
    else:
        raise TraceError(f"--format: {fmt!r} is not allowed: philly, itp or csv")
    if not skip_bad_rows:
        _refuse(path, read.skipped)
    return read


def select(jobs: list[TraceJob], days: tuple[float, float] | None = None, load: float = 1.0) -> list[TraceJob]:
    """Jobs submitted in ``[days[0], days[1])``, days counted from the trace's time
    origin (submit time 0: Philly's and ITP's start of collection), not from its first
    job - so ``40:70`` names the same jobs of a trace whatever was cut before them -
    with inter-arrival times divided by ``load`` (2.0 = twice the arrival rate) from the
    window's start. Submit times stay on the trace's axis."""
    if load <= 0 or not math.isfinite(load):
        raise TraceError(f"--load: {load!r} is not allowed: a number > 0")
    lo, hi = (days[0] * 86400.0, days[1] * 86400.0) if days else (-math.inf, math.inf)
    chosen = [j for j in jobs if lo <= j.submit < hi]
    if load != 1.0:
        base = lo if days else min((j.submit for j in chosen), default=0.0)
        chosen = [replace(j, submit=base + (j.submit - base) / load) for j in chosen]
        if any(not math.isfinite(j.submit) or j.submit > MAX_VALUE for j in chosen):
            raise TraceError(f"--load: {load!r} is not allowed: a factor that keeps submit times below {MAX_VALUE:g} s")
    return chosen


#: what ``--days`` means, for its help and its errors (``select``)
DAYS_MEANING = "days count from the trace's time origin (submit time 0), not from its first job"


def trace_days(jobs: list[TraceJob]) -> str:
    """The days the submit times of ``jobs`` span, rounded outwards to 0.1 day
    (``days 45.0-47.1``): what ``--days`` windows can select; ``no jobs`` if empty."""
    if not jobs:
        return "no jobs"
    lo = math.floor(min(j.submit for j in jobs) / 8640.0) / 10
    hi = math.ceil(max(j.submit for j in jobs) / 8640.0) / 10
    return f"days {lo:.1f}-{max(hi, lo + 0.1):.1f}"


def parse_days(text: str) -> tuple[float, float]:
    """``30`` -> (0, 30); ``40:70`` -> (40, 70): days from the trace's time origin
    (``select``)."""
    try:
        if ":" in text:
            a, b = text.split(":", 1)
            lo, hi = float(a), float(b)
        else:
            lo, hi = 0.0, float(text)
    except ValueError:
        raise TraceError(f"--days: {text!r} is not allowed: N (days 0 to N) or A:B (days A to B); "
                         f"{DAYS_MEANING}") from None
    if not (0 <= lo < hi) or not math.isfinite(hi):
        raise TraceError(f"--days: {text!r} is not allowed: 0 <= A < B")
    return lo, hi
