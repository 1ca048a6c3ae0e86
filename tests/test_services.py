"""Inference services that autoscale on their own signals (R12, design note 014).

The rules (``observe``) and the signal reader directly; then a real `shepherd server`
with real replica processes serving `/metrics` on one shared port (SO_REUSEPORT), their
`queue_length` read from a file the test writes. No timed assertion: the cool-down is
checked on the server's own decision times against the moment the test lowered the
queue.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx
import pytest
from test_daemon import Server, free_port, wait_for

from gpushepherd.daemon.services import MetricMissing, Service, ServiceError, observe, parse_selector, read_signal

POLICY = """\
name: services-test
cluster:
  nodes:
    - {name: local, gpus: 2, gpu_type: FAKE, gpu_mem_mib: 16384}
classes:
  production-inference: {}
  batch: {grace_period_s: 1}
teams:
  ml: {}
preemption: {enabled: true}
"""

REPLICA = """\
import http.server, os, socketserver, sys, time
port, qfile = int(sys.argv[1]), sys.argv[2]
open(os.path.join(os.path.dirname(qfile), "started"), "a").write(os.environ["SHEPHERD_REPLICA"] + "\\n")

class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        try:
            n = open(qfile).read().strip() or "0"
        except OSError:
            n = "0"
        body = ("# TYPE queue_length gauge\\nqueue_length %s\\n# TYPE tokens counter\\ntokens_total 5\\n" % n).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass

class S(http.server.ThreadingHTTPServer):
    allow_reuse_port = True  # every replica serves the service's one port (SO_REUSEPORT)

t0 = time.time()
with S(("127.0.0.1", port), H) as srv:
    srv.timeout = 0.2
    while time.time() - t0 < 300:
        srv.handle_request()
