"""Who a request is, for ``shepherd server`` (design notes 008 "Auth" and 025).

Two ways in. An API token is ``shp_`` + 32 random bytes (``secrets.token_urlsafe``),
shown once when it is created; the database keeps only its SHA-256 (a high-entropy
secret needs no slow password hash) and compares digests with ``hmac.compare_digest``.
A token is bound to one Unix user (admin and metrics tokens apart), the teams whose
jobs it may submit, cancel and read the logs of, an admin flag, a scope (``api``, or
``metrics``: ``/metrics`` only) and an expiry. The local Unix socket needs no token:
the kernel names the caller's uid (``SO_PEERCRED``, ``gpushepherd.daemon.unixsock``),
whose user name is the principal; root and the server's own uid are admin.

A team whose policy entry lists ``members`` (user names, ``@group`` for a Unix group,
resolved with ``grp`` at each check) may be acted for by its members only, on either
path; a token must also carry the team. A team without ``members`` keeps the token's
teams as the rule; on the socket it is open while the server has no tokens, else
admin-only (note 025).

A request over TCP without a token to a server that runs jobs as their Unix users
(root, note 023) says nothing the server can check: it is the ``ANONYMOUS`` principal,
which may read what any caller reads and nothing more - it acts for no team and no
user, submits, cancels, changes, attaches to and applies nothing, and sees no job's
private fields (note 084). A server run as root that runs every job as itself
(``SHEPHERD_RUN_AS=server``, or a cluster backend) names a tokenless loopback caller
from the kernel's TCP table (``tcp_peer``): that Unix user, as on the socket (root and
the server's uid admin); one it cannot name is ``UNKNOWN_TCP``, as ``ANONYMOUS`` (note
087). A server not run as root runs every job as itself: there a tokenless caller is
that user (``None`` principal, as before tokens exist).
"""

from __future__ import annotations

import grp
import hashlib
import hmac
import ipaddress
import os
import pwd
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

PREFIX = "shp_"
#: token scopes: ``api`` (every route the token's user may use), ``metrics`` (``/metrics`` only)
SCOPES = ("api", "metrics")
METRICS_PATH = "/metrics"
#: the 401 of a request without a token once the database has (or had) one
NO_TOKEN = "no token: send 'Authorization: Bearer TOKEN' (shepherd ... --token, or $SHEPHERD_TOKEN)"
#: why the ``ANONYMOUS`` principal may not act: how to say who one is
#: why ``UNKNOWN_TCP`` may not act
UNTRACED = ("this request does not say who sends it (HTTP without a token) and its connection could not be traced "
            "to a Unix user, so on this server, run as root, it acts for no one: use its Unix socket (shepherd ... "
            "without --server) or a token (shepherd token create --user U --team T, then --token or "
            "$SHEPHERD_TOKEN)")
UNAUTHENTICATED = ("this request does not say who sends it (HTTP without a token) and this server runs each job as "
                   "its Unix user, so it acts for no one: use its Unix socket (shepherd ... without --server; the "
                   "kernel names your user) or a token (shepherd token create --user U --team T, then --token or "
                   "$SHEPHERD_TOKEN)")


@dataclass(frozen=True)
class Membership:
    """The ``members`` lists of the policy in force: team -> entries (user names and
    ``@group``); a team absent here lists none. ``source`` names where they come from,
    for messages (``teams.X.members of the policy in force, version 3``)."""

    teams: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    version: int | None = None

    def source(self, team: str) -> str:
        where = f"version {self.version}" if self.version is not None else "no version"
        return f"teams.{team}.members of the policy in force ({where})"


NO_MEMBERS = Membership()


def membership_of(raw_policy: Mapping | None, version: int | None = None) -> Membership:
    """The ``Membership`` of a parsed (already validated) policy mapping."""
    teams = (raw_policy or {}).get("teams") or {}
    listed = {name: tuple(entry["members"]) for name, entry in sorted(teams.items())
              if isinstance(entry, Mapping) and entry.get("members") is not None}
    return Membership(MappingProxyType(listed), version)


