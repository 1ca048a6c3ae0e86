"""Every constraint of the core through the submit API and the CLI (issue 18, point 6;
design note 022): node selector, tolerations, minimum driver, cache key, deadline,
runtime estimate and gang shape change where and whether a job runs, bad input is refused
naming the field, and every field is shown back and survives a restart.

An in-process server (``Daemon`` + ``make_app`` under Starlette's test client, as
tests/test_regressions_api.py) on a three-node static inventory simulated on this machine;
the CLI reaches it through ``httpx``. Jobs wait for a flag file; nothing waits on time."""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from builders import route_cli_to
from fastapi.testclient import TestClient

# n1 is where an unconstrained job goes first (the core's order); n2 has the labels, the
# newer driver and the cache; n3 is tainted
POLICY = """\
name: constraints-test
cluster:
  nodes:
    - {name: n1, gpus: 1, gpu_type: FAKE, gpu_mem_mib: 16384, labels: {zone: a}, driver: "535.54"}
    - {name: n2, gpus: 1, gpu_type: FAKE, gpu_mem_mib: 16384, labels: {zone: b, nvlink: ""}, driver: "550.54",
       cached: [llama-70b]}
    - {name: n3, gpus: 1, gpu_type: FAKE, gpu_mem_mib: 16384, labels: {zone: c}, driver: "535.54",
       taints: ["dedicated=infer:NoSchedule"]}
classes:
  batch: {grace_period_s: 1}
teams:
  ml: {}
"""


def waiting(flag: Path) -> list[str]:
    """A job that runs until ``flag`` exists (at most 120 s)."""
    code = (f"import os, time\nt0 = time.time()\nwhile not os.path.exists({str(flag)!r}) and "
            "time.time() - t0 < 120:\n    time.sleep(0.05)\n")
    return [sys.executable, "-c", code]


def start(tmp_path: Path):
    from gpushepherd.daemon.server import Daemon

    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    d = Daemon(tmp_path / "data", policy_path=policy, poll_s=0.05)
    d.start()
    return d


@pytest.fixture
def served(tmp_path, monkeypatch):
    """The test client (``.daemon``, ``.flag``, ``.tmp``) and ``.cli(*args) -> (code, out, err)``."""
    from gpushepherd.daemon.api import make_app

    d = start(tmp_path)
    flag = tmp_path / "flag"
    try:
        with TestClient(make_app(d)) as client:
            cli = route_cli_to(client, monkeypatch)
            client.cli, client.daemon, client.flag, client.tmp = cli, d, flag, tmp_path
            yield client
    finally:
        flag.touch()
        d.stop()


def body(c, **kw) -> dict:
    return {"class": "batch", "team": "ml", "command": waiting(c.flag), "cwd": str(c.tmp), "time_limit_s": 3600,
            **kw}


def post(c, **kw) -> dict:
    r = c.post("/jobs", json=body(c, **kw))
    assert r.status_code == 201, r.text
    return r.json()


def settled(c, job_id: str) -> dict:
    """The job's view once the loop has placed it or given its reason (RUNNING, or PENDING
    with a reason, or ended)."""
    end = time.monotonic() + 45
    while time.monotonic() < end:
        v = c.get(f"/jobs/{job_id}").json()
        if v["state"] != "PENDING" or v["reason"]:
            return v
        time.sleep(0.05)
    pytest.fail(f"job {job_id} was never placed nor given a reason: {v}")


def node_of(v: dict) -> str:
    assert v["state"] == "RUNNING", v
    return v["placement"].split(":")[0]


def test_an_unconstrained_job_goes_to_n1_and_a_node_selector_moves_it_to_the_labelled_node(served):
    assert node_of(settled(served, post(served)["id"])) == "n1"  # the default, so the next is not luck
    c = served
    b = post(c, node_selector={"zone": "b"})
    assert node_of(settled(c, b["id"])) == "n2"
    assert b["node_selector"] == ["zone=b"]
    # the same label again: n2 is busy and n3 is free, yet it waits (n3 is zone c)
    again = settled(c, post(c, node_selector=["zone=b"])["id"])
    assert again["state"] == "PENDING" and again["placement"] is None


def test_a_slurm_feature_without_a_value_matches_a_label_with_an_empty_value(served):
    v = settled(served, post(served, node_selector=["nvlink"])["id"])
    assert node_of(v) == "n2" and v["node_selector"] == ["nvlink"]


