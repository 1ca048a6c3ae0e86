"""A ``project`` on every job (note 010, "A project on every job"): carried by the
core, never read by it; logged with the submit; reported per project.

Hand computation of the scripted week of ``test_report`` with projects set on some
jobs (prices: H100 2.50, A100 1.00 per GPU-hour):

* ``llm``: train1 (research, 2 H100 x 5 h = 10 GPU-h, 25.00) and inf0..inf2 (serving,
  1 H100 x 2 h each = 6 GPU-h, 15.00): 4 jobs, 16 GPU-h, 40.00 - one project, two teams
* ``etl``: b0..b7 (data, 1 H100 x 3 h each): 8 jobs, 24 GPU-h, 60.00
* ``-`` (no project): inf3..inf6 8 GPU-h (20.00), train2 8 GPU-h (20.00), nb1 half an
  A100 for 4 h = 2 GPU-h (2.00): 6 jobs, 18 GPU-h, 42.00
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import pytest
from sqlalchemy import select, update

from gpushepherd.daemon.store import Store, events, spec_from_dict, spec_to_dict
from gpushepherd.model.job import JobSpec
from gpushepherd.report import History, build_report, replay
from test_regressions_api import api, body, cli  # noqa: F401  (fixtures)
from test_report import MON, POLICY, _row, drive, week_jobs

PROJECTS = {"train1": "llm", "inf0": "llm", "inf1": "llm", "inf2": "llm", **{f"b{i}": "etl" for i in range(8)}}


def project_week() -> list[tuple[JobSpec, float]]:
    return [(dataclasses.replace(s, project=PROJECTS.get(s.id, "")), d) for s, d in week_jobs()]


def test_report_per_project_equals_the_hand_computation(tmp_path):
    hist = replay(drive(Store(Store.sqlite_url(tmp_path)), POLICY, project_week())).history()
    rep = build_report(hist, MON, MON + 7 * 86400)
    usage = rep.tables["usage_by_project"]
    assert list(usage["project"]) == ["-", "etl", "llm"]
    for project, (jobs, hours, cost) in {"llm": (4, 16.0, 40.0), "etl": (8, 24.0, 60.0),
                                         "-": (6, 18.0, 42.0)}.items():
        r = _row(usage, "project", project)
        assert (r["jobs"], r["gpu_hours"], r["cost"]) == (jobs, pytest.approx(hours), pytest.approx(cost)), project
    assert _row(usage, "project", "llm")["share_pct"] == pytest.approx(100 * 16 / 58)
    # the teams' figures are those of the week without projects: a project never moves GPU-hours between teams
    teams = rep.tables["usage_by_team"].set_index("team")["gpu_hours"].to_dict()
    assert teams == pytest.approx({"serving": 14.0, "research": 20.0, "data": 24.0})


def test_a_project_never_changes_a_decision(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    plain = replay(drive(Store(Store.sqlite_url(tmp_path / "a")), POLICY, week_jobs())).history()
    tagged = replay(drive(Store(Store.sqlite_url(tmp_path / "b")), POLICY, project_week())).history()
    assert plain.held.drop(columns="project").equals(tagged.held.drop(columns="project"))
    assert plain.jobs.equals(tagged.jobs)


def test_a_log_written_before_projects_replays_unchanged(tmp_path):
    (tmp_path / "new").mkdir()
    (tmp_path / "old").mkdir()
    for name in ("new", "old"):
        drive(Store(Store.sqlite_url(tmp_path / name)), POLICY, project_week())
    old = Store(Store.sqlite_url(tmp_path / "old"))
    with old.engine.begin() as c:  # rewrite each submit as a server before this change logged it
        rows = c.execute(select(events.c.seq, events.c.payload).where(events.c.kind == "submit")).all()
        assert rows and all("project" in json.loads(p) for _s, p in rows)
        for seq, payload in rows:
            d = json.loads(payload)
            del d["project"]
            c.execute(update(events).where(events.c.seq == seq).values(payload=json.dumps(d)))
    before = History.from_store(old)
    after = History.from_store(Store(Store.sqlite_url(tmp_path / "new")))
    assert before.jobs.equals(after.jobs)
    assert set(before.held["project"]) == {"-"}
    assert before.held.drop(columns="project").equals(after.held.drop(columns="project"))
    rep = build_report(before, MON, MON + 7 * 86400)
    assert list(rep.tables["usage_by_project"]["project"]) == ["-"]
    assert rep.tables["usage_by_project"]["gpu_hours"].sum() == pytest.approx(58.0)


def test_spec_round_trips_with_and_without_a_project():
    spec = JobSpec("j1", "ml", "batch", 1, user="ann", project="llm")
    assert spec_from_dict(json.loads(json.dumps(spec_to_dict(spec)))) == spec
    d = spec_to_dict(spec)
    del d["project"]
    assert spec_from_dict(d).project == ""


def _wait_state(client, job_id: str, states: tuple[str, ...]) -> dict:
    end = time.monotonic() + 30
    v = client.get(f"/jobs/{job_id}").json()
    while time.monotonic() < end and v["state"] not in states:
        time.sleep(0.05)
        v = client.get(f"/jobs/{job_id}").json()
    return v


def test_submit_with_a_project_over_the_api_and_its_array_children_carry_it(api, tmp_path):  # noqa: F811
    r = api.post("/jobs", json=body(tmp_path, project="llm-eval"))
    assert r.status_code == 201 and r.json()["project"] == "llm-eval"
    job_id = r.json()["id"]
    assert api.get(f"/jobs/{job_id}").json()["project"] == "llm-eval"
    assert api.daemon.sched.jobs[job_id].spec.project == "llm-eval"
    plain = api.post("/jobs", json=body(tmp_path)).json()
    assert plain["project"] == ""
    arr = api.post("/jobs", json=body(tmp_path, project="sweep", array="0-2")).json()
    assert arr["project"] == "sweep"
    v = _wait_state(api, arr["id"], ("COMPLETED", "FAILED"))
    kids = [j for ids in api.get(f"/jobs/{arr['id']}").json()["children"].values() for j in ids]
    assert len(kids) == 3 and v["state"] == "COMPLETED"
    assert {api.daemon.sched.jobs[k].spec.project for k in kids} == {"sweep"}


@pytest.mark.parametrize("value, needle", [("a\u001b[2J", "control characters"), ("p" * 256, "255")])
def test_a_bad_project_is_422_naming_the_field(api, tmp_path, value, needle):  # noqa: F811
    r = api.post("/jobs", json=body(tmp_path, project=value))
    assert r.status_code == 422
    d = r.json()["detail"][0]
    assert d["loc"][-1] == "project" and needle in d["msg"]
    assert api.get("/jobs").json() == []  # nothing half-applied


def test_cli_submit_with_a_project_and_show(cli, api, tmp_path):  # noqa: F811
    code, out, _ = cli("submit", "-c", "batch", "-A", "research", "-P", "llm", "-D", str(tmp_path), "--", "true")
    assert code == 0
    job_id = out.split()[-1]
    assert api.get(f"/jobs/{job_id}").json()["project"] == "llm"
    code, out, _ = cli("show", job_id)
    assert code == 0 and "project: llm" in out
    code, out, _ = cli("submit", "-c", "batch", "-A", "research", "-D", str(tmp_path), "--", "true")
    code, out, _ = cli("show", out.split()[-1])
    assert code == 0 and "project: -" in out


def test_cli_report_prints_and_writes_the_project_table(tmp_path):
    import pandas as pd
    from typer.testing import CliRunner

    from gpushepherd.cli.main import app

    (tmp_path / "data").mkdir()
    drive(Store(Store.sqlite_url(tmp_path / "data")), POLICY, project_week())
    res = CliRunner().invoke(app, ["report", "--data-dir", str(tmp_path / "data"), "--from", "2026-11-30",
                                   "--to", "2026-12-07", "--csv", str(tmp_path / "csv")])
    assert res.exit_code == 0, res.output
    assert "GPU-hours per project" in res.output
    df = pd.read_csv(tmp_path / "csv" / "usage_by_project.csv")
    assert df.set_index("project")["gpu_hours"].to_dict() == pytest.approx({"-": 18.0, "etl": 24.0, "llm": 16.0})
    assert df.set_index("project")["cost"].to_dict() == pytest.approx({"-": 42.0, "etl": 60.0, "llm": 40.0})


def test_service_replicas_carry_the_project(api, tmp_path):  # noqa: F811
    svc = {"name": "web", "class": "batch", "team": "research", "project": "chat", "gpus": 1,
           "command": [sys.executable, "-c", "pass"], "cwd": str(tmp_path), "min_replicas": 1, "max_replicas": 1,
           "metric": "queue_length", "scale_up_above": 10, "scale_down_below": 2}
    r = api.post("/services", json=svc)
    assert r.status_code == 201 and r.json()["project"] == "chat"
    end = time.monotonic() + 30
    while time.monotonic() < end and not any(j.startswith("web.") for j in api.daemon.sched.jobs):
        time.sleep(0.05)
    replicas = [job.spec for j, job in api.daemon.sched.jobs.items() if j.startswith("web.")]
    assert replicas and {s.project for s in replicas} == {"chat"}
