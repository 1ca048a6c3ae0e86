"""``shepherd report`` (and ``GET /report``) without ``--to`` counts what happened at the
event log's last event: a range is ``[from, to)`` and the default ``to`` was the last
event itself, so a job cancelled (or ended) by it read as still pending (a newcomer:
cancel a job that cannot start, then ``shepherd report``: ``still_pending 2,
cancelled_before_start 0``; with ``--to`` one second later, 1 and 1). The default ``to``
stays the last event, and the jobs' events at it count (``build_report``'s
``through_end``): no figure over time changes (an instant holds no time), no "range
clipped" line, no day after the last, no float noise in ``to``."""

from __future__ import annotations

import pandas as pd
from test_report import MON, POLICY, drive, week_jobs
from typer.testing import CliRunner

from gpushepherd.cli.main import app
from gpushepherd.cli.report import time_range
from gpushepherd.daemon.store import Store
from gpushepherd.model.events import JobCancelled
from gpushepherd.model.job import JobSpec
from gpushepherd.report import History, build_report

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


def test_the_jobs_events_at_the_end_count_and_nothing_else_changes(tmp_path):
    stuck = JobSpec("stuck", "research", "training", 4, gpu_types=("H100-80GB",), submit_time=MON + 3 * 86400)
    store = Store(Store.sqlite_url(tmp_path))
    drive(store, POLICY, week_jobs() + [(stuck, 3600.0)], [JobCancelled(END, "stuck")])
    hist = History.from_store(store)
    assert time_range(hist.t_first, hist.t_last, None) == (hist.t_first, hist.t_last) == (hist.t_first, END)
    open_end, through = (build_report(hist, hist.t_first, END, through_end=x) for x in (False, True))
    waits = [r.tables["waits_by_class"].set_index("class").loc["training"] for r in (open_end, through)]
    assert [(w["cancelled_before_start"], w["still_pending"]) for w in waits] == [(0, 1), (1, 0)]
    assert through.tables["usage_by_team"].equals(open_end.tables["usage_by_team"])
    assert through.clipped is None and (through.t_to, through.t_end) == (END, END)
