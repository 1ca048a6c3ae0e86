"""A root server that runs every job as itself (``SHEPHERD_RUN_AS=server``, or a cluster
backend) names a tokenless loopback caller from the kernel's TCP table, as the Unix
socket names it (design note 087). Before, every such caller was the server's user,
root: an admin. As user ``nobody`` it applied policies, cancelled root's jobs and
changed their nice, until the first token existed (note 084, Open).

A real ``shepherd server`` (the in-process test client has no TCP connection to trace),
and requests made by a child process running as ``nobody``."""

from __future__ import annotations

import json
import os
import pwd
import socket

import httpx
import pytest
import yaml

from gpushepherd.daemon.tcp_peer import peer_uid
from test_daemon import POLICY, Server, wait_for

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="a server run as root, and a caller made another user")

NOBODY = pwd.getpwnam("nobody").pw_uid
#: team ml lists its members: root's jobs there are none of nobody's business
MEMBERS = POLICY.replace("ml: {}", "ml: {members: [root, ana]}")

@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path)
    s.policy.write_text(MEMBERS)
    os.chmod(tmp_path, 0o755)
    s.start()
    yield s
    s.stop()


def as_nobody(server: Server, job: str) -> dict:
    """The answers to a few requests made by a forked child running as ``nobody`` (a
    fork, not a new interpreter: this one may live where ``nobody`` cannot read)."""
    policy = yaml.safe_load(MEMBERS.replace("batch: {grace_period_s: 2}", "batch: {grace_period_s: 9}"))
    calls = {"whoami": ("GET", "/whoami", {}), "cancel": ("POST", f"/jobs/{job}/cancel", {}),
             "nice": ("PATCH", f"/jobs/{job}", {"json": {"nice": -10000}}),
             "policy": ("POST", "/policy", {"json": {"policy": policy, "user": "root"}}),
             "submit": ("POST", "/jobs", {"json": {"class": "batch", "team": "ml", "user": "root", "gpus": 1,
                                                    "command": ["true"], "cwd": "/"}}),
             "job": ("GET", f"/jobs/{job}", {}),
             # review: uvicorn took the client's address from X-Forwarded-For (trusted from
             # loopback), so naming root's connection there made nobody root; now ignored
             "forwarded": ("GET", "/whoami", {"headers": {"X-Forwarded-For": "127.0.0.1:1"}})}
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nobody
        code = 1
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            out = {}
            for name, (method, path, kw) in calls.items():
                r = httpx.request(method, server.url + path, timeout=60, **kw)
                out[name] = [r.status_code, r.json()]
            os.write(write, json.dumps(out).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        text = f.read()
    _pid, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and text
    return json.loads(text)


@ROOT_ONLY
def test_a_tokenless_loopback_caller_is_its_unix_user_not_the_servers(server):
    me = httpx.get(server.url + "/whoami", timeout=60).json()
    assert me == {"auth": True, "user": "root", "teams": ["ml"], "admin": True, "via": "tcp", "uid": 0}
    r = httpx.post(server.url + "/jobs", timeout=60, json={
        "class": "batch", "team": "ml", "user": "ana", "gpus": 1, "command": ["true"], "cwd": "/", "hold": True,
        "name": "secret-name"})
    assert r.status_code == 201, r.text  # root: an admin, who may submit for ana
    job = r.json()["id"]

    got = as_nobody(server, job)
    assert got["whoami"] == [200, {"auth": True, "user": "nobody", "teams": [], "admin": False, "via": "tcp",
                                   "uid": NOBODY}]
    for name in ("cancel", "nice", "policy", "submit"):
        assert got[name][0] == 403, (name, got[name])
    assert "user 'nobody' is not a member of team 'ml'" in got["cancel"][1]["detail"]
    assert "user 'nobody' is not an admin" in got["policy"][1]["detail"]
    assert "user: 'root' is not allowed: this connection's owner is Unix user 'nobody'" in got["submit"][1]["detail"]
    assert got["job"][0] == 200 and got["job"][1].get("name") != "secret-name"  # private fields hidden
    assert got["forwarded"] == got["whoami"]

    assert server.job(job)["state"] == "PENDING" and server.job(job)["nice"] == 0
    assert [h["version"] for h in httpx.get(server.url + "/policy/history", timeout=60).json()] == [1]
    def refused() -> list:  # audit rows are written a moment later
        rows = httpx.get(server.url + "/audit", params={"user": "nobody"}, timeout=60).json()
        return [a for a in rows if a["outcome"] == "denied"]
    rows = wait_for("nobody's refusals in the audit log", lambda: len(refused()) >= 4 and refused())
    assert {a["action"] for a in rows} >= {"cancel", "update", "policy-apply", "submit"}
    assert all(a["uid"] == NOBODY and a["address"].startswith("127.0.0.1:") for a in rows)


@pytest.mark.parametrize("family, host, listen", [
    (socket.AF_INET, "127.0.0.1", "127.0.0.1"),
    (socket.AF_INET6, "::1", "::1"),
    (socket.AF_INET, "127.0.0.1", "::"),  # an IPv4 client of a dual-stack server: ::ffff:127.0.0.1 in tcp6
])
def test_the_tcp_table_names_the_owner_of_a_connections_client_end(family, host, listen):
    srv = socket.socket(socket.AF_INET6 if ":" in listen else socket.AF_INET)
    if listen == "::":
        srv.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    srv.bind((listen, 0))
    srv.listen()
    with srv, socket.socket(family) as client:
        client.connect((host, srv.getsockname()[1]))
        conn, addr = srv.accept()
        with conn:
            here = conn.getsockname()[:2]
            assert peer_uid(addr[:2], here) == os.geteuid()
            assert peer_uid((addr[0], addr[1] + 1 if addr[1] < 65535 else 1), here) is None  # no such connection
    assert peer_uid(addr[:2], here) is None  # closed: no live row
    with pytest.raises(ValueError):
        peer_uid(("testclient", 50000), ("testserver", 80))


def test_a_connection_its_client_closed_names_no_one():
    # review: after the client's close() the kernel lists its end (FIN_WAIT2) as uid 0, so a
    # caller who sent its request and closed at once was read as root
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    with srv:
        client = socket.create_connection(srv.getsockname())
        conn, addr = srv.accept()
        with conn:
            here = conn.getsockname()[:2]
            assert peer_uid(addr[:2], here) == os.geteuid()
            client.close()  # the server's end stays open: the client's is FIN_WAIT2, an orphan
            rows = [line.split() for line in open("/proc/net/tcp").read().splitlines()[1:]]
            port = f"{addr[1]:04X}"
            assert any(r[1].endswith(":" + port) and r[3] in ("04", "05") for r in rows)
            assert peer_uid(addr[:2], here) is None
