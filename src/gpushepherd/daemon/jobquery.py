"""Filters of ``GET /jobs`` and ``shepherd queue`` (design note 020), with squeue's
vocabulary: job states by our names or Slurm's (long or short: ``PD``, ``R``, ``CG``,
``CD``, ``F``, ``CA``, ``TO``), comma lists, and the job-name rule of ``submit -J``.
"""

from __future__ import annotations

import re

from gpushepherd.model.job import JobState, first_control_char

#: the longest job name, characters, and the characters allowed in one
MAX_JOB_NAME = 128
JOB_NAME = re.compile(rf"[A-Za-z0-9._+:@=-]{{1,{MAX_JOB_NAME}}}")
JOB_NAME_RULE = f"1-{MAX_JOB_NAME} letters, digits or . _ + - : @ = (no spaces, commas or slashes)"

_OURS = tuple(s.value for s in JobState)
#: Slurm's job state names and short forms (squeue(1), "JOB STATE CODES") -> ours.
#: COMPLETING (signalled, inside its grace period) is our PREEMPTING or STOPPING;
#: REJECTED has no Slurm name (``RJ`` is ours).
SLURM_STATES: dict[str, tuple[str, ...]] = {
    "PD": ("PENDING",), "R": ("RUNNING",), "CG": ("PREEMPTING", "STOPPING"), "COMPLETING": ("PREEMPTING", "STOPPING"),
    "PR": ("PREEMPTING",), "PREEMPTED": ("PREEMPTING",), "CD": ("COMPLETED",), "F": ("FAILED",),
    "CA": ("CANCELLED",), "TO": ("TIMEOUT",), "RJ": ("REJECTED",), "ALL": _OURS,
}
STATE_WORDS = ", ".join(list(_OURS) + [k for k in SLURM_STATES if k not in _OURS])


class QueryError(ValueError):
    """A filter value that is not allowed; ``field`` names the query parameter."""

    def __init__(self, field: str, msg: str):
        super().__init__(f"{field}: {msg}")
        self.field = field


def check_job_name(name: str) -> str:
    """``name`` if it is a job name (''  is none): ``JOB_NAME_RULE``.

    Raises:
        ValueError: naming the value and what is allowed.
    """
    if name and not JOB_NAME.fullmatch(name):
        raise ValueError(f"{name[:160]!r} is not allowed: {JOB_NAME_RULE}")
    return name


def split_list(field: str, text: str) -> list[str]:
    """The entries of a comma list (``ana,bo``), stripped.

    Raises:
        QueryError: an empty entry or one with a control character, naming ``field``.
    """
    items = [x.strip() for x in text.split(",")]
    for x in items:
        if not x:
            raise QueryError(field, f"{text!r} is not allowed: a comma list without empty entries")
        bad = first_control_char(x)
        if bad is not None:
            raise QueryError(field, f"{text!r} is not allowed: names without control characters (found {bad!r})")
    return items


def parse_states(text: str) -> set[str]:
    """Our states of a comma list of state names, ours or Slurm's, any case
    (``pd,R`` -> ``{PENDING, RUNNING}``; ``all``: every state).

    Raises:
        QueryError: an unknown state, naming it and listing the allowed ones.
    """
    out: set[str] = set()
    for word in split_list("state", text):
        up = word.upper()
        if up in _OURS:
            out.add(up)
        elif up in SLURM_STATES:
            out.update(SLURM_STATES[up])
        else:
            raise QueryError("state", f"{word!r} is not allowed: one of {STATE_WORDS} (a comma list)")
    return out


class JobFilter:
    """Which job views ``GET /jobs`` answers: each given filter must match (states,
    users, teams, names: any of the list). Built from the query's raw text.

    Raises:
        QueryError: from ``parse_states`` / ``split_list``, naming the field.
    """

    def __init__(self, state: str | None = None, user: str | None = None, team: str | None = None,
                 name: str | None = None):
        self.states = parse_states(state) if state is not None else None
        self.users = set(split_list("user", user)) if user is not None else None
        self.teams = set(split_list("team", team)) if team is not None else None
        self.names = set(split_list("name", name)) if name is not None else None

    def __call__(self, view: dict) -> bool:
        return self.match(view["state"], view.get)

    def match(self, state: str, field) -> bool:
        """Whether a job in ``state`` passes; ``field(name)`` gives its ``user``, ``team``
        and ``name``, asked only when a filter needs it (a page of ``GET /jobs`` looks at
        jobs without building their views, note 029)."""
        return ((self.states is None or state in self.states)
                and (self.users is None or field("user") in self.users)
                and (self.teams is None or field("team") in self.teams)
                and (self.names is None or (field("name") or "") in self.names))
