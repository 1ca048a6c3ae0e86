"""API tokens of ``shepherd server`` (design note 008, "Auth").

A token is ``shp_`` + 32 random bytes (``secrets.token_urlsafe``), shown once when it
is created; the database keeps only its SHA-256 (a high-entropy secret needs no slow
password hash) and compares digests with ``hmac.compare_digest``. A token maps to a
user, the teams whose jobs it may submit, cancel and read the logs of, and an admin
flag (any team, any user).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass

PREFIX = "shp_"


@dataclass(frozen=True)
class Principal:
    """Who a request's token says it is."""

    token_id: int
    user: str
    teams: tuple[str, ...]
    admin: bool = False

    def may_act_for(self, team: str) -> bool:
        """May cancel, read logs of and submit jobs of ``team``."""
        return self.admin or team in self.teams

    def teams_text(self) -> str:
        return ", ".join(self.teams) if self.teams else "none"


def new_token() -> str:
    """A new API token: ``shp_`` and 43 URL-safe characters (256 random bits)."""
    return PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """The SHA-256 hex digest of ``token``: what the database stores."""
    return hashlib.sha256(token.encode()).hexdigest()


def digest_matches(token: str, stored_hash: str) -> bool:
    """Whether ``token`` hashes to ``stored_hash``, compared in constant time."""
    return hmac.compare_digest(token_hash(token), stored_hash)


def is_loopback(host: str) -> bool:
    """``host`` is a loopback address (``127.0.0.1``, ``::1``, ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
