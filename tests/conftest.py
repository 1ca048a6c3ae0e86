import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

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


def pytest_addoption(parser):
    parser.addoption("--screenshot-dir", metavar="DIR", default=None,
                     help="Keep the dashboard's browser-test screenshots here (default: a temporary folder, printed).")


@pytest.fixture(scope="module", autouse=True)
def _no_job_outlives_its_test_module(tmp_path_factory):
    """Jobs outlive a stopped server by design (a restart re-attaches to them), so a test
    that stops its server may leave its jobs running. At the end of each test module,
    kill the process group of every job runner whose exit file lies under this session's
    temporary directory - never another session's or a real server's."""
    yield
    import os
    import signal

    base = os.fsencode(str(tmp_path_factory.getbasetemp().resolve()))
    if not os.path.isdir("/proc"):
        return
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"gpushepherd.daemon.runner" in argv and any(a.startswith(base + b"/") for a in argv):
            try:
                os.killpg(int(entry), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
