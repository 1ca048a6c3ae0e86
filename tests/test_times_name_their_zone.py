"""Times the CLI prints in this machine's local time name its zone (a newcomer read
``2026-12-07T10:20:00`` from a server in another zone and could not tell which): a
single time carries the abbreviation (``show``, ``policy show``/``history``, services),
a queue column names it once, in its header (``EST. START (CET)``), when its times share
one zone (else each cell names its own: a DST change), so the cells keep their widths at
80 columns; a column without times keeps its plain header."""

from __future__ import annotations

from test_timepoints import berlin  # noqa: F401 (the fixture: the local zone is Europe/Berlin)

from gpushepherd.cli.daemon import _fmt_est, _fmt_t, queue_header, queue_table

JAN = 1_767_225_600.0  # 2026-01-01T00:00:00Z
JUL = 1_782_864_000.0  # 2026-07-01T00:00:00Z


def test_a_single_time_names_its_zone_and_its_summer_time(berlin):
    assert _fmt_t(JAN) == "2026-01-01T01:00:00 CET"
    assert _fmt_t(JUL) == "2026-07-01T02:00:00 CEST"
    assert _fmt_t(None) == "-"
    assert _fmt_est({"estimated_start": JAN, "estimated_start_basis": "time limits"}) == "<= 2026-01-01T01:00:00 CET"


def _table(jobs, fields, width=120):
    table, dropped = queue_table(jobs, fields, width)
    return dropped, [c.header for c in table.columns], [[str(x) for x in c.cells] for c in table.columns]


def test_a_queue_column_names_its_zone_once_when_its_times_share_it(berlin):
    jobs = [{"id": str(i), "state": "PENDING", "reason": "Resources", "estimated_start": JAN + i,
             "estimated_start_basis": "estimates", "submit_time": JAN} for i in (1, 2)]
    dropped, heads, cells = _table(jobs, ["id", "state", "reason", "start", "submit"])
    assert dropped == [] and heads[3:] == ["EST. START (CET)", "SUBMIT (CET)"]
    assert cells[3] == ["~ 2026-01-01T01:00:01", "~ 2026-01-01T01:00:02"] and cells[4] == ["2026-01-01T01:00:00"] * 2
    assert queue_header("reason", jobs) == "REASON / PLACEMENT"


def test_times_on_both_sides_of_a_dst_change_name_their_zone_in_each_cell(berlin):
    jobs = [{"id": "1", "state": "PENDING", "reason": "Resources", "submit_time": JAN},
            {"id": "2", "state": "PENDING", "reason": "Resources", "submit_time": JUL}]
    _dropped, heads, cells = _table(jobs, ["id", "state", "reason", "submit"])
    assert heads[3] == "SUBMIT" and cells[3] == ["2026-01-01T01:00:00 CET", "2026-07-01T02:00:00 CEST"]


def test_a_column_without_times_keeps_its_plain_header_and_width(berlin):
    running = [{"id": "1", "state": "RUNNING", "reason": None, "placement": "n1:0", "estimated_start": None}]
    _dropped, heads, cells = _table(running, ["id", "state", "reason", "start"])
    assert heads[3] == "EST. START" and cells[3] == ["-"]
