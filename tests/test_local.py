"""The local backend: processes, environment, exit codes, process groups."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from gpushepherd.daemon.local import REQUEUE_EXIT_CODE, LocalBackend, exit_status, visible_devices
from gpushepherd.model.job import ExitStatus
from gpushepherd.model.placement import Placement


def wait_exits(backend: LocalBackend, timeout: float = 60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = backend.exits()
        if got:
            return got
        time.sleep(0.05)
    pytest.fail("no exit within the deadline")


def test_exit_codes_map_to_the_cores_statuses():
    assert exit_status(0) is ExitStatus.COMPLETED
    assert exit_status(REQUEUE_EXIT_CODE) is ExitStatus.PREEMPTED
    assert exit_status(1) is ExitStatus.FAILED
    assert exit_status(-9) is ExitStatus.FAILED


def test_visible_devices_are_the_placed_gpus():
    assert visible_devices(Placement((("n", (3, 1)),))) == "1,3"
    assert visible_devices(Placement((("n", (2,)),), share="fraction:0.25")) == "2"


def test_a_job_runs_with_its_env_cwd_and_gpus_and_reports_its_exit(tmp_path):
    backend = LocalBackend(tmp_path / "data")
    code = "import os, sys; print(os.getcwd(), os.environ['CUDA_VISIBLE_DEVICES'], os.environ['X']); sys.exit(3)"
    proc = backend.start("5", 1, [sys.executable, "-c", code], shell=False, env={"X": "hello"}, cwd=str(tmp_path),
                         placement=Placement((("n", (0, 2)),)))
    assert proc.pid == os.getpgid(proc.pid)  # its own process group
    assert wait_exits(backend) == [("5", 3)]
    assert (backend.run_dir("5", 1) / "stdout").read_text().split() == [str(tmp_path), "0,2", "hello"]
    assert backend.checkpoint_dir("5").is_dir()


@pytest.mark.parametrize("server_pp, sent, seen", [
    (None, {}, "[]"),  # before: [<this package's root>]
    ("/srv/lib", {}, "[/srv/lib]"),  # a single-user install's job inherits the server's environment
    ("/srv/lib", {"PYTHONPATH": "/mine"}, "[/mine]"),
])
def test_a_job_s_pythonpath_is_its_own_not_the_runner_s(tmp_path, monkeypatch, server_pp, sent, seen):
    if server_pp is None:
        monkeypatch.delenv("PYTHONPATH", raising=False)
    else:
        monkeypatch.setenv("PYTHONPATH", server_pp)
    backend = LocalBackend(tmp_path / "data")
    backend.start("1", 1, ['echo "[$PYTHONPATH]"; env | grep -c SHEPHERD_JOB_PYTHONPATH'], shell=True, env=sent,
                  cwd=str(tmp_path), placement=Placement(()))
    assert wait_exits(backend) == [("1", 1)]  # grep found no runner's variable either
    assert (backend.run_dir("1", 1) / "stdout").read_text().split() == [seen, "0"]


def test_a_shell_only_when_asked(tmp_path):
    backend = LocalBackend(tmp_path)
    backend.start("1", 1, ["echo $((40+2)) > out"], shell=True, env={}, cwd=str(tmp_path), placement=Placement(()))
    backend.start("2", 1, ["echo", "$((40+2))"], shell=False, env={}, cwd=str(tmp_path), placement=Placement(()))
    got = sorted(wait_exits(backend) + (wait_exits(backend) if len(backend.procs) else []))
    assert got == [("1", 0), ("2", 0)]
    assert (tmp_path / "out").read_text() == "42\n"
    assert (backend.run_dir("2", 1) / "stdout").read_text() == "$((40+2))\n"


def test_a_killed_group_is_an_exit_without_a_code(tmp_path):
    backend = LocalBackend(tmp_path)
    proc = backend.start("1", 1, [sys.executable, "-c", "import time; time.sleep(600)"], shell=False, env={},
                         cwd=str(tmp_path), placement=Placement(()))
    backend.signal("1", signal.SIGKILL)
    assert wait_exits(backend) == [("1", None)]
    assert backend.attach("1", 1, proc.pid, proc.start) is None  # gone, no exit file: lost


def test_a_restart_finds_its_own_runner_and_never_another_servers(tmp_path):
    """Two servers on one machine number their jobs alike: a restart that looks up a
    run by its environment must not take (and later kill) the other server's job 1."""
    mine, other = LocalBackend(tmp_path / "mine"), LocalBackend(tmp_path / "other")
    code = "import time; time.sleep(60)"
    proc = other.start("1", 1, [sys.executable, "-c", code], shell=False, env={}, cwd=str(tmp_path),
                       placement=Placement((("n", (0,)),)))
    try:
        time.sleep(0.3)  # the runner has its environment and command line
        assert mine.attach("1", 1, None, None) is None  # not mine: lost, never re-attached
        found = LocalBackend(tmp_path / "other").attach("1", 1, None, None)
        assert found is not None and found.pid == proc.pid
    finally:
        other.signal("1", signal.SIGKILL)
        wait_exits(other)


