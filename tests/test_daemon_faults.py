"""The daemon under faults and hostile clients (issue 19, design note 017): each test runs
a real `shepherd server` (tests/test_daemon.py's helper, SQLite in a tmp data directory)
and injects its fault for real - a killed runner or keeper, a database locked by another
process or on a full tmpfs, a slowloris client, hostile bodies. Named after the fault.

No timed assertions: every wait is a poll with a generous deadline.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
import time
from pathlib import Path

import httpx
import pytest

from test_daemon import Server, gone, wait_for, wait_for_file

FAST_REQUEUE = ("--requeue-backoff", "0.2")


def _pids_code(pidfile: Path, flag: Path, run_marker: Path) -> str:
    """A job that records its process group (the runner's pid) and parent (the keeper),
    then waits for ``flag``; each run appends its number to ``run_marker``."""
    return (f"import os, time\nopen({str(run_marker)!r}, 'a').write(os.environ['SHEPHERD_RUN'] + '\\n')\n"
            f"open({str(pidfile)!r} + '.tmp', 'w').write(f'{{os.getpgrp()}} {{os.getppid()}} {{os.getpid()}}')\n"
            f"os.replace({str(pidfile)!r} + '.tmp', {str(pidfile)!r})\n"
            f"t0 = time.time()\nwhile not os.path.exists({str(flag)!r}) and time.time() - t0 < 120:\n"
            f"    time.sleep(0.05)\nprint('done')\n")


def _events(server: Server, kind: str, job_id: str) -> list[dict]:
    con = sqlite3.connect(server.data / "shepherd.db")
    try:
        rows = con.execute("SELECT t, payload FROM events WHERE kind = ? AND job_id = ? ORDER BY seq",
                           (kind, job_id)).fetchall()
    finally:
        con.close()
    return [dict(json.loads(p), t=t) for t, p in rows]


def _runs_on_disk(server: Server, job_id: str) -> list[str]:
    d = server.data / "runs" / job_id
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


@pytest.fixture
def srv(tmp_path):
    made: list[Server] = []

    def make(*extra: str) -> Server:
        s = Server(tmp_path)
        s.start(extra=extra)
        made.append(s)
        return s
    yield make
    for s in made:
        s.stop()


# -- 1: a lost run relaunched for ever ------------------------------------------------
def test_a_run_lost_while_the_server_runs_is_requeued_once_not_relaunched_for_ever(srv, tmp_path):
    """Before: the requeue's Stop(grace 0) armed a SIGKILL that killed the next run one
    step later, which was lost, requeued ... (1 -> 25 -> 49 runs in 20 s)."""
    pidfile, flag, marker = tmp_path / "pids", tmp_path / "flag", tmp_path / "runs"
    s = srv(*FAST_REQUEUE)
    job_id = s.submit(_pids_code(pidfile, flag, marker))
    s.wait_state(job_id, "RUNNING")
    pgid = int(wait_for("the job's pids", lambda: pidfile.exists() and pidfile.read_text()).split()[0])
    pidfile.unlink()
    os.killpg(pgid, signal.SIGKILL)  # runner, keeper and job: the run is lost
    second = int(wait_for("the second run", lambda: pidfile.exists() and pidfile.read_text()).split()[2])
    # a barrier, not a timer: once another job went through the loop, the SIGKILL that
    # used to hit the new run one step after its start has had its steps
    other = s.submit("print('barrier')")
    assert s.wait_state(other, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    assert not gone(second) and s.job(job_id)["runs"] == 2
    flag.touch()
    job = s.wait_state(job_id, "COMPLETED", "FAILED")
    assert job["state"] == "COMPLETED" and job["runs"] == 2 and job["lost_runs"] == 1
    assert marker.read_text().split() == ["1", "2"]
    assert [e["run"] for e in _events(s, "lost", job_id)] == [1]
    assert _runs_on_disk(s, job_id) == ["1", "2"]


def test_a_runner_that_cannot_start_is_requeued_with_back_off_then_failed_at_the_limit(srv, tmp_path):
    """An environment that breaks the runner itself (PYTHONHOME): 84 runs in 15 s before;
    now 1 + --max-requeues runs, each lost, then FAILED naming the requeue limit."""
    s = srv(*FAST_REQUEUE, "--max-requeues", "2")
    job_id = s.submit("print('never')", env={"PYTHONHOME": "/nonexistent"})
    job = s.wait_state(job_id, "FAILED", "COMPLETED")
    assert job["state"] == "FAILED" and job["runs"] == 3 and job["lost_runs"] == 3
    assert "requeue limit 2" in job["failure"] and "without an exit code" in job["failure"]
    lost = _events(s, "lost", job_id)
    assert [e["run"] for e in lost] == [1, 2, 3] and [e["final"] for e in lost] == [False, False, True]
    gaps = [b["t"] - a["t"] for a, b in zip(lost, lost[1:])]
    assert gaps[0] >= 0.2 and gaps[1] >= 0.4  # the back-off doubles: 0.2 s, then 0.4 s
    assert len(_events(s, "requeue", job_id)) == 2
    assert _runs_on_disk(s, job_id) == ["1", "2", "3"]
    assert s.free_gpus() == 4
    show = s.job(job_id)
    assert show["runs"] == 3  # and it stays so: a failed job is never launched again


# -- 8: a completed job ran again when its runner died while the server was down --------
def test_a_job_whose_runner_is_killed_while_the_server_is_down_is_not_run_again(srv, tmp_path):
    pidfile, flag, marker = tmp_path / "pids", tmp_path / "flag", tmp_path / "runs"
    s = srv()
    job_id = s.submit(_pids_code(pidfile, flag, marker))
    s.wait_state(job_id, "RUNNING")
    runner, keeper, job_pid = map(int, wait_for("the job's pids", lambda: pidfile.exists() and pidfile.read_text())
                                  .split())
    assert runner != keeper != job_pid
    s.kill9()
    os.kill(runner, signal.SIGKILL)  # the runner dies with the server ...
    flag.touch()  # ... and the job completes while nobody watches but its keeper
    wait_for("the job to end", lambda: gone(job_pid) and gone(keeper))
    s.start(policy=False)
    job = s.wait_state(job_id, "COMPLETED", "FAILED")
    assert job["state"] == "COMPLETED" and job["exit_code"] == 0 and job["runs"] == 1
    assert marker.read_text().split() == ["1"]  # ran once
    assert _events(s, "lost", job_id) == []


def test_a_killed_runner_or_keeper_leaves_the_run_running_and_its_exit_recorded(srv, tmp_path):
    s = srv()
    for victim in ("runner", "keeper"):
        d = tmp_path / victim
        d.mkdir()
        pidfile, flag, marker = d / "pids", d / "flag", d / "runs"
        job_id = s.submit(_pids_code(pidfile, flag, marker))
        s.wait_state(job_id, "RUNNING")
        runner, keeper, _job = map(int, wait_for("the job's pids", lambda: pidfile.exists() and pidfile.read_text())
                                   .split())
        os.kill(runner if victim == "runner" else keeper, signal.SIGKILL)
        wait_for(f"the {victim} to be gone", lambda: gone(runner if victim == "runner" else keeper))
        assert s.job(job_id)["state"] == "RUNNING", victim
        flag.touch()
        job = s.wait_state(job_id, "COMPLETED", "FAILED")
        assert (job["state"], job["exit_code"], job["runs"]) == ("COMPLETED", 0, 1), victim
        assert marker.read_text().split() == ["1"], victim


# -- 2 and 10: a failed commit dropped the step's exits; storage failures were bare 500s ----
def _hold_write_lock(db: Path):
    """Another process's write lock on the server's SQLite database (``BEGIN EXCLUSIVE``,
    held until ``commit()``): every write of the server waits its busy timeout, then
    fails with 'database is locked'."""
    con = sqlite3.connect(db, timeout=30, isolation_level=None)
    con.execute("BEGIN EXCLUSIVE")
    return con


def test_exits_during_a_locked_database_are_kept_until_committed_and_the_api_answers_503(srv, tmp_path):
    flag = tmp_path / "flag"
    s = srv("--db-busy-timeout", "0.3")
    job_id = s.submit(wait_for_file(flag), gpus=2)
    victim = s.submit(wait_for_file(tmp_path / "never"), gpus=1)
    s.wait_state(job_id, "RUNNING")
    s.wait_state(victim, "RUNNING")
    jobs_before = len(httpx.get(s.url + "/jobs", timeout=60).json())
    lock = _hold_write_lock(s.data / "shepherd.db")
    try:
        flag.touch()  # the job exits; its exit file says 0; the commit that reports it fails
        wait_for("the step to fail on the lock", lambda: "storage unavailable: database is locked" in s.log.read_text())
        r = httpx.post(s.url + "/jobs", json={"class": "batch", "team": "ml", "command": ["true"],
                                              "cwd": str(tmp_path)}, timeout=120)
        assert r.status_code == 503 and r.headers["Retry-After"] == "5", r.text
        assert "database is locked" in r.json()["detail"] and "nothing was applied" in r.json()["detail"]
        r = httpx.post(f"{s.url}/jobs/{victim}/cancel", timeout=120)
        assert r.status_code == 503 and "nothing was applied" in r.json()["detail"], r.text
        assert s.job(job_id)["state"] == "RUNNING"  # reads still work (WAL), the exit is not applied yet
    finally:
        lock.commit()
        lock.close()
    job = s.wait_state(job_id, "COMPLETED", "FAILED")
    assert job["state"] == "COMPLETED" and job["exit_code"] == 0 and job["runs"] == 1
    assert s.job(victim)["state"] == "RUNNING"  # the cancel answered 503 was not applied
    assert len(httpx.get(s.url + "/jobs", timeout=60).json()) == jobs_before  # nor the submission
    assert wait_for("the job's GPUs free", lambda: s.free_gpus() == 3)
    text = s.log.read_text()
    assert "Traceback" not in text
    assert text.count("reconcile step failed") <= 2, text  # one line per kind a minute, not one per step
    httpx.post(f"{s.url}/jobs/{victim}/cancel", timeout=60)


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 4 MiB tmpfs the test fills (root only; skipped, saying why, elsewhere)."""
    import subprocess

    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("a full disk is made by mounting a small tmpfs, which needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    yield mnt
    from conftest import kill_leftovers

    kill_leftovers(mnt)  # its jobs and their cgroups (note 023): the data dir is gone with the mount
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(mnt: Path) -> Path:
    filler = mnt / "filler"
    with open(filler, "wb", buffering=0) as f:
        for size in (65536, 4096, 1):  # until not one byte more fits
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                pass
    return filler


def test_exits_during_a_full_disk_are_kept_until_committed(tmp_path, small_tmpfs):
    flag = tmp_path / "flag"
    s = Server(tmp_path, db=f"sqlite:///{small_tmpfs / 'shepherd.db'}")
    s.start()
    try:
        job_id = s.submit(wait_for_file(flag), gpus=2)
        s.wait_state(job_id, "RUNNING")
        filler = _fill(small_tmpfs)
        flag.touch()
        wait_for("the step to fail on the full disk", lambda: "storage unavailable: disk full" in s.log.read_text())
        r = httpx.post(s.url + "/jobs", json={"class": "batch", "team": "ml", "command": ["true"],
                                              "cwd": str(tmp_path), "env": {"PAD": "x" * 60000}}, timeout=120)
        assert r.status_code == 503 and "disk full" in r.json()["detail"], r.text
        assert s.job(job_id)["state"] == "RUNNING"
        filler.unlink()
        job = s.wait_state(job_id, "COMPLETED", "FAILED")
        assert job["state"] == "COMPLETED" and job["exit_code"] == 0
        assert wait_for("all GPUs free", lambda: s.free_gpus() == 4)
        assert "Traceback" not in s.log.read_text()
    finally:
        s.stop()


# -- 3 and 12: policies - quadratic validation on the loop, check and apply disagreeing -----
def _policy_cli(*args: str):
    from typer.testing import CliRunner

    from gpushepherd.cli.main import app

    return CliRunner().invoke(app, ["policy", *args])


def _teams_policy(n: int, **extra) -> dict:
    import yaml

    from test_daemon import POLICY

    raw = yaml.safe_load(POLICY)
    raw["teams"] = {"ml": {}, **{f"t{i:05d}": {"parent": f"t{i - 1:05d}" if i % 20 else None} for i in range(n)}}
    raw.update(extra)
    return raw


def test_policy_size_limits_are_the_same_for_check_and_apply_and_refused_fast(srv, tmp_path):
    """Before: 16,000 teams held the loop 54 s (a dry run any token may send); a file
    passing `policy check` got 413 from `apply`."""
    import yaml

    s = srv()
    cases = {
        "teams": (_teams_policy(15_999), "teams: '16,000 entries' is not allowed: at most 5,000"),
        "json": ({**_teams_policy(10), "classes": {"batch": {"grace_period_s": 2, "description": "x" * 900_000}}},
                 "bytes as JSON is not allowed: at most 786,432 bytes as JSON"),
        "depth": (yaml.safe_load(yaml.safe_dump(_teams_policy(0) | {"teams": {
            "ml": {}, **{f"d{i}": {"parent": f"d{i - 1}" if i else None} for i in range(40)}}})),
            "a parent chain of at most 32 teams"),
        "window": (_teams_policy(0) | {"teams": {"ml": {"windows": [{"from": "08:00", "to": "08:00",
                                                                    "max_gpus": 1}]}}},
                   "teams.ml.windows[0]: '08:00-08:00' is not allowed: a window that can apply"),
    }
    for name, (raw, needle) in cases.items():
        f = tmp_path / f"{name}.yaml"
        f.write_text(yaml.safe_dump(raw))
        res = _policy_cli("check", str(f))
        assert res.exit_code == 2 and needle in res.output, (name, res.output)
        for dry in ("true", "false"):
            r = httpx.post(s.url + "/policy", params={"dry_run": dry}, json={"policy": raw, "source": str(f)},
                           timeout=120)
            assert r.status_code == 422 and needle in r.json()["detail"][0]["msg"], (name, dry, r.status_code, r.text)
    big = tmp_path / "big.yaml"  # at the team limit: checked, and dry-run by the server, both linear
    big.write_text(yaml.safe_dump(_teams_policy(4_999)))
    res = _policy_cli("check", str(big), "--server", s.url)
    assert res.exit_code == 0 and ": OK - " in res.output and "could be applied now" in res.output, res.output
    assert httpx.get(s.url + "/policy", timeout=60).json()["version"] == 1  # nothing applied
    too_big = tmp_path / "huge.yaml"
    too_big.write_text("# " + "x" * (1024 * 1024) + "\n" + yaml.safe_dump(_teams_policy(0)))
    res = _policy_cli("check", str(too_big))
    assert res.exit_code == 2 and "a policy file of at most 1,048,576 bytes" in res.output, res.output


# -- 4: one 100,000-task array froze the server; a retried submission made a second one ----
def test_a_100000_task_array_is_expanded_lazily_and_the_server_keeps_answering(srv, tmp_path):
    from gpushepherd.daemon.arrays import MAX_LIVE_TASKS

    s = srv()
    body = {"class": "batch", "team": "ml", "command": [sys.executable, "-c", wait_for_file(tmp_path / "never")],
            "cwd": str(tmp_path), "array": "0-99999"}
    r = httpx.post(s.url + "/jobs", json=body, timeout=60)
    assert r.status_code == 201, r.text
    array_id = r.json()["id"]
    assert r.json()["tasks"] == 100_000
    wait_for("the first tasks to run", lambda: s.job(array_id)["running"] == 4)
    nodes = httpx.get(s.url + "/nodes", timeout=60)  # before: blocked 107 s behind the expansion
    assert nodes.status_code == 200 and nodes.json()[0]["free"] == 0
    submitted = [j for j in httpx.get(s.url + "/jobs", params={"children": "true"}, timeout=60).json()
                 if j["id"].startswith(f"{array_id}_")]
    assert 4 <= len(submitted) <= MAX_LIVE_TASKS  # never 100,000 jobs in the core at once
    view = s.job(array_id)
    assert view["tasks"] == 100_000 and view["pending"] == 100_000 - 4 and view["done"] == 0
    other = s.submit("print('still served')", cls="production-inference")
    assert s.wait_state(other, "COMPLETED", "FAILED")["state"] == "COMPLETED"  # preempting a chunk
    assert httpx.post(f"{s.url}/jobs/{array_id}/cancel", timeout=60).status_code == 200
    assert s.wait_state(array_id, "CANCELLED")["state"] == "CANCELLED"
    assert wait_for("all GPUs free", lambda: s.free_gpus() == 4)


def test_a_retried_submission_with_an_idempotency_key_makes_one_job_even_across_a_restart(srv, tmp_path):
    s = srv()
    body = {"class": "batch", "team": "ml", "user": "ana", "command": ["true"], "cwd": str(tmp_path)}
    key = {"Idempotency-Key": "retry-7f3a"}
    first = httpx.post(s.url + "/jobs", json=body, headers=key, timeout=60)
    assert first.status_code == 201
    again = httpx.post(s.url + "/jobs", json=body, headers=key, timeout=60)
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    other = httpx.post(s.url + "/jobs", json={**body, "command": ["false"]}, headers=key, timeout=60)
    assert other.status_code == 422 and other.json()["detail"][0]["loc"] == ["header", "Idempotency-Key"]
    assert first.json()["id"] in other.json()["detail"][0]["msg"]
    bad = httpx.post(s.url + "/jobs", json=body, headers={"Idempotency-Key": "a b"}, timeout=60)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["header", "Idempotency-Key"]
    array = {**body, "array": "0-2"}
    a1 = httpx.post(s.url + "/jobs", json=array, headers={"Idempotency-Key": "array-1"}, timeout=60).json()["id"]
    s.kill9()
    s.start(policy=False)
    assert httpx.post(s.url + "/jobs", json=body, headers=key, timeout=60).json()["id"] == first.json()["id"]
    r = httpx.post(s.url + "/jobs", json=array, headers={"Idempotency-Key": "array-1"}, timeout=60)
    assert r.status_code == 200 and r.json()["id"] == a1
    mine = httpx.post(s.url + "/jobs", json={**body, "user": "bob"}, headers=key, timeout=60)
    if os.geteuid() == 0:
        # keys are per caller, and a root server names its tokenless caller (note 087): this
        # test's process, root, for both bodies - the same key for another body is refused
        assert mine.status_code == 422 and mine.json()["detail"][0]["loc"] == ["header", "Idempotency-Key"]
        mine = httpx.post(s.url + "/jobs", json={**body, "user": "bob"}, headers={"Idempotency-Key": "bob-1"},
                          timeout=60)
    # else a server not run as root takes every tokenless caller for its own user, and keys
    # are per the body's user
    assert mine.status_code == 201 and mine.json()["id"] != first.json()["id"]
    ids = [j["id"] for j in httpx.get(s.url + "/jobs", timeout=60).json()]
    assert ids.count(first.json()["id"]) == 1 and ids.count(a1) == 1 and len(ids) == 3


# -- 6 and 7: services - any user, any URL -------------------------------------------------
def _service(s: Server, tmp_path: Path, **over) -> dict:
    return {"name": "web", "class": "batch", "team": "ml", "gpus": 1, "command": ["sleep", "60"],
            "cwd": str(tmp_path), "min_replicas": 0, "max_replicas": 1, "metric": "queue_length",
            "metrics_url": None, "scale_up_above": 10, "scale_down_below": 2, "scrape_every_s": 0.2, **over}


def test_a_service_cannot_be_created_as_another_user(srv, tmp_path):
    """Before: a token of user bob created a service as user ana (POST /jobs refused it)."""
    from typer.testing import CliRunner

    from gpushepherd.cli.main import app

    s = srv()
    out = CliRunner().invoke(app, ["token", "create", "--data-dir", str(s.data), "-u", "bob", "-A", "ml"]).output
    bob = {"Authorization": "Bearer " + next(w for w in out.split() if w.startswith("shp_"))}
    r = httpx.post(s.url + "/services", json=_service(s, tmp_path, user="ana"), headers=bob, timeout=60)
    assert r.status_code == 403 and "user: 'ana' is not allowed: this token is user 'bob'" in r.json()["detail"]
    job = {"class": "batch", "team": "ml", "user": "ana", "command": ["true"], "cwd": str(tmp_path)}
    assert httpx.post(s.url + "/jobs", json=job, headers=bob, timeout=60).status_code == 403  # the same rule
    r = httpx.post(s.url + "/services", json=_service(s, tmp_path), headers=bob, timeout=60)
    assert r.status_code == 201, r.text
    r = httpx.get(s.url + "/services/web", headers=bob, timeout=60)
    assert r.status_code == 200


class _Endpoint:
    """A loopback HTTP server answering every GET with ``status``, ``headers`` and
    ``body``; ``hits`` counts the requests it got."""

    def __init__(self, status: int, body: bytes = b"", headers: dict | None = None):
        import http.server
        import threading

        outer = self
        self.hits = 0

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                outer.hits += 1
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


def test_a_metrics_url_is_allow_listed_never_redirected_and_its_answer_never_shown(srv, tmp_path):
    """Before: any team token made the server fetch any URL and show parts of the answer."""
    s = srv()
    r = httpx.post(s.url + "/services", json=_service(s, tmp_path, metrics_url="http://10.255.255.1:9100/metrics"),
                   timeout=60)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "metrics_url"]
    assert "host 10.255.255.1 is not loopback" in r.json()["detail"][0]["msg"]
    r = httpx.post(s.url + "/services", json=_service(s, tmp_path, metrics_url="http://example.invalid/m"),
                   timeout=60)
    assert r.status_code == 422 and "'example.invalid' is not loopback" in r.json()["detail"][0]["msg"]
    target = _Endpoint(200, b"queue_length 99\n")
    secret = b"TOPSECRET-4711 root:x:0:0 \x00\x01 <html>"
    endpoints = {"redirect": _Endpoint(302, b"", {"Location": target.url}),
                 "garbage": _Endpoint(200, secret), "error": _Endpoint(500, secret),
                 "names": _Endpoint(200, b"secret_metric_name_4711 1\n")}
    try:
        for name, ep in endpoints.items():
            r = httpx.post(s.url + "/services", json=_service(s, tmp_path, name=name, metrics_url=ep.url), timeout=60)
            assert r.status_code == 201, r.text
            v = wait_for(f"the scrape error of {name}",
                         lambda: (v := httpx.get(f"{s.url}/services/{name}", timeout=60).json())["error"] and v)
            assert "TOPSECRET" not in v["error"] and "secret_metric" not in v["error"], v["error"]
        assert "HTTP 302 (redirects are not followed)" in httpx.get(f"{s.url}/services/redirect").json()["error"]
        assert target.hits == 0  # the redirect was never followed
        assert "not the Prometheus text format" in httpx.get(f"{s.url}/services/garbage").json()["error"]
        assert "HTTP 500" in httpx.get(f"{s.url}/services/error").json()["error"]
        assert "not among the 1 sample names" in httpx.get(f"{s.url}/services/names").json()["error"]
    finally:
        for ep in [target, *endpoints.values()]:
            ep.close()


# -- 5 and 12: logs read whole into memory; offset 2^44 was a 500 --------------------------
def _hwm_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def test_a_1_gib_log_is_served_in_chunks_without_reading_it_whole(srv, tmp_path):
    s = srv()
    job_id = s.submit("print('hello')")
    s.wait_state(job_id, "COMPLETED")
    log = s.data / "runs" / job_id / "1" / "stdout"
    with open(log, "r+b") as f:  # a sparse 1 GiB log: reading it whole allocates 1 GiB (3.2 GiB before)
        f.truncate(1024 ** 3)
        f.seek(1024 ** 3 - 4)
        f.write(b"end\n")
    before = _hwm_mib(s.proc.pid)
    r = httpx.get(f"{s.url}/jobs/{job_id}/logs", timeout=120)
    assert r.status_code == 200 and len(r.content) == 1024 * 1024
    assert r.headers["X-Next-Offset"] == str(1024 * 1024) and r.headers["X-Log-Size"] == str(1024 ** 3)
    assert r.content.startswith(b"hello\n")
    r = httpx.get(f"{s.url}/jobs/{job_id}/logs", params={"offset": 1024 ** 3 - 4}, timeout=60)
    assert r.text == "end\n" and r.headers["X-Next-Offset"] == str(1024 ** 3)
    r = httpx.get(f"{s.url}/jobs/{job_id}/logs", params={"limit": 8 * 1024 * 1024 + 1}, timeout=60)
    assert r.status_code == 422 and "limit" in r.text
    for offset in (2 ** 44, 2 ** 62):  # past any file's end: empty, never a 500
        r = httpx.get(f"{s.url}/jobs/{job_id}/logs", params={"offset": offset}, timeout=60)
        assert r.status_code == 200 and r.text == "" and r.headers["X-Next-Offset"] == str(offset)
    assert _hwm_mib(s.proc.pid) - before < 256  # peak memory: chunks, not the file


def test_shepherd_logs_reads_a_log_larger_than_one_chunk_to_its_end(srv, tmp_path):
    from typer.testing import CliRunner

    from gpushepherd.cli.main import app

    s = srv()
    job_id = s.submit("import sys; sys.stdout.write('x' * (3 * 1024 * 1024 + 5) + 'tail')")
    s.wait_state(job_id, "COMPLETED")
    res = CliRunner().invoke(app, ["logs", job_id, "--server", s.url])
    assert res.exit_code == 0 and len(res.output) == 3 * 1024 * 1024 + 9 and res.output.endswith("tail")


def test_the_openapi_schema_declares_every_error_answer(srv):
    s = srv()
    paths = httpx.get(s.url + "/openapi.json", timeout=60).json()["paths"]
    for path in ("/jobs", "/jobs/{job_id}", "/jobs/{job_id}/cancel", "/jobs/{job_id}/logs", "/policy", "/services"):
        for method, op in paths[path].items():
            assert {"401", "403", "404", "413", "422", "503"} <= set(op["responses"]), (path, method)
    r = httpx.get(s.url + "/jobs/999", timeout=60)  # and the answers have the declared shape
    assert r.status_code == 404 and isinstance(r.json()["detail"], str)


def test_shepherd_simulate_escapes_control_characters_of_a_trace(tmp_path):
    from typer.testing import CliRunner

    from gpushepherd.cli.main import app

    trace = tmp_path / "t.csv"
    trace.write_text("submit,gpus,duration,team\n0,1,10,\x1b[2Jevil\n5,1,10,ok\n")
    res = CliRunner().invoke(app, ["simulate", "--trace", str(trace), "--format", "csv",
                                   "--map", "submit=submit,gpus=gpus,duration=duration,team=team"])
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.output and "team \\x1b[2Jevil" in res.output


# -- 11: no connection limit, no header timeout --------------------------------------------
def test_idle_and_slowloris_sockets_are_closed_and_never_starve_new_requests(tmp_path):
    """Before: with a 256-descriptor limit, 300 half-open sockets blocked every request."""
    import resource
    import select
    import socket
    import threading

    s = Server(tmp_path)
    s.preexec = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    s.start(extra=("--header-timeout", "1"))
    host, port = "127.0.0.1", int(s.url.rsplit(":", 1)[1])
    socks, stop = [], threading.Event()
    try:
        for i in range(300):
            c = socket.create_connection((host, port), timeout=30)
            if i % 3 == 1:
                c.sendall(b"GET /nodes HTTP/1.1\r\nHost: x\r\n")  # headers never finished
            socks.append(c)
        trickled = socks[2::3]

        def trickle():  # slowloris: a header byte every 0.1 s on a third of them
            while not stop.wait(0.1):
                for c in trickled:
                    try:
                        c.send(b"X")
                    except OSError:
                        pass
        threading.Thread(target=trickle, daemon=True).start()

        def served():
            try:
                return httpx.get(s.url + "/nodes", timeout=10).status_code == 200
            except httpx.HTTPError:
                return False
        assert wait_for("a new request to be served", served, every=0.5)
        open_ = set(socks)
        end = time.monotonic() + 45
        while open_ and time.monotonic() < end:  # every one of them is closed by the server
            ready, _, _ = select.select(list(open_), [], [], 1.0)
            for c in ready:
                try:
                    data = c.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    open_.discard(c)
        assert not open_, f"{len(open_)} of 300 idle or trickling sockets still open"
        assert served() and s.proc.poll() is None
    finally:
        stop.set()
        for c in socks:
            c.close()
        s.stop()


# -- 9: restarts slowed down with the log ---------------------------------------------------
def _metric(s: Server, name: str) -> float:
    text = httpx.get(s.url + "/metrics", timeout=60).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def test_a_restart_from_a_snapshot_shows_the_same_jobs_and_replays_only_what_follows(srv, tmp_path):
    flag = tmp_path / "flag"
    s = srv(*FAST_REQUEUE)
    done = [s.submit("print('ok')") for _ in range(3)]
    failed = s.submit("import sys; sys.exit(3)")
    lost = s.submit("print('never')", env={"PYTHONHOME": "/nonexistent"})  # lost runs, then FAILED at the limit
    for j in (*done, failed, lost):
        s.wait_state(j, "COMPLETED", "FAILED")
    array = httpx.post(s.url + "/jobs", json={"class": "batch", "team": "ml", "command": ["true"],
                                              "cwd": str(tmp_path), "array": "0-2"}, timeout=60).json()["id"]
    s.wait_state(array, "COMPLETED")
    running = s.submit(wait_for_file(flag), gpus=2)
    s.wait_state(running, "RUNNING")
    pending = s.submit("print('later')", gpus=4)
    ids = [*done, failed, lost, array, running, pending]
    before = {j: s.job(j) for j in ids}
    starts = _metric(s, "gpushepherd_job_starts_total")
    s.stop()  # a clean stop writes a snapshot
    assert "snapshot of batch" in s.log.read_text()

    s.start(policy=False)
    assert "starting from the snapshot of batch" in s.log.read_text()
    after = {j: s.job(j) for j in ids}
    for j in (*done, failed, lost):  # ended jobs come from their archived records, unchanged
        assert {k: v for k, v in after[j].items() if k not in ("sampled_at",)} == \
            {k: v for k, v in before[j].items() if k not in ("sampled_at",)}, j
    assert after[lost]["failure"] and after[lost]["lost_runs"] == before[lost]["lost_runs"]
    assert after[array]["done"] == 3 and after[array]["state"] == "COMPLETED"
    assert after[running]["state"] == "RUNNING" and after[running]["runs"] == 1  # re-attached
    assert [h["to"] for h in after[running]["history"]] == [h["to"] for h in before[running]["history"]]
    assert after[pending]["state"] == "PENDING"
    assert _metric(s, "gpushepherd_job_starts_total") == starts
    assert sorted(j["id"] for j in httpx.get(s.url + "/jobs", timeout=60).json()) == sorted(ids)
    assert httpx.post(f"{s.url}/jobs/{done[0]}/cancel", timeout=60).json()["state"] == "COMPLETED"
    extra = s.submit("print('after the snapshot')")  # in the log after the snapshot: the tail
    s.wait_state(extra, "COMPLETED")
    s.kill9()  # no snapshot this time
    s.start(policy=False)
    assert s.job(extra)["state"] == "COMPLETED" and s.job(done[0])["state"] == "COMPLETED"
    flag.touch()
    assert s.wait_state(running, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    assert s.wait_state(pending, "COMPLETED", "FAILED")["state"] == "COMPLETED"


def test_a_launch_error_is_kept_in_the_store_and_shown_by_show_and_why_after_restarts(srv, tmp_path):
    """Issue 18 point 7: a run whose runner cannot start (its cwd removed while it waited)
    fails naming the cause, and the cause is still shown after a kill -9 (the log's tail
    replayed) and after a clean stop (the job archived by the snapshot)."""
    from typer.testing import CliRunner

    from gpushepherd.cli.main import app

    s = srv()
    flag, cwd = tmp_path / "flag", tmp_path / "gone"
    cwd.mkdir()
    holder = s.submit(wait_for_file(flag), gpus=4)
    s.wait_state(holder, "RUNNING")
    job_id = s.submit("print('never')", cwd=str(cwd))
    assert s.job(job_id)["state"] == "PENDING"  # the holder has every GPU
    cwd.rmdir()
    flag.touch()
    job = s.wait_state(job_id, "FAILED", "COMPLETED")
    assert job["state"] == "FAILED" and job["launch_error"].startswith("run 1: cannot start: ")
    assert str(cwd) in job["launch_error"]
    assert len(_events(s, "launch-error", job_id)) == 1
    for restart in (s.kill9, s.stop):
        restart()
        s.start(policy=False)
        assert s.job(job_id)["launch_error"] == job["launch_error"], restart
        why = CliRunner().invoke(app, ["why", job_id, "--server", s.url]).output
        assert why.startswith(f"job {job_id} is FAILED: ") and job["launch_error"] in why, why
        show = CliRunner().invoke(app, ["show", job_id, "--server", s.url]).output
        assert f"launch_error: {job['launch_error']}" in show
    assert len(_events(s, "launch-error", job_id)) == 1  # never relaunched, never logged twice


def test_shepherd_show_and_why_name_the_requeue_limit(srv, tmp_path):
    from typer.testing import CliRunner

    from gpushepherd.cli.main import app

    s = srv(*FAST_REQUEUE, "--max-requeues", "0")
    job_id = s.submit("print('never')", env={"PYTHONHOME": "/nonexistent"})
    assert s.wait_state(job_id, "FAILED", "COMPLETED")["state"] == "FAILED"
    why = CliRunner().invoke(app, ["why", job_id, "--server", s.url]).output
    assert f"job {job_id} is FAILED: lost 1 time (" in why and "the requeue limit 0 is reached" in why
    show = CliRunner().invoke(app, ["show", job_id, "--server", s.url]).output
    assert "lost_runs: 1" in show and "failure: lost 1 time (" in show


def test_a_data_dir_that_cannot_take_the_exit_file_fails_the_job_at_the_limit_not_in_a_loop(tmp_path, small_tmpfs):
    """Point 1's full disk: the keeper cannot write the exit file, the run is lost; the
    requeue limit (or the launch failing on the full disk) ends it - it never loops."""
    s = Server(tmp_path, db=f"sqlite:///{tmp_path / 'shepherd.db'}")
    s.data = small_tmpfs / "data"
    s.start(extra=(*FAST_REQUEUE, "--max-requeues", "2"))
    try:
        flag = tmp_path / "flag"
        job_id = s.submit(wait_for_file(flag))
        s.wait_state(job_id, "RUNNING")
        _fill(small_tmpfs)
        flag.touch()
        job = s.wait_state(job_id, "FAILED", "COMPLETED")
        assert job["state"] == "FAILED" and 1 <= job["runs"] <= 3, job
        assert job["failure"] or job["launch_error"], job
        assert wait_for("all GPUs free", lambda: s.free_gpus() == 4)
        runs = job["runs"]
        other = s.submit("print('barrier')", cwd="/")  # a barrier: the loop went on; the job stays ended
        s.wait_state(other, "COMPLETED", "FAILED")
        assert s.job(job_id)["runs"] == runs and s.job(job_id)["state"] == "FAILED"
    finally:
        s.stop()
