import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
# tests run as root in CI: their jobs still run as the server's user (design note 023)
# unless a test asks for per-user running (SHEPHERD_RUN_AS=user in its server's environment)
os.environ["SHEPHERD_RUN_AS"] = "server"
# the CLI sizes its tables to $COLUMNS where set, else to the terminal (none under the
# tests: full width); a pytest-xdist worker inherits COLUMNS=80, so the tests that size
# output set it themselves
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)

import pytest  # noqa: E402

import pgserver  # noqa: E402


@pytest.fixture(scope="session")
def pg_server():
    """A throwaway PostgreSQL for the whole session (tests/pgserver.py); the test skips,
    saying why, where none can be started for want of binaries or driver."""
    why = pgserver.unavailable()
    if why:
        pytest.skip(f"PostgreSQL: {why}")
    server = pgserver.PgServer().start()
    yield server
    server.stop()


@pytest.fixture
def pg_url(pg_server) -> str:
    """The SQLAlchemy URL of a fresh, empty PostgreSQL database."""
    return pg_server.new_database()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path) -> str:
    """Each database the daemon supports: SQLite in ``tmp_path``, a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path.resolve() / 'shepherd.db'}"
    return request.getfixturevalue("pg_url")


def pytest_configure(config):
    """A short base folder for the temporary folders, made fresh (``mkdtemp``) where none
    is given: paths show in output that wraps at 80 columns (a dashboard's or the CLI's),
    and pytest-xdist adds ``popen-gwN/`` to each worker's. Removed at the end of a run
    that passed; a failed run's is kept, named at the end."""
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        config.option.basetemp = tempfile.mkdtemp(prefix="gs")
        config._shepherd_basetemp = config.option.basetemp


def pytest_sessionfinish(session, exitstatus):
    base = getattr(session.config, "_shepherd_basetemp", None)
    if base is None:
        return
    if exitstatus == 0:
        shutil.rmtree(base, ignore_errors=True)
    else:
        print(f"\ntemporary folders of this run: {base}")


def pytest_addoption(parser):
    parser.addoption("--screenshot-dir", metavar="DIR", default=None,
                     help="Keep the dashboard's browser-test screenshots here (default: a temporary folder, printed).")


@pytest.fixture(scope="module", autouse=True)
def _no_job_outlives_its_test_module(tmp_path_factory):
    """Jobs outlive a stopped server by design (a restart re-attaches to them), so a test
    that stops its server may leave its jobs running. At the end of each test module,
    kill the jobs whose data directories lie under this session's temporary directory -
    never another session's or a real server's (``kill_leftovers``)."""
    yield
    kill_leftovers(tmp_path_factory.getbasetemp().resolve())


def kill_leftovers(base: Path, depth: int = 4) -> None:
    """Kill the process group of every job runner whose command line names a path under
    ``base``, then what is left in the cgroups of the data directories (folders with
    ``runs/`` or ``server.lock``, at most ``depth`` levels down) under ``base`` - a job's
    setsid'd processes leave its process group, never its cgroup (design note 023) - and
    remove those cgroups; another session's are never touched."""
    import signal

    from gpushepherd.daemon import cgroups

    if not os.path.isdir("/proc"):
        return
    prefix = os.fsencode(str(base)) + b"/"
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"gpushepherd.daemon.runner" in argv and any(a.startswith(prefix) for a in argv):
            try:
                os.killpg(int(entry), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    for top, dirs, files in os.walk(base):
        if top.count(os.sep) - str(base).count(os.sep) >= depth:
            dirs[:] = []
        if "runs" in dirs or "server.lock" in files:
            cgroups.remove_instance(Path(top), kill=True, wait_s=5.0)
            dirs[:] = [d for d in dirs if d not in ("runs", "checkpoints")]
