"""Regression tests of the daemon's start, data directory and tokens (faults a reviewer
found from a fresh clone); each is named after its fault. SQLite in a tmp data dir."""

from __future__ import annotations

import subprocess
import sys

import httpx

from test_daemon import POLICY, Server, wait_for_file

CUSTOM = POLICY.replace("classes:\n", "classes:\n  custom: {priority: 50}\n")


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout)


def _running_custom_job_then_kill9(tmp_path) -> tuple[Server, str]:
    s = Server(tmp_path)
    s.policy.write_text(CUSTOM)
    s.start()
    job = s.submit(wait_for_file(tmp_path / "flag"), cls="custom")
    s.wait_state(job, "RUNNING")
    s.kill9()
    return s, job


def test_restart_with_a_policy_lacking_a_running_jobs_class_is_refused_and_logs_nothing(tmp_path):
    from gpushepherd.daemon.store import Store

    s, job = _running_custom_job_then_kill9(tmp_path)
    try:
        s.policy.write_text(POLICY)  # no class custom
        r = cli("server", "--data-dir", str(s.data), "--inventory", "static", "--port", "1",
                "--policy", str(s.policy))
        assert r.returncode == 2, r.stderr
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
        assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        assert f"job {job!r}" in lines[0] and "class" in lines[0] and "nothing logged" in lines[0]
        store = Store(Store.sqlite_url(s.data))
        assert len(store.policy_history()) == 1  # nothing logged
        store.close()
        s.start(policy=False)  # the logged policy: starts, the job re-attached
        assert s.job(job)["state"] == "RUNNING"
    finally:
        (tmp_path / "flag").touch()
        s.stop()


def test_a_data_dir_poisoned_by_a_logged_conflicting_policy_starts_skipping_it(tmp_path):
    from gpushepherd.daemon.store import Store
    from gpushepherd.yamlio import load_yaml as load

    s, job = _running_custom_job_then_kill9(tmp_path)
    try:
        store = Store(Store.sqlite_url(s.data))  # what a server before the fix logged
        store.append_policy(1e10, load(POLICY), by="server --policy", source="old")
        store.close()
        s.start(policy=False)
        assert s.job(job)["state"] == "RUNNING"
        hist = httpx.get(s.url + "/policy/history", timeout=60).json()
        assert [h["version"] for h in hist] == [1, 2] and "skipped" not in hist[0]
        assert f"job {job!r}" in hist[1]["skipped"]
        assert httpx.get(s.url + "/policy", timeout=60).json()["version"] == 1
    finally:
        (tmp_path / "flag").touch()
        s.stop()


def test_a_second_server_on_the_same_data_dir_with_another_database_is_refused(tmp_path):
    a = Server(tmp_path).start()
    try:
        r = cli("server", "--data-dir", str(a.data), "--inventory", "static", "--port", "1",
                "--policy", str(a.policy), "--db", f"sqlite:///{tmp_path / 'other.db'}")
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        err, = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
        assert f"data directory {a.data.resolve()}: another gpushepherd server holds it (pid {a.proc.pid}" in err
        assert not (a.data / "runs").exists()  # it started nothing
    finally:
        a.stop()
    Server(tmp_path).start().stop()  # the lock went with server A


def _one_error_line(*args: str, code: int = 2) -> str:
    from typer.testing import CliRunner

    from gpushepherd.cli.main import app

    res = CliRunner().invoke(app, list(args))
    assert res.exit_code == code, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    return lines[0]


def test_bad_job_ids_data_dirs_databases_and_server_urls_are_one_error_line_not_a_traceback(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for cmd in ("show", "why", "logs", "cancel"):
        assert "JOB: '' is not allowed" in _one_error_line(cmd, "", "--server", "http://127.0.0.1:1")
    assert "is a file" in _one_error_line("server", "--data-dir", str(afile))
    assert "is a file" in _one_error_line("token", "create", "--data-dir", str(afile), "-u", "x", "-A", "ml")
    assert "is a file" in _one_error_line("db", "upgrade", "--data-dir", str(afile))
    bogus = _one_error_line("server", "--data-dir", str(tmp_path / "d"), "--db", "bogus://x")
    assert "--db: 'bogus://x' cannot be read: NoSuchModuleError" in bogus
    assert not (tmp_path / "d").exists()  # nothing made
    down = "postgresql+psycopg://u:secret@127.0.0.1:1/x"  # nobody listens on port 1
    for args in (("server", "--data-dir", str(tmp_path / "d")), ("token", "list"), ("token", "create", "-u", "x",
                 "--admin"), ("db", "current"), ("db", "upgrade")):
        line = _one_error_line(*args, "--db", down)
        assert "cannot be read: OperationalError" in line and "secret" not in line, (args, line)
    # a --server URL that names no server: tests/test_server_option_refuses_an_empty_socket_path.py


def test_revoking_the_last_token_does_not_turn_authentication_off(tmp_path):
    s = Server(tmp_path).start()  # loopback, no token: open
    try:
        assert httpx.get(s.url + "/jobs", timeout=60).status_code == 200
        _one_line_ok("token", "create", "--data-dir", str(s.data), "-u", "ana", "-A", "ml")
        assert httpx.get(s.url + "/jobs", timeout=60).status_code == 401
        _one_line_ok("token", "revoke", "1", "--data-dir", str(s.data))
        assert httpx.get(s.url + "/jobs", timeout=60).status_code == 401  # was 200: auth turned itself off
    finally:
        s.stop()
    s.start()  # a restart does not reopen it either
    try:
        assert httpx.get(s.url + "/jobs", timeout=60).status_code == 401
    finally:
        s.stop()


def _one_line_ok(*args: str) -> str:
    from typer.testing import CliRunner

    from gpushepherd.cli.main import app

    res = CliRunner().invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return res.output


def test_token_create_refuses_a_missing_data_dir_an_empty_user_and_a_team_the_policy_lacks(tmp_path):
    missing = tmp_path / "nodir"
    assert "a folder with a shepherd.db" in _one_error_line("token", "create", "--data-dir", str(missing), "-u", "x",
                                                           "-A", "ml")
    assert "a folder with a shepherd.db" in _one_error_line("token", "list", "--data-dir", str(missing))
    assert not missing.exists()  # nothing made
    s = Server(tmp_path)
    _one_line_ok("db", "upgrade", "--data-dir", str(s.data))
    assert "--user: '' is not allowed" in _one_error_line("token", "create", "--data-dir", str(s.data), "-u", "",
                                                          "-A", "ml")
    # a token's user is a name a job's user may be (a tester's find: 'a b' was taken, and a
    # job submitted with that token without a user became a b's)
    for bad in ("a b", "a/b", "ana ", "ana\u00a0", "ana\u200b"):
        line = _one_error_line("token", "create", "--data-dir", str(s.data), "-u", bad, "-A", "ml")
        assert f"--user: {bad!r} is not allowed: a Unix user's name (letters, digits" in line, line
    _one_line_ok("token", "create", "--data-dir", str(s.data), "-u", "x", "-A", "nosuchteam")  # no policy yet
    s.start()
    s.stop()
    line = _one_error_line("token", "create", "--data-dir", str(s.data), "-u", "x", "-A", "nosuchteam")
    assert "--team: 'nosuchteam' is not allowed: a team of the policy in force (ml)" in line
