"""`shepherd simulate --explain JOB` prints the policy clock's local wall time beside
the scheduler's seconds when the policy's day/night windows or its `clock.start` give
that time a meaning (a newcomer could not follow a night window in seconds since the
trace began); without either, the column is left out."""

from __future__ import annotations

from typer.testing import CliRunner

from gpushepherd.cli.main import app

POLICY = """\
cluster:
  nodes: [{name: n1, gpus: 8}]
teams:
  a: {max_gpus: 2, windows: [{from: "22:00", to: "06:00", max_gpus: 8}]}
clock: {timezone: Europe/Berlin, start: "2026-01-05T08:00:00"}
"""


def _explain(tmp_path, policy: str) -> str:
    (tmp_path / "p.yaml").write_text(policy)
    (tmp_path / "t.csv").write_text("job_id,submit,gpus,duration,team\nj1,0,4,100,a\n")
    r = CliRunner().invoke(app, ["simulate", "--no-progress", "--trace", str(tmp_path / "t.csv"), "--format", "csv",
                                 "--map", "submit=submit,gpus=gpus,duration=duration,team=team,id=job_id",
                                 "--policy", str(tmp_path / "p.yaml"), "--explain", "j1"],
                           env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    return r.output


def test_a_night_window_reads_in_local_time(tmp_path):
    out = _explain(tmp_path, POLICY)
    assert "local time (Europe/Berlin)" in out
    start = next(x for x in out.splitlines() if "placed on n1" in x)
    assert "50400" in start and "Mon 2026-01-05 22:00:00" in start  # the window opens at 22:00 Berlin time


def test_no_window_and_no_start_no_column(tmp_path):
    plain = "cluster:\n  nodes: [{name: n1, gpus: 8}]\nteams:\n  a: {max_gpus: 8}\n"
    out = _explain(tmp_path, plain)
    assert "local time" not in out and "placed on n1" in out
