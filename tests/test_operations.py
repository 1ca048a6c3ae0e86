"""What an SRE runs `shepherd server` with (issue 18, points 12-14; design note 019): the
probes `/healthz` and `/readyz` on a real server, a loop stalled for real (its database
write-locked by another process), the oldest-pending gauge, the shipped Prometheus alert
rules against a live scrape (and `promtool` where installed), GPU samples under our
names unless `--dcgm-names`.

No timed assertions: every wait is a poll with a generous deadline; a gauge's value is
checked against bounds read from the clock before and after the scrape.
"""

from __future__ import annotations

import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from test_daemon import Server, free_port, wait_for, wait_for_file
from test_gpu_daemon import script
from test_metrics import POLICY as METRICS_POLICY
from test_metrics import metric_names, scrape, total, value

ROOT = Path(__file__).resolve().parent.parent
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
#: series Prometheus itself writes for each scrape target (not on /metrics)
PROMETHEUS_SERIES = {"up"}
REASONS_POLICY = """\
name: reasons-test
cluster:
  nodes:
    - {name: local, gpus: 4, gpu_type: FAKE, gpu_mem_mib: 16384}
classes:
  batch: {grace_period_s: 1}
  fifo: {grace_period_s: 1, priority: 50, queueing: strict_fifo}
teams:
  ml: {}
  qa: {max_gpus: 1}
"""


def rules_by_name() -> dict[str, dict]:
    return {r["alert"]: r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]}


def ready(s: Server) -> httpx.Response:
    return httpx.get(s.url + "/readyz", timeout=60)


def live_names(s: Server) -> set[str]:
    """Every sample name a live server's ``/metrics`` can carry, from its families' types
    (a family with no sample yet still declares its type)."""
    r = httpx.get(s.url + "/metrics", headers=s.headers, timeout=60)
    assert r.status_code == 200, r.text
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
                "gauge": ("",)}
    return {f.name + x for f in text_string_to_metric_families(r.text) for x in suffixes[f.type]}


def probe(kind: str, s: Server) -> int:
    """Run the Kubernetes Deployment's ``kind`` probe (``readinessProbe``, ...) of
    deploy/k8s/manifests/deployment.yaml against ``s``: its exit status."""
    docs = yaml.safe_load_all((ROOT / "deploy" / "k8s" / "manifests" / "deployment.yaml").read_text())
    dep = next(d for d in docs if d["kind"] == "Deployment")
    argv = dep["spec"]["template"]["spec"]["containers"][0][kind]["exec"]["command"]
    port = s.url.rsplit(":", 1)[1]
    argv = [sys.executable if a == "python3" else a.replace("127.0.0.1:8765", f"127.0.0.1:{port}") for a in argv]
    return subprocess.run(argv, capture_output=True, check=False, timeout=60).returncode


def _hold_write_lock(db: Path) -> sqlite3.Connection:
    """Another process's write lock on the server's SQLite database, until ``commit()``."""
    con = sqlite3.connect(db, timeout=30, isolation_level=None)
    con.execute("BEGIN EXCLUSIVE")
    return con


@pytest.fixture
def gpu_server(tmp_path):
    """A server on test_metrics' four fake GPUs; ``make(*extra)`` starts it."""
    made: list[Server] = []

    def make(*extra: str) -> Server:
        home = tmp_path / f"s{len(made)}"
        home.mkdir()
        s = Server(home)
        s.policy.write_text(METRICS_POLICY)
        s.data.mkdir(parents=True)
        script(s.data, {"gpus": {"0": {"util_pct": 87, "mem_used_mib": 1000, "temperature_c": 61, "power_w": 250}},
                        "jobs": {}})
        made.append(s.start(extra=("--sample-every", "0.2", *extra)))
        return s
    yield make
    for s in made:
        s.stop()


