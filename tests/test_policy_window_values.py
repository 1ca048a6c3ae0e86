"""Values of a policy's time windows and counts that were accepted and then read as
something else: ``days: []`` showed as Mon..Sun (an empty list meant every day),
``from: '24:00'`` was taken as a start, ``max_gpus: 10**30`` showed as "unlimited" in
``policy check`` and 1e+30 in ``/metrics``, and a window ``max_gpus`` below the team's
``nominal_gpus`` passed without a word where the team's own ``max_gpus`` below it is
refused. The first three are refused at intake naming their field (a policy already in
the event log replays as it was accepted, ``intake=False``). The last is allowed - the
one way to shrink a team's share for some hours, as ``nominal_gpus`` has no windows; the
core then reclaims no more than the window lets the team hold - and ``policy check``
notes it."""

from __future__ import annotations

import re

import pytest

import yaml
from typer.testing import CliRunner

from gpushepherd.cli.main import app
from gpushepherd.policy import policy_from_dict
from gpushepherd.policy.limits import MAX_COUNT
from gpushepherd.policy.load import PolicyError, window_notes


def _policy(team: dict, classes: dict | None = None) -> dict:
    return {"name": "windows", "cluster": {"nodes": [{"name": "n", "gpus": 8}]}, "teams": {"ml": team},
            **({"classes": classes} if classes else {})}


@pytest.mark.parametrize("team, field, allowed", [
    ({"windows": [{"days": [], "max_gpus": 6}]}, "teams.ml.windows[0].days", "omit days for every day"),
    ({"windows": [{"from": "24:00", "to": "08:00", "max_gpus": 6}]}, "teams.ml.windows[0].from", "00:00 to 23:59"),
    ({"windows": [{"max_gpus": 10**30}]}, "teams.ml.windows[0].max_gpus", f"at most {MAX_COUNT:,}"),
    ({"max_gpus": 10**30}, "teams.ml.max_gpus", f"at most {MAX_COUNT:,}"),
    ({"max_running_jobs": MAX_COUNT + 1}, "teams.ml.max_running_jobs", f"at most {MAX_COUNT:,}"),
    ({"classes": {"batch": {"max_gpus": 10**12}}}, "teams.ml.classes.batch.max_gpus", f"at most {MAX_COUNT:,}"),
])
def test_refused_naming_the_field(team, field, allowed):
    with pytest.raises(PolicyError, match=f"^<policy>: {re.escape(field)}: .* is not allowed: .*{re.escape(allowed)}"):
        policy_from_dict(_policy(team))


def test_a_class_window_count_is_bounded_too():
    classes = {"batch": {"priority": 1, "windows": [{"max_gpus_per_user": 10**30}]}}
    with pytest.raises(PolicyError, match=r"classes\.batch\.windows\[0\]\.max_gpus_per_user: .* at most"):
        policy_from_dict(_policy({}, classes))


def test_what_stays_allowed():
    for team in ({"windows": [{"from": "20:00", "to": "24:00", "max_gpus": 6}]},  # 24:00 as an end: midnight
                 {"windows": [{"max_gpus": 6}]},  # days omitted: every day
                 {"nominal_gpus": 3, "max_gpus": 6, "windows": [{"days": ["sat", "sun"], "max_gpus": 3}]},
                 {"max_gpus": MAX_COUNT}):
        policy_from_dict(_policy(team))


def test_a_logged_policy_replays_as_accepted():
    team = {"nominal_gpus": 3, "windows": [{"days": [], "from": "24:00", "to": "08:00", "max_gpus": 1}]}
    policy_from_dict(_policy(team), intake=False)


def test_policy_check_notes_a_team_window_below_its_nominal_quota(tmp_path):
    below = _policy({"nominal_gpus": 3, "windows": [{"days": ["sat"], "max_gpus": 1}]})
    assert window_notes(policy_from_dict(below).spec) == [
        "teams.ml.windows[0].max_gpus=1 is below the team's nominal_gpus (3): in that window it holds at most 1 "
        "GPU, the rest of its guarantee is lent or idle"]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(below))
    res = CliRunner().invoke(app, ["policy", "check", str(path)])
    assert res.exit_code == 0 and "note: teams.ml.windows[0].max_gpus=1 is below the team's nominal_gpus (3)" in \
        " ".join(res.output.split()), res.output
    assert window_notes(policy_from_dict(_policy({"nominal_gpus": 3, "windows": [{"max_gpus": 3}]})).spec) == []
