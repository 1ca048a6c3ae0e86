"""The report and what-if through the API (issue 18 point 8, design note 029):
``GET /report`` and ``POST /whatif`` scoped by the token's teams (an admin sees all),
the daily GPU-hours per team in the policy's zone, bad ranges and policies refused
naming the field. An in-process server (``Daemon`` + ``make_app`` under Starlette's
test client, as tests/test_queue.py) whose jobs really run and end."""

from __future__ import annotations

import sys
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
import yaml
from fastapi.testclient import TestClient
from test_queue import wait_for

ZONE = "Asia/Kolkata"
POLICY = f"""\
name: report-api
clock: {{timezone: {ZONE}}}
cluster:
  nodes:
    - {{name: local, gpus: 4, gpu_type: FAKE, gpu_mem_mib: 16384}}
classes:
  batch: {{grace_period_s: 1}}
teams:
  ml: {{nominal_gpus: 2}}
  cv: {{nominal_gpus: 2}}
pricing: {{currency: EUR, gpu_hour: {{FAKE: 2.0}}}}
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``(client, tokens)`` after three ml jobs (ana, bo) and two cv jobs (cy) ran and ended."""
    from gpushepherd.daemon.api import make_app
    from gpushepherd.daemon.server import Daemon

    tmp = tmp_path_factory.mktemp("report-api")
    policy = tmp / "policy.yaml"
    policy.write_text(POLICY)
    d = Daemon(tmp / "data", policy_path=policy, poll_s=0.05)
    tokens = {"ml": d.store.create_token("ana", ["ml"])[1], "cv": d.store.create_token("cy", ["cv"])[1],
              "admin": d.store.create_token("root", [], True)[1], "none": d.store.create_token("zed", [])[1]}
    d.start()
    try:
        with TestClient(make_app(d)) as client:
            ids = []
            for team, user, gpus in (("ml", "ana", 1), ("ml", "bo", 2), ("ml", "ana", 1), ("cv", "cy", 2),
                                     ("cv", "cy", 1)):
                body = {"class": "batch", "team": team, "user": user, "gpus": gpus, "project": f"p-{team}",
                        "command": [sys.executable, "-c", "import time; time.sleep(0.4)"], "cwd": str(tmp)}
                r = client.post("/jobs", json=body, headers=auth(tokens["admin"]))
                assert r.status_code == 201, r.text
                ids.append(r.json()["id"])
            wait_for("every job to end", lambda: all(
                client.get(f"/jobs/{j}", headers=auth(tokens["admin"])).json()["state"] == "COMPLETED"
                for j in ids), timeout=90)
            yield client, tokens
    finally:
        d.stop()


