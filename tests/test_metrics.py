"""Prometheus ``/metrics`` of a live `shepherd server` (design note 011): a scripted
workload on four fake GPUs (static inventory, utilisation scripted through
``<data>/gpu-samples.json``), scraped and parsed with prometheus-client's parser.

Every wait is a poll with a generous deadline; the one time bound asserted is a lower
one (a GPU is not flagged idle before the idle time has passed), which a slow machine
cannot break.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import typer
from prometheus_client.parser import text_string_to_metric_families
from test_daemon import Server, wait_for
from test_gpu_daemon import POLICY as GPU_POLICY
from test_gpu_daemon import script

from gpushepherd.cli.daemon import duration_param
from gpushepherd.daemon.metrics import cuda_oom_in, reason_kind
from gpushepherd.daemon.server import Daemon

# test_gpu_daemon's four fake GPUs with UUIDs, a second team and preemption
POLICY = GPU_POLICY.replace("  ml: {}\n", "  ml: {}\n  cv: {}\n") + "preemption: {enabled: true}\n"
IDLE_AFTER_S = 2.0
MIB = 1024 * 1024


def scrape(srv: Server) -> dict[tuple[str, frozenset], float]:
    r = httpx.get(srv.url + "/metrics", headers=srv.headers, timeout=60)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(r.text) for s in fam.samples}


def value(m: dict, name: str, **labels) -> float | None:
    """The sample ``name`` with exactly ``labels``; ``None`` when absent."""
    return m.get((name, frozenset(labels.items())))


def total(m: dict, name: str, **labels) -> float:
    """The sum of the samples ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in m.items() if n == name and want <= ls)


def counts(m: dict) -> dict:
    """The job counters and histograms of a scrape (not their ``_created`` times)."""
    return {k: v for k, v in m.items() if k[0].startswith("gpushepherd_job_") and not k[0].endswith("_created")}


def waiting(flag) -> str:
    return f"import os, time\nwhile not os.path.exists({str(flag)!r}): time.sleep(0.05)\n"


def submit(srv: Server, code: str, gpus: int = 1, cls: str = "batch", team: str = "ml") -> str:
    body = {"class": cls, "team": team, "user": "ana", "gpus": gpus, "command": [sys.executable, "-c", code],
            "cwd": str(srv.data.parent)}
    r = httpx.post(srv.url + "/jobs", json=body, timeout=60)
    assert r.status_code == 201, r.text
    return r.json()["id"]


@pytest.fixture
def srv(tmp_path):
    s = Server(tmp_path)
    s.policy.write_text(POLICY)
    s.data.mkdir(parents=True)
    # --dcgm-names: DCGM-exporter's names too (tests/test_operations.py: only ours without it)
    yield s.start(extra=("--sample-every", "0.2", "--idle-threshold-pct", "10", "--idle-after", f"{IDLE_AFTER_S}s",
                         "--dcgm-names"))
    s.stop()


