"""The daemon end to end: a real `shepherd server` (uvicorn, four fake GPUs) running
real processes, on SQLite in a tmp data directory (the default) and again on a fresh
database of a throwaway PostgreSQL (`--db`, tests/pgserver.py; skipped where none).

Robust on a loaded machine: every wait is a poll loop with a generous deadline, no
assertion depends on how long something took. Jobs wait for flag files, not for time.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

POLICY = """\
name: daemon-test
cluster:
  nodes:
    - {name: local, gpus: 4, gpu_type: FAKE, gpu_mem_mib: 16384}
classes:
  batch: {grace_period_s: 2}
  sandbox:
    grace_period_s: 1
    stop_signal: SIGUSR1
    idle_stop: {below_util_pct: 5, after_s: 3, setup_s: 0}
teams:
  ml: {}
preemption: {enabled: true}
"""
DEADLINE_S = 45.0


def wait_for(what: str, fn, timeout: float = DEADLINE_S, every: float = 0.1):
    """Poll ``fn`` until it returns something truthy; fail naming ``what``."""
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        last = fn()
        if last:
            return last
        time.sleep(every)
    pytest.fail(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


def wait_for_file(flag: Path) -> str:
    """A job's code: wait until ``flag`` exists (at most 120 s: a failed test leaks
    nothing for long), then print ``done``."""
    return (f"import os, time\nt0 = time.time()\nwhile not os.path.exists({str(flag)!r}) and time.time() - t0 < 120:\n"
            f"    time.sleep(0.05)\nprint('done')")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gone(pid: int) -> bool:
    """The process no longer runs (never existed, or a zombie nobody reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


class Server:
    def __init__(self, tmp: Path, name: str = "server", db: str | None = None):
        self.data = tmp / "data"
        self.db = db  # None: SQLite in the data directory
        self.policy = tmp / "policy.yaml"
        self.policy.write_text(POLICY)
        self.log = tmp / f"{name}.log"
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.token = ""  # sent as a bearer token by the helpers below when set
        self.preexec = None  # run in the server's process before it starts (resource limits)
        self.scheme = "http"  # https with --tls-cert (the client trusts it through $SSL_CERT_FILE)

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def start(self, policy: bool = True, extra: tuple[str, ...] = ()) -> "Server":
        port = free_port()
        self.url = f"{self.scheme}://127.0.0.1:{port}"
        extra = ("--sample-every", "0.5", *extra)  # GPU samples (static inventory: CPU use) for idle auto-stop
        args = [sys.executable, "-m", "gpushepherd.cli.main", "server", "--data-dir", str(self.data),
                # static: a machine with GPUs would refuse this policy's FAKE node under NVML
                "--port", str(port), "--inventory", "static", *extra] + \
            (["--policy", str(self.policy)] if policy else []) + \
            (["--db", self.db] if self.db else [])
        self.proc = subprocess.Popen(args, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
                                     preexec_fn=self.preexec)

        def up():
            if self.proc.poll() is not None:
                pytest.fail(f"server exited with {self.proc.returncode}: {self.log.read_text()}")
            try:
                return httpx.get(self.url + "/nodes", headers=self.headers, timeout=5).status_code in (200, 401)
            except httpx.TransportError:
                return False
        wait_for("the server to answer", up, every=0.2)
        return self

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    # -- the API --
    def submit(self, code: str, gpus: int = 1, cls: str = "batch", **extra) -> str:
        body = {"class": cls, "team": "ml", "user": "ana", "gpus": gpus,
                "command": [sys.executable, "-c", code], "cwd": str(self.data.parent), **extra}
        r = httpx.post(self.url + "/jobs", json=body, headers=self.headers, timeout=60)
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def job(self, job_id: str) -> dict:
        return httpx.get(f"{self.url}/jobs/{job_id}", headers=self.headers, timeout=60).json()

    def wait_state(self, job_id: str, *states: str) -> dict:
        return wait_for(f"job {job_id} in {states}", lambda: (j := self.job(job_id))["state"] in states and j)

    def logs(self, job_id: str, **params) -> str:
        return httpx.get(f"{self.url}/jobs/{job_id}/logs", params=params, headers=self.headers, timeout=60).text

    def free_gpus(self) -> int:
        return sum(n["free"] for n in httpx.get(self.url + "/nodes", headers=self.headers, timeout=60).json())


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(request, tmp_path_factory):
    db = request.getfixturevalue("pg_server").new_database() if request.param == "postgresql" else None
    s = Server(tmp_path_factory.mktemp("daemon"), db=db).start()
    yield s
    s.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request) -> str | None:
    """The daemon's database: ``None`` (SQLite in the data directory), or a fresh PostgreSQL one."""
    return request.getfixturevalue("pg_url") if request.param == "postgresql" else None