"""


def config(**over) -> dict:
    return {"name": "web", "min_replicas": 1, "max_replicas": 3, "metric": "queue_length", "metrics_url": None,
            "scale_up_above": 10.0, "scale_down_below": 2.0, "cooldown_s": 60.0, "scrape_every_s": 1.0,
            "stabilize": 3, **over}


def test_observe_scales_up_after_stabilisation_and_down_only_after_the_cool_down():
    svc = Service(1, "web", 0.0, config(), desired=1)
    svc.decisions.append({"t": 0.0, "from": 0, "to": 1, "reason": "create"})
    assert observe(svc, 1, 14) is None and observe(svc, 2, 14) is None
    to, why = observe(svc, 3, 14)
    assert to == 2 and why == "scale up 1 -> 2: queue_length 14 > 10 for 3 samples"
    svc.desired = 2
    svc.decisions.append({"t": 3.0, "from": 1, "to": 2, "reason": why})
    assert observe(svc, 4, 14) is None  # the streak restarted
    assert observe(svc, 5, 5) is None  # between the thresholds: hysteresis, streak broken
    assert observe(svc, 6, 14) is None and observe(svc, 7, 14) is None
    assert observe(svc, 8, None) is None  # a failed sample breaks the streak
    assert observe(svc, 9, 14) is None
    # below: nothing until the signal has been below for the cool-down
    svc.above = 0
    assert observe(svc, 10, 1) is None
    assert observe(svc, 69.9, 1) is None
    to, why = observe(svc, 70, 0)
    assert to == 1 and why == "scale down 2 -> 1: queue_length 0 < 2 for 60.0 s (cool-down 60 s)"
    svc.desired = 1
    assert observe(svc, 500, 0) is None  # at min
    svc.config["max_replicas"] = 1
    assert [observe(svc, t, 50) for t in (501, 502, 503, 504)] == [None] * 4  # at max


def test_scale_down_waits_a_cool_down_after_the_last_decision_too():
    svc = Service(1, "web", 0.0, config(cooldown_s=10.0), desired=2)
    svc.decisions.append({"t": 100.0, "from": 1, "to": 2, "reason": "up"})
    assert observe(svc, 95, 0) is None  # below since 95
    assert observe(svc, 105, 0) is None  # below for 10 s but the last decision is 5 s old
    assert observe(svc, 110, 0)[0] == 1


def test_the_signal_reader_takes_gauges_selectors_and_counters_and_names_a_missing_metric():
    text = ('# TYPE queue_length gauge\nqueue_length{model="a"} 3\nqueue_length{model="b"} 4\n'
            '# TYPE latency_seconds summary\nlatency_seconds{quantile="0.95"} 0.25\nlatency_seconds_count 9\n'
            'latency_seconds_sum 2\n# TYPE tokens counter\ntokens_total 120\n')
    assert read_signal(text, "queue_length") == (7.0, False)
    assert read_signal(text, 'queue_length{model="b"}') == (4.0, False)
    assert read_signal(text, 'latency_seconds{quantile="0.95"}') == (0.25, False)
    assert read_signal(text, "tokens_total") == (120.0, True)
    # the answer's own names are not echoed (issue 19, point 7): only how many there were
    with pytest.raises(MetricMissing, match=r"'queue_len' is not exposed by http://x/metrics \(not among the 5 "
                                            r"sample names of its answer\)"):
        read_signal(text, "queue_len", "http://x/metrics")
    for bad in ("gpu_utilization", "DCGM_FI_DEV_GPU_UTIL", "nvidia_gpu_duty_cycle"):
        with pytest.raises(ServiceError, match="GPU utilisation is never a scaling signal") as exc:
            parse_selector(bad)
        assert exc.value.field == "metric"
    with pytest.raises(ServiceError, match="is not allowed: a Prometheus metric name"):
        parse_selector("queue length")


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path)
    s.policy.write_text(POLICY)
    s.start()
    yield s
    s.stop()


def service_body(s: Server, tmp: Path, port: int, **over) -> dict:
    return {"name": "web", "class": "production-inference", "team": "ml", "user": "ana", "gpus": 1,
            "command": [sys.executable, "-c", REPLICA, str(port), str(tmp / "queue")], "cwd": str(tmp),
            "min_replicas": 1, "max_replicas": 2, "metric": "queue_length",
            "metrics_url": f"http://127.0.0.1:{port}/metrics", "scale_up_above": 10, "scale_down_below": 2,
            "cooldown_s": 2, "scrape_every_s": 0.2, "stabilize": 2, **over}


def get(s: Server, name: str = "web") -> dict:
    return httpx.get(f"{s.url}/services/{name}", timeout=60).json()


def test_a_service_scales_up_on_its_queue_preempting_batch_and_down_after_the_cool_down(server, tmp_path):
    s = server
    (tmp_path / "queue").write_text("5")
    port = free_port()
    # GPUs full: a batch job holds the second GPU
    batch = s.submit("import time\nt0 = time.time()\nwhile time.time() - t0 < 300: time.sleep(0.1)", cls="batch")
    s.wait_state(batch, "RUNNING")
    r = httpx.post(s.url + "/services", json=service_body(s, tmp_path, port), timeout=60)
    assert r.status_code == 201, r.text
    assert r.json()["decisions"][0]["reason"] == "create: min 1 replica"
    v = wait_for("replica 1 running and its queue scraped",
                 lambda: (v := get(s))["running"] == 1 and (v["last_signal"] or {}).get("value") == 5 and v)
    first = v["replicas"][0]["id"]
    assert first.startswith("web.") and v["desired"] == 1 and v["error"] is None
    assert httpx.get(f"{s.url}/services", timeout=60).json()[0]["name"] == "web"

    (tmp_path / "queue").write_text("14")
    v = wait_for("a second replica running", lambda: (v := get(s))["running"] == 2 and v)
    up = v["decisions"][-1]
    assert (up["from"], up["to"]) == (1, 2)
    assert up["reason"] == "scale up 1 -> 2: queue_length 14 > 10 for 2 samples"
    assert s.job(batch)["preemptions"] == 1  # production inference took the batch job's GPU
    assert s.job(batch)["state"] == "PENDING"
    # a real second process (RUNNING is the core's word: the process writes its line a moment later)
    wait_for("the second replica's process", lambda: len((tmp_path / "started").read_text().split()) == 2)

    lowered = time.time()
    (tmp_path / "queue").write_text("0")
    v = wait_for("scaled down to min", lambda: (v := get(s))["desired"] == 1 and v["running"] == 1 and v)
    down = v["decisions"][-1]
    assert (down["from"], down["to"]) == (2, 1) and down["reason"].startswith("scale down 2 -> 1: queue_length 0 < 2")
    assert down["t"] >= lowered + 2  # not before the cool-down: the queue was 14 until `lowered`
    assert down["t"] >= up["t"] + 2
    assert [r["id"] for r in v["replicas"]] == [first]  # the newest replica went
    s.wait_state(batch, "RUNNING")  # the batch job got its GPU back
    assert len(v["decisions"]) == 3  # create, up, down: nothing else

    # a restart keeps the service, its replica (re-attached, not started again) and its decisions
    before = v["decisions"]
    s.kill9()
    s.start(policy=False)
    v = wait_for("the service after the restart", lambda: (v := get(s)).get("running") == 1 and v)
    assert [r["id"] for r in v["replicas"]] == [first] and v["desired"] == 1
    assert v["decisions"] == before  # the cool-down clock (the last decision's time) too
    assert len((tmp_path / "started").read_text().split()) == 2
    assert s.job(first)["runs"] == 1

    r = httpx.delete(f"{s.url}/services/web", timeout=60)
    assert r.status_code == 200 and r.json()["decisions"][-1]["reason"] == "delete: 1 -> 0"
    s.wait_state(first, "CANCELLED")
    assert httpx.get(f"{s.url}/services/web", timeout=60).status_code == 404


def test_pushed_signals_and_a_missing_metric(server, tmp_path):
    s = server
    body = service_body(s, tmp_path, free_port(), metrics_url=None, name="push", max_replicas=2, stabilize=1,
                        command=[sys.executable, "-c", "import time; time.sleep(300)"])
    assert httpx.post(s.url + "/services", json=body, timeout=60).status_code == 201
    r = httpx.post(f"{s.url}/services/push/signals", json={"queue_length": 30}, timeout=60)
    assert r.status_code == 200 and r.json()["desired"] == 2
    assert r.json()["decisions"][-1]["reason"] == "scale up 1 -> 2: queue_length 30 > 10 for 1 samples"
    r = httpx.post(f"{s.url}/services/push/signals", json={"latency": 3}, timeout=60)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "signals"]
    assert "'queue_length'" in r.json()["detail"][0]["msg"]
    wait_for("2 replicas", lambda: len(get(s, "push")["replicas"]) == 2)

    port = free_port()
    body = service_body(s, tmp_path, port, name="miss", metric="queue_len", min_replicas=0)
    assert httpx.post(s.url + "/services", json=body, timeout=60).status_code == 201
    (tmp_path / "queue").write_text("1")
    import subprocess
    exporter = subprocess.Popen([sys.executable, "-c", REPLICA, str(port), str(tmp_path / "queue")],
                                env={"SHEPHERD_REPLICA": "exporter"})
    try:
        # the first scrapes may find the exporter not listening yet
        v = wait_for("the scrape error", lambda: "not exposed" in ((v := get(s, "miss"))["error"] or "") and v)
        assert "metric 'queue_len' is not exposed by" in v["error"]
        assert "queue_length" not in v["error"]  # the answer's own names are not echoed (issue 19, point 7)
        assert v["desired"] == 0 and len(v["decisions"]) == 1
    finally:
        exporter.kill()
        exporter.wait()


@pytest.mark.parametrize("over, where, says", [
    ({"min_replicas": 3, "max_replicas": 2}, "min_replicas", "0 <= min_replicas <= max_replicas (2)"),
    ({"metric": "DCGM_FI_DEV_GPU_UTIL"}, "metric", "GPU utilisation is never a scaling signal"),
    ({"scale_down_below": 20}, "scale_down_below", "below scale_up_above"),
    ({"cooldown_s": 0}, "cooldown_s", "greater than 0"),
    ({"metrics_url": "ftp://x"}, "metrics_url", "http://"),
    ({"name": "Web"}, "name", "a lowercase letter"),
    ({"class": "gold"}, "class", "'gold' is not allowed"),
    ({"array": "0-3"}, "body", "array: '0-3' is not allowed"),
])
def test_bad_input_is_422_naming_the_field(server, tmp_path, over, where, says):
    r = httpx.post(server.url + "/services", json=service_body(server, tmp_path, 1, **over), timeout=60)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert where in detail["loc"] and says in detail["msg"], detail
    assert httpx.get(server.url + "/services", timeout=60).json() == []  # nothing half-applied


def test_the_service_commands(server, tmp_path):
    import subprocess

    def shepherd(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", *args[:2], "--server", server.url,
                               *args[2:]],
                              capture_output=True, text=True, timeout=120, cwd=tmp_path)

    res = shepherd("service", "create", "api", "--team", "ml", "--min", "1", "--max", "2", "--scale-up-above",
                   "10", "--scale-down-below", "2", "--stabilize", "1", "--cooldown", "60s", "--",
                   sys.executable, "-c", "import time; time.sleep(300)")
    assert res.returncode == 0 and "Created service api: 1-2 replicas on queue_length" in res.stdout, res.stderr
    res = shepherd("service", "signal", "api", "queue_length=12")
    assert res.returncode == 0 and "scale up 1 -> 2: queue_length 12 > 10 for 1 samples" in res.stdout, res.stderr
    wait_for("2 replicas running", lambda: get(server, "api")["running"] == 2)
    res = shepherd("service", "list")
    assert res.returncode == 0 and "api" in res.stdout and "2/2" in res.stdout and "1-2" in res.stdout
    res = shepherd("service", "show", "api")
    assert res.returncode == 0 and "create: min 1 replica" in res.stdout and "last signal: 12 (pushed" in res.stdout
    assert res.stdout.count(" RUNNING ") == 2
    res = shepherd("service", "create", "bad", "--team", "ml", "--min", "3", "--max", "2", "--scale-up-above",
                   "10", "--scale-down-below", "2", "--", "true")
    assert res.returncode == 2 and "min_replicas: 3 is not allowed" in res.stderr, res.stderr
    res = shepherd("service", "create", "bad", "--team", "ml", "--metric", "gpu_util", "--scale-up-above",
                   "10", "--scale-down-below", "2", "--", "true")
    assert res.returncode == 2 and "GPU utilisation is never a scaling signal" in res.stderr, res.stderr
    res = shepherd("service", "delete", "api")
    assert res.returncode == 0 and "Deleted service api" in res.stdout
    res = shepherd("service", "show", "api")
    assert res.returncode == 2 and "no such service" in res.stderr


def test_service_create_and_delete_are_audited_with_who_what_and_how_it_ended(server, tmp_path):
    """Issue 14 point 5: a service's create and delete are in the audit log as a job's
    submit and cancel are (who, from which address, what), refusals too."""
    from typer.testing import CliRunner

    from gpushepherd.cli.main import app

    s = server
    body = service_body(s, tmp_path, free_port(), metrics_url=None, name="audited", min_replicas=0,
                        command=[sys.executable, "-c", "import time; time.sleep(300)"])
    assert httpx.post(s.url + "/services", json=body, timeout=60).status_code == 201
    bad = httpx.post(s.url + "/services", json={**body, "name": "worse", "min_replicas": 3}, timeout=60)
    assert bad.status_code == 422
    assert httpx.delete(f"{s.url}/services/audited", timeout=60).status_code == 200
    assert httpx.delete(f"{s.url}/services/audited", timeout=60).status_code == 404  # deleted already

    def rows():
        return [e for e in httpx.get(s.url + "/audit", timeout=60).json() if e["action"].startswith("service-")]
    got = wait_for("the four service rows", lambda: len(rows()) == 4 and rows())
    made, refused, deleted, again = got
    # who: the server's user (no tokens, not root: every caller is it), never the body's "ana" (note 084)
    me = __import__("pwd").getpwuid(__import__("os").geteuid()).pw_name
    assert (made["action"], made["outcome"], made["user"], made["team"], made["target"]) == \
        ("service-create", "ok", me, "ml", "audited")
    assert made["address"].startswith("127.0.0.1:")
    assert made["detail"]["command"] == f'["{sys.executable}", "-c", "import time; time.sleep(300)"]'
    assert (made["detail"]["class"], made["detail"]["gpus"], made["detail"]["min_replicas"],
            made["detail"]["metric"]) == ("production-inference", 1, 0, "queue_length")
    assert (refused["action"], refused["outcome"], refused["target"]) == ("service-create", "refused", "worse")
    assert "min_replicas: 3 is not allowed" in refused["detail"]["error"]
    assert (deleted["action"], deleted["outcome"], deleted["team"], deleted["target"]) == \
        ("service-delete", "ok", "ml", "audited")
    assert (again["outcome"], again["target"]) == ("refused", "audited") and "no such service" in \
        again["detail"]["error"]
    r = CliRunner().invoke(app, ["audit", "--server", s.url, "--action", "service-create,service-delete"],
                           env={"COLUMNS": "250"})
    assert r.exit_code == 0 and r.stdout.count("service-create") == 2 and r.stdout.count("service-delete") == 2, \
        r.stdout
