"""The one grammar of points in time (``gpushepherd.timepoints``, design note 022):
Slurm's ``--deadline`` / ``--begin`` forms and ISO 8601, read in the local zone."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

from gpushepherd.timepoints import api_time_point, parse_time_point


@pytest.fixture
def berlin(monkeypatch):
    """The local zone is Europe/Berlin (UTC+1 in January) for the test."""
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


#: 2030-01-15 10:30:00 in Berlin (09:30 UTC)
NOW = datetime(2030, 1, 15, 9, 30, tzinfo=timezone.utc).timestamp()


def utc(*args) -> float:
    return datetime(*args, tzinfo=timezone.utc).timestamp()


@pytest.mark.parametrize("text, expected", [
    ("now", NOW), ("now+60", NOW + 60), ("now+2hours", NOW + 7200), ("now+90m", NOW + 5400),
    ("now+1day", NOW + 86400), ("NOW+1WEEK", NOW + 7 * 86400),
    ("18:00", utc(2030, 1, 15, 17, 0)),  # later today, local time
    ("09:00:30", utc(2030, 1, 16, 8, 0, 30)),  # passed today: tomorrow (Slurm's rule)
    ("today", utc(2030, 1, 14, 23, 0)), ("tomorrow", utc(2030, 1, 15, 23, 0)),
    ("midnight", utc(2030, 1, 15, 23, 0)), ("noon", utc(2030, 1, 15, 11, 0)), ("teatime", utc(2030, 1, 15, 15, 0)),
    ("2030-06-01T18:00", utc(2030, 6, 1, 16, 0)),  # naive: local (summer time there)
    ("2030-06-01", utc(2030, 5, 31, 22, 0)),
    ("2030-06-01T18:00:00Z", utc(2030, 6, 1, 18, 0)), ("2030-06-01t18:00z", utc(2030, 6, 1, 18, 0)),
    ("2030-06-01 18:00+02:00", utc(2030, 6, 1, 16, 0)),
])
def test_each_form_is_the_time_it_names(berlin, text, expected):
    assert parse_time_point(text, NOW) == expected


@pytest.mark.parametrize("text, needle", [
    ("soon", "'soon' is not allowed: YYYY-MM-DD"), ("now+3parsecs", "a unit of seconds, minutes"),
    ("25:00", "hours < 24"), ("12:60", "minutes and seconds < 60"), ("2030-13-01", "a real date and time"),
    ("2030-02-30T00:00", "a real date and time"), ("x" * 100, "is not allowed"), ("now-1h", "is not allowed"),
])
def test_a_bad_time_is_refused_naming_it(text, needle):
    with pytest.raises(ValueError, match="is not allowed") as exc:
        parse_time_point(text, NOW)
    assert needle in str(exc.value)


def test_the_api_takes_epoch_numbers_and_digit_strings_as_they_are():
    assert api_time_point(1_900_000_000) == 1_900_000_000
    assert api_time_point("1900000000") == 1_900_000_000.0
    assert api_time_point("now+1h", now_fn=lambda: NOW) == NOW + 3600
    with pytest.raises(ValueError, match="a finite time"):
        api_time_point(float("inf"))
