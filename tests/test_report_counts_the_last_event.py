"""``shepherd report`` (and ``GET /report``) without ``--to`` counts what happened at the
event log's last event: a range is ``[from, to)`` and the default ``to`` was the last
event itself, so a job cancelled (or ended) by it read as still pending (a newcomer:
cancel a job that cannot start, then ``shepherd report``: ``still_pending 2,
cancelled_before_start 0``; with ``--to`` one second later, 1 and 1). The default ``to``
is now just after the last event (``through_last``), and no "range clipped" line is
printed for it."""

from __future__ import annotations

import math

import pandas as pd
from test_report import MON, POLICY, drive, week_jobs
from typer.testing import CliRunner

from gpushepherd.cli.main import app
from gpushepherd.cli.report import through_last, time_range
from gpushepherd.daemon.store import Store
from gpushepherd.model.events import JobCancelled
from gpushepherd.model.job import JobSpec

END = MON + 7 * 86400  # after every other event of the week


def test_a_job_cancelled_at_the_last_event_is_cancelled_not_pending(tmp_path):
    stuck = JobSpec("stuck", "research", "training", 4, gpu_types=("H100-80GB",), submit_time=MON + 3 * 86400)
    store = Store(Store.sqlite_url(tmp_path))
    drive(store, POLICY, week_jobs() + [(stuck, 3600.0)], [JobCancelled(END, "stuck")])  # > max 3: waits
    store.close()
    res = CliRunner().invoke(app, ["report", "--data-dir", str(tmp_path), "--csv", str(tmp_path / "csv"),
                                   "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "range clipped" not in res.output
    waits = pd.read_csv(tmp_path / "csv" / "waits_by_class.csv").set_index("class")
    assert (waits.loc["training", "cancelled_before_start"], waits.loc["training", "still_pending"]) == (1, 0)


def test_the_default_range_ends_just_after_the_last_event():
    a, b = time_range(100.0, 5000.0, None)
    assert a == 100.0 and b == through_last(5000.0) == math.nextafter(5000.0, math.inf)
    assert time_range(100.0, 5000.0, None, t_to="4000")[1] == 4000.0  # a --to given stays as given
