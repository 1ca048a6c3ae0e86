"""Local time for time windows: the scheduler's seconds -> weekday and time of day.

A ``Clock`` is data handed to the core with the policy: a time zone (IANA name, DST
included, via ``zoneinfo``) and the Unix time of the scheduler's ``t = 0``. It reads no
system clock; the same ``t`` always gives the same local time.

Local times that do not exist or exist twice (design note 003, "Window edges at a DST
change"; ISC/Vixie cron's rule): a wall time skipped by a change (the spring gap, e.g.
02:30 on the night Europe/Berlin goes from 02:00 to 03:00) happens at the change itself,
the first instant after the gap; a wall time that occurs twice (the autumn fold) happens
once, at its first occurrence. ``local``, ``open_window`` and ``next_boundary`` all follow
this rule, so a window opens and closes once per day it is due, never an hour or a day
late. To make that hold, ``local`` reads the wall time through the repeated interval's
second pass as standing still just before the interval's end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone
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
        """Whether the window is open at a local reading ``(weekday, second)`` as
        ``Clock.local`` gives it (its DST rule included: pass a clock's reading, not a
        wall time read elsewhere)."""
        if self.start < self.end:
            return weekday in self.days and self.start <= second < self.end
        return (weekday in self.days and second >= self.start) or ((weekday - 1) % 7 in self.days and second < self.end)


class Clock:
    """Maps scheduler seconds to local time in ``timezone``; ``t = 0`` is ``epoch``
    (Unix seconds; 0 means the scheduler's seconds are Unix time).

    A wall time in a DST gap happens at the change (the gap's end), one in a DST fold at
    its first occurrence (module docstring; design note 003)."""

    def __init__(self, timezone: str = "UTC", epoch: float = 0.0):
        self.timezone = timezone
        self.tz = ZoneInfo(timezone)
        self.epoch = float(epoch)
        self._edges: dict[tuple[int, float], float] = {}  # (day ordinal, second) -> Unix time

    @classmethod
    def starting(cls, timezone: str, local_start: str | None) -> "Clock":
        """A clock whose ``t = 0`` is the local wall time ``local_start`` (ISO 8601;
        ``None``: Unix time). A start without an offset that falls in a DST gap is the
        change itself; one in a fold is its first occurrence.

        Raises:
            ValueError: an unknown time zone or an unreadable start.
        """
        clock = cls(timezone)
        if local_start:
            start = datetime.fromisoformat(local_start)
            clock.epoch = start.timestamp() if start.tzinfo is not None else clock._unix(start)
        return clock

    # ------------------------------------------------------------ local time
    def local(self, t: float) -> tuple[int, float]:
        """``(weekday, seconds since local midnight)`` at scheduler time ``t`` (seconds);
        weekday 0 = Monday.

        The reading never goes back: through the second pass of a repeated interval
        (the fold, e.g. 02:00-03:00 when Europe/Berlin goes back from 03:00 to 02:00) it
        stands at the largest float before the interval's end, so every edge inside the
        fold has already happened (at its first occurrence) and the fold's end happens
        when the wall clock reaches it. A skipped interval is never read.
        """
        x = self.epoch + t
        whole = math.floor(x)
        d = datetime.fromtimestamp(whole, self.tz)
        if d.fold:  # second pass of a repeated interval: read just before its end
            day, second = self._fold_end(whole, d)
            return day.weekday(), math.nextafter(second, -math.inf)
        return d.weekday(), d.hour * 3600 + d.minute * 60 + d.second + (x - whole)

    def open_window(self, windows, t: float):
        """The first of ``windows`` open at scheduler time ``t``, or ``None``."""
        weekday, second = self.local(t)
        for w in windows:
            if w.open_at(weekday, second):
                return w
        return None

    # ------------------------------------------------------------ boundaries
    def edge_time(self, day: date, second: float) -> float:
        """The scheduler time at which local wall time ``second`` (seconds since
        midnight, 0-86400) of ``day`` happens: the instant itself if it exists once;
        the DST change (the first instant after the gap) if the change skips it; its
        first occurrence if the change repeats it."""
        return self._edge_unix(day, second) - self.epoch

    def next_boundary(self, seconds_of_day: tuple[float, ...], t: float) -> float | None:
        """The first scheduler time after ``t`` at which the local time of day reaches
        one of ``seconds_of_day`` (window starts and ends, seconds since midnight),
        under the gap/fold rule of ``edge_time``; ``None`` without any. It is > ``t``,
        and ``local`` read there has passed the edge (so a window changes there, not a
        float's width later)."""
        if not seconds_of_day:
            return None
        x = self.epoch + t
        day0 = self._reading_date(x)
        best = None
        for offset in (0, 1):  # the next day's edges all lie after t (the reading never goes back)
            day = day0 + timedelta(days=offset)
            for s in seconds_of_day:
                u = self._edge_unix(day, s)
                if u > x and (best is None or u < best):
                    best = u
            if best is not None:
                break
        if best is None:
            return None
        out = best - self.epoch
        while self.epoch + out < best:  # a fractional epoch: do not stop a rounding short of the edge
            out = math.nextafter(out, math.inf)
        return out

    # ------------------------------------------------------------ helpers
    def _edge_unix(self, day: date, second: float) -> float:
        """Unix time of ``edge_time`` (remembered: the core asks for the same edges at
        every wake-up; the memo is cleared when it grows past a few years of them)."""
        key = (day.toordinal(), second)
        u = self._edges.get(key)
        if u is None:
            if len(self._edges) >= 4096:
                self._edges.clear()
            u = self._edges[key] = self._unix(datetime.combine(day, time()) + timedelta(seconds=second))
        return u

    def _unix(self, wall: datetime) -> float:
        """Unix time of a naive local wall time under the gap/fold rule."""
        early = wall.replace(tzinfo=self.tz, fold=0).timestamp()
        late = wall.replace(tzinfo=self.tz, fold=1).timestamp()
        if late >= early:  # exists once (equal) or twice (fold=0 is the first occurrence)
            return early
        # in a gap: read with the offset after the change it is an instant before the
        # change, with the offset before it one after; the change lies in (late, early]
        return float(self._change_in(late, early))

    def _change_in(self, lo: float, hi: float) -> int:
        """The first Unix second in ``(lo, hi]`` at which the UTC offset differs from
        the one at ``lo`` (tz transitions fall on whole seconds)."""
        a, b = math.floor(lo), math.ceil(hi)
        before = self._offset(a)
        while b - a > 1:
            mid = (a + b) // 2
            if self._offset(mid) == before:
                a = mid
            else:
                b = mid
        return b

    def _offset(self, unix: float) -> timedelta:
        return datetime.fromtimestamp(unix, self.tz).utcoffset()

    def _fold_end(self, whole: int, d: datetime) -> tuple[date, float]:
        """For a Unix second in the second pass of a repeated interval (``d``: its local
        time, ``fold=1``): the interval's end as (day, seconds since that day's
        midnight), 86400 on the day before rather than 0."""
        first = d.replace(fold=0).utcoffset()
        shift = (first - d.utcoffset()).total_seconds()
        change = self._change_in(whole - shift, whole)  # where the wall clock went back
        end = datetime.fromtimestamp(change, timezone.utc).replace(tzinfo=None) + first
        second = (end - datetime.combine(end.date(), time())).total_seconds()
        if second == 0:
            return end.date() - timedelta(days=1), DAY
        return end.date(), second

    def _reading_date(self, x: float) -> date:
        """The local date ``local`` reads at Unix time ``x``."""
        whole = math.floor(x)
        d = datetime.fromtimestamp(whole, self.tz)
        return self._fold_end(whole, d)[0] if d.fold else d.date()
