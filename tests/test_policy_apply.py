"""`policy apply` on a running server (design note 008, "Policy changes on a running
server"): a real `shepherd server` on SQLite and on PostgreSQL (tests/pgserver.py;
skipped where none), and the pure live-state check."""

from __future__ import annotations

import os
import pwd

import httpx
import yaml

from gpushepherd.core.scheduler import Scheduler
from gpushepherd.daemon.policy_change import conflicts
from gpushepherd.model.events import JobSubmitted
from gpushepherd.model.job import JobSpec
from gpushepherd.policy.load import parse_policy
import test_daemon
from test_daemon import wait_for, wait_for_file

db, fresh = test_daemon.db, test_daemon.fresh  # the daemon tests' fixtures: each database, a fresh server

V1 = """\
name: apply-test
cluster:
  nodes:
    - {name: local, gpus: 4, gpu_type: FAKE, gpu_mem_mib: 16384}
classes:
  batch: {grace_period_s: 2}
  exp: {priority: 150, preemptible: true}
teams:
  ml: {max_gpus: 2}
preemption: {enabled: true}
"""
V2 = V1.replace("ml: {max_gpus: 2}", "ml: {max_gpus: 4}")
SERVER_USER = pwd.getpwuid(os.geteuid()).pw_name  # the tests' servers run every job as their own user


def post_policy(s, text: str, token: str | None = None, **params) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else s.headers
    return httpx.post(s.url + "/policy", json={"policy": yaml.safe_load(text), "source": "p.yaml", "user": "ana"},
                      params=params, headers=headers, timeout=60)


def version(s) -> int:
    return httpx.get(s.url + "/policy", headers=s.headers, timeout=60).json()["version"]


def test_apply_while_a_job_runs_keeps_its_accounting_and_admits_under_the_new_quota(fresh, tmp_path):
    go = tmp_path / "go"
    s = fresh()
    s.policy.write_text(V1)
    s.start()
    assert httpx.get(s.url + "/policy", timeout=60).json()["by"] == "server --policy"
    running = s.submit(wait_for_file(go), gpus=2)
    s.wait_state(running, "RUNNING")
    pending = s.submit(wait_for_file(go), gpus=2)
    assert "max_gpus" in wait_for("the quota reason", lambda: s.job(pending)["reason"])  # ml is at its 2 GPUs
    usage_before = wait_for("usage", lambda: httpx.get(s.url + "/usage", timeout=60).json()["teams"][0]
                            ["decayed_usage_gpu_s"])

    r = post_policy(s, V2)
    assert r.status_code == 200, r.text
    # a server not run as root without tokens: every caller is its user, never the body's "ana" (note 084)
    assert r.json()["applied"] and r.json()["version"] == 2 and r.json()["by"] == SERVER_USER
    assert s.wait_state(pending, "RUNNING")["runs"] == 1  # admitted under the new quota
    job = s.job(running)
    assert job["state"] == "RUNNING" and job["runs"] == 1 and job["placement"] == "local:0,1"
    assert [h["to"] for h in job["history"]] == ["PENDING", "RUNNING"]  # its history kept
    usage = httpx.get(s.url + "/usage", timeout=60).json()["teams"][0]
    assert usage["decayed_usage_gpu_s"] >= usage_before and usage["gpus_in_use"] == 4

    r = post_policy(s, V2)  # the same again: a no-op that says so
    assert r.status_code == 200 and not r.json()["applied"] and "identical to version 2" in r.json()["message"]

    r = post_policy(s, V2.replace("max_gpus: 4", "max_gpus: -1"))
    assert r.status_code == 422
    assert r.json()["detail"][0]["field"] == "teams.ml.max_gpus" and "-1 is not allowed" in r.json()["detail"][0]["msg"]

    r = post_policy(s, V2.replace("gpus: 4, gpu_type", "gpus: 2, gpu_type"))  # below GPU 3, which is in use
    assert r.status_code == 422
    assert [(d["job"], d["field"]) for d in r.json()["detail"]] == [(pending, "cluster.nodes.gpus")]
    assert f"node 'local': gpus: 2 is not allowed: at least 4, job '{pending}' (RUNNING) holds its GPU 3" \
        in r.json()["detail"][0]["msg"]

    r = post_policy(s, V2.replace("  ml: {max_gpus: 4}", "  data: {}"))  # removes the team both jobs are in
    assert r.status_code == 422
    assert [(d["job"], d["field"]) for d in r.json()["detail"]] == [(running, "team"), (pending, "team")]
    assert f"job '{running}': team: 'ml' is not allowed: one of data" in r.json()["detail"][0]["msg"]
    assert version(s) == 2  # nothing applied by the refusals
    hist = httpx.get(s.url + "/policy/history", timeout=60).json()
    assert [h["version"] for h in hist] == [1, 2] and [h["by"] for h in hist] == ["server --policy", SERVER_USER]

    s.kill9()  # the log replays: version 2 in force, the jobs re-attached
    s.start(policy=False)
    assert version(s) == 2 and s.job(running)["state"] == "RUNNING" and s.job(pending)["state"] == "RUNNING"
    go.write_text("")
    assert s.wait_state(running, "COMPLETED")["runs"] == 1 and s.wait_state(pending, "COMPLETED")["runs"] == 1
    s.stop()
    s.start()  # --policy V1, which differs from version 2: version 3
    assert httpx.get(s.url + "/policy", timeout=60).json()["version"] == 3


