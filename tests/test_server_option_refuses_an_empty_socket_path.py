"""``--server 'unix:'`` (or ``$SHEPHERD_SERVER=unix:``) names no socket: ``Path("")`` is
``.``, so before the fix every client command tried the current folder as a socket and
said "no gpushepherd server at unix:. (Connection refused)" (exit 1), as if a server were
down. Now one ``error:`` line naming the option, the value and what is allowed, exit 2,
as ``cli.daemon.path_param`` refuses an empty path. The same for every other value that
names no server: a socket path that is a folder (``unix:/``, ``unix:.``), and anything but
an ``http(s)://`` URL with a host and a valid port (``''``, ``localhost:8765``, ``ftp://x``)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gpushepherd.cli.main import app

ALLOWED = "unix:PATH with the path of the server's socket (unix:shepherd-data/shepherd.sock), or a URL like " \
          "http://127.0.0.1:8765"


@pytest.mark.parametrize("args", [
    ["queue", "--server", "unix:"],
    ["cancel", "7", "--server", "unix:"],
    ["submit", "-c", "batch", "-A", "ml", "--server", "unix:", "--", "true"],
    ["sbatch", "--server", "unix:", "job.sh"],
])
def test_an_empty_socket_path_is_refused_naming_the_option(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SHEPHERD_SERVER", raising=False)
    (tmp_path / "job.sh").write_text("#!/bin/sh\n#SBATCH -p batch\n#SBATCH -A ml\ntrue\n")
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, (r.exit_code, r.stdout, r.stderr)
    line = " ".join(r.stderr.split())
    assert "--server" in line and f"'unix:' is not allowed: {ALLOWED}" in line, r.stderr
    assert "no gpushepherd server" not in line


@pytest.mark.parametrize("value", ["unix:", "localhost:8765", "http://[::1"])
def test_the_refusal_is_one_line_from_the_installed_command(value, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    import gpushepherd

    src = str(Path(gpushepherd.__file__).resolve().parents[1])  # this checkout's, from any folder
    r = subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", "queue", "--server", value], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": src})
    assert r.returncode == 2 and r.stdout == "", r
    assert r.stderr.strip() == (f"error: Invalid value for '--server': {value!r} is not allowed: {ALLOWED} "
                                "(see --help)"), r.stderr


@pytest.mark.parametrize("args", [["queue"], ["sbatch", "job.sh"], ["policy", "check", "p.yaml"]])
def test_an_empty_socket_path_in_the_environment_is_refused_naming_it(args, tmp_path, monkeypatch):
    # sbatch and policy check pass the variable on as their server: a tester saw them name
    # --server, which was not given
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sh").write_text("#!/bin/sh\n#SBATCH -p batch\n#SBATCH -A ml\ntrue\n")
    (tmp_path / "p.yaml").write_text("name: p\ncluster:\n  nodes:\n    - {name: n, gpus: 1, gpu_type: FAKE, "
                                     "gpu_mem_mib: 1024}\n")
    r = CliRunner().invoke(app, args, env={"SHEPHERD_SERVER": "unix:"})
    assert r.exit_code == 2, (r.exit_code, r.stdout, r.stderr)
    assert " ".join(r.stderr.split()) == f"error: $SHEPHERD_SERVER: 'unix:' is not allowed: {ALLOWED}", r.stderr


NAMES_NO_SERVER = ["", "unix:/", "unix://", "unix:.", "unix:..", "unix:run/", "unix:a/..", "localhost:8765",
                   "127.0.0.1:8765", "ftp://x", "http://", "http://:8765", "http://h:99999", "http://h:port", "http://[::1",
                   # a tester's finds: these passed the first check and reached a connection
                   " http://127.0.0.1:1", "http://h h:1", "http://127.0.0.1 ", "http://h:0", "http://127.0.0.1:1/?x=1",
                   "http://127.0.0.1:1#x", "http://h:1\n", "\thttp://h:1", "http://a..b:1", "http://" + "a" * 70 + ":1"]


@pytest.mark.parametrize("value", NAMES_NO_SERVER)
def test_a_server_value_that_names_no_server_is_refused_before_any_connection(value, tmp_path, monkeypatch):
    # before, each read "no gpushepherd server at ..." (exit 1), as if a server were down:
    # a folder tried as a socket, or a URL httpx could not use
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SHEPHERD_SERVER", raising=False)
    r = CliRunner().invoke(app, ["queue", "--server", value])
    assert r.exit_code == 2, (r.exit_code, r.stdout, r.stderr)
    line = " ".join(r.stderr.split())
    assert f"'--server': {value!r} is not allowed: {ALLOWED}" in line, r.stderr
    assert "no gpushepherd server" not in line


@pytest.mark.parametrize("value", [v for v in NAMES_NO_SERVER if v])  # '' in the environment: not set
def test_such_a_value_in_the_environment_is_refused_naming_it(value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["queue"], env={"SHEPHERD_SERVER": value})
    assert r.exit_code == 2, (r.exit_code, r.stdout, r.stderr)
    assert " ".join(r.stderr.split()) == f"error: $SHEPHERD_SERVER: {value!r} is not allowed: {ALLOWED}", r.stderr


@pytest.mark.parametrize("value", ["unix:x.sock", "unix:///run/x.sock", "http://127.0.0.1:1", "https://[::1]:1/",
                                   "http://localhost:1"])
def test_a_value_that_may_name_a_server_is_tried(value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SHEPHERD_SERVER", raising=False)
    r = CliRunner().invoke(app, ["queue", "--server", value])
    assert r.exit_code == 1 and "no gpushepherd server at" in r.stderr, (r.exit_code, r.stderr)


def test_a_socket_path_that_is_a_folder_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SHEPHERD_SERVER", raising=False)
    (tmp_path / "data").mkdir()
    r = CliRunner().invoke(app, ["queue", "--server", "unix:data"])
    assert r.exit_code == 2, (r.exit_code, r.stdout, r.stderr)
    assert "'unix:data' is not allowed: 'data' is a folder; unix:PATH names the server's socket" in \
        " ".join(r.stderr.split()), r.stderr


def test_sbatch_refuses_an_empty_server_and_reads_an_empty_variable_as_unset(tmp_path, monkeypatch):
    # sbatch parses its own --server: '' fell back to $SHEPHERD_SERVER or the default, so an
    # empty shell variable sent the job to another server
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sh").write_text("#!/bin/sh\n#SBATCH -p batch\n#SBATCH -A ml\ntrue\n")
    r = CliRunner().invoke(app, ["sbatch", "--server", "", "job.sh"], env={"SHEPHERD_SERVER": "http://127.0.0.1:1"})
    assert r.exit_code == 2 and "error: --server: '' is not allowed" in " ".join(r.stderr.split()), r.stderr
    r = CliRunner().invoke(app, ["sbatch", "job.sh"], env={"SHEPHERD_SERVER": "", "SHEPHERD_SOCKET": ""})
    assert r.exit_code == 1 and "no gpushepherd server at http://127.0.0.1:8765" in r.stderr, r.stderr


def test_an_upper_case_scheme_is_a_web_socket_url_too():
    # a tester's find: --pty with HTTP:// submitted the job, then crashed before attaching
    from gpushepherd.cli.attach import ws_url

    assert ws_url("HTTP://127.0.0.1:8765") == "ws://127.0.0.1:8765"
    assert ws_url("Https://h") == "wss://h"


@pytest.mark.parametrize("value", ["http://ana:s3cret-pw@127.0.0.1:1", "https://ana@h:1", "http://:s3cret-pw@h:1",
                                   "http://ana:s3cret-pw@",
                                   # a tester's finds: another check refused these first and showed the
                                   # whole value, or the URL parsed with the password as a port and path
                                   "http://ana:s3cret/pw@127.0.0.1:8765", "ana:s3cret-pw@127.0.0.1:8765",
                                   "http://ana:s3cret-pw@127.0.0.1:87650", "http://ana:s3cret#pw@h:1",
                                   "http://ana:s3cret pw@h:1", "http:ana:s3cret-pw@h", "http://ana:123/s3cret@h:1"])
def test_a_user_or_password_in_the_url_is_refused_without_showing_it(value, tmp_path, monkeypatch):
    # before, "http://ana:s3cret-pw@127.0.0.1:1" reached a connection and every error line
    # showed the password ("no gpushepherd server at http://ana:s3cret-pw@...")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SHEPHERD_SERVER", raising=False)
    for r, where in ((CliRunner().invoke(app, ["queue", "--server", value]), "--server"),
                     (CliRunner().invoke(app, ["queue"], env={"SHEPHERD_SERVER": value}), "$SHEPHERD_SERVER")):
        assert r.exit_code == 2, (r.exit_code, r.stdout, r.stderr)
        line = " ".join(r.stderr.split())
        assert where in line and "user or password in the URL is not allowed" in line and "--token" in line, line
        assert "s3cret" not in r.stderr + r.stdout and "ana" not in r.stderr + r.stdout, line