def test_the_runner_exits_with_the_jobs_code_and_records_it(tmp_path):
    # an engine running the runner (Slurm's ExitCode) then agrees with the exit file
    import json
    import subprocess

    for code, want_rc, want_file in (("raise SystemExit(85)", 85, 85),
                                     ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 128 + 9, -9)):
        exit_file = tmp_path / f"exit{want_rc}"
        p = subprocess.run([sys.executable, "-m", "gpushepherd.daemon.runner", str(exit_file), "--",
                            sys.executable, "-c", code], timeout=60)
        assert p.returncode == want_rc
        assert json.loads(exit_file.read_text()) == {"code": want_file}


def test_the_local_backend_kill_ends_the_group_and_running_says_so(tmp_path):
    backend = LocalBackend(tmp_path)
    backend.start("k", 1, [sys.executable, "-c", "import time; time.sleep(60)"], shell=False, env={},
                  cwd=str(tmp_path), placement=Placement((("n", (0,)),)))
    assert backend.running("k")
    backend.kill("k")
    assert wait_exits(backend) == [("k", None)]  # killed with its runner: no exit code (lost)
    assert not backend.running("k")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_a_stop_sent_while_the_runner_starts_is_a_stop_not_a_lost_run(tmp_path, sig):
    # before: the runner, still starting Python, died of the signal and the run was lost
    backend = LocalBackend(tmp_path)
    marker = tmp_path / "ran"
    backend.start("p", 1, [f"touch {marker}; sleep 60"], shell=True, env={}, cwd=str(tmp_path),
                  placement=Placement(()))
    backend.signal("p", sig)  # at once, as a preemption decided in the same pass would
    assert wait_exits(backend) == [("p", -sig)]  # recorded: the server requeues it as preempted
    assert not marker.exists()  # stopped before it started: the job was not started
    assert "before the job started" in (backend.run_dir("p", 1) / "stderr").read_text()


def test_the_job_does_not_inherit_the_runner_s_blocked_stop_signals(tmp_path):
    backend = LocalBackend(tmp_path)
    backend.start("m", 1, ["grep SigBlk /proc/self/status"], shell=True, env={}, cwd=str(tmp_path),
                  placement=Placement(()))
    assert wait_exits(backend) == [("m", 0)]
    blocked = int((backend.run_dir("m", 1) / "stdout").read_text().split()[1], 16)
    assert blocked & (1 << (signal.SIGTERM - 1)) == 0
    assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])  # nor does the server keep them


def test_the_ray_actors_runner_is_stopped_not_killed_by_an_early_stop(tmp_path):
    # the actor (stdlib only, run here without Ray) starts the runner the same way
    import json

    from gpushepherd.backends.ray_actor import STOP_SIGNALS, RunActor
    from gpushepherd.daemon import runner

    assert STOP_SIGNALS == runner.STOP_SIGNALS  # its copy (it may not import gpushepherd) agrees
    exit_file, marker = tmp_path / "exit", tmp_path / "ran"
    actor = RunActor([sys.executable, "-m", "gpushepherd.daemon.runner", "--shell", str(exit_file), "--",
                      f"touch {marker}; sleep 60"], dict(os.environ), str(tmp_path),
                     str(tmp_path / "out"), str(tmp_path / "err"))
    assert actor.signal(signal.SIGTERM)
    assert actor.done() == 128 + signal.SIGTERM
    assert json.loads(exit_file.read_text()) == {"code": -signal.SIGTERM}
    assert not marker.exists()
