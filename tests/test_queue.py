"""`shepherd queue` as squeue and job names (issue 18, points 4 and 3; design note 020):
filters on the server (`GET /jobs?state=&user=&team=&name=`), `--me` by `GET /whoami`,
named fields, `--json`, `--start`, a reason never cut on an 80-column terminal, and
`submit -J`. An in-process server (``Daemon`` + ``make_app`` under Starlette's test
client, as tests/test_regressions_api.py) that the CLI reaches through ``httpx``."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from builders import route_cli_to
from fastapi.testclient import TestClient
from typer.testing import CliRunner

POLICY = """\
name: queue-test
cluster:
  nodes:
    - {name: local, gpus: 4, gpu_type: FAKE, gpu_mem_mib: 16384}
classes:
  batch: {grace_period_s: 1}
teams:
  ml: {max_gpus: 1}
  data: {}
"""


def waiting(flag: Path) -> list[str]:
    """A job that runs until ``flag`` exists (at most 120 s)."""
    code = (f"import os, time\nt0 = time.time()\nwhile not os.path.exists({str(flag)!r}) and "
            "time.time() - t0 < 120:\n    time.sleep(0.05)\n")
    return [sys.executable, "-c", code]


def make(tmp_path: Path, tokens: bool = False):
    from gpushepherd.daemon.api import make_app
    from gpushepherd.daemon.server import Daemon

    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    d = Daemon(tmp_path / "data", policy_path=policy, poll_s=0.05)
    made = {}
    if tokens:
        made["ana"] = d.store.create_token("ana", ["ml"], False)[1]
        made["root"] = d.store.create_token("root", [], True)[1]
    d.start()
    return d, make_app(d), made


@pytest.fixture
def served(tmp_path, monkeypatch):
    """The server and ``run(*args, env=None) -> (exit code, stdout, stderr)`` of the CLI."""
    d, api_app, _ = make(tmp_path)
    flag = tmp_path / "flag"
    try:
        with TestClient(api_app) as client:
            run = route_cli_to(client, monkeypatch)
            run.client, run.daemon, run.flag, run.tmp = client, d, flag, tmp_path
            yield run
    finally:
        flag.touch()
        d.stop()


def wait_for(what, fn, timeout=45.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = fn()
        if v:
            return v
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def submit(run, *args) -> str:
    """A job that waits for ``run.flag``, with a time limit of an hour unless ``-t`` is given."""
    limit = () if "-t" in args else ("-t", "1:00:00")
    code, out, err = run("submit", "-c", "batch", "-D", str(run.tmp), *limit, *args, "--", *waiting(run.flag))
    assert code == 0, err
    return out.split()[-1]


@pytest.fixture
def three(served):
    """ml/ana RUNNING (name train), ml/bo PENDING on ml's quota (name eval), data/ana RUNNING."""
    a = submit(served, "-A", "ml", "-u", "ana", "-J", "train")
    wait_for("the first job to run", lambda: served.client.get(f"/jobs/{a}").json()["state"] == "RUNNING")
    b = submit(served, "-A", "ml", "-u", "bo", "--name", "eval")
    c = submit(served, "-A", "data", "-u", "ana")
    wait_for("the third job to run", lambda: served.client.get(f"/jobs/{c}").json()["state"] == "RUNNING")
    return served, a, b, c


def ids(out: str) -> list[str]:
    return [line.split()[0] for line in out.splitlines()[1:] if line.strip()]


def test_a_job_name_is_stored_returned_and_shown(three):
    run, a, b, _c = three
    assert run.client.get(f"/jobs/{a}").json()["name"] == "train"
    assert json.loads(run.daemon.store.job_row(a)["spec"])["name"] == "train"  # in the spec JSON: no new column
    code, out, _ = run("show", a)
    assert code == 0 and "name: train" in out.splitlines()
    code, out, _ = run("queue")
    line = next(x for x in out.splitlines() if x.split()[:1] == [b])
    assert line.split()[1:5] == ["batch", "ml", "bo", "eval"]