@pytest.fixture
def fresh(tmp_path, db):
    made: list[Server] = []

    def make(name: str = "server") -> Server:
        s = Server(tmp_path, name, db)
        made.append(s)
        return s
    yield make
    for s in made:
        s.stop()


def test_a_job_runs_to_completion_with_its_output_and_gpus(server):
    job_id = server.submit("import os; print('CVD=' + os.environ['CUDA_VISIBLE_DEVICES']); "
                           "print('CKPT=' + os.environ['SHEPHERD_CHECKPOINT_DIR'])", gpus=2)
    job = server.wait_state(job_id, "COMPLETED", "FAILED")
    assert job["state"] == "COMPLETED" and job["exit_code"] == 0
    out = server.logs(job_id)
    assert "CVD=0,1" in out
    assert f"CKPT={server.data.resolve() / 'checkpoints' / job_id}" in out
    assert [h["to"] for h in job["history"]] == ["PENDING", "RUNNING", "COMPLETED"]
    assert wait_for("all GPUs free", lambda: server.free_gpus() == 4)


def test_cancel_ends_a_running_job_and_its_whole_process_group(server, tmp_path):
    pids = tmp_path / "pids"
    # the job starts a child of its own, then both sleep: cancel must end both
    code = (f"import os, subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; "
            f"time.sleep(120)']); open({str(pids)!r} + '.tmp', 'w').write(f'{{os.getpid()}} {{c.pid}}'); "
            f"os.replace({str(pids)!r} + '.tmp', {str(pids)!r}); time.sleep(120)")
    job_id = server.submit(code, gpus=3)
    server.wait_state(job_id, "RUNNING")
    wait_for("the job's pids", pids.exists)
    parent, child = map(int, pids.read_text().split())
    assert not gone(parent) and not gone(child)
    r = httpx.post(f"{server.url}/jobs/{job_id}/cancel", timeout=60)
    assert r.status_code == 200 and r.json()["state"] == "CANCELLED"
    job = server.wait_state(job_id, "CANCELLED")
    assert job["history"][-1]["to"] == "CANCELLED"
    wait_for("the job's processes to end", lambda: gone(parent) and gone(child))
    assert server.free_gpus() == 4  # free at once, in every view
    assert httpx.post(f"{server.url}/jobs/999/cancel", timeout=60).status_code == 404


def test_checkpoint_exit_code_requeues_and_the_next_run_resumes(server):
    code = ("import os, sys; d = os.environ['SHEPHERD_CHECKPOINT_DIR']; p = os.path.join(d, 'step')\n"
            "if os.path.exists(p):\n    print('resumed from', open(p).read(), 'run', os.environ['SHEPHERD_RUN'])\n"
            "else:\n    open(p, 'w').write('41'); sys.exit(int(os.environ['SHEPHERD_REQUEUE_EXIT_CODE']))")
    job_id = server.submit(code)
    job = server.wait_state(job_id, "COMPLETED", "FAILED")
    assert job["state"] == "COMPLETED" and job["runs"] == 2
    assert [h["to"] for h in job["history"]] == ["PENDING", "RUNNING", "PENDING", "RUNNING", "COMPLETED"]
    assert "requeue" in job["history"][2]["reason"]
    assert "resumed from 41 run 2" in server.logs(job_id)
    assert server.logs(job_id, run=1) == ""


