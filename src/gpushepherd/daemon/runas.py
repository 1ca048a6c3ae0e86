"""Whose uid a job runs under (design note 023, "Jobs run as their user").

A server run as root runs each job as the Unix user its spec names (``JobSpec.user``):
the runner (root) starts the job with ``subprocess.Popen(user=, group=, extra_groups=)``,
so the job's uid, gid and supplementary groups are the user's from its first
instruction - no shell or other program runs as root in between - with the user's home
and a clean environment (``clean_env``). A server not run as root - or run as root with
``SHEPHERD_RUN_AS=server`` (the tests' setting) - runs every job as itself: a single-user
install, said in the server's first log line.

Stdlib only (``pwd``, ``os.getgrouplist``): the user database is the system's (NSS).
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass

#: the environment variable that chooses the mode: ``user`` (each job as its user; the
#: default when the server is root) or ``server`` (every job as the server's user)
RUN_AS_ENV = "SHEPHERD_RUN_AS"
RUN_AS_MODES = ("user", "server")
#: the variable that gives the runner of a job run as the server's user the PYTHONPATH
#: of the job itself (its submitter's, else the server's; '' for none): the runner's own
#: starts with this package's root, which the job is not to see (note 023)
JOB_PYTHONPATH_ENV = "SHEPHERD_JOB_PYTHONPATH"
#: PATH of a job that names none (systemd's default for services)
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: variables a per-user job takes from the server's environment (locale and time zone
#: only: nothing that changes what a program loads or where it writes)
SERVER_ALLOW = ("LANG", "LANGUAGE", "TZ")
SERVER_ALLOW_PREFIX = ("LC_",)


class UnknownUser(ValueError):
    """The job's user is no Unix user of this server (or an empty name); ``str()`` names it."""


@dataclass(frozen=True, slots=True)
class Identity:
    """A Unix user as a job runs as it: name, uid, primary gid, supplementary groups
    (``os.getgrouplist``, the primary one included), home directory and login shell."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str
    shell: str

    def runner_arg(self) -> str:
        """The runner's ``--user`` value: ``UID:GID:G1,G2,...``."""
        return f"{self.uid}:{self.gid}:{','.join(map(str, self.groups))}"


def identity(user: str) -> Identity:
    """The ``Identity`` of Unix user ``user`` (a name, as ``JobSpec.user``).

    Raises:
        UnknownUser: no such user (or ``''``), naming it and what is allowed.
    """
    if not user:
        raise UnknownUser("user: '' is not allowed: this server runs each job as its Unix user "
                          "(it runs as root); name a user of this machine")
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise UnknownUser(f"user: {user!r} is not allowed: no Unix user of that name on this server (jobs run as "
                          "their Unix user here; see `getent passwd`)") from None
    return Identity(pw.pw_name, pw.pw_uid, pw.pw_gid, tuple(sorted(set(os.getgrouplist(pw.pw_name, pw.pw_gid)))),
                    pw.pw_dir, pw.pw_shell)


def clean_env(ident: Identity, job_env: dict[str, str], server_env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a job run as ``ident`` before the contract's variables
    (``CUDA_VISIBLE_DEVICES``, ``SHEPHERD_*``, ``PYTHONPATH``) are added: the locale and
    time zone of the server (``SERVER_ALLOW``, ``LC_*``), ``HOME``, ``USER``, ``LOGNAME``,
    ``SHELL`` of the user, ``PATH`` = ``DEFAULT_PATH``, then the job's own ``env`` (which
    wins). Nothing else of the server's environment reaches the job (Slurm's
    ``--export=NONE`` plus the user's login variables)."""
    server_env = os.environ if server_env is None else server_env
    env = {k: v for k, v in server_env.items() if k in SERVER_ALLOW or k.startswith(SERVER_ALLOW_PREFIX)}
    env.update(HOME=ident.home, USER=ident.name, LOGNAME=ident.name, SHELL=ident.shell or "/bin/sh",
               PATH=DEFAULT_PATH)
    env.update(job_env)
    return env


@dataclass(frozen=True, slots=True)
class RunAs:
    """How this server runs jobs: ``per_user`` (each as its user) or not (every job as
    ``server_user``), and ``why`` in words for the first log line."""

    per_user: bool
    server_user: str
    server_uid: int
    why: str

    def text(self) -> str:
        """``jobs run as their Unix users`` or ``every job runs as USER (uid N): WHY``."""
        if self.per_user:
            return "jobs run as their Unix users (the server is root)"
        return f"every job runs as {self.server_user} (uid {self.server_uid}): {self.why}"


def run_as(env: dict[str, str] | None = None) -> RunAs:
    """This process's mode: per user when it runs as root (effective uid 0) and
    ``SHEPHERD_RUN_AS`` is not ``server``.

    Raises:
        ValueError: ``SHEPHERD_RUN_AS`` is set to another value, naming it and the allowed ones.
    """
    env = os.environ if env is None else env
    mode = env.get(RUN_AS_ENV, "").strip()
    if mode and mode not in RUN_AS_MODES:
        raise ValueError(f"{RUN_AS_ENV}: {mode!r} is not allowed: user (each job as its Unix user, when the server "
                         "is root) or server (every job as the server's user)")
    uid = os.geteuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    if uid != 0:
        return RunAs(False, name, uid, "a single-user install (the server is not root)")
    if mode == "server":
        return RunAs(False, name, uid, f"{RUN_AS_ENV}=server")
    return RunAs(True, name, uid, "")