def is_member(user: str, entries: tuple[str, ...]) -> bool:
    """``user`` is one of ``entries``: named, or in a ``@group`` (the group's member
    list, or the user's primary group), read from ``grp`` / ``pwd`` now. An unknown group
    has no members."""
    for entry in entries:
        if not entry.startswith("@"):
            if entry == user:
                return True
            continue
        try:
            group = grp.getgrnam(entry[1:])
        except KeyError:
            continue
        if user in group.gr_mem:
            return True
        try:
            if pwd.getpwnam(user).pw_gid == group.gr_gid:
                return True
        except KeyError:
            pass
    return False


@dataclass(frozen=True)
class Principal:
    """Who a request is: a token (``token_id``) or, on the Unix socket, a Unix user
    (``token_id`` ``None``, ``uid`` the kernel's). ``expires``: epoch seconds or ``None``;
    ``open_teams``: on the socket, teams without a members list are open (the server has
    no tokens); ``membership``: the policy's members lists, set per request."""

    token_id: int | None
    user: str
    teams: tuple[str, ...]
    admin: bool = False
    scope: str = "api"
    expires: float | None = None
    uid: int | None = None
    open_teams: bool = False
    membership: Membership = field(default=NO_MEMBERS, compare=False)
    anonymous: bool = False
    #: a tokenless loopback TCP caller named by the kernel's TCP table (note 087): the
    #: user is vouched for as on the socket; with ``anonymous``: one it could not name
    tcp: bool = False

    @property
    def via_socket(self) -> bool:
        return self.token_id is None and not self.anonymous

    def refusal(self, team: str) -> str | None:
        """Why this principal may not submit for, cancel jobs of or read logs of
        ``team``; ``None``: it may. Rules: this module's docstring."""
        if self.anonymous:
            return UNTRACED if self.tcp else UNAUTHENTICATED
        if self.admin:
            return None
        listed = self.membership.teams.get(team)
        if listed is not None:
            if not is_member(self.user, listed):
                return (f"user {self.user!r} is not a member of team {team!r} ({self.membership.source(team)}: "
                        f"{', '.join(listed) or 'none'})")
            if not self.via_socket and team not in self.teams:
                return f"this token's teams are {self.teams_text()}"
            return None
        if self.via_socket:
            return None if self.open_teams else (
                f"team {team!r} lists no members ({self.membership.source(team)} is not set): through the socket "
                "only its members or an admin may act for it")
        return None if team in self.teams else f"this token's teams are {self.teams_text()}"

    def may_act_for(self, team: str) -> bool:
        """May cancel, read logs of and submit jobs of ``team`` (``refusal`` is ``None``)."""
        return self.refusal(team) is None

    def teams_text(self) -> str:
        return ", ".join(self.teams) if self.teams else "none"

    def expired(self, now: float | None = None) -> bool:
        return self.expires is not None and self.expires <= (time.time() if now is None else now)


#: a tokenless TCP caller of a server that runs jobs as their Unix users (this module's
#: docstring): no user, no team, no admin; audited as user ``-``
ANONYMOUS = Principal(None, "", (), anonymous=True)
#: a tokenless TCP caller of a root server whose connection the kernel's TCP table does
#: not name (closed already, not loopback): as ``ANONYMOUS`` (note 087)
UNKNOWN_TCP = Principal(None, "", (), anonymous=True, tcp=True)


def user_of_uid(uid: int) -> str:
    """The user name of ``uid`` (``pwd``), or the uid as text when it has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def socket_principal(uid: int, open_teams: bool, server_uid: int | None = None, tcp: bool = False) -> Principal:
    """The principal of a Unix-socket caller whose uid the kernel gave (``tcp``: of a
    loopback TCP caller whose uid the kernel's TCP table gave, note 087): its user name,
    admin when root or the server's own uid (``server_uid``, default this process's)."""
    own = os.geteuid() if server_uid is None else server_uid
    return Principal(None, user_of_uid(uid), (), admin=uid in (0, own), uid=uid, open_teams=open_teams, tcp=tcp)


def unix_user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


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