def test_preemption_sends_sigterm_then_sigkill_after_the_grace_period_and_requeues(server, tmp_path):
    pidfile = tmp_path / "pid"
    # run 1 ignores SIGTERM: only the SIGKILL at the end of the grace period ends it
    code = (f"import os, signal, time\nif os.environ['SHEPHERD_RUN'] == '1':\n"
            f"    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            f"    open({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
            f"    time.sleep(120)\nprint('run', os.environ['SHEPHERD_RUN'])")
    victim = server.submit(code, gpus=4, cls="batch")
    server.wait_state(victim, "RUNNING")
    wait_for("the pid file", lambda: pidfile.exists() and pidfile.read_text())
    urgent = server.submit("print('serving')", gpus=2, cls="production-inference")
    assert server.wait_state(urgent, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    assert gone(int(pidfile.read_text()))
    job = server.wait_state(victim, "COMPLETED", "FAILED")
    assert job["state"] == "COMPLETED" and job["runs"] == 2 and job["preemptions"] == 1
    assert [h["to"] for h in job["history"]][:4] == ["PENDING", "RUNNING", "PREEMPTING", "PENDING"]
    assert "run 2" in server.logs(victim)
    assert wait_for("all GPUs free", lambda: server.free_gpus() == 4)


def test_a_job_past_its_time_limit_is_stopped_as_timeout(server):
    job_id = server.submit("import time; time.sleep(120)", cls="sandbox", time_limit_s=1)
    job = server.wait_state(job_id, "TIMEOUT", "COMPLETED", "FAILED")
    assert job["state"] == "TIMEOUT" and job["exit_code"] is not None and job["exit_code"] < 0
    assert wait_for("all GPUs free", lambda: server.free_gpus() == 4)


def test_the_class_stop_signal_is_sent_at_the_time_limit(server, tmp_path):
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGUSR1, lambda *_: (print('got SIGUSR1', flush=True), sys.exit(0)))\n"
            "while True: sum(range(10000))\n")  # busy: never idle-stopped
    job = server.wait_state(server.submit(code, cls="sandbox", time_limit_s=1, user="sig"), "TIMEOUT", "COMPLETED",
                            "FAILED")
    # it got SIGUSR1 (not SIGTERM) when its time limit passed, and ended inside the grace period
    assert "got SIGUSR1" in server.logs(job["id"])
    assert [h["to"] for h in job["history"]][-2:] == ["STOPPING", job["state"]]


def test_an_idle_sandbox_job_is_stopped_and_a_busy_one_is_not(server):
    busy = server.submit("while True: sum(range(10000))", cls="sandbox", user="busy")
    idle = server.submit("import time; time.sleep(120)", cls="sandbox", user="idle")
    server.wait_state(busy, "RUNNING")
    job = server.wait_state(idle, "TIMEOUT", "COMPLETED", "FAILED", "CANCELLED")
    assert job["state"] == "TIMEOUT"
    assert "idle" in (job["stop_reason"] or "") and any("idle" in (h["reason"] or "") for h in job["history"])
    stopped_at = next(h["t"] for h in job["history"] if h["to"] == "STOPPING")
    started_at = next(h["t"] for h in job["history"] if h["to"] == "RUNNING")
    assert stopped_at - started_at >= 3  # not before after_s below the threshold
    time.sleep(2)  # the busy one outlives the idle one's limit by well over a sample period
    assert server.job(busy)["state"] == "RUNNING"
    assert httpx.post(f"{server.url}/jobs/{busy}/cancel", headers=server.headers, timeout=60).status_code == 200
    server.wait_state(busy, "CANCELLED")


def test_a_malformed_submission_is_422_naming_the_field(server):
    def post(**body):
        base = {"class": "batch", "team": "ml", "command": ["true"], "cwd": "/"}
        base.update(body)
        return httpx.post(server.url + "/jobs", json={k: v for k, v in base.items() if v is not None}, timeout=60)

    before = len(httpx.get(server.url + "/jobs", timeout=60).json())
    r = post(gpus="two")
    assert r.status_code == 422 and ["body", "gpus"] in [d["loc"] for d in r.json()["detail"]]
    r = post(command=None)
    assert r.status_code == 422 and ["body", "command"] in [d["loc"] for d in r.json()["detail"]]
    r = post(cwd="/no/such/dir")
    assert r.status_code == 422 and "/no/such/dir" in r.text
    r = post(**{"class": "trainnig"})  # the policy refuses it: field, value and what is allowed
    detail = r.json()["detail"][0]
    assert r.status_code == 422 and detail["loc"] == ["body", "class"]
    assert detail["msg"].startswith("class: 'trainnig' is not allowed: one of ") and "training" in detail["msg"]
    r = post(team="nobody")
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "team"]
    # environments the OS would refuse at launch (they used to leave a job RUNNING for ever)
    for env in ({"A=B": "x"}, {"": "x"}, {"A": "x\u0000y"}):
        r = post(env=env)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "env"], r.text
        assert not r.json()["detail"][0]["msg"].startswith("Value error")
    # NaN / Infinity are no JSON numbers: named as text, never a 500
    body = '{"class": "batch", "team": "ml", "command": ["true"], "cwd": "/", "time_limit_s": NaN}'
    r = httpx.post(server.url + "/jobs", content=body, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "time_limit_s"], r.text
    r = post(gpus=True)
    assert r.status_code == 422 and ["body", "gpus"] in [d["loc"] for d in r.json()["detail"]]
    assert len(httpx.get(server.url + "/jobs", timeout=60).json()) == before  # nothing accepted
    r = httpx.get(server.url + "/jobs/1/logs", params={"offset": 10**20}, timeout=60)
    assert r.status_code == 422


