"""--days counts from the trace's time origin (submit time 0), not from its first job:
what bench/compare.py's presets ("Philly days 40-70" = --days 40:70) mean. --help and
the error of an empty window say so, and the error names the days the trace covers."""

import json
from pathlib import Path

from typer.testing import CliRunner

from gpushepherd.cli.main import app
from gpushepherd.sim.traces import TraceJob, select

runner = CliRunner()


def run(*args):
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_an_empty_window_names_the_origin_and_the_days_the_trace_covers():
    # the bundled excerpt is days 45-47 of Philly: --days 1 selects nothing; the error
    # said "counted from the trace's first job", which would have selected day 45
    res = run("simulate", "--no-progress", "--days", "1")
    assert res.exit_code == 2
    assert " ".join(res.output.split()) == (
        "error: no jobs to simulate: --days '1' selects none of the bundled Philly excerpt: days count from the "
        "trace's time origin (submit time 0), not from its first job, and the trace covers days 45.0-47.0")


def test_days_select_on_the_trace_s_own_axis(tmp_path):
    p = tmp_path / "t.csv"
    # first job at day 2.5; jobs at days 2.5, 3.25 and 4.0
    p.write_text("id,t,n,d\na,216000,1,50\nb,280800,1,50\nc,345600,1,50\n")
    common = ("simulate", "--no-progress", "--trace", str(p), "--format", "csv", "--map",
              "id=id,submit=t,gpus=n,duration=d")
    res = run(*common, "--days", "1")
    assert res.exit_code == 2 and "the trace covers days 2.5-4.0" in " ".join(res.output.split())
    for days, n in (("3", 1), ("3:4", 1), ("2:5", 3), ("4:4.5", 1)):
        res = run(*common, "--days", days, "--json", str(tmp_path / "s.json"))
        assert res.exit_code == 0, res.output
        assert json.loads((tmp_path / "s.json").read_text())["overall"]["jobs"] == n, days


def test_trace_days_rounds_outwards():
    from gpushepherd.sim.traces import trace_days

    jobs = [TraceJob("a", 45.04 * 86400, 1, 1.0), TraceJob("b", 47.01 * 86400, 1, 1.0)]
    assert trace_days(jobs) == "days 45.0-47.1"
    assert trace_days([]) == "no jobs"
    assert len(select(jobs, (45.0, 47.1))) == 2


def test_help_says_where_days_count_from():
    res = run("simulate", "--help")
    text = " ".join(res.output.split())
    assert "counted from its time origin (submit time 0" in text and "not from its first job" in text
    assert "counted from the trace's first job" not in text
