"""The README says what a team without ``members`` is on a server without tokens: open to
every local user over the socket. A newcomer found it unsaid (the README said only that
such a team is admin-only once tokens exist). The claims, each checked against the
server (``auth.Principal.refusal``: ``open_teams`` while there is no token;
``owner_only`` for hold, release, update, requeue, attach; a tokenless HTTP caller of a
server not run as root is the server's own user, ``None``), and that the README says
them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gpushepherd.daemon.api import make_app
from gpushepherd.daemon.server import Daemon
from test_daemon import POLICY
from test_tokenless_http_acts_for_no_one import NOBODY, AsPeer, sock

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def api(tmp_path, monkeypatch):
    """A server without tokens, every job as its user (nothing launches: held jobs), team
    ``ml`` without members and ``closed`` whose only member is ``daemon``."""
    monkeypatch.setenv("SHEPHERD_RUN_AS", "server")
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.replace("ml: {}", "ml: {}\n  closed: {members: [daemon]}"))
    d = Daemon(tmp_path / "data", policy_path=policy, poll_s=0.05)
    d.start()
    try:
        with TestClient(AsPeer(make_app(d))) as client:
            yield client
    finally:
        d.stop()


def _held(api, team: str, uid: int | None, user: str):
    return api.post("/jobs", headers=sock(uid) if uid is not None else {}, json={"class": "batch", "team": team, "user": user, "gpus": 1,
                                                      "command": ["true"], "cwd": "/", "hold": True, "name": "n"})


def test_a_team_without_members_is_open_to_every_local_user_and_members_close_it(api):
    ml, closed = _held(api, "ml", 0, "root").json()["id"], _held(api, "closed", 0, "root").json()["id"]
    assert _held(api, "ml", NOBODY, "nobody").status_code == 201  # submit to it, as themselves
    assert _held(api, "ml", NOBODY, "root").status_code == 403  # never as another user
    assert _held(api, "closed", NOBODY, "nobody").status_code == 403
    assert api.get(f"/jobs/{ml}", headers=sock(NOBODY)).json()["name"] == "n"  # private fields
    assert api.get(f"/jobs/{closed}", headers=sock(NOBODY)).json()["name"] is None
    assert api.get(f"/jobs/{ml}/logs", headers=sock(NOBODY)).status_code != 403  # never ran: no log yet
    assert api.get(f"/jobs/{closed}/logs", headers=sock(NOBODY)).status_code == 403
    for action in ("hold", "release", "requeue"):  # the job's user's or an admin's only
        r = api.post(f"/jobs/{ml}/{action}", headers=sock(NOBODY))
        assert r.status_code == 403 and "only its user or an admin" in r.json()["detail"], (action, r.text)
    assert api.post(f"/jobs/{closed}/cancel", headers=sock(NOBODY)).status_code == 403
    assert api.post(f"/jobs/{ml}/cancel", headers=sock(NOBODY)).status_code == 200  # another user's job
    assert api.get(f"/jobs/{ml}").json()["state"] == "CANCELLED"
    # tokenless HTTP that is no Unix user the server can name: the server's own user (the
    # principal None of a server not run as root; here the in-process client, no IP), whom
    # no members list binds - only a token closes the team to it
    assert _held(api, "closed", None, "nobody").status_code == 201


def test_the_readme_says_a_team_without_members_is_open_without_tokens_and_how_to_close_it():
    text = " ".join((ROOT / "README.md").read_text().split())
    said = re.search(r"on a server without tokens a team with no `members` list is open: (.*?) needs one\)", text)
    assert said, "README: what a team without members is on a server without tokens"
    for claim in ("any local user may submit to it over the socket", "cancel any of its jobs - another user's too",
                  "hold, release, update, requeue and attach stay the job's user's or an admin's",
                  "list its `members` to close it", "a server not run as root takes every tokenless loopback HTTP "
                  "caller for its own user, whom no `members` list binds: there only a first token closes it"):
        assert claim in said.group(1), claim