@pytest.mark.parametrize("toleration", ["dedicated=infer", "dedicated", "dedicated=infer:NoSchedule"])
def test_an_untolerated_taint_keeps_jobs_off_a_free_node_and_a_toleration_lets_one_on(served, toleration):
    c = served
    placed = {node_of(settled(c, post(c)["id"])) for _ in range(2)}
    assert placed == {"n1", "n2"}
    third = settled(c, post(c)["id"])
    assert third["state"] == "PENDING"  # n3 is free but tainted
    wrong = settled(c, post(c, tolerations=["dedicated=train"])["id"])
    assert wrong["state"] == "PENDING"  # Equal: the value must match
    v = settled(c, post(c, tolerations=[toleration])["id"])
    assert node_of(v) == "n3" and v["tolerations"] == [toleration]


def test_min_driver_and_a_preferred_cache_choose_n2_and_a_required_cache_waits_for_it(served):
    c = served
    v = settled(c, post(c, min_driver="550")["id"])
    assert node_of(v) == "n2" and v["min_driver"] == "550"
    c.post(f"/jobs/{v['id']}/cancel")
    v = settled(c, post(c, cache_key="llama-70b")["id"])
    assert node_of(v) == "n2" and (v["cache_key"], v["cache_required"]) == ("llama-70b", False)
    # n2 busy: a preferred cache takes another node, a required one waits
    assert node_of(settled(c, post(c, cache_key="llama-70b")["id"])) == "n1"
    v = settled(c, post(c, cache_key="llama-70b", cache_required=True)["id"])
    assert v["state"] == "PENDING" and v["cache_required"] is True


def test_a_gang_of_pods_spans_nodes_and_same_node_is_rejected_where_no_node_has_the_gpus(served):
    c = served
    v = settled(c, post(c, gpus=2, gpus_per_pod=1)["id"])
    assert v["state"] == "RUNNING" and v["gpus_per_pod"] == 1
    assert sorted(p.split(":")[0] for p in v["placement"].split()) == ["n1", "n2"]
    v = post(c, gpus=2, same_node=True)
    assert v["state"] == "REJECTED" and "same_node" in v["reason"] and v["same_node"] is True
    r = c.post("/jobs", json=body(c, gpus=3, gpus_per_pod=2))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "gpus_per_pod"]
    assert "a divisor of gpus (3)" in r.json()["detail"][0]["msg"]


@pytest.mark.parametrize("extra, needle", [
    ({"node_selector": {"zone": "z"}}, "node_selector.zone=z"),
    ({"min_driver": "999.1"}, "min_driver=999.1"),
    ({"cache_key": "nowhere", "cache_required": True}, "cache=nowhere"),
])
def test_a_constraint_no_node_could_ever_meet_is_rejected_at_submit_with_the_core_s_reason(served, extra, needle):
    c = served
    v = post(c, **extra)
    assert v["state"] == "REJECTED" and needle in v["reason"]
    flags = {"node_selector": ["-C", "zone=z"], "min_driver": ["--min-driver", "999.1"],
             "cache_key": ["--cache-key", "nowhere", "--cache-required"]}[next(iter(extra))]
    code, out, err = c.cli("submit", "-c", "batch", "-A", "ml", "-D", str(c.tmp), *flags, "--", "true")
    assert code == 3 and out == "" and err.startswith("rejected: ") and needle in err


@pytest.mark.parametrize("extra, field, needle", [
    ({"node_selector": ["zone a"]}, "node_selector", "label 'zone a' is not allowed: 1-253 letters"),
    ({"node_selector": {"zone": "a\u001b[2J"}}, "node_selector", "without control characters"),
    ({"node_selector": ["zone=a", "zone=b"]}, "node_selector", "zone=b is not allowed with zone=a"),
    ({"node_selector": "zone=a"}, "node_selector", "an object {LABEL: VALUE} or a list"),
    ({"tolerations": ["has space"]}, "tolerations", "'has space' is not allowed: a taint as the policy writes"),
    ({"min_driver": "r535"}, "min_driver", "'r535' is not allowed: a driver version as dotted numbers"),
    ({"cache_required": True}, None, "cache_required: true is not allowed without cache_key"),
    ({"deadline": "soon"}, "deadline", "'soon' is not allowed: YYYY-MM-DD"),
    ({"deadline": 5}, "deadline", "deadline: 5.0 is not allowed: a finite time after submit_time"),
    ({"deadline": "now+1h", "array": "0-1"}, None, "deadline is not allowed with array"),
    ({"gpus_per_pod": 0}, "gpus_per_pod", "greater than or equal to 1"),
    # a user is a Unix user's name, as teams.X.members takes it: before, " ", "a/b" and
    # " ana" were stored as given; a tester's finds: zero-width and list characters
    ({"user": " "}, "user", "' ' is not allowed: a Unix user's name (letters, digits, _ . -"),
    ({"user": "a/b"}, "user", "'a/b' is not allowed: a Unix user's name"),
    ({"user": " ana"}, "user", "' ana' is not allowed: a Unix user's name"),
    ({"user": "ana:x"}, "user", "'ana:x' is not allowed: a Unix user's name"),
    ({"user": "ana\u200b"}, "user", "'ana\\u200b' is not allowed: a Unix user's name"),
    ({"user": "ana,bob"}, "user", "'ana,bob' is not allowed: a Unix user's name"),
    ({"user": "a" * 65}, "user", "is not allowed: a Unix user's name"),
])
def test_bad_constraint_input_is_422_naming_the_field_and_nothing_is_stored(served, extra, field, needle):
    r = served.post("/jobs", json=body(served, **extra))
    assert r.status_code == 422, r.text
    d = r.json()["detail"][0]
    assert needle in d["msg"]
    if field is not None:
        assert field in d["loc"]
    assert served.get("/jobs").json() == []


