"""The one grammar of points in time of the CLI and the API (design note 022).

Slurm's ``--begin`` / ``--deadline`` forms and ISO 8601, read against a given ``now``
(epoch seconds) in the local time zone of the process that reads them (the CLI's for
``submit``, the server's for a string sent to the API):

* ``YYYY-MM-DD[THH:MM[:SS]]`` (ISO 8601; ``Z`` or ``+HH:MM`` gives the zone, else local);
* ``HH:MM[:SS]``: that time today, or tomorrow once it has passed (Slurm's rule);
* ``now[+COUNT[UNIT]]``: ``UNIT`` seconds (the default), minutes, hours, days or weeks, in
  Slurm's words (``now+2hours``) or short (``now+2h``, ``now+90m``);
* ``today``, ``tomorrow`` (midnight starting them), ``midnight``, ``noon``, ``elevenses``
  (11:00), ``fika`` (15:00), ``teatime`` (16:00): the next such time, as Slurm's.

No typer here: errors are ``ValueError`` naming the value and the forms; callers add the
field or option name.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta

#: what an error or ``--help`` lists as the forms ``parse_time_point`` takes
FORMS = ("YYYY-MM-DD[THH:MM[:SS]] (ISO 8601, Z or +HH:MM for a zone, else local time), HH:MM[:SS] (the next such "
         "time), now+COUNT[seconds|minutes|hours|days|weeks] (now+2hours, now+90m), today, tomorrow, midnight, noon")
_UNITS = {"": 1.0, "s": 1.0, "sec": 1.0, "second": 1.0, "seconds": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0,
          "minutes": 60.0, "h": 3600.0, "hour": 3600.0, "hours": 3600.0, "d": 86400.0, "day": 86400.0,
          "days": 86400.0, "w": 604800.0, "week": 604800.0, "weeks": 604800.0}
_NOW = re.compile(r"now(?:\+(\d{1,9})([a-z]*))?")
_CLOCK = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2}))?")
_ISO = re.compile(r"\d{4}-\d{2}-\d{2}(?:[t ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?(?:z|[+-]\d{2}:?\d{2})?")
_WORD_HOURS = {"midnight": 0, "noon": 12, "elevenses": 11, "fika": 15, "teatime": 16}


def parse_time_point(text: str, now: float) -> float:
    """Epoch seconds of the time ``text`` names, ``now`` being epoch seconds.

    Raises:
        ValueError: a form not listed in ``FORMS``, or a field out of range (hour 24,
            month 13); the message names the value.
    """
    s = text.strip().lower()
    if len(s) > 64:
        raise ValueError(f"{text[:64]!r}... is not allowed: {FORMS}")
    if m := _NOW.fullmatch(s):
        count, unit = m[1], m[2] or ""
        if unit not in _UNITS:
            raise ValueError(f"{text!r} is not allowed: now+COUNT with a unit of seconds, minutes, hours, days, "
                             "weeks (or s, m, h, d, w)")
        return now + int(count or 0) * _UNITS[unit]
    local = datetime.fromtimestamp(now).astimezone()
    if s in ("today", "tomorrow"):
        day = local.replace(hour=0, minute=0, second=0, microsecond=0)
        return _wall(day + timedelta(days=1 if s == "tomorrow" else 0))
    if s in _WORD_HOURS:
        return _next(local, _WORD_HOURS[s], 0, 0)
    if m := _CLOCK.fullmatch(s):
        h, mi, sec = int(m[1]), int(m[2]), int(m[3] or 0)
        if h > 23 or mi > 59 or sec > 59:
            raise ValueError(f"{text!r} is not allowed: HH:MM[:SS] with hours < 24, minutes and seconds < 60")
        return _next(local, h, mi, sec)
    if _ISO.fullmatch(s):
        try:
            t = datetime.fromisoformat(text.strip().upper())
        except ValueError as exc:
            raise ValueError(f"{text!r} is not allowed: a real date and time ({exc})") from None
        return t.timestamp() if t.tzinfo is not None else _wall(t)
    raise ValueError(f"{text!r} is not allowed: {FORMS}")


def _wall(t: datetime) -> float:
    """Epoch seconds of a naive local wall-clock time (``mktime``'s rules at a DST change)."""
    return t.replace(tzinfo=None).timestamp()


def _next(local: datetime, h: int, mi: int, sec: int) -> float:
    """The next local time ``h:mi:sec`` at or after ``local`` (today, else tomorrow)."""
    t = local.replace(tzinfo=None, hour=h, minute=mi, second=sec, microsecond=0)
    if _wall(t) < local.timestamp():
        t += timedelta(days=1)
    return _wall(t)


def api_time_point(value, now_fn=None):
    """A JSON API time field's value (pydantic ``BeforeValidator``): a number is epoch
    seconds; a string of digits is too; any other string is read by ``parse_time_point``
    against the clock (``now_fn``, default ``time.time``). Anything else is left to the
    field's own checks.

    Raises:
        ValueError: a string ``parse_time_point`` refuses, or a number that is not finite.
    """
    import time

    if isinstance(value, str):
        s = value.strip()
        if re.fullmatch(r"\d{1,12}(?:\.\d+)?", s):
            return float(s)
        return parse_time_point(value, (now_fn or time.time)())
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value!r} is not allowed: a finite time (epoch seconds) or {FORMS}")
    return value
