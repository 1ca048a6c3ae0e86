"""Jobs the daemon keeps from the core until they may be scheduled: dependencies, begin
times and user holds, as Slurm's ``sbatch --dependency / --begin / --hold`` (design note
021). The reconcile loop (``gpushepherd.daemon.server``) hands a kept job to the core as
an ordinary submission, with its original submit time, once ``kept_reason`` is ``None``.

No I/O here: parsing, the record and its reason.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from gpushepherd.model.job import JobSpec
from gpushepherd.timepoints import FORMS as TIME_FORMS, api_time_point

#: dependency types (Slurm's sbatch(1) names); ``singleton`` takes no ids
DEP_KINDS = ("afterok", "afternotok", "afterany", "singleton")
DEPENDENCY_RULE = ("a comma list (all must hold) of afterok:ID[:ID...], afternotok:ID[:ID...], afterany:ID[:ID...] "
                   "or singleton")
BEGIN_RULE = f"epoch seconds, or {TIME_FORMS}"
_ID = re.compile(r"[0-9]+(?:_[0-9]+(?:\.[0-9]+)?)?")
#: final states that count as failed for ``afternotok`` (Slurm: any end but COMPLETED)
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "REJECTED")
#: reason codes of a kept job (Slurm's squeue reasons)
HELD, NEVER, DEPENDENCY, BEGIN, BAD = ("JobHeldUser", "DependencyNeverSatisfied", "Dependency", "BeginTime",
                                       "BadConstraints")


@dataclass(frozen=True, slots=True)
class Dep:
    """One dependency: ``kind`` (``DEP_KINDS``) on job ``ids`` (none for singleton)."""

    kind: str
    ids: tuple[str, ...] = ()

    def __str__(self) -> str:
        return self.kind if self.kind == "singleton" else f"{self.kind}:{':'.join(self.ids)}"


def parse_dependency(text: str) -> tuple[Dep, ...]:
    """The dependencies of Slurm's ``--dependency`` text (``afterok:5:6,singleton``).

    Raises:
        ValueError: naming the value and what is allowed (Slurm's ``?``, ``after``,
            ``aftercorr``, ``afterburstbuffer`` and ``+time`` are named as not supported).
    """
    s = text.strip()
    if not s:
        raise ValueError(f"{text!r} is not allowed: {DEPENDENCY_RULE}")
    if "?" in s:
        raise ValueError(f"{text!r} is not allowed: '?' (any of) is not supported, ',' (all of) only: "
                         f"{DEPENDENCY_RULE}")
    out = []
    for part in s.split(","):
        kind, _, rest = part.strip().partition(":")
        if kind == "singleton" and not rest:
            out.append(Dep("singleton"))
            continue
        if kind in ("after", "aftercorr", "afterburstbuffer"):
            raise ValueError(f"{part!r} is not allowed: {kind} is not supported; {DEPENDENCY_RULE}")
        if kind not in DEP_KINDS or kind == "singleton" or not rest:
            raise ValueError(f"{part!r} is not allowed: {DEPENDENCY_RULE}")
        ids = tuple(rest.split(":"))
        for i in ids:
            if "+" in i:
                raise ValueError(f"{part!r} is not allowed: a delay (+minutes) is not supported; {DEPENDENCY_RULE}")
            if not _ID.fullmatch(i):
                raise ValueError(f"{part!r} is not allowed: {i!r} is not a job id; {DEPENDENCY_RULE}")
        out.append(Dep(kind, ids))
    return tuple(out)


def parse_begin(value: float | str, now: float) -> float:
    """Epoch seconds of a ``--begin`` value at ``now`` (epoch seconds): ``BEGIN_RULE``. A
    number, or a string of digits, is epoch seconds; any other string is read by the one
    grammar of points in time (``gpushepherd.timepoints.parse_time_point``, note 022) in
    the local zone of this process (the server's, as slurmctld's).

    Raises:
        ValueError: naming the value and the allowed forms.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{value!r} is not allowed: {BEGIN_RULE}")
    if isinstance(value, (int, float)) and (not math.isfinite(value) or value < 0):
        raise ValueError(f"{value!r} is not allowed: {BEGIN_RULE}")
    return float(api_time_point(value, lambda: now))


