"""Faults found by trying to break the submission API and the CLI with hostile input
(each was a 500, a silent acceptance, a misleading message or a leak before its fix).
An in-process server (``Daemon`` + ``make_app`` under Starlette's test client) on
SQLite in a tmp data directory; jobs are ``true``-like and never wait on time."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from builders import in_process_api, route_cli_to

POLICY = """\
name: api-regressions
cluster:
  nodes:
    - {name: local, gpus: 8, gpu_type: FAKE, gpu_mem_mib: 16384}
classes:
  batch: {grace_period_s: 1}
teams:
  research: {}
"""


@pytest.fixture
def api(tmp_path):
    with in_process_api(tmp_path, POLICY) as client:
        yield client


def body(tmp_path: Path, **kw) -> dict:
    return {"class": "batch", "team": "research", "command": [sys.executable, "-c", "pass"], "cwd": str(tmp_path),
            **kw}


def msgs(r) -> str:
    return json.dumps(r.json()["detail"])


def test_array_throttle_too_large_is_422_naming_the_throttle_and_its_range(api, tmp_path):
    r = api.post("/jobs", json=body(tmp_path, array="0-9%99999999999999999999"))
    assert r.status_code == 422 and "throttle %99999999999999999999" in msgs(r) and "1..100000" in msgs(r)
    r = api.post("/jobs", json=body(tmp_path, array="99999999999999999999"))
    assert r.status_code == 422 and "2147483647" in msgs(r)


def test_a_bad_array_does_not_fail_the_good_submissions_of_the_same_step(api, tmp_path):
    """Before: the bad array's row failed the batch's commit, and every submission of
    that loop step got the error (500) and was dropped."""
    from gpushepherd.core.scheduler import SpecError
    from gpushepherd.model.job import JobSpec

    d = api.daemon
    spec = JobSpec(id="", team="research", workload_class="batch", gpus=1)
    argv = [sys.executable, "-c", "pass"]
    with d.lock:  # all queued before the loop's next step takes them
        good = [d.submit_future(spec, argv, cwd=str(tmp_path)) for _ in range(3)]
        bad = d.submit_future(spec, argv, cwd=str(tmp_path), array=("0-9%99999999999999999999", list(range(10)),
                                                                     10**20, 2))
        good += [d.submit_future(spec, argv, cwd=str(tmp_path)) for _ in range(3)]
    with pytest.raises(SpecError, match="throttle"):
        bad.result(timeout=30)
    ids = [f.result(timeout=30)["id"] for f in good]
    assert len(set(ids)) == 6 and all(d.store.job_row(j) is not None for j in ids)


@pytest.mark.parametrize("extra, field", [
    ({"gpu_mem_mib": 10**30}, "gpu_mem_mib"),
    ({"max_retries": 10**20, "array": "0-1"}, "max_retries"),
    ({"gpus": 10**20}, "gpus"),
    ({"time_limit_s": 1e300}, "time_limit_s"),
    ({"share": {"kind": "fraction", "milli": 500, "mem_mib": 10**30}}, "mem_mib"),
])
def test_every_integer_that_reaches_the_database_is_bounded(api, tmp_path, extra, field):
    r = api.post("/jobs", json=body(tmp_path, **extra))
    assert r.status_code == 422 and field in msgs(r)


def test_a_request_body_over_1_mib_is_413_and_a_long_command_is_422_naming_the_limit(api, tmp_path):
    r = api.post("/jobs", json=body(tmp_path, command=["echo", "x" * (2 * 1024 * 1024)]))
    assert r.status_code == 413 and "1,048,576" in r.json()["detail"]
    r = api.post("/jobs", json=body(tmp_path, command=["echo", "x" * 200_000]))
    assert r.status_code == 422 and "command and env" in msgs(r) and "131,072" in msgs(r)
    r = api.post("/jobs", json=body(tmp_path, env={"BIG": "y" * 200_000}))
    assert r.status_code == 422 and "command and env" in msgs(r)
    assert api.get("/jobs").json() == []  # nothing stored


def test_a_nul_byte_in_command_is_422_naming_command(api, tmp_path):
    r = api.post("/jobs", json=body(tmp_path, command=["tr\u0000ue"]))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "command"]


@pytest.mark.parametrize("field, key", [("user", "user"), ("team", "team"), ("class", "workload_class")])
def test_control_characters_in_names_are_422_naming_the_field(api, tmp_path, field, key):
    r = api.post("/jobs", json=body(tmp_path, **{field: "a\u001b[2J"}))
    assert r.status_code == 422
    d = r.json()["detail"][0]
    assert d["loc"][-1] in (field, key) and "control characters" in d["msg"] and f"{field} " in d["msg"]


@pytest.mark.parametrize("extra, reason", [
    ({"gpus": 9}, "9"),
    ({"gpu_type": ["NOPE"]}, "NOPE"),
    ({"share": {"kind": "fraction", "milli": 0, "mem_mib": 99999999}}, "99999999"),
    ({"share": {"kind": "mig", "profile": "1g.10gb"}}, "1g.10gb"),
])
def test_a_rejected_job_carries_its_reason_in_every_view(api, tmp_path, extra, reason):
    r = api.post("/jobs", json=body(tmp_path, **extra))
    assert r.status_code in (201, 422)
    if r.status_code == 422:  # refused by the policy outright: also a reason naming the value
        assert reason in msgs(r)
        return
    v = r.json()
    assert v["state"] == "REJECTED" and v["reason"] and reason in v["reason"]
    assert api.get(f"/jobs/{v['id']}").json()["reason"] == v["reason"]
    assert [j["reason"] for j in api.get("/jobs").json() if j["id"] == v["id"]] == [v["reason"]]


def test_an_array_whose_tasks_would_be_rejected_is_refused_at_submit(api, tmp_path):
    r = api.post("/jobs", json=body(tmp_path, array="0-3", gpus=9))
    assert r.status_code == 422 and "array" in msgs(r) and "rejected" in msgs(r)
    assert api.get("/jobs").json() == []


def test_an_unknown_state_filter_is_422_naming_the_allowed_states(api):
    r = api.get("/jobs", params={"state": "BOGUS"})
    assert r.status_code == 422 and "'BOGUS' is not allowed" in msgs(r) and "PENDING" in msgs(r)
    assert api.get("/jobs", params={"state": "pending"}).status_code == 200


@pytest.mark.parametrize("share, field", [
    ({"kind": "fraction", "milli": 500, "profile": "1g.10gb"}, "profile"),
    ({"kind": "fraction", "milli": 500, "slots": 4}, "slots"),
    ({"kind": "mig", "profile": "1g.10gb", "milli": 300}, "milli"),
])
def test_a_share_field_the_kind_does_not_use_is_422_naming_it(api, tmp_path, share, field):
    r = api.post("/jobs", json=body(tmp_path, share=share))
    assert r.status_code == 422 and f"{field}: " in msgs(r) and share["kind"] in msgs(r)


def test_a_launch_failure_cause_is_in_the_job_view(api, tmp_path):
    r = api.post("/jobs", json=body(tmp_path, command=["/nonexistent/program-xyz"]))
    job_id = r.json()["id"]
    import time
    end = time.monotonic() + 30
    while time.monotonic() < end and api.get(f"/jobs/{job_id}").json()["state"] not in ("FAILED", "COMPLETED"):
        time.sleep(0.05)
    v = api.get(f"/jobs/{job_id}").json()
    if v["state"] == "FAILED" and v["exit_code"] is None:  # the runner itself could not start
        assert v["launch_error"]
    else:  # the local runner reports an exec failure as the job's exit instead
        assert v["state"] == "FAILED"


@pytest.fixture
def cli(api, monkeypatch):
    """Run ``shepherd ARGS`` against the in-process server: (exit code, stdout, stderr)."""
    from typer.testing import CliRunner

    from gpushepherd.cli.main import app

    route_cli_to(api, monkeypatch)

    def run(*args):
        r = CliRunner().invoke(app, list(args))
        return r.exit_code, r.stdout, r.stderr
    return run


def test_cli_submit_of_a_rejected_job_prints_the_reason_and_exits_3(cli, tmp_path):
    code, out, err = cli("submit", "-c", "batch", "-A", "research", "--gpus", "9", "-D", str(tmp_path), "--", "true")
    # one line, the rejection: no "Submitted job N" first (issue 18 point 7)
    assert code == 3 and out == "" and err.startswith("rejected: ExceedsCapacity(gpus=9") and len(err.splitlines()) == 1
    job_id = err.rsplit("(job ", 1)[1].rstrip(")\n")
    code, out, _ = cli("why", job_id)
    assert code == 0 and "REJECTED" in out and "9" in out


def test_cli_table_output_escapes_control_characters(cli, api, tmp_path):
    d = api.daemon
    from gpushepherd.model.job import JobSpec
    d.submit_view(JobSpec(id="", team="research", workload_class="batch", gpus=1, user="evil\x1b[2J"),
                  [sys.executable, "-c", "pass"], cwd=str(tmp_path))  # an embedding caller, past the API
    code, out, _ = cli("queue", "--all")
    assert code == 0 and "\x1b" not in out and "evil\\x1b" in out


@pytest.mark.parametrize("args, needle", [
    (["--share", "fraction:1.5"], "--share"), (["--share", "mps:2:200"], "--share"),
    (["--share", "mem"], "--gpu-mem"), (["-t", "1:99:99"], "-t"), (["-t", "99999999999999999999999"], "-t"),
])
def test_cli_submit_option_errors_name_the_option_and_the_value(cli, tmp_path, args, needle):
    code, _, err = cli("submit", "-c", "batch", "-A", "research", *args, "-D", str(tmp_path), "--", "true")
    assert code == 2 and needle in err and args[1] in err


@pytest.mark.parametrize("cmd", ["show", "cancel", "why"])
def test_cli_an_impossible_job_id_is_no_such_job(cli, cmd):
    code, _, err = cli(cmd, "../../etc")
    assert code == 2 and "no such job '../../etc'" in err