def test_removing_a_class_in_use_is_refused_naming_the_job(fresh, tmp_path):
    s = fresh()
    s.policy.write_text(V1)
    s.start()
    exp = s.submit(wait_for_file(tmp_path / "never"), gpus=1, cls="exp")
    s.wait_state(exp, "RUNNING")
    r = post_policy(s, V1.replace("  exp: {priority: 150, preemptible: true}\n", ""))
    assert r.status_code == 422, r.text
    d, = r.json()["detail"]
    assert d["job"] == exp and d["field"] == "class" and f"job '{exp}': class: 'exp' is not allowed" in d["msg"]
    assert "(RUNNING) has not ended" in d["msg"] and version(s) == 1
    r = post_policy(s, V1.replace("local, gpus: 4", "other, gpus: 4"))  # removes the node it runs on
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "cluster.nodes"
    assert "node 'local' is removed by the new policy" in r.json()["detail"][0]["msg"]
    assert httpx.post(f"{s.url}/jobs/{exp}/cancel", timeout=60).status_code == 200
    r = post_policy(s, V1.replace("  exp: {priority: 150, preemptible: true}\n", ""))
    assert r.status_code == 200 and r.json()["version"] == 2  # nobody is in it any more
    assert s.job(exp)["state"] == "CANCELLED"  # an ended job of the removed class stays visible
    s.stop()
    s.start(policy=False)  # and the log replays across the removal
    assert version(s) == 2 and s.job(exp)["state"] == "CANCELLED"


def test_only_an_admin_token_applies_a_policy(fresh):
    from gpushepherd.daemon.store import Store

    s = fresh()
    s.policy.write_text(V1)
    s.start()
    store = Store(s.db or Store.sqlite_url(s.data))
    _, user_token = store.create_token("bo", ["ml"])
    _, admin_token = store.create_token("root", [], admin=True)
    store.close()
    r = post_policy(s, V2, token=user_token)
    assert r.status_code == 403 and r.json()["detail"] == (
        "applying a policy needs an admin token (or, on the Unix socket, root or the server's own user): "
        "user 'bo' is not an admin")
    r = post_policy(s, V2, token=user_token, dry_run="true")  # checking changes nothing: any token
    assert r.status_code == 200 and r.json()["would_apply"] and "as version 2" in r.json()["message"]
    s.token = admin_token
    assert version(s) == 1
    r = post_policy(s, V2, token=admin_token)
    assert r.status_code == 200 and r.json()["version"] == 2 and r.json()["by"] == "root"  # the token's user


def test_the_policy_commands_against_a_real_server(fresh, tmp_path):
    from typer.testing import CliRunner

    from gpushepherd.cli.main import app

    def shepherd(*args):
        return CliRunner().invoke(app, list(args), catch_exceptions=False)

    s = fresh()
    s.policy.write_text(V1)
    s.start()
    new = tmp_path / "v2.yaml"
    new.write_text(V2)
    res = shepherd("policy", "check", str(new), "--server", s.url)
    assert res.exit_code == 0, res.output
    assert "team ml: max_gpus=4" in res.output and "class exp: priority 150, preemptible" in res.output
    assert "server: version 1 is in force; this policy could be applied now as version 2" in res.output
    res = shepherd("policy", "apply", str(new), "--server", s.url)
    assert res.exit_code == 0 and "policy version 2 applied (was 1): version 2 in force since" in res.output
    res = shepherd("policy", "apply", str(new), "--server", s.url)
    assert res.exit_code == 0 and "identical to version 2" in res.output
    res = shepherd("policy", "show", "--server", s.url)
    assert res.exit_code == 0 and res.output.startswith("version 2, applied ") and str(new.resolve()) in res.output
    res = shepherd("policy", "history", "--server", s.url)
    assert [line.split()[0] for line in res.output.splitlines()[1:]] == ["1", "2"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(V2.replace("max_gpus: 4", "max_gpus: lots"))
    for cmd in ("check", "apply"):  # refused here, by the loader the server uses: never sent
        res = shepherd("policy", cmd, str(bad), "--server", s.url)
        assert res.exit_code == 2 and f"error: {bad}: teams.ml.max_gpus: 'lots' is not allowed" in res.output
    job = s.submit(wait_for_file(tmp_path / "never"), gpus=1, cls="exp")
    s.wait_state(job, "RUNNING")
    gone = tmp_path / "v3.yaml"
    gone.write_text(V2.replace("  exp: {priority: 150, preemptible: true}\n", ""))
    res = shepherd("policy", "apply", str(gone), "--server", s.url)
    assert res.exit_code == 2 and f"error: policy: job '{job}': class: 'exp' is not allowed" in res.output
    assert version(s) == 2


def test_conflicts_name_each_live_job_in_id_order():
    old = parse_policy(V1).rules
    sched = Scheduler(old)
    decisions = sched.handle([JobSubmitted(0.0, JobSpec(id=str(i), team="ml", workload_class="exp", gpus=1))
                              for i in (10, 2)])
    placements = {d.job_id: d.placement for d in decisions if hasattr(d, "placement")}
    assert sorted(placements) == ["10", "2"]
    new = parse_policy(V1.replace("  exp: {priority: 150, preemptible: true}\n", "")).rules
    assert [(c.job, c.field) for c in conflicts(sched, old, new, placements)] == [("2", "class"), ("10", "class")]
    assert conflicts(sched, old, parse_policy(V2).rules, placements) == []
