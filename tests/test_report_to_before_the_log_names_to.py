"""`shepherd report --to T` alone, with T at or before the log's first event, names
--to, its value and what is allowed. It said "--from: 1796636116.4958587 is not
allowed: a time before --to (2020-01-01)": an option that was not given, as raw epoch
seconds."""

import pytest
from typer.testing import CliRunner

from gpushepherd.cli.main import app
from test_report import week  # noqa: F401 (the fixture: a week of jobs in a store)


@pytest.mark.parametrize("to", ["2020-01-01", "2026-11-30T09:00:00"])
def test_to_alone_before_the_log_names_to(week, to):
    res = CliRunner().invoke(app, ["report", "--data-dir", str(week), "--no-progress", "--to", to])
    assert res.exit_code == 2, res.output
    assert " ".join(res.output.split()) == (f"error: --to: {to!r} is not allowed: a time after the event log's "
                                            "first event (2026-11-30T09:00:00+00:00)")


def test_from_after_to_still_names_from(week):
    res = CliRunner().invoke(app, ["report", "--data-dir", str(week), "--from", "2026-12-05", "--to", "2026-12-01"])
    assert res.exit_code == 2
    assert "--from: '2026-12-05' is not allowed: a time before --to (2026-12-01)" in " ".join(res.output.split())
