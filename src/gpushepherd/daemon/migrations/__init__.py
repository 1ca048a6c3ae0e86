"""Alembic migrations of the daemon's database (run by ``gpushepherd.daemon.migrate``)."""