@pytest.mark.parametrize("name", ["two words", "a,b", "x/y", "n" * 129])
def test_a_bad_job_name_is_refused_naming_name_and_the_rule(served, name):
    code, _, err = served("submit", "-c", "batch", "-A", "ml", "-J", name, "-D", str(served.tmp), "--", "true")
    assert code == 2 and "error: name: " in err and "is not allowed: 1-128 letters, digits" in err
    assert served.client.get("/jobs").json() == []  # nothing half-applied


def test_an_array_carries_its_name_to_every_element(served):
    code, out, err = served("submit", "-c", "batch", "-A", "data", "-J", "sweep", "--array", "0-2",
                            "-D", str(served.tmp), "--", "true")
    assert code == 0, err
    array_id = out.split()[-1]
    assert served.client.get(f"/jobs/{array_id}").json()["name"] == "sweep"

    def elements():
        kids = [j for j in served.client.get("/jobs", params={"children": True}).json()
                if j["id"].startswith(array_id + "_")]
        return kids if len({k["id"].split("_")[1] for k in kids}) == 3 else None
    kids = wait_for("the array's three elements", elements)
    assert kids and {k["name"] for k in kids} == {"sweep"}


def test_queue_filters_by_user_team_state_and_name(three):
    run, a, b, c = three
    assert ids(run("queue", "-u", "ana")[1]) == [a, c]
    assert ids(run("queue", "-u", "bo,ana", "-A", "ml")[1]) == [a, b]
    assert ids(run("queue", "--account", "data")[1]) == [c]
    assert ids(run("queue", "-t", "PD")[1]) == [b]
    assert ids(run("queue", "-t", "r")[1]) == [a, c]
    assert ids(run("queue", "-t", "PD,R")[1]) == [a, b, c]
    assert ids(run("queue", "-n", "train,eval")[1]) == [a, b]
    # the same filters on the API, Slurm's names too
    got = run.client.get("/jobs", params={"state": "pending,R", "user": "ana", "team": "ml"}).json()
    assert [j["id"] for j in got] == [a]


@pytest.mark.parametrize("params, field, needle", [
    ({"state": "PD,XX"}, "state", "'XX' is not allowed: one of PENDING"),
    ({"state": "PD,"}, "state", "without empty entries"),
    ({"user": "ana,,bo"}, "user", "without empty entries"),
    ({"team": "m\x1bl"}, "team", "without control characters"),
])
def test_a_bad_filter_is_422_naming_the_field(served, params, field, needle):
    r = served.client.get("/jobs", params=params)
    assert r.status_code == 422
    (entry,) = r.json()["detail"]
    assert entry["loc"] == ["query", field] and needle in entry["msg"]


def test_a_bad_state_or_field_in_the_cli_names_the_option_and_the_allowed_values(served):
    code, _, err = served("queue", "-t", "RUN")
    assert code == 2 and "--state: 'RUN' is not allowed: one of PENDING, RUNNING" in err and "CD" in err
    code, _, err = served("queue", "-o", "id,colour")
    assert code == 2 and "'colour' is not allowed" in err and "id, name" in err and "reason" in err


def test_format_picks_named_fields_and_slurm_aliases(three):
    run, a, b, c = three
    code, out, _ = run("queue", "-o", "jobid,st,name,account")
    assert code == 0
    lines = [x.split() for x in out.splitlines()]
    assert lines[0] == ["JOBID", "ST", "NAME", "TEAM"]
    assert lines[1:] == [[a, "R", "train", "ml"], [b, "PD", "eval", "ml"], [c, "R", "-", "data"]]


def test_json_has_stable_keys_and_raw_values(three):
    run, a, b, c = three
    code, out, _ = run("queue", "--json")
    assert code == 0
    rows = json.loads(out)
    assert [r["id"] for r in rows] == [a, b, c]
    assert list(rows[0]) == ["id", "class", "team", "user", "name", "gpus", "state", "reason", "start", "priority"]
    assert rows[1]["state"] == "PENDING" and rows[1]["reason"].startswith("QuotaExceeded")
    assert rows[2]["name"] == "" and isinstance(rows[0]["gpus"], int)
    rows = json.loads(run("queue", "--json", "-o", "id,submit,st")[1])
    assert list(rows[0]) == ["id", "submit", "st"] and isinstance(rows[0]["submit"], float)