def test_kill9_of_the_server_loses_nothing(fresh, tmp_path):
    go = tmp_path / "go"
    s = fresh().start()
    running = s.submit(wait_for_file(go), gpus=2)
    s.wait_state(running, "RUNNING")
    pending = s.submit("print('second')", gpus=4)  # waits for the first job's GPUs
    assert s.job(pending)["state"] == "PENDING"
    s.kill9()

    s.start(policy=False)  # same data directory; the policy comes from the event log
    assert s.job(running)["state"] == "RUNNING"  # re-attached, not restarted
    assert s.job(running)["runs"] == 1
    assert s.job(pending)["state"] == "PENDING"
    go.write_text("")
    assert s.wait_state(running, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    assert "done" in s.logs(running)
    assert s.wait_state(pending, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    assert wait_for("all GPUs free", lambda: s.free_gpus() == 4)


def test_a_run_lost_with_the_server_is_requeued(fresh, tmp_path):
    pidfile = tmp_path / "pid"
    s = fresh().start()
    code = (f"import os, time\nif os.environ['SHEPHERD_RUN'] == '1':\n    open({str(pidfile)!r}, 'w').write("
            f"str(os.getpgrp()))\n    time.sleep(120)\nprint('second run')")
    job_id = s.submit(code)
    s.wait_state(job_id, "RUNNING")
    wait_for("the pid file", lambda: pidfile.exists() and pidfile.read_text())
    s.kill9()
    os.killpg(int(pidfile.read_text()), signal.SIGKILL)  # the machine "lost" the job too

    s.start()
    job = s.wait_state(job_id, "COMPLETED", "FAILED")
    assert job["state"] == "COMPLETED" and job["runs"] == 2
    assert "second run" in s.logs(job_id)
    assert any(h["from"] == "RUNNING" and h["to"] == "PENDING" for h in job["history"])
    assert wait_for("all GPUs free", lambda: s.free_gpus() == 4)


def test_a_second_server_on_the_same_database_refuses_to_start(fresh):
    first = fresh("first").start()
    second = fresh("second")
    second.data, second.policy = first.data, first.policy
    port = free_port()
    r = subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", "server", "--data-dir", str(first.data),
                        "--port", str(port)] + (["--db", first.db] if first.db else []),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "another gpushepherd server holds it" in r.stderr and f"pid {first.proc.pid}" in r.stderr
    assert first.free_gpus() == 4  # the first one is undisturbed


def test_a_restart_under_another_policy_replays_the_log_under_the_old_one(tmp_path, db):
    from gpushepherd.daemon.server import Daemon, DaemonError
    from gpushepherd.model.job import JobSpec

    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    with pytest.raises(DaemonError, match="no policy: pass --policy FILE"):
        Daemon(tmp_path / "data", db).start()
    d = Daemon(tmp_path / "data", db, policy_path=policy, poll_s=0.05)
    d.start()
    job_id = d.submit(JobSpec(id="", team="ml", workload_class="batch", gpus=1), [sys.executable, "-c", "pass"],
                      cwd=str(tmp_path))
    wait_for("the job to complete", lambda: d.sched.jobs[job_id].state.value == "COMPLETED")
    d.stop()

    policy.write_text(POLICY.replace("  ml: {}", "  ml: {}\n  data: {}"))
    d = Daemon(tmp_path / "data", db, policy_path=policy, poll_s=0.05)
    d.start()
    try:
        assert [kind for _t, kind, _ in d.store.batches()].count("policy") == 2
        # replayed (the old rules; from the snapshot the clean stop took: archived, note 017), then the new rules
        assert d.job_state(job_id) == "COMPLETED"
        second = d.submit(JobSpec(id="", team="data", workload_class="batch", gpus=1), ["true"], cwd=str(tmp_path))
        assert int(second) == int(job_id) + 1
        wait_for("the new team's job to complete", lambda: d.sched.jobs[second].state.value == "COMPLETED")
    finally:
        d.stop()


def test_a_start_decided_before_a_crash_but_never_launched_is_launched_at_restart(tmp_path, db):
    """The server died after committing a submission, before applying its Start."""
    import json

    from gpushepherd.daemon.server import Daemon
    from gpushepherd.daemon.store import Store, spec_to_dict
    from gpushepherd.model.events import JobSubmitted
    from gpushepherd.model.job import JobSpec
    import yaml

    data = tmp_path / "data"
    data.mkdir()
    store = Store(db or Store.sqlite_url(data))
    store.append_policy(time.time(), yaml.safe_load(POLICY))
    spec = JobSpec(id="1", team="ml", workload_class="batch", gpus=1, submit_time=time.time())
    store.append(spec.submit_time, [JobSubmitted(spec.submit_time, spec)],
                 [dict(id="1", num=1, spec=json.dumps(spec_to_dict(spec)), shell=False, pty=False, env="{}", cwd=str(tmp_path),
                       argv=json.dumps([sys.executable, "-c", "print('launched late')"]), state="PENDING", run=0)])
    d = Daemon(data, db, poll_s=0.05)
    d.start()
    try:
        wait_for("the job to complete", lambda: d.sched.jobs["1"].state.value == "COMPLETED")
        assert d.runs["1"] == 1
        assert (d.backend.run_dir("1", 1) / "stdout").read_text() == "launched late\n"
    finally:
        d.stop()


def test_a_run_whose_pid_was_never_recorded_is_found_and_not_launched_twice(tmp_path, db):
    """The server died between the fork and the commit of the pid."""
    from gpushepherd.daemon.server import Daemon
    from gpushepherd.model.job import JobSpec

    go = tmp_path / "go"
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    d = Daemon(tmp_path / "data", db, policy_path=policy, poll_s=0.05)
    d.start()
    code = wait_for_file(go)
    job_id = d.submit(JobSpec(id="", team="ml", workload_class="batch", gpus=1), [sys.executable, "-c", code],
                      cwd=str(tmp_path))
    wait_for("the job to run", lambda: d.sched.jobs[job_id].state.value == "RUNNING")
    d.stop()  # the loop ends, the job runs on
    d.store.update_job(job_id, pid=None, pgid=None, proc_start=None)

    d = Daemon(tmp_path / "data", db, poll_s=0.05)
    d.start()
    try:
        assert job_id in d.backend.procs and d.backend.procs[job_id].popen is None  # re-attached
        go.write_text("")
        wait_for("the job to complete", lambda: d.sched.jobs[job_id].state.value == "COMPLETED")
        assert d.runs[job_id] == 1 and not d.backend.run_dir(job_id, 2).exists()
        assert (d.backend.run_dir(job_id, 1) / "stdout").read_text() == "done\n"
    finally:
        d.stop()


def test_the_client_commands_against_a_real_server(server, tmp_path):
    from typer.testing import CliRunner

    from gpushepherd.cli.main import app

    def shepherd(*args):
        return CliRunner().invoke(app, [*args[:1], "--server", server.url, *args[1:]], catch_exceptions=False)

    res = shepherd("submit", "--class", "batch", "--team", "ml", "--gpus", "2", "--env", "GREETING=hi", "-t", "10:00",
                   "--chdir", str(tmp_path), "--", sys.executable, "-c",
                   "import os; print(os.environ['GREETING'], os.getcwd())")
    assert res.exit_code == 0, res.output
    job_id = res.output.split()[-1]
    assert res.output.startswith("Submitted job ")
    res = shepherd("logs", job_id, "-f")  # follows until the job ends
    assert res.exit_code == 0 and res.output == f"hi {tmp_path}\n"
    assert server.job(job_id)["state"] == "COMPLETED"
    line = next(x for x in shepherd("queue", "--all").output.splitlines() if x.split()[:1] == [job_id])
    assert line.split()[1:3] == ["batch", "ml"] and "COMPLETED" in line
    assert shepherd("why", job_id).output.strip() == f"job {job_id} is COMPLETED: exit 0"
    show = shepherd("show", job_id).output
    assert "PENDING -> RUNNING  placed on local:" in show and "RUNNING -> COMPLETED  exit 0" in show
    assert "local" in shepherd("nodes").output and "ml" in shepherd("usage").output
    paths = httpx.get(server.url + "/openapi.json", timeout=60).json()["paths"]
    assert {"/jobs", "/jobs/{job_id}", "/jobs/{job_id}/cancel", "/jobs/{job_id}/logs", "/nodes", "/usage"} <= set(paths)

    res = shepherd("submit", "--class", "trainnig", "--team", "ml", "--", "true")
    assert res.exit_code == 2 and "error: class: 'trainnig' is not allowed: one of " in res.output
    res = shepherd("cancel", "999")
    assert res.exit_code == 2 and "no such job" in res.output
    res = CliRunner().invoke(app, ["queue", "--server", f"http://127.0.0.1:{free_port()}"])
    assert res.exit_code == 1 and "no gpushepherd server at" in res.output


def test_a_cancel_committed_before_a_crash_kills_the_job_at_restart(tmp_path, db):
    """The server died after logging a cancel, before killing the job."""
    from gpushepherd.daemon.server import Daemon
    from gpushepherd.model.events import JobCancelled
    from gpushepherd.model.job import JobSpec

    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    d = Daemon(tmp_path / "data", db, policy_path=policy, poll_s=0.05)
    d.start()
    job_id = d.submit(JobSpec(id="", team="ml", workload_class="batch", gpus=4),
                      [sys.executable, "-c", wait_for_file(tmp_path / "never")], cwd=str(tmp_path))
    pgid = wait_for("the job's process", lambda: job_id in d.backend.procs and d.backend.procs[job_id].pid)
    d.stop()
    now = max(time.time(), d.sched.now)
    d.store.append(now, [JobCancelled(now, job_id)])

    d = Daemon(tmp_path / "data", db, poll_s=0.05)
    d.start()
    try:
        assert d.sched.jobs[job_id].state.value == "CANCELLED"
        from gpushepherd.daemon.local import group_running
        wait_for("the cancelled job's processes to end", lambda: not group_running(pgid))
        with d.lock:
            assert d.nodes_view()[0]["free"] == 4
        wait_for("the jobs table to say so", lambda: d.store.job_row(job_id)["state"] == "CANCELLED")
    finally:
        d.stop()


def test_a_submission_returns_the_view_the_step_left_and_its_rows_agree(tmp_path, db):
    """``submit_view`` (what ``POST /jobs`` returns): the job as the core left it after
    the batch that took it - started with its placement and run, or pending with the
    reason - and the jobs rows written by the step's batched updates say the same."""
    from gpushepherd.daemon.server import Daemon
    from gpushepherd.model.job import JobSpec

    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    flag = tmp_path / "release"
    d = Daemon(tmp_path / "data", db, policy_path=policy, poll_s=0.05)
    d.start()
    try:
        code = [sys.executable, "-c", wait_for_file(flag)]
        first = d.submit_view(JobSpec(id="", team="ml", workload_class="batch", gpus=4), code, cwd=str(tmp_path))
        assert (first["state"], first["runs"], first["placement"]) == ("RUNNING", 1, "local:0,1,2,3")
        second = d.submit_view(JobSpec(id="", team="ml", workload_class="batch", gpus=1), code, cwd=str(tmp_path))
        assert second["state"] == "PENDING" and second["runs"] == 0 and second["placement"] is None
        assert second["reason"]
        row = d.store.job_row(first["id"])
        assert (row["state"], row["run"], row["placement"]) == ("RUNNING", 1, "local:0,1,2,3") and row["pid"] > 0
        assert d.store.job_row(second["id"])["state"] == "PENDING"
        flag.touch()
        wait_for("both jobs to complete", lambda: all(d.store.job_row(j["id"])["state"] == "COMPLETED"
                                                      for j in (first, second)))
        assert [d.store.job_row(j["id"])["exit_code"] for j in (first, second)] == [0, 0]
    finally:
        flag.touch()
        d.stop()
