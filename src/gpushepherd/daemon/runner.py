"""The leader of one job's process group: runs the job, waits, records its exit.

``python -m gpushepherd.daemon.runner EXIT_FILE -- ARGV...`` runs ``ARGV`` (with
``--shell``: ``/bin/sh -c ARGV[0]``), waits for it and writes its exit code to
``EXIT_FILE`` (``{"code": N}``; a signal ``S`` is ``-S``) atomically, so that a
server that restarted - and is no longer the job's parent - still learns how it
ended; it then exits with that code (a signal S: ``128+S``).
SIGTERM/SIGINT/SIGHUP/SIGQUIT/SIGUSR1/SIGUSR2 sent to the group reach the job
directly; the runner itself outlives them to record the exit (handlers, unlike ignored signals, are not
inherited by the job). Stdlib only: it starts fast.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys


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
    # every signal a policy may choose as its stop signal (``classes.X.stop_signal``)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda *_: None)
    try:
        proc = subprocess.Popen(argv[0] if shell else argv, shell=shell)
        code = proc.wait()
    except OSError as exc:  # the command does not exist or cannot run
        print(f"shepherd: cannot run {argv[0]!r}: {exc}", file=sys.stderr)
        code = 127
    tmp = exit_file + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"code": code}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, exit_file)
    # the job's own code, so that an engine running the runner (Slurm's ExitCode=85:0)
    # reports what the exit file says; a signal S as a shell does: 128+S
    return code if 0 <= code < 256 else 128 - code if code < 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