def test_metrics_follow_a_scripted_workload_and_survive_a_restart(srv, tmp_path):
    samples: dict = {"gpus": {"0": {"util_pct": 87, "mem_used_mib": 1000, "temperature_c": 61, "power_w": 250}},
                     "jobs": {}}
    script(srv.data, samples)
    # per GPU: DCGM-exporter's names and labels, and ours in base units
    m = wait_for("GPU 0 sampled", lambda: (m := scrape(srv)) and total(m, "DCGM_FI_DEV_GPU_UTIL", gpu="0") and m)
    [labels] = [dict(ls) for (n, ls) in m if n == "DCGM_FI_DEV_GPU_UTIL" and ("gpu", "0") in ls]
    assert (labels["UUID"], labels["modelName"]) == ("GPU-f0", "FAKE") and labels["Hostname"]
    dcgm = {n: total(m, n, gpu="0", UUID="GPU-f0") for n in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED",
                                                             "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_TEMP",
                                                             "DCGM_FI_DEV_POWER_USAGE")}
    assert dcgm == {"DCGM_FI_DEV_GPU_UTIL": 87, "DCGM_FI_DEV_FB_USED": 1000, "DCGM_FI_DEV_FB_FREE": 16384 - 1000,
                    "DCGM_FI_DEV_GPU_TEMP": 61, "DCGM_FI_DEV_POWER_USAGE": 250}
    g0 = dict(node="local", gpu="0", uuid="GPU-f0")
    assert value(m, "gpushepherd_gpu_utilization_ratio", **g0) == pytest.approx(0.87)
    assert value(m, "gpushepherd_gpu_memory_used_bytes", **g0) == 1000 * MIB
    assert value(m, "gpushepherd_gpu_memory_total_bytes", **g0) == 16384 * MIB
    assert value(m, "gpushepherd_gpu_unmanaged", **g0) == 0

    # failures: a CUDA out-of-memory exit and a plain one
    oom = submit(srv, "import sys\nsys.stderr.write('RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\\n')"
                      "\nsys.exit(1)\n")
    plain = submit(srv, "import sys\nsys.stderr.write('ValueError: bad input\\n')\nsys.exit(1)\n")
    srv.wait_state(oom, "FAILED")
    srv.wait_state(plain, "FAILED")
    m = scrape(srv)
    assert value(m, "gpushepherd_job_failures_total", **{"class": "batch", "team": "ml", "cause": "cuda-oom"}) == 1
    assert value(m, "gpushepherd_job_failures_total", **{"class": "batch", "team": "ml", "cause": "other"}) == 1
    assert value(m, "gpushepherd_job_ends_total", **{"class": "batch", "team": "ml", "state": "FAILED"}) == 2
    assert total(m, "gpushepherd_job_run_duration_seconds_count", outcome="FAILED") == 2

    # queue length and a stranded GPU: 3 of 4 GPUs held, a 2-GPU job pending
    flag = tmp_path / "go"
    a, b = submit(srv, waiting(flag)), submit(srv, waiting(flag), gpus=2)
    samples["jobs"] = {a: {"util_pct": 50}, b: {"util_pct": 60}}
    script(srv.data, samples)
    srv.wait_state(a, "RUNNING")
    srv.wait_state(b, "RUNNING")
    c = submit(srv, waiting(flag), gpus=2, team="cv")
    assert srv.job(c)["state"] == "PENDING"
    m = scrape(srv)
    assert value(m, "gpushepherd_queue_length", **{"class": "batch", "team": "cv"}) == 1
    assert value(m, "gpushepherd_queue_length", **{"class": "batch", "team": "ml"}) == 0
    assert value(m, "gpushepherd_queue_length", **{"class": "training", "team": "ml"}) == 0  # no gaps
    assert value(m, "gpushepherd_gpus_allocated", **{"class": "batch", "team": "ml"}) == 3
    assert value(m, "gpushepherd_jobs_running", **{"class": "batch", "team": "ml"}) == 2
    assert value(m, "gpushepherd_gpus_stranded", constraint="single-node") == 1
    assert total(m, "gpushepherd_gpus_stranded") == 1 and value(m, "gpushepherd_gpus_free") == 1
    assert value(m, "gpushepherd_team_fair_share_factor", team="cv") == 1  # cv has used nothing
    assert value(m, "gpushepherd_team_decayed_usage_gpu_seconds", team="ml") > 0

    # allocated-but-idle: busy samples never flag; idle ones only after the idle time
    wait_for("a's busy samples", lambda: srv.job(a)["gpu_util_pct"] == 50 and srv.job(b)["gpu_util_pct"] == 60)
    time.sleep(IDLE_AFTER_S + 0.5)  # busy for longer than the idle time: still not idle
    assert total(scrape(srv), "gpushepherd_gpus_allocated_idle") == 0
    samples["jobs"][a] = {"util_pct": 3}
    t0 = time.time()
    script(srv.data, samples)
    m = wait_for("a flagged idle",
                 lambda: (m := scrape(srv)) and value(m, "gpushepherd_gpus_allocated_idle",
                                                      **{"class": "batch", "team": "ml"}) and m)
    assert time.time() - t0 >= IDLE_AFTER_S
    assert value(m, "gpushepherd_gpus_allocated_idle", **{"class": "batch", "team": "ml"}) == 1  # a's 1 GPU, not b's
    assert total(m, "gpushepherd_gpus_allocated_idle") == 1

    # preemption: production inference takes 2 GPUs while 1 is free
    httpx.post(f"{srv.url}/jobs/{c}/cancel", timeout=60)
    srv.wait_state(c, "CANCELLED")
    urgent = submit(srv, waiting(flag), gpus=2, cls="production-inference")
    srv.wait_state(urgent, "RUNNING")
    victims = [j for j in (a, b) if "PREEMPTING" in [h["to"] for h in srv.job(j)["history"]]]
    assert len(victims) == 1
    wait_for("the victim requeued", lambda: srv.job(victims[0])["state"] in ("PENDING", "RUNNING"))
    m = scrape(srv)
    assert value(m, "gpushepherd_job_preemptions_total", **{"class": "batch", "team": "ml", "reason": "priority"}) == 1
    assert value(m, "gpushepherd_job_ends_total", **{"class": "batch", "team": "cv", "state": "CANCELLED"}) == 1
    assert total(m, "gpushepherd_job_run_duration_seconds_count", outcome="requeued") == 1
    assert value(m, "gpushepherd_job_starts_total", **{"class": "batch", "team": "ml"}) == \
        4 + (srv.job(victims[0])["runs"] - 1)
    assert value(m, "gpushepherd_job_starts_total", **{"class": "production-inference", "team": "ml"}) == 1
    assert value(m, "gpushepherd_job_queueing_delay_seconds_count", **{"class": "batch"}) == 4  # first starts
    assert total(m, "gpushepherd_scheduling_cycle_duration_seconds_count") > 0

    # a restart rebuilds the counters from the event log: nothing resets, nothing doubles
    assert total(m, "gpushepherd_job_starts_total") > 0
    srv.stop()
    srv.start(policy=False, extra=("--sample-every", "0.2", "--idle-after", f"{IDLE_AFTER_S}s"))
    assert counts(scrape(srv)) == counts(m)
    flag.write_text("")
    srv.wait_state(urgent, "COMPLETED")


