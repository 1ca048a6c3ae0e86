"""Another team sees a service's state, replicas and signal, but not its replicas'
command, where its signal is scraped, nor the scrape's error (which names that
address): the fields a job hides from another team (note 023, "What another team sees";
the review of note 084 found ``GET /services`` showed them to any token). Its own team,
an admin and the user who made it see them whole (as a job's user does), and
``shepherd service show`` says which are hidden."""

from __future__ import annotations

import sys

import pytest
from builders import in_process_api
from test_auth import create_token

POLICY = """\
cluster:
  nodes:
    - {name: local, gpus: 2, gpu_type: FAKE, gpu_mem_mib: 16384}
teams:
  ml: {}
  data: {}
"""


@pytest.fixture
def api(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    tokens = {"ml": create_token(data, "--user", "ana", "--team", "ml"),
              "data": create_token(data, "--user", "bo", "--team", "data"),
              "admin": create_token(data, "--user", "root", "--admin"),
              "ana-moved": create_token(data, "--user", "ana", "--team", "data")}  # its maker, now in data
    with in_process_api(tmp_path, POLICY) as client:
        client.tokens = tokens
        yield client


def _as(api, who: str) -> dict:
    return {"Authorization": f"Bearer {api.tokens[who]}"}


def test_another_teams_token_sees_a_service_without_its_command_and_metrics_url(api, tmp_path):
    body = {"name": "web", "class": "production-inference", "team": "ml", "user": "ana", "gpus": 1,
            "command": [sys.executable, "-c", "pass"], "cwd": str(tmp_path), "min_replicas": 0, "max_replicas": 1,
            "metric": "queue_length", "metrics_url": "http://127.0.0.1:9/metrics", "scale_up_above": 10,
            "scale_down_below": 2}
    r = api.post("/services", json=body, headers=_as(api, "ml"))
    assert r.status_code in (200, 201), r.text
    for who in ("ml", "admin", "ana-moved"):  # its team, an admin, the user who made it
        v = api.get("/services/web", headers=_as(api, who)).json()
        assert v["command"] == body["command"] and v["metrics_url"] == body["metrics_url"] and "hidden" not in v
    other = api.get("/services/web", headers=_as(api, "data")).json()
    assert (other["command"], other["metrics_url"], other["error"]) == (None, None, None)
    assert other["hidden"] == ["command", "metrics_url", "error"]
    assert other["team"] == "ml" and other["metric"] == "queue_length" and other["max_replicas"] == 1
    listed, = api.get("/services", headers=_as(api, "data")).json()
    assert listed["command"] is None and listed["hidden"] == ["command", "metrics_url", "error"]
    assert api.get("/services", headers=_as(api, "ml")).json()[0]["command"] == body["command"]
    assert api.get("/services").status_code == 401  # the database has tokens: none is no one