# -- 12: alert rules --------------------------------------------------------------------
def test_every_alert_expression_names_only_metrics_a_live_server_exports(gpu_server):
    rules = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    exported = live_names(gpu_server())
    for rule in rules:
        used = metric_names(rule["expr"])
        assert used, rule["alert"]
        assert used - exported - PROMETHEUS_SERIES == set(), (rule["alert"], used - exported)
    # the five alerts, the server down and the 5xx answers, each on the metric that shows it
    by_metric = {n: r["alert"] for r in rules for n in metric_names(r["expr"])}
    for name in ("gpushepherd_gpus_free_usable", "gpushepherd_oldest_pending_by_reason_seconds",
                 "gpushepherd_scheduling_loop_last_step_timestamp_seconds", "gpushepherd_store_errors_total",
                 "gpushepherd_job_preemptions_total", "up", "gpushepherd_http_responses_total"):
        assert name in by_metric, name
    assert {r["labels"]["severity"] for r in rules} <= {"warning", "critical"}
    assert all(r["annotations"]["summary"] and r["annotations"]["description"] for r in rules)


def test_the_alerts_on_waiting_jobs_name_the_capacity_reasons_only():
    """GPUs idle while jobs wait and the oldest pending job count jobs that wait for
    capacity only (CAPACITY_REASONS), never a quota, a window, a hold, a dependency or a
    begin time (issue 18 follow-up: a quota wait fired both in normal multi-team use)."""
    from gpushepherd.daemon.metrics import CAPACITY_REASONS

    rules = rules_by_name()
    assert metric_names(rules["GpuShepherdGpusFreeWhileJobsWait"]["expr"]) == {"gpushepherd_gpus_free_usable"}
    old = rules["GpuShepherdOldestPendingJobTooOld"]["expr"]
    assert metric_names(old) == {"gpushepherd_oldest_pending_by_reason_seconds"}
    codes = set(re.search(r'reason=~"([^"]*)"', old)[1].split("|"))
    assert codes == set(CAPACITY_REASONS) | {"New"}
    assert not codes & {"QuotaExceeded", "CohortQuota", "WindowLimit", "ExceedsCapacity", "JobHeldUser",
                        "Dependency", "BeginTime", "DependencyNeverSatisfied", "BadConstraints"}
    down = rules["GpuShepherdServerDown"]["expr"]
    assert 'up{job=~"gpushepherd.*"} == 0' in down and "absent(" in down
    assert 'gpushepherd_http_responses_total{code="5xx"}' in rules["GpuShepherdApiServerErrors"]["expr"]


def test_pending_jobs_by_reason_and_usable_free_gpus_on_a_real_server(tmp_path):
    """A job held by its team's quota while 3 GPUs are free counts under QuotaExceeded and
    leaves no usable free GPU (the alert stays quiet); a strict-FIFO job behind a head that
    waits for Resources could use the free GPUs: they count as usable; a held job counts
    under JobHeldUser."""
    s = Server(tmp_path)
    s.policy.write_text(REASONS_POLICY)
    flag = tmp_path / "go"
    s.start()
    try:
        a = s.submit(wait_for_file(flag), gpus=1, team="qa")
        s.wait_state(a, "RUNNING")
        quota = s.submit(wait_for_file(flag), gpus=1, team="qa")
        wait_for("a quota reason", lambda: (s.job(quota)["reason"] or "").startswith("QuotaExceeded"))
        m = scrape(s)
        assert value(m, "gpushepherd_gpus_free") == 3
        assert value(m, "gpushepherd_pending_jobs", **{"class": "batch", "team": "qa", "reason": "QuotaExceeded"}) == 1
        assert total(m, "gpushepherd_pending_jobs") == 1
        assert value(m, "gpushepherd_gpus_free_usable") == 0  # idle by policy, not a waste
        assert value(m, "gpushepherd_oldest_pending_by_reason_seconds",
                     **{"class": "batch", "team": "qa", "reason": "QuotaExceeded"}) >= 0
        assert total(m, "gpushepherd_oldest_pending_by_reason_seconds", reason="Resources") == 0
        # capacity: a 4-GPU head of a strict-FIFO queue waits for Resources; the 1-GPU job behind it could run
        head = s.submit(wait_for_file(flag), gpus=4, cls="fifo")
        behind = s.submit(wait_for_file(flag), gpus=1, cls="fifo")
        s.submit(wait_for_file(flag), gpus=1, hold=True)
        wait_for("the head's reason", lambda: (s.job(head)["reason"] or "").startswith("Resources"))
        wait_for("a priority reason", lambda: (s.job(behind)["reason"] or "").startswith("Priority"))
        submitted = s.job(quota)["submit_time"]
        t0 = time.time()
        m = scrape(s)
        t1 = time.time()
        assert value(m, "gpushepherd_pending_jobs", **{"class": "fifo", "team": "ml", "reason": "Resources"}) == 1
        assert value(m, "gpushepherd_pending_jobs", **{"class": "fifo", "team": "ml", "reason": "Priority"}) == 1
        assert value(m, "gpushepherd_pending_jobs", **{"class": "batch", "team": "ml", "reason": "JobHeldUser"}) == 1
        assert value(m, "gpushepherd_pending_jobs", **{"class": "batch", "team": "qa", "reason": "QuotaExceeded"}) == 1
        assert value(m, "gpushepherd_gpus_free") == 3
        assert value(m, "gpushepherd_gpus_free_usable") == 3  # the 1-GPU job fits any of them
        v = value(m, "gpushepherd_oldest_pending_by_reason_seconds",
                  **{"class": "batch", "team": "qa", "reason": "QuotaExceeded"})
        assert t0 - submitted <= v <= t1 - submitted, (t0 - submitted, v, t1 - submitted)
    finally:
        flag.touch()
        s.stop()


