"""The leader of one job's process group: runs the job, waits, records its exit.

``python -m gpushepherd.daemon.runner [OPTIONS] EXIT_FILE -- ARGV...`` runs ``ARGV``
(with ``--shell``: ``/bin/sh -c ARGV[0]``), waits for it and writes its exit code to
``EXIT_FILE`` (``{"code": N}``; a signal ``S`` is ``-S``) atomically, so that a
server that restarted - and is no longer the job's parent - still learns how it
ended; it then exits with that code (a signal S: ``128+S``).

Options (design notes 023, 036): ``--cgroup DIR`` (repeated: one for each hierarchy,
cgroup v2 and v1): first of all, move into those cgroups (every process of the job is
then in them); ``--user UID:GID:G1,G2``: start the job with
that uid, gid and supplementary groups (``Popen(user=, group=, extra_groups=)``: no
shell or other program runs as root in between) and give it the exit file (mode 0600);
``--cwd DIR``: the job's directory, entered as that user; ``--env-file FILE``: the job's
environment (a JSON object, the file removed once read) instead of the runner's own,
which then holds only what the runner needs; ``--pty``: the runner's stdin is a
pseudo-terminal's slave (design note 041): the runner - a session leader - makes it
its session's controlling terminal (``TIOCSCTTY``), and the job runs with it as its
stdin, stdout and stderr, in the runner's process group (the terminal's foreground
group: Ctrl-C reaches the job, and a stop sent to the group still does).

Two processes record the exit (design note 017, "Runs that are lost"): the runner forks
a *keeper*, which starts the job, waits for it and writes the exit file; the runner
waits for the keeper and - a child subreaper (``PR_SET_CHILD_SUBREAPER``, Linux), so
that the job becomes its child if the keeper dies - writes the exit file itself when
the keeper died first. Either of the two may be killed and the exit is still recorded.

SIGTERM/SIGINT/SIGHUP/SIGQUIT/SIGUSR1/SIGUSR2 sent to the group reach the job
directly; runner and keeper outlive them to record the exit (handlers, unlike ignored
signals, are not inherited by the job). With ``--pty`` they also outlive Ctrl-Z
(SIGTSTP, SIGTTIN, SIGTTOU), and a stop signal that reaches them while another process
group of the job holds the terminal's foreground (a shell's job control moved it there)
is passed on to that group. The server starts the runner with those stop signals
blocked (``LocalBackend.start``), so one sent while Python is still starting waits for
the handlers: a stop that arrives before the job is started means the job is not
started, and the exit file says ``-S`` (a preemption, not a lost run). Stdlib only: it
starts fast.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import signal
import subprocess
import sys
import termios

from gpushepherd.daemon.runas import JOB_PYTHONPATH_ENV

#: prctl option: orphaned descendants are re-parented to this process (Linux >= 3.4)
PR_SET_CHILD_SUBREAPER = 36
#: the signals a policy may choose as its stop signal (``classes.X.stop_signal``)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
#: the terminal's job-control stops, which runner and keeper of a ``--pty`` run outlive
TTY_STOPS = (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)


def write_exit(exit_file: str, code: int, owner: tuple[int, int] | None = None) -> bool:
    """Write ``{"code": code}`` to ``exit_file`` atomically (a temporary file of mode 0600
    - given to ``owner`` ``(uid, gid)`` when set -, fsync, rename); ``False`` (and a line
    on stderr) when it cannot be written (disk full, read-only): the server then counts
    the run as lost."""
    tmp = f"{exit_file}.{os.getpid()}.tmp"
    try:
        try:
            os.unlink(tmp)  # a stale one of a reused pid
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            if owner is not None:
                os.fchown(fd, *owner)
            json.dump({"code": code}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, exit_file)
        return True
    except OSError as exc:
        print(f"shepherd: cannot record the exit code {code} in {exit_file}: {exc}", file=sys.stderr)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False


def _status_code(status: int) -> int:
    """A ``waitpid`` status as an exit code (a signal S as ``-S``, like ``Popen.returncode``)."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


