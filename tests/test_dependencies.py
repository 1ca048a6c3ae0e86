"""Dependencies, begin times, holds, requeue and update (issue 18 point 3, design note
021) on a real server: an in-process ``Daemon`` + ``make_app`` under Starlette's test
client, SQLite in a tmp data directory, real processes. Jobs wait for flag files, never
for time; a begin time is crossed with the daemon's clock shifted forward."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from builders import route_cli_to
from fastapi.testclient import TestClient
from test_daemon import wait_for

POLICY = """\
name: dependencies
cluster:
  nodes:
    - {name: local, gpus: 2, gpu_type: FAKE, gpu_mem_mib: 16384}
classes:
  batch: {grace_period_s: 1, max_runtime_s: 86400}
teams:
  research: {}
"""


class Api:
    """One server on ``tmp``; ``restart(snapshot)`` stops it (with its snapshot, or as a
    crash leaves it: only the log) and starts another on the same data directory."""

    def __init__(self, tmp: Path, tokens: bool = False):
        self.tmp, self.shift = tmp, [0.0]
        self.policy = tmp / "policy.yaml"
        self.policy.write_text(POLICY)
        self.tokens: dict[str, str] = {}
        self._tokens = tokens
        self._open()

    def _open(self):
        from gpushepherd.daemon.api import make_app
        from gpushepherd.daemon.server import Daemon

        self.d = Daemon(self.tmp / "data", policy_path=self.policy, poll_s=0.05,
                        clock=lambda: time.time() + self.shift[0])
        if self._tokens and not self.tokens:
            for user, admin in (("ana", False), ("bo", False), ("root", True)):
                self.tokens[user] = self.d.store.create_token(user, ["research"], admin)[1]
        self.d.start()
        self.client = TestClient(make_app(self.d))
        self.client.__enter__()

    def close(self, snapshot: bool = True):
        self.client.__exit__(None, None, None)
        if snapshot:
            self.d.stop()
        else:  # as a crash leaves it: no snapshot, only the log
            d = self.d
            d._stop.set()
            d.wake.set()
            d._thread.join(timeout=30)
            d.store.release_lock()
            d.store.close()
            d._unlock_data_dir()

    def restart(self, snapshot: bool = True):
        self.close(snapshot)
        self._open()

    def h(self, user: str | None) -> dict:
        return {"Authorization": f"Bearer {self.tokens[user]}"} if user else {}

    def submit(self, code: str = "pass", user: str | None = None, expect: int = 201, **kw) -> dict:
        body = {"class": "batch", "team": "research", "command": [sys.executable, "-c", code],
                "cwd": str(self.tmp), **({"user": user} if user and not self.tokens else {}), **kw}
        r = self.client.post("/jobs", json=body, headers=self.h(user if self.tokens else None))
        assert r.status_code == expect, r.text
        return r.json()

    def job(self, job_id: str) -> dict:
        return self.client.get(f"/jobs/{job_id}", headers=self.h("root" if self.tokens else None)).json()

    def state(self, job_id: str, *states: str) -> dict:
        return wait_for(f"job {job_id} in {states}", lambda: (j := self.job(job_id))["state"] in states and j)


@pytest.fixture
def api(tmp_path):
    a = Api(tmp_path)
    yield a
    (tmp_path / "flag").touch()
    a.close()


def waits(flag: Path, line: str = "", out: Path | None = None) -> str:
    """Code of a job that waits for ``flag``, then appends ``line`` to ``out``."""
    write = f"open({str(out)!r}, 'a').write({line + chr(10)!r})\n" if out else ""
    return (f"import os, time\nt0 = time.time()\nwhile not os.path.exists({str(flag)!r}) and time.time() - t0 < 120:"
            f"\n    time.sleep(0.05)\n{write}")


def appends(out: Path, line: str) -> str:
    return f"open({str(out)!r}, 'a').write({line + chr(10)!r})\n"


def detail(r) -> str:
    return json.dumps(r.json()["detail"])


def test_an_afterok_chain_runs_in_order_each_after_the_one_before_completed(api, tmp_path):
    out, flag = tmp_path / "order.txt", tmp_path / "flag"
    a = api.submit(waits(flag, "a", out))["id"]
    b = api.submit(appends(out, "b"), dependency=f"afterok:{a}")
    assert b["state"] == "PENDING" and b["reason"] == f"Dependency(afterok:{a})" and b["dependency"] == f"afterok:{a}"
    c = api.submit(appends(out, "c"), dependency=f"afterok:{b['id']}")["id"]
    assert api.job(c)["reason"] == f"Dependency(afterok:{b['id']})"
    assert api.d.sched.jobs.get(b["id"]) is None  # kept by the daemon, not handed to the core
    listed = {j["id"]: j for j in api.client.get("/jobs").json()}
    assert listed[c]["reason"].startswith("Dependency(")
    flag.touch()
    assert api.state(c, "COMPLETED", "FAILED", "CANCELLED")["state"] == "COMPLETED"
    assert out.read_text() == "a\nb\nc\n"
    assert api.job(b["id"])["submit_time"] == b["submit_time"]  # its original submit time


def test_afternotok_runs_after_a_failure_and_afterok_on_it_is_never_satisfied(api, tmp_path):
    a = api.submit("raise SystemExit(3)")["id"]
    ok = api.submit(dependency=f"afternotok:{a}")["id"]
    never = api.submit(dependency=f"afterok:{a},afterany:{a}")["id"]
    assert api.state(ok, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    assert api.state(a, "FAILED")
    j = wait_for("the reason", lambda: (v := api.job(never))["reason"].startswith("DependencyNeverSatisfied") and v)
    assert j["state"] == "PENDING" and j["reason"] == f"DependencyNeverSatisfied(afterok:{a})"
    r = api.client.post(f"/jobs/{never}/cancel")
    assert r.json()["state"] == "CANCELLED" and api.job(never)["state"] == "CANCELLED"
    # the cancelled job never reached the core, and afterany on it is satisfied
    assert never not in api.d.sched.jobs
    after = api.submit(dependency=f"afterany:{never}")["id"]
    assert api.state(after, "COMPLETED", "FAILED")["state"] == "COMPLETED"


def test_singleton_runs_one_job_of_a_name_and_user_at_a_time(api, tmp_path):
    out, flag = tmp_path / "order.txt", tmp_path / "flag"
    first = api.submit(waits(flag, "1", out), name="sweep", user="ana", dependency="singleton")
    second = api.submit(appends(out, "2"), name="sweep", user="ana", dependency="singleton")
    other = api.submit(appends(out, "bo"), name="sweep", user="bo", dependency="singleton")
    assert first["state"] in ("PENDING", "RUNNING") and first["reason"] in (None, "New", "Resources") or \
        not first["reason"].startswith("Dependency")
    assert second["reason"] == "Dependency(singleton)"
    assert api.state(other["id"], "COMPLETED")  # another user's job of that name is not held back
    assert api.job(second["id"])["state"] == "PENDING"
    flag.touch()
    assert api.state(second["id"], "COMPLETED", "FAILED")["state"] == "COMPLETED"
    assert out.read_text().splitlines()[-2:] == ["1", "2"]


def test_a_begin_time_keeps_the_job_until_the_clock_passes_it(api, tmp_path):
    j = api.submit(begin="now+1h")
    assert j["state"] == "PENDING" and j["reason"].startswith("BeginTime(")
    assert j["begin_time"] == pytest.approx(j["submit_time"] + 3600)
    past = api.submit(begin="2020-01-01T00:00:00+00:00")
    assert api.state(past["id"], "COMPLETED")["state"] == "COMPLETED"
    assert api.job(j["id"])["state"] == "PENDING"
    api.shift[0] = 3700.0  # the loop's clock crosses the begin time
    assert api.state(j["id"], "COMPLETED", "FAILED")["state"] == "COMPLETED"


def test_hold_and_release_a_held_submission_and_a_kept_dependency(api, tmp_path):
    flag = tmp_path / "flag"
    held = api.submit(hold=True)
    assert held["state"] == "PENDING" and held["reason"] == "JobHeldUser" and held["held"]
    a = api.submit(waits(flag))["id"]
    dep = api.submit(dependency=f"afterok:{a}")["id"]
    r = api.client.post(f"/jobs/{dep}/hold")
    assert r.status_code == 200 and r.json()["reason"] == "JobHeldUser"
    flag.touch()
    assert api.state(a, "COMPLETED")
    assert api.job(dep)["reason"] == "JobHeldUser"  # satisfied, but held
    assert api.client.post(f"/jobs/{held['id']}/release").status_code == 200
    assert api.client.post(f"/jobs/{dep}/release").status_code == 200
    assert api.state(held["id"], "COMPLETED")["state"] == "COMPLETED"
    assert api.state(dep, "COMPLETED")["state"] == "COMPLETED"


def test_hold_of_a_job_queued_in_the_scheduler_is_refused_saying_what_works(api, tmp_path):
    flag = tmp_path / "flag"
    big = api.submit(waits(flag), gpus=2)["id"]
    api.state(big, "RUNNING")
    queued = api.submit()["id"]
    assert api.job(queued)["state"] == "PENDING"
    r = api.client.post(f"/jobs/{queued}/hold")
    assert r.status_code == 409 and "queued in the scheduler already" in r.json()["detail"]
    assert "--hold" in r.json()["detail"]
    r = api.client.post(f"/jobs/{big}/hold")
    assert r.status_code == 409 and "RUNNING" in r.json()["detail"] and "requeue" in r.json()["detail"]
    r = api.client.patch(f"/jobs/{queued}", json={"begin": "now+1h"})  # time_limit_s and nice can (note 039)
    assert r.status_code == 409 and "begin cannot be changed now" in r.json()["detail"]
    assert api.client.post("/jobs/999/hold").status_code == 404
    r = api.client.post(f"/jobs/{queued}/requeue")
    assert r.status_code == 409 and "only a RUNNING job can be requeued" in r.json()["detail"]


def test_requeue_stops_a_running_job_and_queues_it_again(api, tmp_path):
    flag, runs = tmp_path / "flag", tmp_path / "runs.txt"
    code = appends(runs, "run") + waits(flag)
    j = api.submit(code)["id"]
    api.state(j, "RUNNING")
    wait_for("the first run", lambda: runs.exists())
    r = api.client.post(f"/jobs/{j}/requeue")
    assert r.status_code == 200, r.text
    wait_for("a second run", lambda: api.job(j)["runs"] == 2 and api.job(j)["state"] == "RUNNING")
    flag.touch()
    done = api.state(j, "COMPLETED", "FAILED")
    assert done["state"] == "COMPLETED" and done["runs"] == 2
    assert "operator requeue" in [h["reason"] for h in done["history"]]


def test_update_changes_time_limit_name_and_begin_of_a_kept_job_and_refuses_the_rest(api, tmp_path):
    j = api.submit(hold=True, name="before")["id"]
    r = api.client.patch(f"/jobs/{j}", json={"time_limit_s": "2h", "name": "after", "begin": "now+1d"})
    assert r.status_code == 200, r.text
    v = api.job(j)
    assert v["name"] == "after" and v["time_limit_s"] == 7200 and v["begin_time"] > time.time() + 80000
    r = api.client.patch(f"/jobs/{j}", json={"gpus": 2})
    assert r.status_code == 422 and "gpus: cannot be changed after submit" in detail(r)
    r = api.client.patch(f"/jobs/{j}", json={"time_limit_s": "2d"})
    assert r.status_code == 422 and "time_limit_s" in detail(r), r.text
    r = api.client.patch(f"/jobs/{j}", json={"name": "a b"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "name"
    assert api.job(j)["time_limit_s"] == 7200  # nothing half-applied


@pytest.mark.parametrize("snapshot", [True, False], ids=["stop", "crash"])
def test_a_restart_keeps_pending_dependencies_holds_and_cancelled_kept_jobs(tmp_path, snapshot):
    out, flag = tmp_path / "order.txt", tmp_path / "flag"
    a = Api(tmp_path)
    try:
        first = a.submit(waits(flag, "a", out))["id"]
        dep = a.submit(appends(out, "b"), dependency=f"afterok:{first}")["id"]
        held = a.submit(hold=True)["id"]
        gone = a.submit(hold=True)["id"]
        a.client.post(f"/jobs/{gone}/cancel")
        a.state(first, "RUNNING")
        a.restart(snapshot)
        assert a.job(dep)["reason"] == f"Dependency(afterok:{first})"
        assert a.job(held)["reason"] == "JobHeldUser"
        assert a.job(gone)["state"] == "CANCELLED"
        a.restart(snapshot=True)  # and once more: the cancelled one archived by the snapshot
        assert a.job(gone)["state"] == "CANCELLED" and a.job(held)["reason"] == "JobHeldUser"
        flag.touch()
        assert a.state(dep, "COMPLETED", "FAILED")["state"] == "COMPLETED"
        assert out.read_text() == "a\nb\n"
        assert a.job(held)["state"] == "PENDING"
    finally:
        flag.touch()
        a.close()


@pytest.mark.parametrize("extra, field, needle", [
    ({"dependency": "afterok:999"}, "dependency", "job 999 does not exist"),
    ({"dependency": "afterok:"}, "dependency", "afterok:ID"),
    ({"dependency": "after:1"}, "dependency", "after is not supported"),
    ({"dependency": "afterok:1?afterany:1"}, "dependency", "'?' (any of) is not supported"),
    ({"dependency": "afterok:1+5"}, "dependency", "a delay (+minutes) is not supported"),
    ({"dependency": "singleton"}, "dependency", "'singleton' is not allowed without a job name"),
    ({"begin": "soon"}, "begin", "'soon' is not allowed: YYYY-MM-DD"),  # timepoints' grammar (note 022)
    ({"begin": "now+soon"}, "begin", "is not allowed"),
    ({"begin": "25:00"}, "begin", "hours < 24"),
    ({"hold": True, "array": "0-3"}, "array", "not allowed with a dependency, begin time or hold"),
])
def test_bad_dependency_begin_or_hold_is_422_naming_the_field_and_value(api, tmp_path, extra, field, needle):
    api.submit()  # job 1 exists
    before = len(api.client.get("/jobs").json())
    r = api.client.post("/jobs", json={"class": "batch", "team": "research", "command": ["true"],
                                       "cwd": str(tmp_path), **extra})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"][-1] == field and needle in detail(r), r.text
    assert len(api.client.get("/jobs").json()) == before  # nothing submitted


def test_only_the_jobs_user_or_an_admin_may_hold_release_update_or_requeue(tmp_path):
    a = Api(tmp_path, tokens=True)
    try:
        j = a.submit(user="ana", hold=True)["id"]
        for path in ("/release", "/hold"):
            r = a.client.post(f"/jobs/{j}{path}", headers=a.h("bo"))
            assert r.status_code == 403 and "user 'ana'" in r.json()["detail"]
        r = a.client.patch(f"/jobs/{j}", json={"name": "x"}, headers=a.h("bo"))
        assert r.status_code == 403
        assert a.job(j)["held"]
        assert a.client.patch(f"/jobs/{j}", json={"name": "x"}, headers=a.h("ana")).status_code == 200
        assert a.client.post(f"/jobs/{j}/release", headers=a.h("root")).status_code == 200
        assert a.state(j, "COMPLETED")["name"] == "x"
    finally:
        a.close()


def test_the_cli_submits_with_dependency_begin_and_hold_and_holds_releases_updates(api, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from gpushepherd.cli.main import app

    route_cli_to(api.client, monkeypatch)

    def run(*args):
        r = CliRunner().invoke(app, list(args))
        return r.exit_code, r.stdout, r.stderr

    flag = tmp_path / "flag"
    base = ("submit", "-c", "batch", "-A", "research", "-D", str(tmp_path))
    code, out, err = run(*base, "--", sys.executable, "-c", waits(flag))
    assert code == 0, err
    a = out.split()[-1]
    code, out, err = run(*base, "-d", f"afterok:{a}", "-J", "next", "--", "true")
    assert code == 0, err
    b = out.split()[-1]
    code, out, err = run(*base, "-H", "--begin", "now+1h", "--", "true")
    assert code == 0, err
    c = out.split()[-1]
    code, out, err = run("queue", "-o", "id,state,reason")
    assert code == 0 and f"Dependency(afterok:{a})" in out and "JobHeldUser" in out, out
    code, out, err = run("show", b)
    assert code == 0 and f"dependency: afterok:{a}" in out
    code, out, err = run("hold", b)
    assert code == 0 and f"job {b}: PENDING (JobHeldUser)" in out, err
    code, out, err = run("update", b, "-t", "30", "-J", "renamed")
    assert code == 0 and api.job(b)["time_limit_s"] == 1800 and api.job(b)["name"] == "renamed"
    code, out, err = run("release", b, c)
    assert code == 0 and f"job {c}: PENDING (BeginTime(" in out, out
    code, out, err = run("why", c)
    assert code == 0 and "BeginTime(" in out
    code, out, err = run("hold", a)
    assert code != 0 and "RUNNING" in err
    flag.touch()
    assert api.state(b, "COMPLETED")["state"] == "COMPLETED"


def test_sbatch_takes_dependency_begin_and_hold_directives(api, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from gpushepherd.cli.main import app

    route_cli_to(api.client, monkeypatch)
    first = api.submit(hold=True)["id"]
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/sh\n#SBATCH -A research\n#SBATCH -p batch\n#SBATCH --dependency=afterany:{first}\n"
                      "#SBATCH --begin=now+10\n#SBATCH -H\ntrue\n")
    r = CliRunner().invoke(app, ["sbatch", "-D", str(tmp_path), str(script)])
    assert r.exit_code == 0, r.stderr
    v = api.job(r.stdout.split()[-1])
    assert v["dependency"] == f"afterany:{first}" and v["held"] and v["begin_time"] is not None


def test_a_kept_job_carries_its_constraints_and_deadline_and_one_no_node_offers_is_rejected_at_submit(api, tmp_path):
    """Note 021 with note 022: a kept job's view shows its constraints and deadline, and
    keeps its submit time when handed to the core. A selector no node offers is REJECTED
    at submit with the core's reason, as a plain job: it was kept and rejected only when
    released, until a newcomer found that whether a job can ever fit does not depend on
    its hold, begin time or dependency (Slurm's sbatch refuses it at once too)."""
    j = api.submit(hold=True, deadline="now+2h", same_node=True)
    assert j["state"] == "PENDING" and j["reason"] == "JobHeldUser" and j["held"] and j["same_node"]
    assert j["deadline"] == pytest.approx(time.time() + 7200, abs=60) and j["deadline_at_risk"] == []
    bad = api.submit(hold=True, node_selector=["zone=a"], min_driver="535.1")
    assert bad["state"] == "REJECTED" and "zone=a" in bad["reason"], bad
    assert bad["node_selector"] == ["zone=a"] and bad["min_driver"] == "535.1"
    assert api.client.post(f"/jobs/{j['id']}/release").status_code == 200
    v = api.state(j["id"], "COMPLETED")
    assert v["submit_time"] == j["submit_time"] and v["same_node"]


def test_a_begin_time_at_or_after_the_deadline_is_refused_at_submit_and_update(api, tmp_path):
    r = api.client.post("/jobs", json={"class": "batch", "team": "research", "command": ["true"],
                                       "cwd": str(tmp_path), "begin": "now+3h", "deadline": "now+2h"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "begin", r.text
    assert "before the job's deadline" in detail(r)
    j = api.submit(hold=True, deadline="now+2h", begin="now+1h")["id"]
    r = api.client.patch(f"/jobs/{j}", json={"begin": "now+1d"})
    assert r.status_code == 422 and "before the job's deadline" in detail(r), r.text
    assert api.client.patch(f"/jobs/{j}", json={"begin": "now+90m"}).status_code == 200


def test_begin_takes_the_one_grammar_of_points_in_time(api, tmp_path):
    """``begin`` is read by ``gpushepherd.timepoints`` as ``deadline`` is (note 022)."""
    for text in ("tomorrow", "teatime", "now+2hours", str(int(time.time()) + 3600)):
        v = api.submit(begin=text)
        assert v["reason"].startswith("BeginTime(") and v["begin_time"] > time.time(), (text, v)


def test_a_service_refuses_dependency_begin_and_hold_naming_them(api, tmp_path):
    base = {"class": "batch", "team": "research", "command": ["true"], "cwd": str(tmp_path), "name": "svc",
            "metric": "queue_length", "scale_up_above": 5, "scale_down_below": 1}
    api.submit()  # job 1 exists
    for extra, needle in (({"dependency": "afterok:1"}, "dependency: not allowed for a service"),
                          ({"begin": "now+1h", "hold": True}, "begin, hold: not allowed for a service")):
        r = api.client.post("/services", json={**base, **extra})
        assert r.status_code == 422 and needle in detail(r), r.text
    assert api.client.get("/services").json() == []