def test_a_deadline_is_shown_and_flagged_at_risk_when_the_limit_ends_after_it(served):
    c = served
    code, out, err = c.cli("submit", "-c", "batch", "-A", "ml", "-t", "1:00:00", "--deadline", "now+10minutes",
                           "-D", str(c.tmp), "--", *waiting(c.flag))
    assert code == 0, err
    risky = out.split()[-1]
    v = settled(c, risky)
    assert v["deadline"] == pytest.approx(v["submit_time"] + 600, abs=30)
    assert [stage for _t, stage, _end in v["deadline_at_risk"]] == ["submit", "start"]
    code, out, _ = c.cli("show", risky)
    line = next(x for x in out.splitlines() if x.startswith("deadline: "))
    assert "AT RISK (at start: ends " in line
    iso = "2099-01-01T00:00:00Z"  # ISO with a zone: exact epoch seconds
    safe = settled(c, post(c, deadline=iso)["id"])
    assert safe["deadline"] == datetime(2099, 1, 1, tzinfo=timezone.utc).timestamp()
    assert safe["deadline_at_risk"] == []
    code, out, _ = c.cli("show", safe["id"])
    assert "deadline: 2099-01-01" in out and "AT RISK" not in out
    code, _, err = c.cli("submit", "-c", "batch", "-A", "ml", "--deadline", "someday", "--", "true")
    assert code == 2 and "--deadline" in err and "'someday' is not allowed" in err


def test_submit_options_reach_the_job_spec_and_show_prints_them(served):
    c = served
    code, out, err = c.cli("submit", "-c", "batch", "-A", "ml", "-C", "zone=b", "--node-selector", "nvlink",
                           "--toleration", "dedicated", "--min-driver", "550.54", "--cache-key", "llama-70b",
                           "--cache-required", "--estimate", "30", "-G", "1", "--gpus-per-task", "1", "--same-node",
                           "-D", str(c.tmp), "--", *waiting(c.flag))
    assert code == 0, err
    job_id = out.split()[-1]
    assert node_of(settled(c, job_id)) == "n2"
    spec = c.daemon.sched.jobs[job_id].spec
    assert spec.node_selector == (("nvlink", ""), ("zone", "b"))
    assert (spec.tolerations, spec.min_driver, spec.cache_key, spec.cache_required) == \
        (("dedicated",), "550.54", "llama-70b", True)
    assert (spec.runtime_estimate_s, spec.gpus, spec.gpus_per_pod, spec.same_node) == (1800, 1, 1, True)
    code, out, _ = c.cli("show", job_id)
    assert ("constraints: node_selector=nvlink,zone=b tolerations=dedicated min_driver=550.54 "
            "cache=llama-70b(required) gpus_per_pod=1 same_node") in out.splitlines()
    code, _, err = c.cli("submit", "-c", "batch", "-A", "ml", "-C", "a|b", "--", "true")
    assert code == 2 and "'a|b' is not allowed" in err and "no OR" in err
    code, out, _ = c.cli("submit", "--help")
    for option in ("--constraint", "--toleration", "--min-driver", "--cache-key", "--deadline", "--estimate",
                   "--gpus-per-task", "--same-node"):
        assert option in out


