"""``shepherd run`` (issue 18, point 5; design note 028) through a real server: it waits
for the GPUs saying why, streams the job's output, exits with the job's exit code, and
the session's end (Ctrl-C, hang-up) cancels the job. Jobs wait for flag files, never
for time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import test_daemon
from test_daemon import Server, wait_for, wait_for_file

from gpushepherd.cli.interactive import exit_status, pick_class, pick_team

SRC = Path(__file__).resolve().parents[1] / "src"
POLICY = """\
name: run-test
cluster:
  nodes:
    - {name: local, gpus: 2, gpu_type: FAKE, gpu_mem_mib: 16384}
classes:
  batch: {priority: 100, preemptible: false}
  sandbox: {priority: 300, preemptible: false}
teams:
  ml: {}
preemption: {enabled: false}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("run"))
    s.policy.write_text(POLICY)
    s.start()
    yield s
    s.stop()


def shepherd_run(server: Server, *args: str, stderr=subprocess.PIPE) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(SRC), "SHEPHERD_SERVER": server.url, "USER": "ana", "COLUMNS": "200"}
    return subprocess.Popen([sys.executable, "-m", "gpushepherd.cli.main", "run", *args], stdout=subprocess.PIPE,
                            stderr=stderr, text=True, env=env, cwd=server.data.parent)


@contextmanager
def session(server: Server, tmp_path: Path, *args: str):
    """``shepherd run ARGS`` with its stderr in a file, read while it runs: yields
    ``(process, that file)``; the process is killed if a failed test leaves it running."""
    errors = tmp_path / "stderr"
    with open(errors, "w") as sink:
        p = shepherd_run(server, *args, stderr=sink)
        try:
            yield p, errors
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_run_streams_the_output_and_exits_with_the_jobs_code(server):
    code = "import sys; print('to stdout'); print('to stderr', file=sys.stderr); sys.exit(7)"
    p = shepherd_run(server, "--", sys.executable, "-c", code)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 7, (out, err)
    assert out == "to stdout\n"  # only the job's output on stdout
    assert "to stderr" in err
    job_id = err.split("Submitted job ", 1)[1].split()[0]
    job = server.job(job_id)
    # the defaults: the policy's interactive class and its only team
    assert job["state"] == "FAILED" and job["class"] == "sandbox" and job["team"] == "ml"
    assert f"job {job_id} ended FAILED (exit code 7)" in err


def test_run_waits_saying_why_then_runs_when_the_gpus_free(server, tmp_path):
    flag = tmp_path / "flag"
    blocker = server.submit(wait_for_file(flag), gpus=2, cls="batch")
    server.wait_state(blocker, "RUNNING")
    with session(server, tmp_path, "-c", "sandbox", "-A", "ml", "--", sys.executable, "-c",
                 wait_for_file(tmp_path / "go")) as (p, errors):
        wait_for("run's waiting line", lambda: "waiting:" in errors.read_text())
        assert p.poll() is None  # still waiting: the GPUs are held
        flag.touch()
        wait_for("run's running line", lambda: "RUNNING on local" in errors.read_text())
        (tmp_path / "go").touch()
        out, _ = p.communicate(timeout=120)
    text = errors.read_text()
    assert p.returncode == 0, text
    assert out == "done\n"
    waiting = next(line for line in text.splitlines() if "waiting:" in line)
    assert "Resources" in waiting or "NoFit" in waiting, waiting  # the core's pending reason, named
    assert server.job(blocker)["state"] == "COMPLETED"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_the_sessions_end_cancels_the_job(server, tmp_path, sig):
    started = tmp_path / "started"
    code = f"import time; open({str(started)!r}, 'w').close(); print('up', flush=True); time.sleep(120)"
    p = shepherd_run(server, "--", sys.executable, "-c", code)
    try:
        wait_for("the job to start", started.exists)
        p.send_signal(sig)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 128 + sig, (out, err)
    job_id = err.split("Submitted job ", 1)[1].split()[0]
    assert f"job {job_id} cancelled: the session ended ({sig.name})" in err
    assert server.wait_state(job_id, "CANCELLED")["state"] == "CANCELLED"


