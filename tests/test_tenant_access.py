"""What newcomers found trying one server for several teams (issues 14 and 18, design
note 023): a class a team may never use is refused at submit. An in-process server
(``Daemon`` + ``make_app`` under Starlette's test client) on SQLite in a tmp data
directory; every job runs as the server's user (``SHEPHERD_RUN_AS=server``, conftest)."""

from __future__ import annotations

import sys

import pytest
from builders import in_process_api, route_cli_to

POLICY = """\
name: tenant-access
cluster:
  nodes:
    - {name: local, gpus: 8, gpu_type: FAKE, gpu_mem_mib: 16384}
classes:
  batch: {grace_period_s: 1, max_gpus: 2}
teams:
  data: {classes: {production-inference: {max_gpus: 0}}}
  ml: {allowed_classes: [training, batch]}
  ml-vision: {parent: ml}
  research: {}
"""


@pytest.fixture
def api(tmp_path):
    with in_process_api(tmp_path, POLICY) as client:
        yield client


def body(tmp_path, team: str, cls: str, **kw) -> dict:
    return {"class": cls, "team": team, "command": [sys.executable, "-c", "pass"], "cwd": str(tmp_path), **kw}


@pytest.mark.parametrize("team, cls, named", [
    ("data", "production-inference", "teams.data.classes.production-inference.max_gpus=0"),
    ("ml", "production-inference", "one of training, batch (teams.ml.allowed_classes"),
    ("ml-vision", "production-inference", "one of training, batch (teams.ml.allowed_classes"),  # the parent's list
])
def test_a_class_a_team_may_never_use_is_refused_at_submit_naming_the_policy_field(api, tmp_path, team, cls, named):
    r = api.post("/jobs", json=body(tmp_path, team, cls))
    assert r.status_code == 422, r.json()
    (entry,) = r.json()["detail"]
    assert entry["loc"] == ["body", "class"]
    assert entry["msg"].startswith(f"class: 'production-inference' is not allowed for team {team}: ")
    assert named in entry["msg"]
    assert api.get("/jobs", params={"all": "true"}).json() == []  # nothing queued


def test_the_classes_a_team_may_use_are_still_taken_and_a_limit_above_zero_still_queues(api, tmp_path):
    for team, cls in [("data", "batch"), ("ml", "training"), ("research", "production-inference")]:
        assert api.post("/jobs", json=body(tmp_path, team, cls)).status_code == 201, (team, cls)
    # too big for a limit that is not 0: still the pending ExceedsCapacity of note 007
    r = api.post("/jobs", json=body(tmp_path, "research", "batch", gpus=4))
    assert r.status_code == 201 and r.json()["reason"] == "ExceedsCapacity(classes.batch.max_gpus=2)"


def test_the_cli_says_why_a_closed_class_is_refused_and_exits_2(api, monkeypatch, tmp_path):
    cli = route_cli_to(api, monkeypatch)
    code, out, err = cli("submit", "-c", "production-inference", "-A", "data", "-D", str(tmp_path), "--", "true")
    assert code == 2 and "Submitted" not in out
    assert "is not allowed for team data: teams.data.classes.production-inference.max_gpus=0" in err