def auth(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def report(client, token, **params) -> dict:
    r = client.get("/report", params=params, headers=auth(token))
    assert r.status_code == 200, r.text
    return r.json()


def teams_of(rep: dict, table: str) -> set[str]:
    return {row["team"] for row in rep["tables"][table]}


def test_an_admin_sees_every_team_and_a_team_token_its_own_only(served):
    client, tokens = served
    full = report(client, tokens["admin"])
    assert full["scope"]["teams"] is None and full["timezone"] == ZONE and full["currency"] == "EUR"
    assert teams_of(full, "usage_by_team") == {"ml", "cv"}
    by_team = {r["team"]: r for r in full["tables"]["usage_by_team"]}
    assert by_team["ml"]["jobs"] == 3 and by_team["cv"]["jobs"] == 2
    assert by_team["ml"]["gpu_hours"] > 0 and by_team["cv"]["cost"] == pytest.approx(2.0 * by_team["cv"]["gpu_hours"],
                                                                                        rel=1e-4)
    assert {r["user"] for r in full["tables"]["usage_by_user"]} == {"ana", "bo", "cy"}
    assert "idle_gaps" in full["tables"] and "waits_by_class" in full["tables"]

    ml = report(client, tokens["ml"])
    assert ml["scope"]["teams"] == ["ml"]
    assert teams_of(ml, "usage_by_team") == {"ml"} and teams_of(ml, "usage_against_quota") == {"ml"}
    assert {r["user"] for r in ml["tables"]["usage_by_user"]} == {"ana", "bo"}  # cy is cv's
    assert {r["project"] for r in ml["tables"]["usage_by_project"]} == {"p-ml"}
    assert [r["submitted"] for r in ml["tables"]["waits_by_class"]] == [3]  # cv's two jobs are not counted
    assert "idle_gaps" not in ml["tables"]
    assert {r["team"]: r["gpu_hours"] for r in ml["tables"]["usage_by_team"]}["ml"] == \
        pytest.approx(by_team["ml"]["gpu_hours"], rel=1e-4)
    assert set(ml["daily"]["teams"]) == {"ml"}

    nobody = report(client, tokens["none"])  # a token of no team sees no team's figures
    assert nobody["scope"]["teams"] == [] and nobody["tables"]["usage_by_team"] == []
    assert nobody["daily"]["teams"] == {}


def test_the_daily_chart_is_per_team_per_day_of_the_policys_zone_and_adds_up(served):
    client, tokens = served
    rep = report(client, tokens["admin"])
    days, per_team = rep["daily"]["days"], rep["daily"]["teams"]
    z = ZoneInfo(ZONE)
    first = datetime.fromtimestamp(rep["start"], z).strftime("%Y-%m-%d")
    last = datetime.fromtimestamp(rep["end"], z).strftime("%Y-%m-%d")
    assert days[0] == first and days[-1] == last and days == sorted(set(days))
    by_team = {r["team"]: r["gpu_hours"] for r in rep["tables"]["usage_by_team"]}
    assert set(per_team) == set(by_team)
    for team, hours in per_team.items():
        assert len(hours) == len(days)
        assert sum(hours) == pytest.approx(by_team[team], rel=1e-3, abs=1e-6)


@pytest.mark.parametrize(("params", "field", "words"), [
    ({"from": "yesterday-ish"}, "from", "'yesterday-ish' is not allowed: an ISO date"),
    ({"to": "nan"}, "to", "NaN is not a time"),
    ({"from": "2000-01-01", "to": "2000-01-02"}, "from", "it must overlap the event log"),
    ({"from": "2999-01-01", "to": "2998-01-01"}, "from", "a time before 'to'"),
])
def test_a_bad_range_is_422_naming_the_field_and_the_value(served, params, field, words):
    client, tokens = served
    r = client.get("/report", params=params, headers=auth(tokens["admin"]))
    assert r.status_code == 422, r.text
    [d] = r.json()["detail"]
    assert d["loc"] == ["query", field] and words in d["msg"], d


def test_the_report_needs_a_token_once_the_server_has_tokens(served):
    client, _tokens = served
    assert client.get("/report").status_code == 401
    assert client.post("/whatif", json={"policy": {}}).status_code == 401


def test_whatif_puts_the_proposed_policy_beside_the_current_one_scoped(served):
    client, tokens = served
    proposed = yaml.safe_load(POLICY)
    proposed["cluster"]["nodes"][0]["gpus"] = 1  # one GPU: the 2-GPU jobs are rejected, the rest wait longer
    proposed["teams"] = {"ml": {}, "cv": {}}
    r = client.post("/whatif", json={"policy": proposed}, headers=auth(tokens["admin"]))
    assert r.status_code == 200, r.text
    out = r.json()
    rows = {(x["by"], x["group"]): x for x in out["rows"]}
    assert {("team", "ml"), ("team", "cv"), ("class", "batch")} <= set(rows)
    assert rows[("team", "ml")]["jobs"] == 3 and rows[("team", "ml")]["rejected_current"] == 0
    assert rows[("team", "ml")]["rejected_proposed"] == 1 and rows[("team", "cv")]["rejected_proposed"] == 1
    assert {x["team"] for x in out["rejected"]} == {"ml", "cv"}
    # the log's own figures beside the two simulated runs (note 040): what the report measures
    rep = client.get("/report", headers=auth(tokens["admin"])).json()
    for team in ("ml", "cv"):
        logged = next(x["gpu_hours"] for x in rep["tables"]["usage_by_team"] if x["team"] == team)
        assert rows[("team", team)]["gpu_hours_measured"] == pytest.approx(logged)
        assert rows[("team", team)]["rejected_measured"] == 0 and rows[("team", team)]["wait_mean_s_measured"] >= 0

    mine = client.post("/whatif", json={"policy": proposed}, headers=auth(tokens["cv"])).json()
    assert mine["scope"]["teams"] == ["cv"]
    assert [(x["by"], x["group"]) for x in mine["rows"]] == [("team", "cv")]
    assert {x["team"] for x in mine["rejected"]} == {"cv"}


def test_whatif_refuses_a_bad_policy_or_range_naming_the_field(served):
    client, tokens = served
    r = client.post("/whatif", json={"policy": {"name": "x", "cluster": {"nodes": "many"}}},
                    headers=auth(tokens["admin"]))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "policy"], r.text
    assert "cluster" in r.json()["detail"][0]["msg"]
    r = client.post("/whatif", json={"policy": yaml.safe_load(POLICY), "from": "soon"},
                    headers=auth(tokens["admin"]))
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "from"] and "'soon' is not allowed" in r.json()["detail"][0]["msg"]
    r = client.post("/whatif", json={"policy": yaml.safe_load(POLICY), "extra": 1}, headers=auth(tokens["admin"]))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "extra"], r.text


def test_whatif_takes_the_policy_as_text_too_and_names_a_yaml_error(served):
    client, tokens = served
    text = POLICY.replace("gpus: 4", "gpus: 1").replace("nominal_gpus: 2", "max_gpus: 1")
    r = client.post("/whatif", json={"policy_yaml": text}, headers=auth(tokens["ml"]))
    assert r.status_code == 200, r.text
    assert [(x["by"], x["group"], x["rejected_proposed"]) for x in r.json()["rows"]] == [("team", "ml", 1)]
    r = client.post("/whatif", json={"policy_yaml": "name: [unclosed"}, headers=auth(tokens["ml"]))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "policy_yaml"], r.text
    assert "not YAML at line 1" in r.json()["detail"][0]["msg"]
    r = client.post("/whatif", json={"policy_yaml": text, "policy": {}}, headers=auth(tokens["ml"]))
    assert r.status_code == 422 and "exactly one of policy" in r.text
