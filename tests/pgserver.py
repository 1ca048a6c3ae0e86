"""A throwaway PostgreSQL for the tests: ``initdb`` into a temporary directory,
``pg_ctl start`` on a free port on 127.0.0.1 (its unix socket in that directory too),
one fresh database per test, ``pg_ctl stop -m immediate`` and the directory removed at
the end.

The binaries are looked up in ``$GPUSHEPHERD_PG_BIN``, then on ``PATH``, then in
Debian's ``/usr/lib/postgresql/<version>/bin`` (the newest). ``.ci/run`` installs
Debian's ``postgresql`` package when none is found; without one the PostgreSQL tests
skip and say why.

PostgreSQL refuses to run as root, so as root (CI, these machines) ``initdb`` and
``postgres`` run as the ``postgres`` user (``nobody`` where there is none) through
``runuser``; the temporary directory is handed to that user. The server runs with
``fsync=off``: it is thrown away, and the tests are about the daemon's logic, not the
disk (a crash here is a ``kill -9`` of gpushepherd's server, not of the machine).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

SUPERUSER = "shepherd"


def find_bin() -> Path | None:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``, or ``None``."""
    tools = ("initdb", "pg_ctl", "postgres")
    candidates = []
    if os.environ.get("GPUSHEPHERD_PG_BIN"):
        candidates.append(Path(os.environ["GPUSHEPHERD_PG_BIN"]))
    found = shutil.which("initdb")
    if found:
        candidates.append(Path(found).resolve().parent)
    def version(p: str) -> tuple:
        return tuple(int(x) if x.isdigit() else 0 for x in Path(p).parent.name.split("."))
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)]
    for d in candidates:
        if all(os.access(d / t, os.X_OK) for t in tools):
            return d
    return None


def unavailable() -> str | None:
    """Why no PostgreSQL can be started here, or ``None`` if one can."""
    if find_bin() is None:
        return ("no PostgreSQL binaries (initdb, pg_ctl, postgres) on PATH, in $GPUSHEPHERD_PG_BIN or in "
                "/usr/lib/postgresql/*/bin: install Debian's postgresql package (.ci/run does, as root)")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "the psycopg driver is not installed: pip install -e '.[test]'"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root and runuser is missing: PostgreSQL cannot run as root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    """One PostgreSQL instance; ``start()``, then ``new_database()`` per test, ``stop()``."""

    def __init__(self) -> None:
        self.bin = find_bin()
        self.dir: Path | None = None
        self.port = 0
        self._dbs = 0
        self._user: str | None = None
        if os.geteuid() == 0:
            names = {p.pw_name for p in pwd.getpwall()}
            self._user = "postgres" if "postgres" in names else "nobody"

    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        cmd = [str(self.bin / args[0]), *args[1:]]
        if self._user:
            cmd = ["runuser", "-u", self._user, "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    @property
    def log(self) -> Path:
        return self.dir / "server.log"

    def start(self) -> "PgServer":
        self.dir = Path(tempfile.mkdtemp(prefix="gpushepherd-pg-"))
        if self._user:
            pw = pwd.getpwnam(self._user)
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        data = self.dir / "data"
        r = self._run("initdb", "-D", str(data), "-U", SUPERUSER, "-A", "trust", "-E", "UTF8", "--no-sync",
                      "--locale=C")
        if r.returncode != 0:
            raise RuntimeError(f"initdb failed ({r.returncode}): {r.stdout}{r.stderr}")
        last = ""
        for _ in range(3):  # a free port can be taken between the probe and the bind: try another
            self.port = _free_port()
            opts = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
                    f"-c full_page_writes=off -c synchronous_commit=off -c max_connections=200")
            r = self._run("pg_ctl", "-D", str(data), "-l", str(self.log), "-w", "-t", "60", "-o", opts, "start",
                          timeout=90)
            if r.returncode == 0:
                return self
            last = f"{r.stdout}{r.stderr}{self.log.read_text() if self.log.exists() else ''}"
        raise RuntimeError(f"pg_ctl start failed: {last}")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; returns its SQLAlchemy URL."""
        import psycopg

        self._dbs += 1
        name = f"t{self._dbs}_{os.getpid()}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname=postgres",
                             autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        if self.dir is None:
            return
        self._run("pg_ctl", "-D", str(self.dir / "data"), "-m", "immediate", "-w", "stop")
        deadline = time.monotonic() + 10
        while (self.dir / "data" / "postmaster.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None
