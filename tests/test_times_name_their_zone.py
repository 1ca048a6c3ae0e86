"""Times the CLI prints in this machine's local time name its zone (a newcomer read
``2026-12-07T10:20:00`` from a server in another zone and could not tell which): a
single time carries the abbreviation (``show``, ``policy show``/``history``, services),
a queue table names it once, in the header of its time columns (``EST. START (CET)``),
so the cells keep their widths at 80 columns."""

from __future__ import annotations

import time

from test_timepoints import berlin  # noqa: F401 (the fixture: the local zone is Europe/Berlin)

from gpushepherd.cli.daemon import _fmt_est, _fmt_t, queue_header, queue_table

JAN = 1_767_225_600.0  # 2026-01-01T00:00:00Z
JUL = 1_782_864_000.0  # 2026-07-01T00:00:00Z


def test_a_single_time_names_its_zone_and_its_summer_time(berlin):
    assert _fmt_t(JAN) == "2026-01-01T01:00:00 CET"
    assert _fmt_t(JUL) == "2026-07-01T02:00:00 CEST"
    assert _fmt_t(None) == "-"
    assert _fmt_est({"estimated_start": JAN, "estimated_start_basis": "time limits"}) == "<= 2026-01-01T01:00:00 CET"


def test_a_queue_table_names_the_zone_in_its_time_headers_not_in_each_cell(berlin):
    zone = time.strftime("%Z")
    assert queue_header("start") == f"EST. START ({zone})" and queue_header("submit") == f"SUBMIT ({zone})"
    assert queue_header("reason") == "REASON / PLACEMENT"
    job = {"id": "1", "state": "PENDING", "reason": "Resources", "estimated_start": JAN,
           "estimated_start_basis": "estimates", "submit_time": JUL}
    table, dropped = queue_table([job], ["id", "state", "reason", "start", "submit"], 120)
    assert dropped == []
    heads = [c.header for c in table.columns]
    cells = [str(next(iter(c.cells))) for c in table.columns]
    assert heads[3:] == [f"EST. START ({zone})", f"SUBMIT ({zone})"]
    assert cells[3:] == ["~ 2026-01-01T01:00:00", "2026-07-01T02:00:00"]
