"""`shepherd report --csv DIR` and `whatif --csv DIR` check DIR before the log is
replayed, as --html is checked: a folder that takes no new file (under /proc, below a
file) is refused in one line naming --csv, the value and what is allowed. Only a DIR
that was an existing file was refused; any other ended in a traceback from mkdir after
the whole replay, with nothing written."""

import pytest
from typer.testing import CliRunner

from gpushepherd.cli.main import app
from test_report import week  # noqa: F401 (the fixture: a week of jobs in a store)


@pytest.mark.parametrize("command", [["report"], ["whatif", "--policy", "__POLICY__"]])
def test_a_csv_folder_below_a_file_is_refused_before_the_replay(week, tmp_path, command):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "p.yaml").write_text("cluster: {nodes: [{name: h, gpus: 4}]}\n")
    command = [str(tmp_path / "p.yaml") if a == "__POLICY__" else a for a in command]
    target = tmp_path / "afile" / "csv"
    res = CliRunner().invoke(app, [*command, "--data-dir", str(week), "--no-progress", "--csv", str(target)])
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    assert " ".join(res.output.split()) == (f"error: --csv: {str(target)!r} is not allowed: {str(tmp_path / 'afile')!r} "
                                            "is a file, not a folder; a folder you can write to (made if missing)")


def test_a_csv_folder_under_proc_is_refused(week):
    res = CliRunner().invoke(app, ["report", "--data-dir", str(week), "--no-progress", "--csv", "/proc/shepherd-x"])
    assert res.exit_code == 2, res.output
    assert "error: --csv: '/proc/shepherd-x' is not allowed: '/proc' takes no new file" in " ".join(res.output.split())
    assert not (week / "shepherd-x").exists()


def test_a_missing_csv_folder_is_made_when_written(week, tmp_path):
    target = tmp_path / "new" / "csv"
    res = CliRunner().invoke(app, ["report", "--data-dir", str(week), "--no-progress", "--csv", str(target)])
    assert res.exit_code == 0, res.output
    assert (target / "usage_by_team.csv").is_file()