def test_sbatch_maps_deadline_constraint_nodes_and_tasks(served):
    c = served
    script = c.tmp / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH -A ml -p batch\n#SBATCH --constraint=zone=b&nvlink\n"
                      "#SBATCH --deadline=now+2hours\n#SBATCH -N 1\ntrue\n")
    code, out, err = c.cli("sbatch", "-D", str(c.tmp), str(script))
    assert code == 0, err
    spec = c.daemon.sched.jobs[out.split()[-1]].spec
    assert spec.node_selector == (("nvlink", ""), ("zone", "b")) and spec.same_node
    assert spec.deadline == pytest.approx(spec.submit_time + 7200, abs=30)
    plain = c.tmp / "plain.sh"
    plain.write_text("#!/bin/sh\n#SBATCH -A ml -p batch\ntrue\n")
    code, out, err = c.cli("sbatch", "-n", "2", "--gpus-per-task", "1", "-D", str(c.tmp), str(plain))
    assert code == 0, err
    spec = c.daemon.sched.jobs[out.split()[-1]].spec
    assert (spec.gpus, spec.gpus_per_pod, spec.same_node) == (2, 1, False)
    code, _, err = c.cli("sbatch", "-n", "2", "--gpus-per-task", "1", "-G", "3", str(plain))
    assert code == 2 and "--gpus-per-task 1 is not allowed with --gpus 3 and -n 2: --gpus 2" in err


def test_every_constraint_survives_a_restart(tmp_path):
    from gpushepherd.daemon.api import make_app

    fields = {"node_selector": ["nvlink", "zone=b"], "tolerations": ["dedicated=infer"], "min_driver": "550",
              "cache_key": "llama-70b", "cache_required": True, "deadline": 4070908800.0, "gpus_per_pod": 1,
              "same_node": False, "runtime_estimate_s": 60.0}
    d = start(tmp_path)
    try:
        with TestClient(make_app(d)) as c:
            c.flag, c.tmp = tmp_path / "flag", tmp_path
            job_id = post(c, **fields)["id"]
            before = settled(c, job_id)
    finally:
        d.stop()
    row = json.loads(d.store.job_row(job_id)["spec"])
    assert row["node_selector"] == [["nvlink", ""], ["zone", "b"]] and row["deadline"] == 4070908800.0
    d = start(tmp_path)
    try:
        with TestClient(make_app(d)) as c:
            after = c.get(f"/jobs/{job_id}").json()
    finally:
        (tmp_path / "flag").touch()
        d.stop()
    for key in fields:
        if key != "runtime_estimate_s":
            assert after[key] == before[key] == fields[key], key
    assert d.sched.jobs[job_id].spec.runtime_estimate_s == 60.0
    assert after["state"] == before["state"] == "RUNNING" and after["placement"] == before["placement"]


def test_a_service_refuses_a_deadline_its_replicas_could_not_keep(served):
    r = served.post("/services", json=body(served, name="svc", metric="queue_length", scale_up_above=5,
                                           scale_down_below=1, deadline="now+1h"))
    assert r.status_code == 422 and "a service runs until deleted" in r.json()["detail"][0]["msg"]
    assert served.get("/services").json() == []


def test_a_per_job_grace_period_reaches_the_spec_is_shown_and_one_above_the_class_s_is_rejected(served):
    # batch's grace is 1 s in POLICY (issue 13, point 6; note 027)
    c = served
    code, out, err = c.cli("submit", "-c", "batch", "-A", "ml", "--grace", "0.5", "-D", str(c.tmp),
                           "--", *waiting(c.flag))
    assert code == 0, err
    job_id = out.split()[-1]
    settled(c, job_id)
    assert c.daemon.sched.jobs[job_id].spec.grace_period_s == 0.5
    assert c.get(f"/jobs/{job_id}").json()["grace_period_s"] == 0.5
    code, out, _ = c.cli("show", job_id)
    assert "constraints: grace=0.5s" in out.splitlines()
    r = c.post("/jobs", json=body(c, grace_period_s="5s"))
    assert r.status_code == 422
    d = r.json()["detail"][0]
    assert d["loc"] == ["body", "grace_period_s"]
    assert d["msg"] == "grace_period_s: 5.0 is not allowed: seconds from 0 to the grace period of class batch (1 s)"
    r = c.post("/jobs", json=body(c, grace_period_s="soon"))
    assert r.status_code == 422 and "grace_period_s" in r.json()["detail"][0]["loc"]
    code, _, err = c.cli("submit", "-c", "batch", "-A", "ml", "--grace", "later", "--", "true")
    assert code == 2 and "--grace" in err


def test_a_grace_above_the_class_s_is_refused_naming_the_flag_typed_and_its_unit(served):
    # issue 14, point 4a: the API names its field (grace_period_s); the CLI the flag (--grace)
    c = served
    code, out, err = c.cli("submit", "-c", "batch", "-A", "ml", "--grace", "5m", "-D", str(c.tmp), "--", "true")
    assert code == 2 and out == "", out
    assert err.strip() == ("error: --grace: 300 s is not allowed: seconds from 0 to the grace period of class "
                           "batch (1 s)"), err
    assert "grace_period_s" not in err