def test_a_job_killed_by_a_signal_exits_as_a_shell_reports_it(server):
    p = shepherd_run(server, "-q", "--", sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 128 + 9, (out, err)
    assert "Submitted" not in err and "shepherd run:" not in err  # --quiet: the job's output only


def test_defaults_and_exit_statuses():
    assert pick_class({"classes": {"batch": {}, "notebook": {}, "sandbox": {}}}) == "notebook"
    with pytest.raises(ValueError, match="give one of batch, training"):
        pick_class({"classes": {"batch": {}, "training": {}}})
    assert pick_team({"teams": ["ml"]}, {"teams": {"ml": {}, "cv": {}}}) == "ml"  # the token's only team
    assert pick_team({"teams": []}, {"teams": {"cv": {}}}) == "cv"
    with pytest.raises(ValueError, match="give one of ml, cv"):
        pick_team({"teams": []}, {"teams": {"ml": {}, "cv": {}}})
    assert exit_status({"state": "COMPLETED", "exit_code": 0}) == 0
    assert exit_status({"state": "FAILED", "exit_code": 3}) == 3
    assert exit_status({"state": "FAILED", "exit_code": -15}) == 143
    assert exit_status({"state": "TIMEOUT", "exit_code": -15}) == 1
    assert exit_status({"state": "CANCELLED", "exit_code": None}) == 1


def server_jobs(server: Server) -> list[dict]:
    import httpx

    return httpx.get(f"{server.url}/jobs", params={"state": "all"}, timeout=60).json()


def test_run_waits_for_a_restarted_server_and_follows_the_job_to_its_end(tmp_path, monkeypatch):
    s = Server(tmp_path)
    s.policy.write_text(POLICY)
    s.start()
    port = int(s.url.rsplit(":", 1)[1])
    go = tmp_path / "go"
    started = tmp_path / "started"
    p = shepherd_run(s, "--", sys.executable, "-c", f"print('before', flush=True); open({str(started)!r}, 'w')\n"
                     + wait_for_file(go))
    try:
        wait_for("the job to start", started.exists)
        s.kill9()  # the job lives on (note 017); run waits for the server to come back
        monkeypatch.setattr(test_daemon, "free_port", lambda: port)
        s.start()
        go.touch()
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
        s.stop()
    assert p.returncode == 0, err
    assert out == "before\ndone\n"  # all of the output, nothing twice
    assert "waiting up to 120 s for it to come back" in err and "the server answers again" in err


def test_a_requeued_job_is_followed_into_its_next_run(server, tmp_path):
    started, go = tmp_path / "started", tmp_path / "go"
    code = (f"import os; print('run', os.environ.get('SHEPHERD_RUN', '?'), flush=True); "
            f"open({str(started)!r}, 'a').write('x')\n" + wait_for_file(go))
    with session(server, tmp_path, "-c", "batch", "--", sys.executable, "-c", code) as (p, errors):
        wait_for("the first run", lambda: started.exists() and started.read_text() == "x")
        job_id = errors.read_text().split("Submitted job ", 1)[1].split()[0]
        r = server_post(server, f"/jobs/{job_id}/requeue")
        assert r.status_code == 200, r.text
        wait_for("the second run", lambda: started.read_text() == "xx")
        wait_for("run's line of the second run", lambda: "(run 2)" in errors.read_text())
        go.touch()
        out, _ = p.communicate(timeout=120)
    text = errors.read_text()
    assert p.returncode == 0, text
    assert out.count("run ") == 2 and out.endswith("done\n"), out  # each run's output once, the last one's to its end


def server_post(server: Server, path: str):
    import httpx

    return httpx.post(server.url + path, timeout=60)