def test_start_lists_pending_jobs_with_their_estimate(three):
    run, _a, b, _c = three
    big = submit(run, "-A", "data", "-u", "ana", "--gpus", "4", "-t", "2:00:00")  # waits for a and c to end
    wait_for("the 4-GPU job's estimate", lambda: run.client.get(f"/jobs/{big}").json()["estimated_start"])
    code, out, _ = run("queue", "--start")
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[:7] == ["JOBID", "CLASS", "NAME", "USER", "TEAM", "ST", "EST."]
    starts = {j: run.client.get(f"/jobs/{j}").json()["estimated_start"] for j in (b, big)}
    assert ids(out) == sorted(starts, key=lambda j: (starts[j], int(j)))  # pending only, earliest first
    assert "<= " in next(x for x in lines if x.split()[:1] == [big])
    rows = json.loads(run("queue", "--start", "--json")[1])
    assert {r["id"]: r["start"] for r in rows} == starts and [r["id"] for r in rows] == ids(out)
    assert [r["st"] for r in rows] == ["PD", "PD"]
    code, _, err = run("queue", "--start", "-t", "R")
    assert code == 2 and "--state" in err


def test_the_reason_is_never_cut_on_an_80_column_terminal(three):
    run, a, b, c = three
    reason = run.client.get(f"/jobs/{b}").json()["reason"]
    assert len(reason) > 20  # the test means something: the reason is long
    code, out, err = run("queue", env={"COLUMNS": "80"})
    lines = out.splitlines()
    assert code == 0 and max(len(x) for x in lines) <= 80 and "\u2026" not in out
    left = lines[0].index("REASON")
    right = next((lines[0].index(h) for h in ("EST.", "PRIORITY") if h in lines[0][left:]), None)
    mine = [x for i, x in enumerate(lines) if i > 0 and (x.split()[:1] == [b] or (not x[:left].strip() and any(
        y.split()[:1] == [b] for y in lines[1:i]) and not any(y.split()[:1] == [c] for y in lines[1:i])))]
    column = "".join(x[left:right].strip() for x in mine)
    assert column.replace(" ", "") == reason.replace(" ", ""), out  # all of it, wrapped in its column
    assert "left out for the terminal's 80 columns: priority" in err
    assert ids(out)[:2] == [a, b] and "STATE" in lines[0] and "REASON" in lines[0]


def test_me_is_the_tokens_user(tmp_path, monkeypatch):

    from gpushepherd.cli.main import app

    d, api_app, tokens = make(tmp_path, tokens=True)
    flag = tmp_path / "flag"
    try:
        with TestClient(api_app) as client:
            route_cli_to(client, monkeypatch)

            def run(*args, token):
                r = CliRunner().invoke(app, [args[0], "--token", token, *args[1:]])
                return r.exit_code, r.stdout, r.stderr
            for user, token, team in (("ana", tokens["ana"], "ml"), ("bo", tokens["root"], "data")):
                code, out, err = run("submit", "-c", "batch", "-A", team, "-u", user, "-D", str(tmp_path), "--",
                                     *waiting(flag), token=token)
                assert code == 0, err
            code, out, _ = run("queue", "--me", token=tokens["ana"])
            assert code == 0 and [x.split()[3] for x in out.splitlines()[1:]] == ["ana"]
            assert client.get("/whoami", headers={"Authorization": f"Bearer {tokens['ana']}"}).json() == {
                "auth": True, "user": "ana", "teams": ["ml"], "admin": False}
            code, out, _ = run("queue", "--me", token=tokens["root"])
            assert code == 0 and ids(out) == []  # root submitted as bo: none is root's
    finally:
        flag.touch()
        d.stop()


def test_me_without_tokens_is_the_unix_user(served):
    submit(served, "-A", "data", "-u", "carol")
    submit(served, "-A", "data", "-u", "dave")
    assert served.client.get("/whoami").json() == {"auth": False, "user": None, "teams": [], "admin": False}
    code, out, _ = served("queue", "--me", env={"USER": "dave"})
    assert code == 0 and [x.split()[3] for x in out.splitlines()[1:]] == ["dave"]
