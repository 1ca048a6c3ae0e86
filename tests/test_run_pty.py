"""``shepherd run --pty`` (issue 18 point 5, design note 041) through a real server: the
client runs inside a pseudo-terminal made here (``pty.fork``), as a user's terminal; the
job gets a terminal of its own that the server relays over the WebSocket
``/jobs/{id}/attach``. Every wait polls for an outcome (output, a process, a state),
never for a time."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import shutil
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
from test_auth import create_token
from test_daemon import Server, wait_for

from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect, unix_connect

from gpushepherd.daemon.unixsock import short_path
from gpushepherd.gpu.procs import env_and_argv, stat_fields

SRC = Path(__file__).resolve().parents[1] / "src"
POLICY = """\
name: pty-test
cluster:
  nodes:
    - {name: local, gpus: 2, gpu_type: FAKE, gpu_mem_mib: 16384}
classes:
  batch: {priority: 100, preemptible: false}
  interactive: {priority: 300, preemptible: false}
teams:
  ml: {}
preemption: {enabled: false}
"""


@pytest.fixture(scope="module")
def sockdir():
    """A directory every local user may traverse (pytest's tmp_path is 0700), for the socket."""
    d = Path(tempfile.mkdtemp(prefix="shp-pty-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory, sockdir):
    s = Server(tmp_path_factory.mktemp("pty"))
    s.policy.write_text(POLICY)
    s.sock = sockdir / "open.sock"
    s.start(extra=("--socket", str(s.sock)))
    yield s
    s.stop()


class Terminal:
    """``shepherd run ARGS`` on a pseudo-terminal made here: ``read_until`` what it
    shows, ``type`` keys, ``wait`` for its exit status."""

    def __init__(self, server_url: str, *args: str):
        env = {**os.environ, "PYTHONPATH": str(SRC), "SHEPHERD_SERVER": server_url, "USER": "ana",
               "TERM": "xterm", "PYTHONSTARTUP": ""}
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the client, its terminal the pty's slave
            try:
                os.execve(sys.executable, [sys.executable, "-m", "gpushepherd.cli.main", "run", *args], env)
            finally:
                os._exit(127)
        self.seen = b""
        self.status: int | None = None

    def _read(self) -> bool:
        ready, _, _ = select.select([self.fd], [], [], 0.2)
        if ready:
            try:
                data = os.read(self.fd, 65536)
            except OSError:  # EIO: the client exited and closed the terminal
                data = b""
            self.seen += data
            return bool(data)
        return True

    def read_until(self, text: str) -> str:
        want = text.encode()
        wait_for(f"{text!r} on the terminal", lambda: (self._read(), want in self.seen)[1])
        return self.seen.decode(errors="replace")

    def type(self, keys: str) -> None:
        os.write(self.fd, keys.encode())

    def exited(self) -> bool:
        if self.status is None:
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(st)
        self._read()
        return self.status is not None

    def wait(self) -> int:
        wait_for("the client to exit", self.exited)
        return self.status

    @property
    def job_id(self) -> str:
        return self.read_until("Submitted job ").split("Submitted job ", 1)[1].split()[0]

    def close(self) -> None:
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(self.pid, 0)
            self.status = -9
        try:
            os.close(self.fd)
        except OSError:
            pass


@pytest.fixture
def terminals():
    made: list[Terminal] = []

    def make(url: str, *args: str) -> Terminal:
        made.append(Terminal(url, *args))
        return made[-1]
    yield make
    for t in made:
        t.close()


#: this test session's temporary base directory: every server of these tests keeps its data
#: (so its jobs' SHEPHERD_CHECKPOINT_DIR) under it
_BASE: list[str] = []


@pytest.fixture(autouse=True)
def _base_temp(tmp_path_factory):
    _BASE[:] = [str(tmp_path_factory.getbasetemp())]


def job_processes(job_id: str, argv0: str) -> list[int]:
    """Pids of processes of job ``job_id`` of a server of this test session (by their
    environment: the job id, and a checkpoint directory under this session's temporary
    base - another server on the machine numbers its jobs 1, 2, ... too) running ``argv0``."""
    job, ckpt = f"SHEPHERD_JOB_ID={job_id}".encode(), f"SHEPHERD_CHECKPOINT_DIR={_BASE[0]}/".encode()
    return [int(e) for e in os.listdir("/proc") if e.isdigit() and (read := env_and_argv(int(e))) is not None
            and job in read[0] and any(v.startswith(ckpt) for v in read[0]) and read[1][0] == argv0.encode()]


def test_python_on_the_jobs_terminal_answers_and_its_exit_code_is_runs(server, terminals):
    t = terminals(server.url, "--gpus", "1", "--pty", "--", sys.executable, "-q")
    job_id = t.job_id
    t.read_until(">>> ")  # the job's own prompt: python saw a terminal (isatty)
    t.type("print(6*7)\r")
    t.read_until("\r\n42\r\n")  # the job's output, through its terminal (ONLCR)
    t.type("import os; print(os.ttyname(0), os.isatty(1), os.getenv('TERM'))\r")
    shown = t.read_until(" True xterm")
    assert "/dev/pts/" in shown.split("os.getenv('TERM'))", 1)[1]  # a pseudo-terminal, the user's TERM
    t.type("exit(3)\r")
    assert t.wait() == 3
    job = server.job(job_id)
    assert (job["state"], job["exit_code"], job["pty"], job["class"]) == ("FAILED", 3, True, "interactive")
    assert "42" in server.logs(job_id)  # the terminal's output is in the job's log too


def test_ctrl_c_interrupts_the_jobs_foreground_process_not_the_client(server, terminals):
    t = terminals(server.url, "--pty", "--env", "PS1=sh> ", "--", "/bin/sh")
    job_id = t.job_id
    t.read_until("sh> ")
    t.type("sleep 1000\r")
    wait_for("sleep to run in the job", lambda: job_processes(job_id, "sleep"))
    t.type("\x03")  # Ctrl-C, a byte: the job's terminal makes it SIGINT for its foreground group
    wait_for("sleep to be interrupted", lambda: not job_processes(job_id, "sleep"))
    t.type("echo rc=$?\r")
    t.read_until("rc=130")  # sleep ended by SIGINT; the shell lives on
    assert not t.exited() and server.job(job_id)["state"] == "RUNNING"  # the client and the job too
    t.type("exit 5\r")
    assert t.wait() == 5
    assert server.wait_state(job_id, "FAILED")["exit_code"] == 5


@pytest.mark.parametrize("how", ["client killed", "terminal closed"])
def test_the_sessions_end_ends_the_job(server, terminals, how):
    t = terminals(server.url, "--pty", "--env", "PS1=sh> ", "--", "/bin/sh")
    job_id = t.job_id
    t.read_until("sh> ")
    if how == "client killed":  # no goodbye: the server cancels it once no client is attached
        os.kill(t.pid, signal.SIGKILL)
    else:  # the user's terminal goes away: the client is hung up and cancels it
        os.close(t.fd)
        t.fd = os.open(os.devnull, os.O_RDONLY)
    job = server.wait_state(job_id, "CANCELLED", "COMPLETED", "FAILED")
    assert job["state"] == "CANCELLED", job
    wait_for("the job's shell to end", lambda: not job_processes(job_id, "/bin/sh"))


def test_a_server_restart_ends_a_running_pty_session_and_its_job(tmp_path, terminals, monkeypatch):
    import test_daemon

    s = Server(tmp_path)
    s.policy.write_text(POLICY)
    s.start()
    try:
        # a job busy with its own work (a REPL would read the hang-up as its input's end and exit)
        t = terminals(s.url, "--pty", "--", sys.executable, "-c", "import time; print(6*7); time.sleep(600)")
        job_id = t.job_id
        t.read_until("42")
        s.kill9()  # the terminal's master closes with it; the job lives on (note 017)
        monkeypatch.setattr(test_daemon, "free_port", lambda: int(s.url.rsplit(":", 1)[1]))
        s.start()
        assert s.wait_state(job_id, "CANCELLED", "COMPLETED", "FAILED")["state"] == "CANCELLED"
        assert t.wait() == 1  # run follows the job to its end through the restart
        assert f"job {job_id} ended CANCELLED" in t.seen.decode(errors="replace")
        wait_for("the job's python to end", lambda: not job_processes(job_id, sys.executable))
    finally:
        s.stop()


def test_the_window_size_follows_the_users_terminal(server, terminals):
    import fcntl
    import struct
    import termios

    t = terminals(server.url, "--pty", "--env", "PS1=sh> ", "--", "/bin/sh")
    t.read_until("sh> ")
    t.type("while :; do stty size; sleep 0.2; done\r")
    t.read_until("24 80")  # a new terminal's size until the user's is known
    fcntl.ioctl(t.fd, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 101, 0, 0))  # the user resizes: SIGWINCH
    t.read_until("33 101")
    mark = len(t.seen)
    t.type("\x03")
    # keys typed before the shell is back are lost: the terminal's ^C flushes its input
    # queue (a CI run on a loaded machine saw "exit 0" vanish), so wait for a new prompt
    wait_for("the prompt after Ctrl-C", lambda: (t._read(), b"sh> " in t.seen[mark:])[1])
    t.type("exit 0\r")
    assert t.wait() == 0


def test_a_command_that_cannot_run_says_so_on_the_terminal(server, terminals):
    t = terminals(server.url, "--pty", "--", "no-such-command-41")
    assert t.wait() == 127
    t.read_until("cannot run 'no-such-command-41'")


def test_without_cgroups_the_sessions_end_ends_a_shells_job_control_groups_too(tmp_path, terminals, monkeypatch):
    """Process groups only (``SHEPHERD_CGROUP=off``): an interactive shell puts ``sleep``
    in a process group of its own, in the terminal's foreground; the session's end still
    ends both (the stop passed on to the foreground group, the terminal hung up)."""
    monkeypatch.setenv("SHEPHERD_CGROUP", "off")
    s = Server(tmp_path)
    s.policy.write_text(POLICY)
    s.start()
    try:
        t = terminals(s.url, "--pty", "--env", "PS1=sh> ", "--", "/bin/sh")
        job_id = t.job_id
        t.read_until("sh> ")
        t.type("sleep 1000\r")
        sleep = wait_for("sleep to run in the job", lambda: job_processes(job_id, "sleep"))[0]
        shell = job_processes(job_id, "/bin/sh")[0]
        assert int(stat_fields(sleep)[2]) != int(stat_fields(shell)[2])  # job control: a group of its own
        os.kill(t.pid, signal.SIGKILL)  # the client goes without a word
        assert s.wait_state(job_id, "CANCELLED", "COMPLETED", "FAILED")["state"] == "CANCELLED"
        wait_for("the job's shell and sleep to end",
                 lambda: not job_processes(job_id, "/bin/sh") and not job_processes(job_id, "sleep"))
    finally:
        s.stop()


def test_the_terminal_attaches_over_the_unix_socket(server, terminals):
    t = terminals(f"unix:{server.sock}", "--pty", "--env", "PS1=sh> ", "--", "/bin/sh")
    job_id = t.job_id
    t.read_until("sh> ")
    t.type("tty; exit\r")
    assert t.wait() == 0
    assert "/dev/pts/" in t.seen.decode(errors="replace").split("tty; exit", 1)[1]
    assert server.job(job_id)["state"] == "COMPLETED"


def attach_status(url: str, job_id: str, token: str | None = None, sock: Path | None = None,
                  keep: ExitStack | None = None) -> tuple[int, str]:
    """The server's answer to an attach: ``(101, '')`` accepted (the connection closed,
    or entered into the ExitStack ``keep``), else the status and detail."""
    try:
        if sock is not None:
            with short_path(sock) as where:
                ws = unix_connect(where, f"ws://shepherd/jobs/{job_id}/attach")
        else:
            ws = connect(url.replace("http", "ws", 1) + f"/jobs/{job_id}/attach",
                         additional_headers={"Authorization": f"Bearer {token}"} if token else None)
    except InvalidStatus as exc:
        return exc.response.status_code, json.loads(exc.response.body)["detail"]
    if keep is not None:
        keep.enter_context(ws)
    else:
        with ws:
            pass
    return 101, ""


def as_nobody(fn):
    """``fn()``'s result, called in a child process running as uid/gid 65534."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.write(w, json.dumps(fn()).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    os.waitpid(pid, 0)
    return json.loads(out)


@pytest.mark.skipif(os.geteuid() != 0, reason="the socket as another Unix user needs root (setuid)")
def test_another_users_job_cannot_be_attached_by_token_or_socket(tmp_path, sockdir):
    s = Server(tmp_path)
    s.policy.write_text(POLICY)
    ana = create_token(s.data, "--user", "ana", "--team", "ml")
    bob = create_token(s.data, "--user", "bob", "--team", "ml")
    sock = sockdir / "authed.sock"
    s.token = ana
    s.start(extra=("--socket", str(sock)))
    try:
        job_id = s.submit("import time; time.sleep(300)", cls="interactive", pty=True)
        plain = s.submit("import time; time.sleep(300)")
        s.wait_state(job_id, "RUNNING")
        held = ExitStack()  # attached all along: the session (and the job) stays
        assert attach_status("", job_id, sock=sock, keep=held) == (101, "")  # root on the socket: an admin
        assert attach_status(s.url, job_id, ana) == (101, "")  # its user, by token
        status, detail = attach_status(s.url, job_id, bob)  # a token of the same team, another user
        assert status == 403 and "is user 'ana'" in detail and "'bob'" in detail, detail
        status, detail = as_nobody(lambda: attach_status("", job_id, sock=sock))  # the kernel says: nobody
        assert status == 403 and "'nobody'" in detail, detail
        assert attach_status(s.url, job_id)[0] == 401  # no token, once tokens exist
        assert s.job(job_id)["state"] == "RUNNING"
        held.close()
        s.wait_state(plain, "RUNNING")
        status, detail = attach_status(s.url, plain, ana)
        assert status == 409 and "not submitted with pty" in detail, detail
        r = httpx.post(s.url + "/jobs", headers=s.headers, timeout=60, json={
            "class": "batch", "team": "ml", "command": ["true"], "cwd": "/tmp", "pty": True, "array": "0-1"})
        assert r.status_code == 422 and "pty: true is not allowed with array" in r.text, r.text
        denied = httpx.get(s.url + "/audit", params={"action": "attach"}, headers=s.headers, timeout=60).json()
        assert {(a["user"], a["outcome"]) for a in denied} >= {("bob", "denied"), ("nobody", "denied")}
    finally:
        s.stop()


def test_a_pty_job_runs_as_its_user_in_its_cgroup_with_a_clean_environment(request, terminals):
    """Under a root server that runs jobs as their users (note 023): the terminal changes
    none of it - the job's uid, its cgroup, no variable of the server's; the terminal is
    the user's."""
    from test_multitenant import SECRET, why_not_cgroups

    tenants, users = request.getfixturevalue("tenants"), request.getfixturevalue("users")
    alice = users.ident[users.alice]
    t = terminals(tenants.server.url, "--token", tenants.tokens[users.alice], "-c", "batch", "-A", "ml", "--pty",
                  "-D", str(tenants.work), "--env", "PS1=sh> ", "--", "/bin/sh")
    job_id = t.job_id
    t.read_until("sh> ")
    t.type(f"echo U=$(id -u) O=$(stat -c %u $(tty)) S=${{{SECRET}:-none}} C=$(tail -1 /proc/self/cgroup) "
           "E=$((40+2))\r")
    line = next(x for x in t.read_until("E=42").split("\r\n") if "E=42" in x)  # the output, not the echoed keys
    assert f"U={alice.uid} O={alice.uid} S=none C=" in line, line
    if why_not_cgroups() is None:
        assert "gpushepherd" in line.split(" C=", 1)[1], line  # the job's own cgroup
    t.type("exit 4\r")
    assert t.wait() == 4
    assert tenants.server.wait_state(job_id, "FAILED")["exit_code"] == 4


from test_multitenant import tenants, users  # noqa: E402,F401 - the per-user server's fixtures
