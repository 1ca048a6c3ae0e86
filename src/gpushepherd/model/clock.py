"""Local time for time windows: the scheduler's seconds -> weekday and time of day.

A ``Clock`` is data handed to the core with the policy: a time zone (IANA name, DST
included, via ``zoneinfo``) and the Unix time of the scheduler's ``t = 0``. It reads no
system clock; the same ``t`` always gives the same local time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, time, timedelta
from zoneinfo import ZoneInfo

DAY = 86400.0
WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


@dataclass(frozen=True, slots=True)
class Window:
    """An interval of local time on some weekdays: ``[start, end)`` seconds of the day;
    ``start >= end`` wraps past midnight (the window belongs to the day it starts).

    Attributes:
        name: shown in reasons (``night``).
        days: weekdays it starts on, 0 = Monday.
        start, end: seconds since local midnight (``end`` may be 86400).
    """

    name: str
    days: frozenset[int]
    start: float
    end: float

    def open_at(self, weekday: int, second: float) -> bool:
        if self.start < self.end:
            return weekday in self.days and self.start <= second < self.end
        return (weekday in self.days and second >= self.start) or ((weekday - 1) % 7 in self.days and second < self.end)


class Clock:
    """Maps scheduler seconds to local time in ``timezone``; ``t = 0`` is ``epoch``
    (Unix seconds; 0 means the scheduler's seconds are Unix time)."""

    def __init__(self, timezone: str = "UTC", epoch: float = 0.0):
        self.timezone = timezone
        self.tz = ZoneInfo(timezone)
        self.epoch = float(epoch)

    @classmethod
    def starting(cls, timezone: str, local_start: str | None) -> "Clock":
        """A clock whose ``t = 0`` is the local wall time ``local_start`` (ISO 8601;
        ``None``: Unix time).

        Raises:
            ValueError: an unknown time zone or an unreadable start.
        """
        clock = cls(timezone)
        if local_start:
            start = datetime.fromisoformat(local_start)
            if start.tzinfo is None:
                start = start.replace(tzinfo=clock.tz)
            clock.epoch = start.timestamp()
        return clock

    def local(self, t: float) -> tuple[int, float]:
        """``(weekday, seconds since local midnight)`` at scheduler time ``t``."""
        d = datetime.fromtimestamp(self.epoch + t, self.tz)
        return d.weekday(), d.hour * 3600 + d.minute * 60 + d.second + d.microsecond / 1e6

    def open_window(self, windows, t: float):
        """The first of ``windows`` open at ``t``, or ``None``."""
        weekday, second = self.local(t)
        for w in windows:
            if w.open_at(weekday, second):
                return w
        return None

    def next_boundary(self, seconds_of_day: tuple[float, ...], t: float) -> float | None:
        """The first scheduler time after ``t`` whose local time of day is one of
        ``seconds_of_day`` (window starts and ends)."""
        if not seconds_of_day:
            return None
        day0 = datetime.fromtimestamp(self.epoch + t, self.tz).date()
        best = None
        for offset in range(0, 3):
            day = day0 + timedelta(days=offset)
            for s in seconds_of_day:
                local = datetime.combine(day, time(), tzinfo=self.tz) + timedelta(seconds=s)
                cand = local.timestamp() - self.epoch
                if cand > t + 1e-9 and (best is None or cand < best):
                    best = cand
            if best is not None:
                return best
        return best
