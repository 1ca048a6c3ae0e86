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
