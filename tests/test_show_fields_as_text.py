"""`shepherd show` prints a job's fields as text, as `scontrol show job` does: no Python
reprs (a newcomer's test read `reason: None` and `command: ['sleep', '200']`)."""

from __future__ import annotations

from gpushepherd.cli.daemon import _shown


def test_no_value_reads_a_dash_and_the_command_reads_as_a_shell_line():
    j = {"reason": None, "command": ["sleep", "200"], "exit_code": 0, "project": "", "name": None,
         "failed_indices": [1, 3], "held": False, "runs": 2, "cwd": "/tmp/my dir"}
    assert _shown(j, "reason") == "-" and _shown(j, "project") == "-" and _shown(j, "name") == "-"
    assert _shown(j, "command") == "sleep 200" and _shown(j, "failed_indices") == "1,3"
    assert _shown(j, "exit_code") == 0 and _shown(j, "runs") == 2 and _shown(j, "held") == "no"
    assert _shown({"command": ["python", "-c", "print('a b')"]}, "command") == "python -c 'print('\"'\"'a b'\"'\"')'"
    assert _shown({"failed_indices": []}, "failed_indices") == "-"


def test_a_hidden_field_still_says_whose_it_is():
    assert _shown({"hidden": ["command"], "team": "vision", "command": None}, "command") == \
        "(hidden: a job of team vision, seen by its members and admins)"
