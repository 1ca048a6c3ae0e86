"""The leader of one job's process group: runs the job, waits, records its exit.

``python -m gpushepherd.daemon.runner EXIT_FILE -- ARGV...`` runs ``ARGV`` (with
``--shell``: ``/bin/sh -c ARGV[0]``), waits for it and writes its exit code to
``EXIT_FILE`` (``{"code": N}``; a signal ``S`` is ``-S``) atomically, so that a
server that restarted - and is no longer the job's parent - still learns how it
ended; it then exits with that code (a signal S: ``128+S``).

Two processes record the exit (design note 017, "Runs that are lost"): the runner forks
a *keeper*, which starts the job, waits for it and writes the exit file; the runner
waits for the keeper and - a child subreaper (``PR_SET_CHILD_SUBREAPER``, Linux), so
that the job becomes its child if the keeper dies - writes the exit file itself when
the keeper died first. Either of the two may be killed and the exit is still recorded.

SIGTERM/SIGINT/SIGHUP/SIGQUIT/SIGUSR1/SIGUSR2 sent to the group reach the job
directly; runner and keeper outlive them to record the exit (handlers, unlike ignored
signals, are not inherited by the job). Stdlib only: it starts fast.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys

#: prctl option: orphaned descendants are re-parented to this process (Linux >= 3.4)
PR_SET_CHILD_SUBREAPER = 36
#: the signals a policy may choose as its stop signal (``classes.X.stop_signal``)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def write_exit(exit_file: str, code: int) -> bool:
    """Write ``{"code": code}`` to ``exit_file`` atomically (a temporary file, fsync,
    rename); ``False`` (and a line on stderr) when it cannot be written (disk full,
    read-only): the server then counts the run as lost."""
    tmp = f"{exit_file}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
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


def _keeper(argv: list[str], shell: bool, exit_file: str, pid_w: int) -> int:
    """In the forked keeper: start the job, tell the runner its pid, wait, write the exit file."""
    try:
        proc = subprocess.Popen(argv[0] if shell else argv, shell=shell)
    except OSError as exc:  # the command does not exist or cannot run
        print(f"shepherd: cannot run {argv[0]!r}: {exc}", file=sys.stderr)
        os.close(pid_w)
        return 127 if write_exit(exit_file, 127) else 3
    os.write(pid_w, f"{proc.pid}\n".encode())
    os.close(pid_w)
    code = proc.wait()
    return _as_exit(code) if write_exit(exit_file, code) else 3


def main(args: list[str]) -> int:
    """Run ``args`` (``[--shell] EXIT_FILE -- ARGV...``), record the exit code in
    ``EXIT_FILE`` and return it (a signal S as ``128+S``); 2 for a bad command line."""
    shell = False
    if args and args[0] == "--shell":
        shell, args = True, args[1:]
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m gpushepherd.daemon.runner [--shell] EXIT_FILE -- ARGV...", file=sys.stderr)
        return 2
    exit_file, argv = args[0], args[2:]
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda *_: None)
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
            code = _keeper(argv, shell, exit_file, pid_w)
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
    write_exit(exit_file, code)
    return _as_exit(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
