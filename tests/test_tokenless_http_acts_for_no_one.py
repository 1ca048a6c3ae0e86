"""HTTP without a token to a server that runs jobs as their Unix users (root, note 023)
says nothing the server can check, so it acts for no one (note 084): every action that
changes state or reads another user's private fields is refused (403 saying how to
authenticate: the Unix socket or a token), as for a socket caller who is no admin, and a
body's ``user`` is never recorded as who acted. Before the fix a tokenless request over
loopback was treated as an admin: it applied a policy "by root", lowered root's job's
nice, cancelled it (audited as user ``-``). A server not run as root keeps its documented
single-user rule (every caller is its user), recorded as that user.

In process (``Daemon`` + ``make_app`` under Starlette's test client); a socket request
is one whose ASGI scope carries the kernel's ``PeerCred``, set here by a small wrapper
from a test header as ``unixsock.peer_protocol`` sets it from ``SO_PEERCRED``."""

from __future__ import annotations

import os
import pwd

import pytest
from fastapi.testclient import TestClient

from gpushepherd.daemon.api import make_app
from gpushepherd.daemon.server import Daemon
from gpushepherd.daemon.unixsock import PEER_KEY, PeerCred
from test_daemon import POLICY, wait_for

V2 = POLICY.replace("ml: {}", "ml: {max_gpus: 2}")
NOBODY = pwd.getpwnam("nobody").pw_uid
SERVER_USER = pwd.getpwuid(os.geteuid()).pw_name


class AsPeer:
    """ASGI wrapper: a request with ``x-test-peer-uid: UID`` is served as a Unix-socket
    request of that uid (its scope's ``PEER_KEY``); any other as a TCP one."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket"):
            uid = dict(scope.get("headers") or []).get(b"x-test-peer-uid")
            if uid is not None:
                scope[PEER_KEY] = PeerCred(os.getpid(), int(uid), 0)
        await self.app(scope, receive, send)


@pytest.fixture
def api(tmp_path, monkeypatch, request):
    """A server without tokens; ``request.param``: ``user`` (jobs as their users, root
    only) or ``server`` (every job as the server's user)."""
    mode = getattr(request, "param", "user")
    if mode == "user" and os.geteuid() != 0:
        pytest.skip("a server that runs jobs as their Unix users is root")
    monkeypatch.setenv("SHEPHERD_RUN_AS", mode)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    d = Daemon(tmp_path / "data", policy_path=policy, poll_s=0.05)
    assert d.backend.run_as.per_user is (mode == "user")
    d.start()
    try:
        with TestClient(AsPeer(make_app(d))) as client:
            client.daemon = d
            yield client
    finally:
        d.stop()


def sock(uid: int) -> dict:
    return {"x-test-peer-uid": str(uid)}


def held_job(api, **extra) -> str:
    """A held job of root's (submitted by root on the socket): never launched."""
    r = api.post("/jobs", headers=sock(0), json={"class": "batch", "team": "ml", "user": "root", "gpus": 1,
                                                   "command": ["true"], "cwd": "/", "hold": True,
                                                   "name": "secret-name", **extra})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def says_how_to_authenticate(r) -> None:
    assert r.status_code == 403, r.text
    assert "socket" in r.json()["detail"] and "token" in r.json()["detail"], r.text


def test_tokenless_http_to_a_root_server_changes_nothing_and_reads_no_private_field(api):
    job = held_job(api)
    body = {"policy": __import__("yaml").safe_load(V2), "user": "root", "source": "/etc/gpushepherd/policy.yaml"}

    r = api.post("/policy", json=body)  # over TCP, no token, claiming root
    says_how_to_authenticate(r)
    r = api.post("/policy", json=body, headers=sock(NOBODY))  # the same body on the socket
    assert r.status_code == 403 and "user 'nobody' is not an admin" in r.json()["detail"]
    assert [h["version"] for h in api.get("/policy/history").json()] == [1]
    assert api.post("/policy", json=body, params={"dry_run": True}).status_code == 200  # a check changes nothing

    says_how_to_authenticate(api.patch(f"/jobs/{job}", json={"nice": -10000}))
    for action in ("cancel", "release", "hold", "requeue"):
        says_how_to_authenticate(api.post(f"/jobs/{job}/{action}"))
    says_how_to_authenticate(api.get(f"/jobs/{job}/logs"))
    says_how_to_authenticate(api.get("/audit"))
    says_how_to_authenticate(api.post("/jobs", json={"class": "batch", "team": "ml", "user": "root",
                                                      "command": ["id"], "cwd": "/"}))
    svc = {"name": "svc", "class": "batch", "team": "ml", "user": "root", "command": ["sleep", "600"], "cwd": "/",
           "min_replicas": 0, "max_replicas": 1, "metric": "queue_length", "scale_up_above": 10.0,
           "scale_down_below": 2.0}
    says_how_to_authenticate(api.post("/services", json=svc))
    assert api.post("/services", json=svc, headers=sock(0)).status_code == 201
    says_how_to_authenticate(api.post("/services/svc/signals", json={"queue_length": 99}))
    says_how_to_authenticate(api.delete("/services/svc"))
    assert api.get("/services/svc").json()["name"] == "svc"

    seen = api.get(f"/jobs/{job}").json()  # reads stay open, without another user's private fields
    assert seen["state"] == "PENDING" and seen["name"] is None and seen["command"] is None and "name" in seen["hidden"]
    assert all(j["name"] is None for j in api.get("/jobs").json())
    assert api.get("/whoami").json()["auth"] is False

    mine = api.get(f"/jobs/{job}", headers=sock(0)).json()
    assert mine["state"] == "PENDING" and mine["name"] == "secret-name" and mine.get("nice", 0) == 0
    refused = {"policy-apply", "update", "cancel", "release", "hold", "requeue", "submit", "service-create",
               "service-delete"}

    def tcp_rows():  # the test client's TCP requests; the loop commits the API's rows with its next step
        rows = [e for e in api.get("/audit", headers=sock(0)).json() if str(e["address"]).startswith("testclient")]
        return {e["action"] for e in rows} == refused and rows
    tcp = wait_for("the refusals' audit rows", tcp_rows)
    assert {(e["outcome"], e["user"]) for e in tcp} == {("denied", "")}, tcp  # user shown as -
    tried = [e for e in tcp if e["action"] == "policy-apply"]
    assert len(tried) == 1 and tried[0]["detail"]["claimed_user"] == "root"  # the claim kept, never as who


@pytest.mark.parametrize("api", ["server"], indirect=True)
def test_a_server_not_run_as_root_records_its_own_user_not_the_bodys(api):
    job = held_job(api)
    body = {"policy": __import__("yaml").safe_load(V2), "user": "mallory", "source": "p.yaml"}
    r = api.post("/policy", json=body)  # open: every caller is the server's user (as documented)
    assert r.status_code == 200 and r.json()["version"] == 2 and r.json()["by"] == SERVER_USER, r.text
    assert api.get("/policy/history").json()[-1]["by"] == SERVER_USER
    assert api.post(f"/jobs/{job}/cancel").status_code == 200

    def mine():  # the loop commits a cancel's row with its next step
        rows = api.get("/audit").json()
        got = [e for e in rows if e["action"] in ("policy-apply", "cancel") and e["target"] in ("2", job)]
        return {e["action"] for e in got} == {"policy-apply", "cancel"} and got
    mine = wait_for("the apply's and the cancel's audit rows", mine)
    assert all(e["user"] == SERVER_USER for e in mine), mine