def test_api_responses_are_counted_by_route_and_status_class_and_a_500_is_logged(tmp_path):
    """A 404 counts as 4xx on its route template; an exception in a handler answers 500,
    counts as 5xx and logs its method, route and traceback (an SRE saw 500s while
    /readyz stayed 200 and nothing in the metrics showed them)."""
    import logging

    from fastapi.testclient import TestClient

    from gpushepherd.daemon.api import make_app
    from gpushepherd.daemon.server import Daemon

    policy = tmp_path / "policy.yaml"
    policy.write_text(METRICS_POLICY)
    d = Daemon(tmp_path / "data", policy_path=policy, poll_s=0.05)
    d.start()
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("gpushepherd.daemon")
    logger.addHandler(handler)
    try:
        def broken(job_id, history=False, row=None):
            raise RuntimeError("boom in job_view")
        with TestClient(make_app(d), raise_server_exceptions=False) as client:
            assert client.get("/jobs/nope").status_code == 404
            assert client.get("/healthz").status_code == 200
            d.job_view = broken
            assert client.get("/jobs/12").status_code == 500
            m = {(s.name, frozenset(s.labels.items())): s.value
                 for f in text_string_to_metric_families(client.get("/metrics").text) for s in f.samples}
        assert value(m, "gpushepherd_http_responses_total", route="/jobs/{job_id}", code="4xx") == 1
        assert value(m, "gpushepherd_http_responses_total", route="/jobs/{job_id}", code="5xx") == 1
        assert value(m, "gpushepherd_http_responses_total", route="/healthz", code="2xx") == 1
        failed = [r for r in records if "failed" in r.getMessage()]
        assert len(failed) == 1 and "GET /jobs/{job_id}" in failed[0].getMessage()
        assert failed[0].exc_info and "boom in job_view" in str(failed[0].exc_info[1])
    finally:
        logger.removeHandler(handler)
        d.stop()


def test_promtool_accepts_the_alert_rules():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not on PATH (Debian's prometheus package has it; .ci/run installs it as root)")
    r = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, check=False, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len([1 for g in yaml.safe_load(ALERTS.read_text())['groups'] for _ in g['rules']])} rules" \
        in r.stdout + r.stderr


