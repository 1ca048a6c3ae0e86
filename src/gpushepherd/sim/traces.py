"""Trace readers: real GPU-cluster job traces -> ``TraceJob`` rows.

Formats:

* ``philly`` - the Microsoft Philly job list as flattened by RFold (Jeon et al., ATC'19;
  CC-BY-4.0): a ``#`` header line, then ``job id, arrival time (sec), topology, shape,
  size, duration (sec)``;
* ``itp`` - Microsoft ITP clusters (ElasticFlow, ASPLOS'23; MIT):
  ``job_id, submission_time, duration, num_gpu`` with a header; rows are not sorted;
* ``csv`` - any CSV with a header and a column mapping
  (``submit=col,gpus=col,duration=col[,id=col,team=col,class=col,user=col,project=col]``).

Files ending in ``.gz`` are read compressed. Times are seconds from the trace's start.
A malformed row raises ``TraceError`` naming the file, line, column, value and what is
allowed; nothing of the file is used then.
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
    """A trace that cannot be read; ``str()`` is one line naming file, line, column and value."""


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


def _open(path: Path) -> io.TextIOBase:
    try:
        if path.suffix == ".gz":
            return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", newline="")
        return open(path, encoding="utf-8-sig", newline="")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror}") from None


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
    """Read the RFold Philly job list (``philly_trace.csv[.gz]``)."""
    path = Path(path)
    jobs: list[TraceJob] = []
    header = ["job id", "arrival time (sec)", "topology", "shape", "size", "duration (sec)"]
    for lineno, row in _rows(path):
        if not row or (lineno == 1 and row[0].lstrip().startswith("#")):
            continue
        if len(row) != 6:
            raise TraceError(f"{path}: line {lineno}: {len(row)} columns is not allowed: 6 columns ({', '.join(header)})")
        jobs.append(TraceJob(
            id=row[0].strip(),
            submit=_num(path, lineno, header[1], row[1]),
            gpus=_gpus(path, lineno, header[4], row[4]),
            duration=_num(path, lineno, header[5], row[5]),
            where=f"{path}: line {lineno}",
        ))
    _check_ids(path, jobs)
    return jobs


def read_itp(path: str | Path) -> list[TraceJob]:
    """Read a raw ITP cluster file (``clusterNN.csv[.gz]``); rows are sorted by submit time."""
    path = Path(path)
    return read_csv(path, {"id": "job_id", "submit": "submission_time", "duration": "duration", "gpus": "num_gpu"})


CSV_FIELDS = ("submit", "gpus", "duration", "id", "team", "class", "user", "project")


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
    return mapping


def read_csv(path: str | Path, mapping: dict[str, str]) -> list[TraceJob]:
    """Read a CSV with a header; ``mapping`` names the column of each field (see
    ``CSV_FIELDS``). Without an ``id`` column the row number is the id."""
    path = Path(path)
    rows = _rows(path)
    try:
        _, header = next(rows)
    except StopIteration:
        raise TraceError(f"{path}: empty file is not allowed: a CSV with a header line") from None
    index = {name.strip(): i for i, name in enumerate(header)}
    for field, col in mapping.items():
        if col not in index:
            raise TraceError(f"{path}: line 1: column {col!r} (for {field}) is not allowed: one of the header's "
                             f"columns: {', '.join(index)}")
    pos = {field: index[col] for field, col in mapping.items()}
    jobs = []
    for lineno, row in rows:
        if not row:
            continue
        if len(row) != len(header):
            raise TraceError(f"{path}: line {lineno}: {len(row)} columns is not allowed: {len(header)} columns as in the header")
        get = row.__getitem__
        jobs.append(TraceJob(
            id=get(pos["id"]).strip() if "id" in pos else str(lineno - 1),
            submit=_num(path, lineno, mapping["submit"], get(pos["submit"])),
            gpus=_gpus(path, lineno, mapping["gpus"], get(pos["gpus"])),
            duration=_num(path, lineno, mapping["duration"], get(pos["duration"])),
            team=get(pos["team"]).strip() or None if "team" in pos else None,
            workload_class=get(pos["class"]).strip() or None if "class" in pos else None,
            user=get(pos["user"]).strip() or None if "user" in pos else None,
            where=f"{path}: line {lineno}",
            project=_project(path, lineno, mapping["project"], get(pos["project"])) if "project" in pos else "",
        ))
    _check_ids(path, jobs)
    jobs.sort(key=lambda j: (j.submit, j.id))
    return jobs


def _project(path: Path, lineno: int, col: str, text: str) -> str:
    """A project cell: at most 255 characters, none a control character (as the API's names)."""
    text = text.strip()
    if first_control_char(text) is not None or len(text) > 255:
        raise TraceError(f"{path}: line {lineno}: column {col!r}: {text[:40]!r} is not allowed: a project of at most "
                         "255 characters without control characters")
    return text


def _check_ids(path: Path, jobs: list[TraceJob]) -> None:
    seen: dict[str, str] = {}
    for j in jobs:
        if not j.id:
            raise TraceError(f"{j.where}: an empty job id is not allowed: a non-empty id")
        if j.id in seen:
            raise TraceError(f"{j.where}: job id {j.id[:40]!r} is not allowed: ids must be unique "
                             f"(first at {seen[j.id].rsplit(': ', 1)[-1]})")
        seen[j.id] = j.where


def read_trace(path: str | Path, fmt: str, mapping: str | None = None) -> list[TraceJob]:
    """Read ``path`` in format ``fmt`` (``philly``, ``itp`` or ``csv`` with ``mapping``)."""
    if fmt == "philly":
        return read_philly(path)
    if fmt == "itp":
        return read_itp(path)
    if fmt == "csv":
        if not mapping:
            raise TraceError("--format csv needs --map submit=COL,gpus=COL,duration=COL[,id=COL,team=COL,class=COL,"
                             "user=COL,project=COL]")
        return read_csv(path, parse_mapping(mapping))
    raise TraceError(f"--format: {fmt!r} is not allowed: philly, itp or csv")


def select(jobs: list[TraceJob], days: tuple[float, float] | None = None, load: float = 1.0) -> list[TraceJob]:
    """Jobs submitted in ``[days[0], days[1])`` (days from the trace's start), with
    inter-arrival times divided by ``load`` (2.0 = twice the arrival rate) from the
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


def parse_days(text: str) -> tuple[float, float]:
    """``30`` -> (0, 30); ``40:70`` -> (40, 70)."""
    try:
        if ":" in text:
            a, b = text.split(":", 1)
            lo, hi = float(a), float(b)
        else:
            lo, hi = 0.0, float(text)
    except ValueError:
        raise TraceError(f"--days: {text!r} is not allowed: N (the first N days) or A:B (days A to B)") from None
    if not (0 <= lo < hi) or not math.isfinite(hi):
        raise TraceError(f"--days: {text!r} is not allowed: 0 <= A < B")
    return lo, hi
