"""Time windows at DST changes (issue 20, observation 13; design note 003, "Window edges at a
DST change"): an edge at a wall time the change skips happens at the change (the first
instant after the gap), one at a wall time the change repeats happens once, at its first
occurrence - in every zone, for ``Clock.local`` / ``open_window`` / ``next_boundary`` alike.

The zones: Europe/Berlin and America/New_York (1 h at 02:00 / 03:00), Australia/Lord_Howe
(a 30-minute shift), America/Santiago and Asia/Beirut (the change at midnight, so the gap
or fold crosses a day and a weekday).

The property tests compare the clock with an oracle written from the rule alone: an edge
at local wall time ``w`` happens at the first instant whose raw ``zoneinfo`` wall reading
is ``>= w`` (found by scanning minutes, not by the clock's bisection); window ``i`` is
open on ``[edge(day, start), edge(day or day + 1, end))`` for each day it starts on.
"""

from __future__ import annotations

from datetime import date, datetime, time, timedelta, timezone
from functools import lru_cache
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpushepherd.model.clock import Clock, Window

H = 3600.0
Q = 900.0  # a quarter hour
ALL = frozenset(range(7))
ZONES = ("Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "America/Santiago", "Asia/Beirut")
YEAR = 2026


def utc(s: str) -> float:
    return datetime.fromisoformat(s).replace(tzinfo=timezone.utc).timestamp()


# ------------------------------------------------------------------ the oracle
def wall(tz: ZoneInfo, unix: float) -> datetime:
    """The raw local wall reading (naive) at a Unix time: it jumps in a gap and goes back in a fold."""
    return datetime.fromtimestamp(unix, tz).replace(tzinfo=None)


@lru_cache(maxsize=None)
def oracle_edge(zone: str, day: date, second: float) -> float:
    """First Unix time whose wall reading is at or past ``second`` of ``day``."""
    tz = ZoneInfo(zone)
    w = datetime.combine(day, time()) + timedelta(seconds=second)
    cands = [u for u in (w.replace(tzinfo=tz, fold=f).timestamp() for f in (0, 1)) if wall(tz, u) == w]
    if cands:  # the wall time exists: its first occurrence
        return min(cands)
    u = w.replace(tzinfo=tz, fold=1).timestamp()  # in a gap: an instant before the change
    assert wall(tz, u) < w
    while wall(tz, u) < w:  # changes fall on whole minutes in these zones
        u += 60
    return u


def oracle_open(zone: str, windows: list[Window], unix: float) -> int | None:
    """Index of the first window open at ``unix`` under the rule (None: none)."""
    today = wall(ZoneInfo(zone), unix).date()
    for i, w in enumerate(windows):
        for back in (2, 1, 0):
            d = today - timedelta(days=back)
            if d.weekday() not in w.days:
                continue
            end_day = d + timedelta(days=1) if w.start >= w.end else d
            if oracle_edge(zone, d, w.start) <= unix < oracle_edge(zone, end_day, w.end):
                return i
    return None


def oracle_next(zone: str, edges: tuple[float, ...], unix: float) -> float:
    today = wall(ZoneInfo(zone), unix).date()
    return min(u for back in range(-1, 3) for s in edges
               if (u := oracle_edge(zone, today + timedelta(days=back), s)) > unix)


@lru_cache(maxsize=None)
def changes(zone: str) -> tuple[float, ...]:
    """The zone's UTC-offset changes in YEAR (Unix seconds)."""
    tz = ZoneInfo(zone)
    off = lambda u: datetime.fromtimestamp(u, tz).utcoffset()  # noqa: E731
    out = []
    u, end = utc(f"{YEAR}-01-01T00:00:00"), utc(f"{YEAR + 1}-01-01T00:00:00")
    while u < end:
        if off(u) != off(u + 86400):
            a, b = u, u + 86400
            while b - a > 1:
                m = (a + b) // 2
                a, b = (m, b) if off(m) == off(a) else (a, m)
            out.append(b)
        u += 86400
    return tuple(out)


def special_quarters(zone: str) -> set[int]:
    """Quarter hours of the day (0-96) from a quarter before to a quarter after each gap
    and fold of the zone in YEAR."""
    tz = ZoneInfo(zone)
    out = set()
    for u in changes(zone):
        a, b = sorted((wall(tz, u - 1) + timedelta(seconds=1), wall(tz, u)))  # the skipped or repeated wall times
        w = a - timedelta(seconds=Q)
        while w <= b + timedelta(seconds=Q):
            q = round((w - datetime.combine(w.date(), time())).total_seconds() / Q)
            out |= {q, 96} if q == 0 else {q}
            w += timedelta(seconds=Q)
    return out


def index(clock: Clock, windows: list[Window], t: float) -> int | None:
    w = clock.open_window(windows, t)
    return None if w is None else windows.index(w)


# ------------------------------------------------------------------ examples
@pytest.mark.parametrize("zone, day, hhmm, expected", [
    # spring gaps: at the change, the first instant after the gap
    ("Europe/Berlin", "2026-03-29", "02:30", "2026-03-29T01:00:00"),
    ("Europe/Berlin", "2026-03-29", "02:00", "2026-03-29T01:00:00"),   # the gap's first wall time
    ("Europe/Berlin", "2026-03-29", "03:00", "2026-03-29T01:00:00"),   # the first wall time after it
    ("Europe/Berlin", "2026-03-29", "01:45", "2026-03-29T00:45:00"),
    ("America/New_York", "2026-03-08", "02:30", "2026-03-08T07:00:00"),
    ("Australia/Lord_Howe", "2026-10-04", "02:15", "2026-10-03T15:30:00"),  # 02:00-02:30 skipped
    ("America/Santiago", "2026-09-06", "00:00", "2026-09-06T04:00:00"),  # midnight does not exist
    ("America/Santiago", "2026-09-06", "00:45", "2026-09-06T04:00:00"),
    ("Asia/Beirut", "2026-03-29", "00:30", "2026-03-28T22:00:00"),
    # autumn folds: the first occurrence
    ("Europe/Berlin", "2026-10-25", "02:30", "2026-10-25T00:30:00"),
    ("Europe/Berlin", "2026-10-25", "02:00", "2026-10-25T00:00:00"),   # the fold's first wall time
    ("Europe/Berlin", "2026-10-25", "03:00", "2026-10-25T02:00:00"),   # exists once: after both passes
    ("America/New_York", "2026-11-01", "01:30", "2026-11-01T05:30:00"),
    ("Australia/Lord_Howe", "2026-04-05", "01:45", "2026-04-04T14:45:00"),  # 01:30-02:00 twice
    ("America/Santiago", "2026-04-04", "23:30", "2026-04-05T02:30:00"),  # Saturday 23:00-24:00 twice
    ("America/Santiago", "2026-04-05", "00:00", "2026-04-05T04:00:00"),
    ("Asia/Beirut", "2026-10-24", "23:00", "2026-10-24T20:00:00"),
])
def test_an_edge_in_a_gap_is_the_change_and_in_a_fold_its_first_occurrence(zone, day, hhmm, expected):
    clock = Clock(zone)
    h, m = hhmm.split(":")
    second = int(h) * H + int(m) * 60
    d = date.fromisoformat(day)
    assert clock.edge_time(d, second) == utc(expected)
    assert clock.edge_time(d, second) == oracle_edge(zone, d, second)
    # the core's wake-up lands there, from any earlier moment that day
    assert clock.next_boundary((second,), utc(expected) - 5 * H) == utc(expected)
    assert clock.next_boundary((second,), utc(expected) - 1) == utc(expected)


def open_spans(clock: Clock, windows: list[Window], t0: float, t1: float) -> list[tuple[float, float]]:
    """[(from, to)] the first window is open, walking the boundaries from t0 to t1."""
    spans, t, since = [], t0, (t0 if index(clock, windows, t0) == 0 else None)
    edges = tuple(sorted({w.start % 86400 for w in windows} | {w.end % 86400 for w in windows}))
    while t < t1:
        t = clock.next_boundary(edges, t)
        now_open = index(clock, windows, t) == 0
        if now_open and since is None:
            since = t
        elif not now_open and since is not None:
            spans.append((since, t))
            since = None
    return spans


def test_berlin_0230_to_0600_opens_at_three_in_spring_and_once_in_autumn():
    clock = Clock("Europe/Berlin")
    w = [Window("night", ALL, 2.5 * H, 6 * H)]
    # spring: 02:30 does not exist; the window opens at 03:00 CEST (01:00 UTC), not 03:30
    assert open_spans(clock, w, utc("2026-03-28T12:00:00"), utc("2026-03-29T12:00:00")) == [
        (utc("2026-03-29T01:00:00"), utc("2026-03-29T04:00:00"))]
    # autumn: opens at the first 02:30 (CEST), stays open through the repeated hour, closes at 06:00 CET
    assert open_spans(clock, w, utc("2026-10-24T12:00:00"), utc("2026-10-25T12:00:00")) == [
        (utc("2026-10-25T00:30:00"), utc("2026-10-25T05:00:00"))]
    # at 02:10 CET (second pass) it is open and the next boundary is 06:00 CET
    t = utc("2026-10-25T01:10:00")
    assert index(clock, w, t) == 0 and clock.next_boundary((2.5 * H, 6 * H), t) == utc("2026-10-25T05:00:00")


def test_a_window_closing_in_the_fold_closes_once_and_does_not_reopen():
    clock = Clock("Europe/Berlin")
    w = [Window("night", ALL, 22 * H, 2.5 * H)]
    spans = open_spans(clock, w, utc("2026-10-24T12:00:00"), utc("2026-10-25T23:00:00"))
    assert spans[0] == (utc("2026-10-24T20:00:00"), utc("2026-10-25T00:30:00"))  # 22:00 CEST - first 02:30
    assert spans[1][0] == utc("2026-10-25T21:00:00")  # next opening: Sunday 22:00 CET, not 02:00 CET
    for minute in range(0, 60, 5):  # the repeated hour's second pass reads closed throughout
        assert index(clock, w, utc("2026-10-25T01:00:00") + minute * 60) is None
    weekday, second = clock.local(utc("2026-10-25T01:10:00"))
    assert weekday == 6 and 3 * H - 1e-6 < second < 3 * H  # the reading stands just before 03:00


def test_a_window_inside_the_gap_never_opens_and_one_inside_the_fold_opens_once():
    clock = Clock("Europe/Berlin")
    w = [Window("x", ALL, 2 * H, 2.5 * H)]
    assert open_spans(clock, w, utc("2026-03-28T12:00:00"), utc("2026-03-29T12:00:00")) == []
    assert open_spans(clock, w, utc("2026-10-24T12:00:00"), utc("2026-10-25T12:00:00")) == [
        (utc("2026-10-25T00:00:00"), utc("2026-10-25T00:30:00"))]


def test_midnight_changes_keep_weekday_windows_on_their_day():
    # Santiago: Saturday 2026-04-04 23:00-24:00 happens twice; Sunday 2026-09-06 00:00-01:00 never
    clock = Clock("America/Santiago")
    sat = [Window("sat-late", frozenset({5}), 23.5 * H, 0.0)]  # Saturday 23:30 -> Sunday 00:00
    assert open_spans(clock, sat, utc("2026-04-04T12:00:00"), utc("2026-04-05T12:00:00")) == [
        (utc("2026-04-05T02:30:00"), utc("2026-04-05T04:00:00"))]  # first 23:30 (-03) to 00:00 (-04)
    weekday, second = clock.local(utc("2026-04-05T03:15:00"))  # 23:15 -04, second pass
    assert weekday == 5 and 86400 - 1e-6 < second < 86400
    sun = [Window("sun", frozenset({6}), 0.0, 6 * H)]
    assert open_spans(clock, sun, utc("2026-09-05T12:00:00"), utc("2026-09-06T23:00:00")) == [
        (utc("2026-09-06T04:00:00"), utc("2026-09-06T09:00:00"))]  # opens at 01:00 -03, the gap's end
    # Beirut: the Saturday window wrapping past the missing midnight closes at the change
    clock = Clock("Asia/Beirut")
    late = [Window("late", frozenset({5}), 22 * H, 0.5 * H)]
    assert open_spans(clock, late, utc("2026-03-28T12:00:00"), utc("2026-03-29T12:00:00")) == [
        (utc("2026-03-28T20:00:00"), utc("2026-03-28T22:00:00"))]


def test_a_start_in_a_gap_is_the_change_and_in_a_fold_its_first_occurrence():
    assert Clock.starting("Europe/Berlin", "2026-03-29T02:30:00").epoch == utc("2026-03-29T01:00:00")
    assert Clock.starting("Europe/Berlin", "2026-10-25T02:30:00").epoch == utc("2026-10-25T00:30:00")
    assert Clock.starting("Europe/Berlin", "2026-10-25T02:30:00+01:00").epoch == utc("2026-10-25T01:30:00")


# ------------------------------------------------------------------ properties
@st.composite
def cases(draw):
    zone = draw(st.sampled_from(ZONES))
    tz = ZoneInfo(zone)
    # quarter hours, two in three inside a gap or fold of the zone or a quarter hour either side
    special = sorted(special_quarters(zone))
    quarter = st.one_of(st.integers(0, 96), st.sampled_from(special), st.sampled_from(special))
    windows = []
    for i in range(draw(st.integers(1, 3))):
        days = frozenset(draw(st.sets(st.integers(0, 6), min_size=1, max_size=7)))
        start, end = draw(quarter) * Q, draw(quarter) * Q
        windows.append(Window(f"w{i}", days, start % 86400, end))
    start = draw(st.sampled_from([None, f"{YEAR}-01-01T00:00:00", f"{YEAR}-03-01T06:15:00.25"]))
    clock = Clock.starting(zone, start)
    near = draw(st.sampled_from(changes(zone)))
    before = st.floats(near - 26 * H, near)  # the day before a change: the next boundary may lie in it
    around = st.floats(near - 2 * H, near + 2 * H)  # in or next to the gap or fold
    unix = draw(st.one_of(
        st.floats(utc(f"{YEAR}-01-02T00:00:00"), utc(f"{YEAR}-12-30T00:00:00")),
        before, before, around, around,
        st.floats(near, near + H),  # in a fold's second pass
        st.integers(-8, 8).map(lambda k: near + k * Q),  # exactly at the change, and quarter hours around it
    ))
    return zone, clock, windows, unix - clock.epoch


@settings(max_examples=500, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_no_boundary_skipped_and_the_state_follows_the_rule(case):
    zone, clock, windows, t = case
    edges = tuple(sorted({w.start % 86400 for w in windows} | {w.end % 86400 for w in windows}))
    nb = clock.next_boundary(edges, t)
    assert nb is not None and nb > t
    # (b) an edge every day: never more than a day plus the largest DST shift (and an hour to spare)
    assert nb - t <= 26 * H
    # the boundary is the rule's next edge: none between t and it
    assert clock.epoch + nb == pytest.approx(oracle_next(zone, edges, clock.epoch + t), abs=1e-6)
    assert clock.epoch + nb >= oracle_next(zone, edges, clock.epoch + t)
    # (a) the open window is constant on [t, nb) (sampled, incl. just before nb) and is the rule's
    state = index(clock, windows, t)
    samples = [t + k * (nb - t) / 7 for k in range(7)] + [max(t, nb - 1e-3), max(t, nb - 1.0)]
    for u in changes(zone):  # and at, around and after each change in between (a fold's second pass)
        samples += [x for d in (-1e-3, 0.0, 600.0, 1800.0, 3599.0) if t <= (x := u - clock.epoch + d) < nb]
    for x in samples:
        assert index(clock, windows, x) == state, (zone, windows, t, x, nb)
        assert state == oracle_open(zone, windows, clock.epoch + x), (zone, windows, t, x)
    assert index(clock, windows, nb) == oracle_open(zone, windows, clock.epoch + nb)
    # the reading never goes back over [t, nb] (a weekday may roll over once)
    readings = [clock.local(x) for x in [t] + sorted(samples) + [nb]]
    for (d0, s0), (d1, s1) in zip(readings, readings[1:]):
        assert (d1 == d0 and s1 >= s0) or d1 == (d0 + 1) % 7, (zone, t, d0, s0, d1, s1)
    # (c) determinism: a fresh clock, asked in another order, answers the same
    again = Clock(clock.timezone, clock.epoch)
    assert again.local(nb) == clock.local(nb) and again.next_boundary(edges, t) == nb
    assert [index(again, windows, x) for x in reversed(samples)] == [state] * len(samples)


@settings(max_examples=60, derandomize=True, database=None, deadline=None)
@given(st.sampled_from(ZONES), st.sets(st.integers(0, 96), min_size=1, max_size=4))
def test_walking_a_year_of_boundaries_sees_each_edge_once_a_day(zone, quarters):
    """From Jan 1 to Dec 31, next_boundary steps through every day's edges in order: one
    instant per (day, edge) with distinct instants, except edges in one gap, which share
    the change's instant."""
    clock = Clock(zone)
    edges = tuple(sorted({q * Q % 86400 for q in quarters}))
    t, end = utc(f"{YEAR}-01-01T12:00:00"), utc(f"{YEAR}-12-31T00:00:00")
    seen = []
    while t < end:
        t = clock.next_boundary(edges, t)
        seen.append(t)
    expected = sorted({oracle_edge(zone, date(YEAR, 1, 1) + timedelta(days=n), s)
                       for n in range(1, 366) for s in edges} | {oracle_edge(zone, date(YEAR, 1, 1), s) for s in edges})
    expected = [u for u in expected if utc(f"{YEAR}-01-01T12:00:00") < u <= seen[-1]]
    assert seen == expected
    assert max(b - a for a, b in zip(seen, seen[1:])) <= 25 * H