def fmt_time(t: float) -> str:
    """``2025-06-01T10:00:00Z``: a begin time as a reason shows it (UTC)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


@dataclass
class Kept:
    """A job the daemon keeps from the core (note 021).

    Attributes:
        spec: its spec, id and submit time assigned.
        dependency: the ``--dependency`` text as given ('': none).
        begin: not before this, epoch seconds (``None``: no begin time).
        held: held by its user (``hold``; ``submit --hold``).
        state: ``PENDING``, or ``CANCELLED`` (cancelled while kept; never in the core).
        ended: when it was cancelled, epoch seconds.
        history: ``[t, from, to, reason]`` rows, as a job's history.
    """

    spec: JobSpec
    dependency: str = ""
    begin: float | None = None
    held: bool = False
    state: str = "PENDING"
    ended: float | None = None
    history: list = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def deps(self) -> tuple[Dep, ...]:
        return parse_dependency(self.dependency) if self.dependency else ()

    def changed(self, t: float, why: str, **changes) -> Kept:
        """A copy with ``changes`` and a history row at ``t`` saying ``why``."""
        new = replace(self, history=list(self.history), **changes)
        new.history.append([t, self.state, new.state, why])
        return new


def kept_to_dict(k: Kept, spec_to_dict: Callable) -> dict:
    """JSON-ready data of a kept job (the ``keep`` event's payload, a snapshot's entry)."""
    return {"spec": spec_to_dict(k.spec), "dependency": k.dependency, "begin": k.begin, "held": k.held,
            "state": k.state, "ended": k.ended, "history": k.history}


def kept_from_dict(d: dict, spec_from_dict: Callable) -> Kept:
    """The ``Kept`` of ``kept_to_dict``'s data."""
    return Kept(spec_from_dict(d["spec"]), dependency=d.get("dependency", ""), begin=d.get("begin"),
                held=bool(d.get("held")), state=d.get("state", "PENDING"), ended=d.get("ended"),
                history=list(d.get("history") or []))


def unmet(k: Kept, state_of: Callable[[str], str | None], busy: Callable[[str, str], bool]) -> tuple[list, list]:
    """``(never, waiting)``: the dependencies of ``k`` that can never hold now and those
    not yet met (both lists of ``Dep``, only the unmet ids kept). ``state_of``: a job's
    state (``None``: unknown, counted as waiting); ``busy(name, user)``: a job of that name
    and user is in the core and not ended (``singleton``)."""
    never, waiting = [], []
    for dep in k.deps:
        if dep.kind == "singleton":
            if busy(k.spec.name, k.spec.user):
                waiting.append(dep)
            continue
        bad, wait = [], []
        for i in dep.ids:
            st = state_of(i)
            if st not in ENDED:
                wait.append(i)
            elif (dep.kind == "afterok" and st != "COMPLETED") or (dep.kind == "afternotok" and st == "COMPLETED"):
                bad.append(i)
        if bad:
            never.append(Dep(dep.kind, tuple(bad)))
        if wait:
            waiting.append(Dep(dep.kind, tuple(wait)))
    return never, waiting


def kept_reason(k: Kept, now: float, state_of: Callable[[str], str | None],
                busy: Callable[[str, str], bool]) -> str | None:
    """Why ``k`` is kept from the core at ``now`` (Slurm's reason, the first that applies:
    ``JobHeldUser``, ``DependencyNeverSatisfied(...)``, ``Dependency(...)``,
    ``BeginTime(...)``), or ``None``: it may be handed to the core."""
    if k.held:
        return HELD
    never, waiting = unmet(k, state_of, busy)
    if never:
        return f"{NEVER}({','.join(map(str, never))})"
    if waiting:
        return f"{DEPENDENCY}({','.join(map(str, waiting))})"
    if k.begin is not None and k.begin > now:
        return f"{BEGIN}({fmt_time(k.begin)})"
    return None