def test_promtool_evaluates_the_alert_rules_on_the_quota_and_capacity_cases():
    """deploy/prometheus/alerts_test.yaml (promtool's rule unit tests): a job pending
    QuotaExceeded beside 3 free GPUs fires nothing for 2 h; usable free GPUs fire after
    15 m, a capacity wait over 1 h, a 5xx answer and a failing scrape fire theirs."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not on PATH (Debian's prometheus package has it; .ci/run installs it as root)")
    r = subprocess.run([promtool, "test", "rules", "alerts_test.yaml"], capture_output=True, text=True,
                       check=False, timeout=120, cwd=ALERTS.parent)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout + r.stderr


# -- 12: probes and the stalled loop ------------------------------------------------------
def test_readyz_fails_while_the_loop_is_blocked_on_a_locked_database_and_recovers(tmp_path):
    s = Server(tmp_path)
    # a write waits up to an hour for the lock: the loop's step blocks, holding the daemon's lock
    s.start(extra=("--ready-max-step-age", "1", "--db-busy-timeout", "3600"))
    try:
        assert httpx.get(s.url + "/healthz", timeout=60).json() == {"status": "ok"}
        r = wait_for("ready", lambda: (r := ready(s)).status_code == 200 and r)
        body = r.json()
        assert body["status"] == "ready" and body["checks"]["loop"]["ok"] and body["checks"]["store"] == {"ok": True}
        assert body["checks"]["loop"]["max_step_age_s"] == 1
        before = value(scrape(s), "gpushepherd_scheduling_loop_last_step_timestamp_seconds")

        lock = _hold_write_lock(s.data / "shepherd.db")
        answers: list[httpx.Response] = []
        try:
            # a submission makes the loop write now (else its heartbeat does within 5 s)
            t = threading.Thread(target=lambda: answers.append(httpx.post(s.url + "/jobs", json={
                "class": "batch", "team": "ml", "command": ["true"], "cwd": str(tmp_path)}, timeout=120)))
            t.start()
            r = wait_for("not ready", lambda: (r := ready(s)).status_code == 503 and r)
            body = r.json()
            loop = body["checks"]["loop"]
            assert body["status"] == "not ready" and not loop["ok"], body
            assert "no step completed" in loop["detail"] and loop["last_step_age_s"] > 1, loop
            assert body["checks"]["store"] == {"ok": True}  # reads still answer (WAL): only the loop is stuck
            assert httpx.get(s.url + "/healthz", timeout=60).status_code == 200  # alive all the same
            # /metrics answers while the loop holds the daemon's lock, without the state gauges
            stalled = scrape(s)
            assert value(stalled, "gpushepherd_scheduling_loop_last_step_timestamp_seconds") >= before
            assert wait_for("a blocked step", lambda: ready(s).json()["checks"]["loop"]["step_running_s"])
            again = scrape(s)
            assert value(again, "gpushepherd_scheduling_loop_last_step_timestamp_seconds") == \
                value(stalled, "gpushepherd_scheduling_loop_last_step_timestamp_seconds")
            assert total(again, "gpushepherd_queue_length") == 0 and \
                not any(n == "gpushepherd_queue_length" for n, _ in again)
        finally:
            lock.commit()
            lock.close()
        t.join(timeout=120)
        assert answers and answers[0].status_code == 201, answers and answers[0].text
        r = wait_for("ready again", lambda: (r := ready(s)).status_code == 200 and r)
        assert r.json()["checks"]["loop"]["last_error"] is None
        after = value(scrape(s), "gpushepherd_scheduling_loop_last_step_timestamp_seconds")
        assert after > value(stalled, "gpushepherd_scheduling_loop_last_step_timestamp_seconds")

        # the probes stay open once the server has tokens; everything else needs one
        out = subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", "token", "create", "--user", "ops",
                              "--team", "ml", "--data-dir", str(s.data)], capture_output=True, text=True, check=False, timeout=60)
        assert out.returncode == 0, out.stderr
        assert wait_for("auth on", lambda: httpx.get(s.url + "/jobs", timeout=60).status_code == 401)
        assert httpx.get(s.url + "/healthz", timeout=60).status_code == 200
        assert ready(s).status_code == 200

        # another server takes the database lock over: not ready, naming the store
        con = sqlite3.connect(s.data / "shepherd.db", timeout=30)
        con.execute("UPDATE server_lock SET token = 'someone-else' WHERE name = 'server'")
        con.commit()
        con.close()
        r = wait_for("not ready: lock lost", lambda: (r := ready(s)).status_code == 503 and r)
        assert r.json()["checks"]["store"] == {"ok": False, "detail": "another server holds the database lock"}
    finally:
        s.stop()


def test_store_errors_are_counted_and_named_by_readyz(tmp_path):
    s = Server(tmp_path)
    s.start(extra=("--ready-max-step-age", "10", "--db-busy-timeout", "0.3"))
    try:
        wait_for("ready", lambda: ready(s).status_code == 200)
        assert total(scrape(s), "gpushepherd_store_errors_total") == 0
        lock = _hold_write_lock(s.data / "shepherd.db")
        try:
            r = httpx.post(s.url + "/jobs", json={"class": "batch", "team": "ml", "command": ["true"],
                                                  "cwd": str(tmp_path)}, timeout=120)
            assert r.status_code == 503, r.text
            m = wait_for("a store error counted", lambda: (m := scrape(s)) and value(
                m, "gpushepherd_store_errors_total", reason="database is locked") and m)
            assert total(m, "gpushepherd_store_errors_total") == \
                value(m, "gpushepherd_store_errors_total", reason="database is locked")
            # the loop still steps (reads answer, WAL) but nothing can be written: not ready
            r = wait_for("not ready", lambda: (r := ready(s)).status_code == 503 and r)
            store = r.json()["checks"]["store"]
            assert not store["ok"] and "database is locked" in store["detail"], store
            wait_for("a failed step named", lambda: ready(s).json()["checks"]["loop"]["last_error"] ==
                     "storage unavailable: database is locked")  # the heartbeat's write, every 5 s
            # the shipped Kubernetes probes: alive, not ready
            assert probe("livenessProbe", s) == 0
            assert wait_for("the readiness probe failing", lambda: probe("readinessProbe", s) != 0)
        finally:
            lock.commit()
            lock.close()
        wait_for("ready again", lambda: ready(s).status_code == 200)
        assert wait_for("the readiness probe passing", lambda: probe("readinessProbe", s) == 0)
        assert probe("startupProbe", s) == 0
    finally:
        s.stop()


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
def test_oldest_pending_seconds_follows_a_waiting_job(tmp_path, request, db):
    url = request.getfixturevalue("pg_server").new_database() if db == "postgresql" else None
    s = Server(tmp_path, db=url).start()
    flag = tmp_path / "go"
    try:
        r = wait_for("ready", lambda: (r := ready(s)).status_code == 200 and r)  # Store.ping on either database
        assert r.json()["checks"]["store"] == {"ok": True}
        big = s.submit(wait_for_file(flag), gpus=4)
        s.wait_state(big, "RUNNING")
        m = scrape(s)
        assert value(m, "gpushepherd_oldest_pending_seconds", **{"class": "batch", "team": "ml"}) == 0
        assert value(m, "gpushepherd_oldest_pending_seconds", **{"class": "sandbox", "team": "ml"}) == 0  # no gaps
        waiting = s.submit(wait_for_file(flag), gpus=1)
        submitted = s.job(waiting)["submit_time"]
        assert s.job(waiting)["state"] == "PENDING"
        time.sleep(0.5)  # it waits a little; the value is checked against the clock, not this sleep
        t0 = time.time()
        m = scrape(s)
        t1 = time.time()
        v = value(m, "gpushepherd_oldest_pending_seconds", **{"class": "batch", "team": "ml"})
        assert t0 - submitted <= v <= t1 - submitted, (t0 - submitted, v, t1 - submitted)
        assert value(m, "gpushepherd_oldest_pending_seconds", **{"class": "sandbox", "team": "ml"}) == 0
        flag.touch()
        s.wait_state(waiting, "RUNNING", "COMPLETED")
        assert value(scrape(s), "gpushepherd_oldest_pending_seconds", **{"class": "batch", "team": "ml"}) == 0
    finally:
        flag.touch()
        s.stop()


def test_a_requeued_job_waits_from_its_requeue_not_its_submission():
    from types import SimpleNamespace

    from gpushepherd.core.state import Transition
    from gpushepherd.daemon.metrics import pending_since

    spec = SimpleNamespace(submit_time=10.0)
    job = SimpleNamespace(spec=spec, history=[Transition(10.0, "", "PENDING", "submitted", 1)])
    assert pending_since(job) == 10.0
    job.history += [Transition(20.0, "PENDING", "RUNNING", "placed", 2),
                    Transition(50.0, "RUNNING", "PREEMPTING", "priority", 3),
                    Transition(55.0, "PREEMPTING", "PENDING", "requeued", 4)]
    assert pending_since(job) == 55.0
    assert pending_since(SimpleNamespace(spec=spec, history=[])) == 10.0  # no history kept: its submission


# -- 13: GPU samples under our names; DCGM's behind --dcgm-names -------------------------------
def test_gpu_samples_use_our_names_only_unless_dcgm_names(gpu_server):
    ours = {"node": "local", "gpu": "0", "uuid": "GPU-f0"}
    plain = gpu_server()
    m = wait_for("GPU 0 sampled", lambda: (m := scrape(plain)) and
                 value(m, "gpushepherd_gpu_utilization_ratio", **ours) is not None and m)
    assert value(m, "gpushepherd_gpu_utilization_ratio", **ours) == pytest.approx(0.87)
    assert value(m, "gpushepherd_gpu_temperature_celsius", **ours) == 61
    assert not [n for n in live_names(plain) if n.startswith("DCGM_")]  # not even an empty family
    plain.stop()

    both = gpu_server("--dcgm-names")
    m = wait_for("GPU 0 sampled", lambda: (m := scrape(both)) and total(m, "DCGM_FI_DEV_GPU_UTIL", gpu="0") and m)
    assert total(m, "DCGM_FI_DEV_GPU_UTIL", gpu="0", UUID="GPU-f0") == 87
    assert total(m, "DCGM_FI_DEV_FB_USED", gpu="0") == 1000
    assert value(m, "gpushepherd_gpu_utilization_ratio", **ours) == pytest.approx(0.87)  # ours as well


# -- 14: the first log line, the systemd unit ------------------------------------------------
UNIT = ROOT / "deploy" / "systemd" / "gpushepherd.service"


def test_the_first_log_line_says_where_the_server_listens_and_which_policy_version_runs(tmp_path):
    s = Server(tmp_path).start()
    try:
        job = s.submit("print('hi')")
        s.wait_state(job, "COMPLETED")
    finally:
        s.stop()  # writes a snapshot: the next start logs that it reads it
    first = s.log.read_text().splitlines()[0]
    assert f"serving {s.url};" in first and f"policy version 1 from {s.policy} (applied " in first, first
    assert "by server --policy" in first and f"data dir {s.data}" in first

    again = Server(tmp_path, name="again")  # same data dir, another log file
    again.policy.write_text(again.policy.read_text().replace("  ml: {}\n", "  ml: {}\n  cv: {}\n"))
    again.start()
    try:
        lines = again.log.read_text().splitlines()
    finally:
        again.stop()
    assert f"serving {again.url};" in lines[0] and f"policy version 2 from {again.policy}" in lines[0], lines[0]
    # what the start logged before it knew the policy comes after that line, not before
    later = "\n".join(lines[1:])
    assert "starting from the snapshot of batch" in later and "inventory static: node local" in later


def test_held_log_lines_follow_the_first_line_even_with_two_servers_starting_at_once():
    import logging

    from gpushepherd.daemon.server import HeldLog

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    root, keep = logging.getLogger(), Keep()
    root.addHandler(keep)
    level = root.level
    root.setLevel(logging.INFO)  # setLevel, not .level =: loggers cache their effective level
    log = logging.getLogger("gpushepherd.daemon")
    try:
        a, b = HeldLog(), HeldLog()
        a.hold()
        log.info("a: inventory")
        b.hold()
        log.info("both: snapshot")
        a.hand_on("a: first")
        assert seen == []  # b still holds: nothing goes out of order
        b.hand_on("b: first")
        assert seen == ["b: first", "a: first", "a: inventory", "both: snapshot"]  # each once
        seen.clear()
        log.info("after")
        assert seen == ["after"] and logging.getLogger("gpushepherd").propagate
    finally:
        root.removeHandler(keep)
        root.setLevel(level)


def test_a_port_in_use_is_refused_before_the_server_takes_its_data_dir(tmp_path):
    import socket

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        policy = tmp_path / "policy.yaml"
        policy.write_text(METRICS_POLICY)
        r = subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", "server", "--data-dir", str(tmp_path / "d"),
                            "--policy", str(policy), "--inventory", "static", "--port", str(busy.getsockname()[1])],
                           capture_output=True, text=True, check=False, timeout=120)
    finally:
        busy.close()
    assert r.returncode == 2, r.stdout + r.stderr
    assert "error: --host 127.0.0.1 --port " in r.stderr and "cannot listen there: Address already in use" in r.stderr, r.stderr
    # nothing of the data dir is made (before: shepherd.db and shepherd.db.open-lock were)
    made = sorted(p.name for p in (tmp_path / "d").iterdir()) if (tmp_path / "d").exists() else []
    assert made == [], made


def _unit_exec_start() -> list[str]:
    line = next(x for x in UNIT.read_text().splitlines() if x.startswith("ExecStart="))
    return line.removeprefix("ExecStart=").split()


def test_the_systemd_unit_runs_shepherd_server_and_its_command_line_serves(tmp_path):
    text = UNIT.read_text()
    for needed in ("Restart=on-failure", "StateDirectory=gpushepherd", "KillMode=process", "NoNewPrivileges=yes"):
        assert needed in text.splitlines(), needed
    assert not any(x.startswith(("PrivateDevices=", "DevicePolicy=", "ProtectClock=")) for x in text.splitlines())
    argv = _unit_exec_start()
    assert argv[0].endswith("/shepherd") and argv[1] == "server"
    # the unit's own options, with this test's data dir, policy and port: the server answers
    opts = argv[2:]
    subst = {"--data-dir": str(tmp_path / "data"), "--policy": str(tmp_path / "policy.yaml"),
             "--port": str(free_port()), "--inventory": "static", "--socket": str(tmp_path / "shepherd.sock")}
    for i, opt in enumerate(opts[:-1]):
        if opt in subst:
            opts[i + 1] = subst[opt]
    (tmp_path / "policy.yaml").write_text(METRICS_POLICY)
    log = tmp_path / "server.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gpushepherd.cli.main", "server", *opts], stdout=out,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{subst['--port']}"
    try:
        def up():
            assert proc.poll() is None, log.read_text()
            try:
                return httpx.get(url + "/readyz", timeout=5).status_code == 200
            except httpx.TransportError:
                return False
        wait_for("the unit's server ready", up, every=0.2)
        assert f"serving {url};" in log.read_text().splitlines()[0]
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    # systemd's stop is a SIGTERM: the server saves its state and unlocks before it ends
    # by that signal (uvicorn's re-raised SIGTERM used to end it before Daemon.stop ran)
    assert proc.returncode == -signal.SIGTERM
    assert "stopped: state saved, data dir unlocked" in log.read_text().splitlines()[-1]


def test_systemd_analyze_verifies_the_unit(tmp_path):
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not on PATH (systemd's package has it)")
    # the unit names /usr/local/bin/shepherd, which verify requires to exist: this test's own
    shepherd = Path(sys.executable).with_name("shepherd")
    if not shepherd.exists():
        pytest.skip(f"no shepherd script beside {sys.executable} to stand in for /usr/local/bin/shepherd")
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/shepherd", str(shepherd)))
    r = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True, check=False, timeout=120)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr  # no warning either
