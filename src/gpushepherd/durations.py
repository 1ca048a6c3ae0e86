"""The one duration grammar of the CLI and the API (design note 018).

Slurm's ``sbatch --time`` forms (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``,
``D-HH:MM:SS``) and a number with a unit (``30s``, ``10m``, ``2h``, ``1d``, ``2w``); what a
bare number means is the caller's (``bare``): minutes as in Slurm's ``--time``, seconds for
the options that always took seconds, or refused. No typer here: errors are ``ValueError``
naming the value and what is allowed; the CLI adds the option's name.
"""

from __future__ import annotations

import math
import re
from typing import Literal

#: the longest duration, seconds (10 years, as the API's ``MAX_SECONDS``)
MAX_SECONDS = 10 * 365 * 86400.0
UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
#: Slurm's words for no limit (``sbatch --time``: "INFINITE" or "UNLIMITED"), any case
UNLIMITED_WORDS = ("unlimited", "infinite")
Bare = Literal["minutes", "seconds"] | None

_NUM = r"\d+(?:\.\d+)?"
_UNIT = re.compile(rf"({_NUM})\s*([smhdw])")
_COLONS = re.compile(r"(\d+)(?::(\d{1,2}))?(?::(\d{1,2}))?")  # MM, MM:SS, HH:MM:SS
_DAYS = re.compile(r"(\d+)-(\d{1,2})(?::(\d{1,2}))?(?::(\d{1,2}))?")  # D-HH[:MM[:SS]]


def allowed_forms(bare: Bare = "minutes") -> str:
    """The forms ``parse_duration`` takes with ``bare``, as an error or ``--help`` says them."""
    first = {"minutes": "MINUTES, ", "seconds": "SECONDS, ", None: ""}[bare]
    return (f"{first}MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (Slurm's --time) or a number with a unit: "
            "30s, 10m, 2h, 1d, 2w")


def parse_duration(text: str, *, bare: Bare = "minutes", unlimited: bool = False, zero: bool = False,
                   maximum: float = MAX_SECONDS) -> float:
    """Seconds of a duration ``text``.

    Args:
        bare: what a number without a unit or colon means: ``"minutes"`` (Slurm's
            ``--time``), ``"seconds"``, or ``None`` (refused: a unit is needed).
        unlimited: ``UNLIMITED`` / ``INFINITE`` (any case) give ``math.inf``; else refused.
        zero: 0 is allowed (else a duration must be > 0).
        maximum: the longest allowed, seconds.

    Raises:
        ValueError: a form not listed by ``allowed_forms(bare)``, a field out of range
            (minutes and seconds after the first field < 60, hours after ``D-`` < 24), 0
            without ``zero``, more than ``maximum``; the message names the value.
    """
    s = text.strip()
    if len(s) > 40:  # no duration of at most 10 years needs more (and int() of 5,000 digits fails)
        raise ValueError(f"{text[:40]!r}... is not allowed: at most {_short(maximum)} ({allowed_forms(bare)})")
    if s.lower() in UNLIMITED_WORDS:
        if unlimited:
            return math.inf
        raise ValueError(f"{text!r} is not allowed here: a finite duration ({allowed_forms(bare)})")
    if bare is None and not zero and re.fullmatch(_NUM, s) and float(s) == 0:
        # a bare 0 with no unit: say what is wrong with it, not that a unit is missing
        raise ValueError(f"{text!r} is not allowed: a duration > 0 ({allowed_forms(bare)})")
    seconds = _seconds(text, s, bare)
    if seconds == 0 and not zero:
        raise ValueError(f"{text!r} is not allowed: a duration > 0 ({allowed_forms(bare)})")
    if seconds > maximum:
        raise ValueError(f"{text!r} is not allowed: at most {_short(maximum)}")
    return seconds


def _seconds(text: str, s: str, bare: Bare) -> float:
    if m := _UNIT.fullmatch(s):
        return float(m[1]) * UNITS[m[2]]
    if re.fullmatch(_NUM, s):
        if bare is None:
            raise ValueError(f"{text!r} is not allowed: give its unit ({s}s, {s}m, {s}h); a bare number is "
                             "not taken here")
        return float(s) * (60.0 if bare == "minutes" else 1.0)
    if m := _DAYS.fullmatch(s):
        days, hours, minutes, secs = (int(x or 0) for x in m.groups())
        if hours >= 24 or minutes >= 60 or secs >= 60:
            raise ValueError(f"{text!r} is not allowed: D-HH:MM:SS with hours < 24, minutes and seconds < 60")
        return days * 86400.0 + hours * 3600.0 + minutes * 60.0 + secs
    m = _COLONS.fullmatch(s)
    if m and m[2] is not None:
        first, *rest = (int(x) for x in m.groups() if x is not None)
        if any(x >= 60 for x in rest):
            raise ValueError(f"{text!r} is not allowed: minutes and seconds after the first field are < 60 "
                             "(MM:SS, HH:MM:SS)")
        total = float(first)
        for x in rest:
            total = total * 60 + x
        return total
    raise ValueError(f"{text!r} is not allowed: {allowed_forms(bare)}")


def _short(seconds: float) -> str:
    """``10 years``, ``300 s``, ``1 d``: a limit as an error names it."""
    if seconds >= 365 * 86400 and seconds % (365 * 86400) == 0:
        return f"{seconds / (365 * 86400):.0f} years"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:g} s"


def api_seconds(value):
    """A JSON API duration field's value (pydantic ``BeforeValidator``): a number is
    seconds, as it always was, and so is a string of digits (``"30"``: pydantic read it so
    before); any other string is read by ``parse_duration``: ``"2h"`` and ``"1-00:00"``
    are 7200 and 86400. Anything else is left to the field's own checks.

    Raises:
        ValueError: a string ``parse_duration`` refuses.
    """
    return parse_duration(value, bare="seconds") if isinstance(value, str) else value
