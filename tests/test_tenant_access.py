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


def test_an_unconfirmed_submit_prints_its_idempotency_key_and_the_retry_that_submits_once(api, monkeypatch, tmp_path):
    """Before: the 503 said "retry with the same Idempotency-Key", but the CLI sent none
    and had no option to give one."""
    import concurrent.futures

    import gpushepherd.daemon.api as api_mod

    cli = route_cli_to(api, monkeypatch)
    d = api.daemon
    sent = {}
    real = d.submit_future

    def stalled(*a, **kw):  # the loop never answers in time: the server's 503 "not confirmed"
        sent["key"] = kw["idempotency"][1]
        return concurrent.futures.Future()

    monkeypatch.setattr(d, "submit_future", stalled)
    monkeypatch.setattr(api_mod, "SUBMIT_TIMEOUT_S", 0.05)
    argv = ["submit", "-c", "batch", "-A", "research", "-D", str(tmp_path), "--", "true"]
    monkeypatch.setattr(sys, "argv", ["shepherd", *argv])
    code, out, err = cli(*argv)
    key = sent["key"]
    assert code == 2 and "not confirmed" in err and f"Idempotency-Key is {key}" in err
    retry = f"shepherd submit --idempotency-key {key} -c batch -A research -D {tmp_path} -- true"
    assert retry in " ".join(err.split()), err

    monkeypatch.setattr(d, "submit_future", real)
    retry_argv = retry.split()[1:]
    code, out, _ = cli(*retry_argv)
    assert code == 0 and out.startswith("Submitted job ")
    again = cli(*retry_argv)  # the same key again: the job first made, not a second one
    assert again[0] == 0 and again[1] == out
    assert len(api.get("/jobs", params={"all": "true"}).json()) == 1


def test_sbatch_takes_an_idempotency_key_and_a_retry_submits_once(api, monkeypatch, tmp_path):
    cli = route_cli_to(api, monkeypatch)
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH -p batch\n#SBATCH -A research\ntrue\n")
    first = cli("sbatch", "--idempotency-key", "k-sbatch-1", str(script))
    again = cli("sbatch", "--idempotency-key", "k-sbatch-1", str(script))
    assert first[0] == 0 and first[1].startswith("Submitted job ") and again[:2] == first[:2]
    code, _, err = cli("sbatch", str(script).replace("job.sh", "other.sh"))  # refused before any request
    assert code == 2
    script.write_text("#!/bin/sh\n#SBATCH -p batch\n#SBATCH -A research\n#SBATCH --idempotency-key k2\ntrue\n")
    code, _, err = cli("sbatch", str(script))
    assert code == 2 and "on the command line only" in err


def test_with_key_puts_the_key_after_the_command_s_name_in_place_of_any():
    from gpushepherd.cli.daemon import with_key

    assert with_key(["shepherd", "submit", "--idempotency-key", "old", "-c", "b", "--", "x", "--idempotency-key"],
                    "K") == ["shepherd", "submit", "--idempotency-key", "K", "-c", "b", "--", "x", "--idempotency-key"]
    assert with_key(["shepherd", "sbatch", "--idempotency-key=old", "job.sh", "a"], "K") == [
        "shepherd", "sbatch", "--idempotency-key", "K", "job.sh", "a"]
