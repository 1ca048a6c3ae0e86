"""``shepherd demo`` end to end: a real server, real processes, the seed's mixed
workload (about a minute). Every promise of the demo is checked from the server's own
views and the jobs' logs (``gpushepherd.daemon.demo.checks``)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gpushepherd.cli.main import app
from gpushepherd.daemon.demo import gpu_seconds, run_demo


def test_demo_workload_keeps_every_promise(tmp_path):
    events = []
    result = run_demo(tmp_path, on_event=lambda t, text: events.append((t, text)))
    failed = [(name, detail) for name, ok, detail in result.checks if not ok]
    assert not failed, f"{failed}\n" + "\n".join(f"{t:6.1f} {x}" for t, x in events)
    by_name = {v["name"]: v for v in result.jobs}
    train = by_name["train-llm"]
    # the preemptor started only after the victim left its GPUs, on GPUs it had held
    burst = by_name["inference-burst"]
    preempting = [h["t"] for h in train["history"] if h["to"] == "PREEMPTING"]
    assert preempting and burst["first_start"] >= preempting[0]
    # usage: every team that ran something used GPU-seconds, none is left holding GPUs
    assert {u["team"] for u in result.usage} >= {"ml-platform", "research", "data"}
    assert all(u["gpus_in_use"] == 0 for u in result.usage)
    # nothing of the demo outlives it: no run left without its exit file
    for v in result.jobs:
        if v.get("runs") and "tasks" not in v:
            assert (tmp_path / "runs" / v["id"] / str(v["runs"]) / "exit").exists(), v["id"]


def test_gpu_seconds_counts_intervals_holding_gpus():
    view = {"gpus": 2, "history": [
        {"t": 0.0, "from": "new", "to": "PENDING"}, {"t": 1.0, "from": "PENDING", "to": "RUNNING"},
        {"t": 4.0, "from": "RUNNING", "to": "PREEMPTING"}, {"t": 5.0, "from": "PREEMPTING", "to": "PENDING"},
        {"t": 7.0, "from": "PENDING", "to": "RUNNING"}]}
    assert gpu_seconds(view, end=10.0) == 2 * ((5.0 - 1.0) + (10.0 - 7.0))


def test_demo_command_is_listed():
    r = CliRunner().invoke(app, ["demo", "--help"])
    assert r.exit_code == 0 and "--keep" in r.output


def test_demo_refuses_a_data_dir_that_holds_anything(tmp_path):
    used = tmp_path / "server-data"
    used.mkdir()
    (used / "shepherd.db").write_bytes(b"a real server's database")
    afile = tmp_path / "afile"
    afile.write_text("x")
    for where in (used, afile):
        r = CliRunner().invoke(app, ["demo", "--data-dir", str(where)])
        assert r.exit_code == 2 and "--data-dir" in r.output and "new or empty directory" in r.output, r.output
    assert sorted(p.name for p in used.iterdir()) == ["shepherd.db"]  # nothing written


def test_demo_on_a_fake_slurm_cluster_keeps_every_promise_but_idle_stop(tmp_path):
    from gpushepherd.backends.fakeslurm import unavailable

    if unavailable():
        pytest.skip(f"Slurm: {unavailable()}")
    events = []
    result = run_demo(tmp_path, on_event=lambda t, text: events.append((t, text)), backend="slurm")
    checks = {name: (ok, detail) for name, ok, detail in result.checks}
    failed = {name: c for name, c in checks.items() if c[0] is False}
    assert not failed, f"{failed}\n" + "\n".join(f"{t:6.1f} {x}" for t, x in events)
    assert checks["idle notebook stopped"][0] is None and "not available under Slurm" in checks["idle notebook stopped"][1]
    assert [n for n, c in checks.items() if c[0] is True] == [
        "training preempted, checkpointed, resumed and completed", "inference burst started at once by preemption",
        "inference service never interrupted", "batch chunks all done, the failed one retried"]
    # every run went through Slurm (the server's log names each Slurm job), and the cluster is stopped
    log = (tmp_path / "server.log").read_text()
    runs = sum(v["runs"] for v in result.jobs if "tasks" not in v)
    assert log.count(": Slurm job ") == runs
    assert not (tmp_path / "slurm" / "slurmctld.pid").exists()


def test_demo_refuses_an_unknown_backend_naming_the_allowed_ones(tmp_path):
    with pytest.raises(ValueError, match="backend 'ray' is not allowed: local or slurm"):
        run_demo(tmp_path, backend="ray")
    r = CliRunner().invoke(app, ["demo", "--backend", "ray"])
    assert r.exit_code == 2 and "'ray' is not allowed: local or slurm" in r.output


def test_the_demo_s_server_runs_every_job_as_its_own_user_even_as_root(tmp_path, monkeypatch):
    # the README's first command runs the demo, in CI as root: a root server without
    # SHEPHERD_RUN_AS=server (the tests' setting) runs jobs as their Unix users and refuses
    # a submission without a token - the demo's users (alice, bob) are names only
    from gpushepherd.daemon.demo import DemoServer, demo_policy_path

    monkeypatch.delenv("SHEPHERD_RUN_AS", raising=False)
    server = DemoServer(tmp_path / "data", demo_policy_path())
    try:
        assert server.daemon.backend.run_as.per_user is False
    finally:
        server.daemon.store.close()