def _as_exit(code: int) -> int:
    # the job's own code, so that an engine running the runner (Slurm's ExitCode=85:0)
    # reports what the exit file says; a signal S as a shell does: 128+S
    return code if 0 <= code < 256 else 128 - code if code < 0 else 1


class Options:
    """The runner's command line: ``[--shell] [--pty] [--cgroup DIR] [--user UID:GID:GROUPS]
    [--cwd DIR] [--env-file FILE] EXIT_FILE -- ARGV...``."""

    def __init__(self, args: list[str]):
        self.shell, self.pty, self.user, self.cwd, self.env_file = False, False, None, None, None
        self.cgroups: list[str] = []
        valued = {"--user": "user", "--cwd": "cwd", "--env-file": "env_file"}
        while args and args[0].startswith("--") and args[0] != "--":
            if args[0] in ("--shell", "--pty"):
                setattr(self, args[0][2:], True)
                args = args[1:]
            elif args[0] == "--cgroup" and len(args) > 1:
                self.cgroups.append(args[1])
                args = args[2:]
            elif args[0] in valued and len(args) > 1:
                setattr(self, valued[args[0]], args[1])
                args = args[2:]
            else:
                raise ValueError(f"unknown option {args[0]!r}")
        if len(args) < 3 or args[1] != "--":
            raise ValueError("EXIT_FILE -- ARGV... expected")
        self.exit_file, self.argv = args[0], args[2:]
        self.uid = self.gid = None
        self.groups: list[int] = []
        if self.user is not None:
            uid, gid, groups = self.user.split(":")
            self.uid, self.gid = int(uid), int(gid)
            self.groups = [int(g) for g in groups.split(",") if g]

    @property
    def owner(self) -> tuple[int, int] | None:
        return None if self.uid is None else (self.uid, self.gid)


#: the first stop signal that reached the runner or the keeper (0: none yet); the keeper
#: does not start a job that was stopped before it started
_stopped = 0


def _note_stop(signum: int, _frame) -> None:
    """The runner's and keeper's handler of the stop signals: remember the first one."""
    global _stopped
    _stopped = _stopped or signum


def _keeper(opts: Options, env: dict[str, str] | None, pid_w: int) -> int:
    """In the forked keeper: start the job, tell the runner its pid, wait, write the exit
    file; a job stopped before it started is not started (exit ``-S``)."""
    argv, kw = opts.argv, {}
    if _stopped:  # a preemption or cancel sent while the runner was starting
        print(f"shepherd: stopped by signal {_stopped} before the job started; not started", file=sys.stderr)
        os.close(pid_w)
        return _as_exit(-_stopped) if write_exit(opts.exit_file, -_stopped, opts.owner) else 3
    if opts.uid is not None:
        kw = dict(user=opts.uid, group=opts.gid, extra_groups=opts.groups)
    cwd = opts.cwd
    # entered after the uid change (Popen's cwd= is entered before it, as root); the keeper
    # is one thread, so a preexec_fn is safe here
    preexec = (lambda: os.chdir(cwd)) if cwd is not None else None
    if opts.pty:  # the terminal (our stdin) is the job's stdin, stdout and stderr
        kw.update(stdin=0, stdout=0, stderr=0)
    try:
        proc = subprocess.Popen(argv[0] if opts.shell else argv, shell=opts.shell, env=env, preexec_fn=preexec, **kw)
    except (OSError, subprocess.SubprocessError) as exc:  # the command does not exist or cannot run
        why = exc if isinstance(exc, OSError) else f"cannot enter its directory {cwd!r} as uid {opts.uid}"
        print(f"shepherd: cannot run {argv[0]!r}: {why}", file=sys.stderr)
        if opts.pty:  # and where its user looks
            try:
                os.write(0, f"shepherd: cannot run {argv[0]!r}: {why}\r\n".encode())
            except OSError:
                pass
        os.close(pid_w)
        return 127 if write_exit(opts.exit_file, 127, opts.owner) else 3
    os.write(pid_w, f"{proc.pid}\n".encode())
    os.close(pid_w)
    code = proc.wait()
    return _as_exit(code) if write_exit(opts.exit_file, code, opts.owner) else 3