def test_metrics_need_a_token_once_tokens_exist(tmp_path):
    s = Server(tmp_path)
    s.policy.write_text(POLICY)
    try:
        s.start()
        out = subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", "token", "create", "--user", "prometheus",
                              "--team", "ml", "--data-dir", str(s.data)], capture_output=True, text=True, timeout=60)
        token = next(w for w in out.stdout.split() if w.startswith("shp_"))
        assert httpx.get(s.url + "/metrics", timeout=60).status_code == 401
        r = httpx.get(s.url + "/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=60)
        assert r.status_code == 200 and "gpushepherd_queue_length" in r.text
    finally:
        s.stop()


def test_cuda_oom_is_read_from_the_tail_of_stderr(tmp_path):
    f = tmp_path / "stderr"
    f.write_text("x" * 200_000 + "\ntorch.OutOfMemoryError: CUDA out of memory.\n")
    assert cuda_oom_in(f)
    f.write_text("CUDA_ERROR_OUT_OF_MEMORY\n" + "x" * 200_000)  # outside the last 64 KiB
    assert not cuda_oom_in(f)
    f.write_text("cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY\n")
    assert cuda_oom_in(f)
    assert not cuda_oom_in(tmp_path / "missing")


def test_preemption_reason_kinds_and_idle_durations():
    assert reason_kind("priority:training") == "priority"
    assert reason_kind("window-closed:classes.batch.max_gpus") == "window-closed"
    assert reason_kind("reclaim") == "reclaim"
    assert reason_kind("") == "unknown"
    idle_after = duration_param()  # --idle-after: a bare number is seconds, as it always was
    assert [idle_after(x) for x in ("10m", "1.5s", "2h", "1d", "600", "10:00")] == \
        [600, 1.5, 7200, 86400, 600, 600]
    for bad in ("0", "0m", "ten", "-5s"):
        with pytest.raises(typer.BadParameter, match="is not allowed: "):
            idle_after(bad)


DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "gpushepherd.json"
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                "offset", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are not a
    function or aggregation (followed by ``(``), a keyword, a label (inside ``{}`` or a
    ``by``/``without`` list) or part of a range (``[...]``) or string."""
    expr = re.sub(r'"(?:\\.|[^"\\])*"', "", expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    return {m[1] for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()", expr)
            if m[1].lower() not in PROMQL_WORDS}


def exported_names(tmp_path) -> set[str]:
    """Every sample name the daemon's /metrics can carry, from its families' types."""
    data = tmp_path / "d"
    data.mkdir()
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    d = Daemon(data, policy_path=policy, sample_every=0.1)
    d.start()
    try:
        text = d.metrics.exposition().decode()
    finally:
        d.stop()
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
                "gauge": ("",)}
    return {f.name + s for f in text_string_to_metric_families(text) for s in suffixes[f.type]}


def test_the_grafana_dashboard_queries_only_metrics_the_server_exports(tmp_path):
    dash = json.loads(DASHBOARD.read_text())
    assert [i["name"] for i in dash["__inputs"]] == ["DS_PROMETHEUS"]
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    assert all(p["targets"] and p["datasource"]["uid"] == "${DS_PROMETHEUS}" for p in panels)
    exported = exported_names(tmp_path)
    used = set().union(*map(metric_names, exprs))
    assert used - exported == set()
    # the panels are there
    for name in ("gpushepherd_queue_length", "gpushepherd_job_queueing_delay_seconds_bucket",
                 "gpushepherd_gpus_allocated", "gpushepherd_quota_limit", "gpushepherd_gpus_allocated_idle",
                 "gpushepherd_gpus_stranded", "gpushepherd_job_preemptions_total",
                 "gpushepherd_gpu_utilization_ratio", "gpushepherd_gpu_memory_used_bytes",
                 "gpushepherd_gpu_temperature_celsius", "gpushepherd_gpu_power_watts",
                 "gpushepherd_scheduling_cycle_duration_seconds_bucket", "gpushepherd_job_failures_total"):
        assert name in used, name


def test_metric_names_are_read_from_promql():
    assert metric_names('histogram_quantile(0.95, sum by (class, le) (rate(x_bucket{a="b(c)"}[$__rate_interval])))') \
        == {"x_bucket"}
    assert metric_names('max by (team) (q{unit="gpus"}) > 0 or vector(0)') == {"q"}
    assert metric_names("sum(a) / on (gpu) group_left b offset 5m") == {"a", "b"}


def test_size_class_tails_and_user_fairness_over_the_window():
    """A 8-GPU job runs 0-100 s; a 1-GPU job submitted at 10 waits for it (90 s), then
    runs 50 s: JCT 140, slowdown 2.8 (note 030). Then three more of ana's 1-GPU jobs and
    five of user "many" run at once (slowdown 1): both users have 5 ended jobs."""
    import threading
    from types import SimpleNamespace

    from builders import job, policy

    from gpushepherd.core.scheduler import Scheduler
    from gpushepherd.daemon.metrics import Metrics
    from gpushepherd.model.events import JobFinished, JobSubmitted
    from gpushepherd.model.job import ExitStatus

    rules = policy(nodes=[("n1", 8)])
    sched = Scheduler(rules)
    d = SimpleNamespace(sched=sched, rules=rules, kept={}, lock=threading.Lock(), clock=lambda: sched.now,
                        store=SimpleNamespace(errors={}), last_step_wall=0.0, node=None, found=None, sampled={})
    m = Metrics(d)

    def step(t, *events):
        m.observe(t, events, sched.handle(list(events)))

    step(0.0, JobSubmitted(0.0, job("big", 8, user="ana")))
    step(10.0, JobSubmitted(10.0, job("small", 1, user="ana", submit=10.0)))
    step(100.0, JobFinished(100.0, "big", ExitStatus.COMPLETED))
    step(150.0, JobFinished(150.0, "small", ExitStatus.COMPLETED))
    many = [job(f"m{i}", 1, user="many", submit=200.0) for i in range(5)]
    many += [job(f"a{i}", 1, user="ana", submit=200.0) for i in range(3)]
    step(200.0, *(JobSubmitted(200.0, s) for s in many))
    step(300.0, *(JobFinished(300.0, s.id, ExitStatus.COMPLETED) for s in many))
    parsed = {(s.name, frozenset(s.labels.items())): s.value
              for fam in text_string_to_metric_families(m.exposition().decode()) for s in fam.samples}
    assert value(parsed, "gpushepherd_size_class_wait_seconds", size_class="1", stat="max") == 90
    assert value(parsed, "gpushepherd_size_class_wait_seconds", size_class="5-8", stat="max") == 0
    # 1 GPU: small waited 90 s, the eight others 0; p90 at 0.9 x 8 = 7.2: 0.2 x 90 s
    assert value(parsed, "gpushepherd_size_class_wait_seconds", size_class="1", stat="p90") == pytest.approx(18)
    assert value(parsed, "gpushepherd_size_class_slowdown_ratio", size_class="1", stat="max") == pytest.approx(2.8)
    assert value(parsed, "gpushepherd_size_class_slowdown_ratio", size_class="5-8", stat="mean") == 1
    assert value(parsed, "gpushepherd_size_class_jobs", size_class="1", what="ended") == 9
    assert value(parsed, "gpushepherd_size_class_jobs", size_class="16+", what="started") == 0
    assert value(parsed, "gpushepherd_size_class_wait_seconds", size_class="16+", stat="max") is None
    ana = (1 + 2.8 + 3) / 5  # many: 1
    assert value(parsed, "gpushepherd_user_fairness_ratio") == pytest.approx((ana + 1) ** 2 / (2 * (ana ** 2 + 1)))
    # a snapshot keeps the window; past the window nothing is left
    again = Metrics(d)
    again.load(json.loads(json.dumps(m.state())))
    assert again.tails(300.0) == m.tails(300.0)
    assert m.tails(160.0 + 7 * 86400)["size_classes"]["1"]["ended"] == 8  # small ended at 150: out of it
    step(10 * 86400.0, JobSubmitted(10 * 86400.0, job("late", 1, user="bob")))
    late = m.tails(10 * 86400.0)
    assert (late["size_classes"]["1"]["started"], late["size_classes"]["1"]["ended"]) == (1, 0)
    assert late["fairness"]["value"] is None
    assert len(m._slow_ends) == 0 and len(m._first_starts) == 1  # pruned, not only filtered