def _pass_on(signum: int, _frame) -> None:
    """A ``--pty`` run's handler of the stop signals: a signal that reached our group
    while another group of the job holds the terminal's foreground is sent to that group
    too (the terminal's own signals - Ctrl-C - go to the foreground group only, so they
    never arrive here twice)."""
    _note_stop(signum, _frame)
    try:
        fg = os.tcgetpgrp(0)
        if fg > 0 and fg != os.getpgrp():
            os.killpg(fg, signum)
    except OSError:  # the terminal hung up, or the group is gone
        pass


def main(args: list[str]) -> int:
    """Run ``args`` (``[OPTIONS] EXIT_FILE -- ARGV...``, see the module), record the exit
    code in ``EXIT_FILE`` and return it (a signal S as ``128+S``); 2 for a bad command
    line, a cgroup it cannot enter or an environment file it cannot read (nothing was
    started: the server counts the run as lost)."""
    try:
        opts = Options(list(args))
    except ValueError as exc:
        print(f"usage: python -m gpushepherd.daemon.runner [--shell] [--pty] [--cgroup DIR] [--user UID:GID:GROUPS] "
              f"[--cwd DIR] [--env-file FILE] EXIT_FILE -- ARGV... ({exc})", file=sys.stderr)
        return 2
    for cgroup in opts.cgroups:  # first: every process started from here on is in the job's cgroups
        try:
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        except OSError as exc:
            print(f"shepherd: cannot enter the job's cgroup {cgroup}: {exc}", file=sys.stderr)
            return 2
    env = None
    if opts.env_file is not None:
        try:
            with open(opts.env_file) as f:
                env = json.load(f)
            os.unlink(opts.env_file)
        except (OSError, ValueError) as exc:
            print(f"shepherd: cannot read the job's environment {opts.env_file}: {exc}", file=sys.stderr)
            return 2
    elif JOB_PYTHONPATH_ENV in os.environ:  # the job's own PYTHONPATH, not the runner's (note 023)
        env = dict(os.environ)
        theirs = env.pop(JOB_PYTHONPATH_ENV)
        if theirs:
            env["PYTHONPATH"] = theirs
        else:
            env.pop("PYTHONPATH", None)
    exit_file = opts.exit_file
    if opts.pty:
        try:  # we lead a session of our own (the server's start_new_session): the terminal becomes its
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        except OSError as exc:
            print(f"shepherd: cannot make the job's terminal the session's controlling terminal: {exc}",
                  file=sys.stderr)
            return 2
        for sig in TTY_STOPS:
            signal.signal(sig, lambda *_: None)
    for sig in STOP_SIGNALS:
        signal.signal(sig, _pass_on if opts.pty else _note_stop)
    # the server started us with them blocked: one sent while we started is delivered now
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    try:  # the job is re-parented to the runner if the keeper dies
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    pid_r, pid_w = os.pipe()
    keeper = os.fork()
    if keeper == 0:  # the keeper: the job's parent
        os.close(pid_r)
        code = 1
        try:
            code = _keeper(opts, env, pid_w)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(pid_w)
    with os.fdopen(pid_r) as f:
        line = f.readline().strip()  # the job's pid; '' when the keeper could not start it (or died first)
    job = int(line) if line.isdigit() else None
    _pid, status = os.waitpid(keeper, 0)
    if os.path.exists(exit_file):  # the keeper recorded it
        try:
            with open(exit_file) as f:
                return _as_exit(int(json.load(f)["code"]))
        except (OSError, ValueError, KeyError):
            return _as_exit(_status_code(status))
    # the keeper died before it could record the exit: the job, if it still runs, is
    # our child now (subreaper); wait for it and record its exit ourselves
    code = None
    while job is not None:
        try:
            pid, st = os.waitpid(-1, 0)
        except ChildProcessError:  # no child left: the job was not re-parented to us
            break
        if pid == job:
            code = _status_code(st)
            break
    if code is None:
        return 1  # no exit code to record: the server counts the run as lost
    write_exit(exit_file, code, opts.owner)
    return _as_exit(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
