"""Identity and transport (issue 14 points 1 and 4, design note 025): the local Unix
socket names the caller's Unix user (SO_PEERCRED), tokens are bound to a user, expire
and rotate, a policy's ``teams.X.members`` limits a team on both paths, a public address
needs TLS, a metrics token reads ``/metrics`` only. Against a real ``shepherd server``;
as root the socket is also tried as Unix users created for the test."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from builders import remove_unix_users
from test_auth import create_token, shepherd
from test_daemon import POLICY, Server, free_port

from gpushepherd.daemon.auth import Membership, is_member, socket_principal, user_of_uid
from gpushepherd.daemon.store import Store
from gpushepherd.daemon.unixsock import MAX_SUN_PATH, UnixListener, peer_cred, short_path
from gpushepherd.policy.load import PolicyError, policy_from_dict

ME = pwd.getpwuid(os.geteuid()).pw_name
#: a stdlib-only client, run as another Unix user (who may not read the venv): METHOD PATH [BODY]
CLIENT = """\
import http.client, json, socket, sys
class C(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(sys.argv[1])
c = C("localhost")
c.request(sys.argv[2], sys.argv[3], body=sys.argv[4] if len(sys.argv) > 4 else None,
          headers={"Content-Type": "application/json"})
r = c.getresponse()
print(json.dumps({"status": r.status, "body": json.loads(r.read())}))
"""


def members_policy(ml: list[str], data: list[str]) -> str:
    return POLICY.replace("  ml: {}", f"  ml: {{members: {json.dumps(ml)}}}\n  data: {{members: {json.dumps(data)}}}\n"
                                      "  open: {}")


@pytest.fixture
def sockdir():
    """A directory every local user may traverse (pytest's tmp_path is 0700), for the socket."""
    d = Path(tempfile.mkdtemp(prefix="shp-sock-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def over_socket(path: Path, method: str, target: str, **kw) -> httpx.Response:
    with short_path(path) as where, httpx.Client(transport=httpx.HTTPTransport(uds=where)) as c:
        return c.request(method, "http://shepherd" + target, timeout=60, **kw)


def job(s: Server, team: str, **extra) -> dict:
    return {"class": "batch", "team": team, "command": ["true"], "cwd": "/tmp", **extra}


# -- Unix users for the socket (root only) -----------------------------------------------
def _why_no_users() -> str | None:
    if os.geteuid() != 0:
        return "not root: the socket is tried as this process's own user only (creating users needs root)"
    if not (shutil.which("useradd") and shutil.which("groupadd")):
        return "no useradd/groupadd on PATH: the socket is tried as this process's own user only"
    return None


class Users:
    """Unix users and a group made for the test, removed at the end; ``run`` calls the
    socket as one of them (a stdlib client, /usr/bin/python3 when the venv is not theirs)."""

    def __init__(self, where: Path):
        tag = uuid.uuid4().hex[:6]
        self.alice, self.bob, self.group = f"shpa{tag}", f"shpb{tag}", f"shpg{tag}"
        self.script = where / "client.py"
        self.script.write_text(CLIENT)
        self.script.chmod(0o644)
        subprocess.run(["groupadd", self.group], check=True)
        for name, extra in ((self.alice, ["-G", self.group]), (self.bob, [])):
            subprocess.run(["useradd", "-M", "-s", "/bin/false", *extra, name], check=True)
        self.python = next((exe for exe in (sys.executable, "/usr/bin/python3") if self._runs(exe)), None)

    def _runs(self, exe: str) -> bool:
        try:
            return subprocess.run([exe, "-c", "pass"], user=self.alice, cwd="/", capture_output=True,
                                  check=False).returncode == 0
        except OSError:  # not executable by that user (a venv under /root)
            return False

    def run(self, user: str, sock: Path, method: str, target: str, body: dict | None = None) -> tuple[int, dict]:
        args = [self.python, str(self.script), str(sock), method, target] + ([json.dumps(body)] if body else [])
        r = subprocess.run(args, user=user, cwd="/", capture_output=True, text=True, timeout=60, check=False)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        return out["status"], out["body"]

    def remove(self) -> None:
        """Remove the users and their group (``builders.remove_unix_users``)."""
        remove_unix_users((self.alice, self.bob), self.group)


@pytest.fixture
def users(sockdir):
    why = _why_no_users()
    if why:
        pytest.skip(why)
    u = Users(sockdir)
    try:
        if u.python is None:
            pytest.skip("no Python interpreter the created users may run (the venv's and /usr/bin/python3 refused)")
        yield u
    finally:
        u.remove()


# -- the socket ----------------------------------------------------------------------------
def test_the_socket_names_the_callers_unix_user_and_tcp_only_on_a_root_server(tmp_path, sockdir):
    s = Server(tmp_path)
    sock = sockdir / "shepherd.sock"
    s.start(extra=("--socket", str(sock)))
    try:
        assert oct(sock.stat().st_mode & 0o777) == "0o666"
        who = over_socket(sock, "GET", "/whoami").json()
        assert (who["user"], who["uid"], who["via"], who["admin"]) == (ME, os.geteuid(), "socket", True)
        tcp = httpx.get(s.url + "/whoami").json()
        if os.geteuid() == 0:  # a root server names a tokenless loopback caller from the TCP table (note 087)
            assert (tcp["user"], tcp["uid"], tcp["via"], tcp["admin"]) == (ME, 0, "tcp", True)
        else:  # a server not run as root: no identity over TCP without a token
            assert tcp["auth"] is False
        # the CLI takes the socket by default ($SHEPHERD_SOCKET here) and leaves the user to it
        res = shepherd("submit", "-c", "batch", "-A", "ml", "-D", str(tmp_path), "--", "true",
                       env={"SHEPHERD_SOCKET": str(sock), "USER": "someone-else"})
        assert res.exit_code == 0, res.output
        assert s.job(res.stdout.split()[-1])["user"] == ME
        # once tokens exist TCP needs one; the socket still needs none
        create_token(s.data, "--user", "ana", "--team", "ml")
        assert httpx.get(s.url + "/jobs").status_code == 401
        assert over_socket(sock, "GET", "/jobs").status_code == 200
    finally:
        s.stop()
    assert not sock.exists()  # removed at stop


def test_socket_as_other_unix_users(tmp_path, sockdir, users):
    s = Server(tmp_path)
    s.policy.write_text(members_policy([users.alice], [f"@{users.group}"]))
    sock = sockdir / "shepherd.sock"
    create_token(s.data, "--user", "ana", "--team", "ml")  # auth on: a team without members is admin-only
    s.start(extra=("--socket", str(sock)))
    try:
        status, who = users.run(users.alice, sock, "GET", "/whoami")
        assert status == 200 and (who["user"], who["uid"], who["admin"]) == (
            users.alice, pwd.getpwnam(users.alice).pw_uid, False)
        assert who["teams"] == ["data", "ml"]  # ml by name, data through the group
        for team in ("ml", "data"):
            status, body = users.run(users.alice, sock, "POST", "/jobs", job(s, team))
            assert status == 201 and body["user"] == users.alice, body
        status, body = users.run(users.bob, sock, "POST", f"/jobs/{body['id']}/cancel")
        assert status == 403 and f"user {users.bob!r} is not a member of team 'data'" in body["detail"]
        status, body = users.run(users.bob, sock, "POST", "/jobs", job(s, "ml"))
        assert status == 403 and body["detail"] == (
            f"team: 'ml' is not allowed: user {users.bob!r} is not a member of team 'ml' (teams.ml.members of the "
            f"policy in force (version 1): {users.alice})")
        status, body = users.run(users.alice, sock, "POST", "/jobs", job(s, "open"))
        assert status == 403 and "team 'open' lists no members" in body["detail"]
        status, body = users.run(users.alice, sock, "POST", "/jobs", job(s, "ml", user="root"))
        assert status == 403 and body["detail"] == (f"user: 'root' is not allowed: the socket's caller is Unix "
                                                     f"user {users.alice!r}")
        status, body = users.run(users.bob, sock, "POST", "/policy", {"policy": {}})
        assert status == 403 and "needs an admin" in body["detail"]
    finally:
        s.stop()


def test_a_path_longer_than_sun_path_is_bound_and_reached_through_its_directory(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = deep / "shepherd.sock"
    assert len(str(path)) > MAX_SUN_PATH
    listener = UnixListener(path)
    try:
        with short_path(path) as where, socket.socket(socket.AF_UNIX) as client:
            client.connect(where)
            conn, _ = listener.sock.accept()
            with conn:
                assert peer_cred(conn).uid == os.geteuid() and peer_cred(conn).pid == os.getpid()
    finally:
        listener.close()
    assert not path.exists()


def test_membership_rules():
    """The rule of ``Principal.refusal`` on its own: members by name or @group, the
    socket's unlisted teams open only while the server has no tokens."""
    root_group = __import__("grp").getgrgid(pwd.getpwuid(os.geteuid()).pw_gid).gr_name
    assert is_member(ME, (f"@{root_group}",))  # a primary group counts
    assert not is_member(ME, ("@no-such-group-xyz", "someone"))
    uid = os.geteuid() or 65534  # root is always admin: another uid (its name, or the uid as text)
    p = socket_principal(uid, open_teams=False, server_uid=uid + 1)
    assert not p.admin and p.user == user_of_uid(uid)
    p = replace(p, membership=Membership({"ml": (p.user,), "data": ()}, version=3))
    assert p.refusal("ml") is None
    assert p.refusal("data") == f"user {p.user!r} is not a member of team 'data' (teams.data.members of the policy " \
                                "in force (version 3): none)"
    assert "lists no members" in p.refusal("x")
    assert replace(p, open_teams=True).refusal("x") is None


def test_policy_members_are_validated_naming_the_entry():
    raw = {"cluster": {"nodes": [{"name": "n", "gpus": 1, "gpu_type": "X"}]},
           "teams": {"ml": {"members": ["alice", "@ml-users", "-rf"]}}}
    with pytest.raises(PolicyError, match=r"teams\.ml\.members\[2\]: '-rf' is not allowed: a Unix user name "
                                          r"\(alice\) or @ and a Unix group"):
        policy_from_dict(raw)
    raw["teams"]["ml"]["members"] = ["alice", "@ml-users"]
    assert policy_from_dict(raw).spec.teams["ml"].members == ["alice", "@ml-users"]


# -- tokens ----------------------------------------------------------------------------------
def test_tokens_expire_with_a_401_saying_when(tmp_path):
    s = Server(tmp_path)
    token = create_token(s.data, "--user", "ana", "--team", "ml", "--expires", "30d")
    store = Store(Store.sqlite_url(s.data))
    row = store.tokens()[0]
    assert abs(row["expires"] - row["created"] - 30 * 86400) < 60
    res = shepherd("token", "create", "--data-dir", str(s.data), "--user", "ana", "--team", "ml", "--expires", "30")
    assert res.exit_code == 2 and "'30' is not allowed: give its unit" in res.output
    old_id, old = store.create_token("ana", ["ml"], expires=time.time() - 3600)
    store.close()
    s.start()
    try:
        assert httpx.get(s.url + "/jobs", headers={"Authorization": f"Bearer {token}"}).status_code == 200
        r = httpx.get(s.url + "/jobs", headers={"Authorization": f"Bearer {old}"})
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(Store(Store.sqlite_url(s.data)).tokens()[1]["expires"]))
        assert r.status_code == 401 and r.json()["detail"].startswith(
            f"the token expired at {when} (token {old_id}, user 'ana')")
        listed = shepherd("token", "list", "--data-dir", str(s.data)).stdout
        assert "(expired)" in next(x for x in listed.splitlines() if x.split()[:1] == [str(old_id)])
    finally:
        s.stop()


def test_rotate_makes_a_new_secret_with_the_same_user_teams_and_lifetime(tmp_path):
    s = Server(tmp_path)
    s.policy.write_text(POLICY.replace("  ml: {}", "  ml: {}\n  data: {}"))
    old = create_token(s.data, "--user", "ana", "--team", "ml", "--team", "data", "--expires", "7d")
    res = shepherd("token", "rotate", "1", "--data-dir", str(s.data))
    assert res.exit_code == 0, res.output
    new = res.stdout.strip()
    assert new.startswith("shp_") and new != old and "token 1: revoked; token 2 replaces it" in res.stderr
    rows = Store(Store.sqlite_url(s.data)).tokens()
    assert rows[0]["revoked"] is not None and rows[1]["revoked"] is None
    assert (rows[1]["user"], rows[1]["teams"], rows[1]["admin"], rows[1]["scope"]) == ("ana", ["ml", "data"], False,
                                                                                      "api")
    assert abs(rows[1]["expires"] - rows[1]["created"] - 7 * 86400) < 60
    res = shepherd("token", "rotate", "1", "--data-dir", str(s.data))
    assert res.exit_code == 2 and "token 1: no such token, or already revoked" in res.output
    s.start()
    try:
        assert httpx.get(s.url + "/jobs", headers={"Authorization": f"Bearer {old}"}).status_code == 401
        assert httpx.get(s.url + "/whoami", headers={"Authorization": f"Bearer {new}"}).json() == {
            "auth": True, "user": "ana", "teams": ["ml", "data"], "admin": False}
    finally:
        s.stop()


def test_team_members_limit_tokens_too(tmp_path):
    """The token path of the members check (the socket's: test_socket_as_other_unix_users)."""
    s = Server(tmp_path)
    s.policy.write_text(members_policy(["ana", "carol"], ["@no-such-group-for-shepherd"]))
    tokens = {u: create_token(s.data, "--user", u, "--team", "ml", "--team", "data", "--team", "open")
              for u in ("ana", "bo")}
    s.start()
    try:
        def post(user, team):
            return httpx.post(s.url + "/jobs", json=job(s, team), headers={"Authorization": f"Bearer {tokens[user]}"},
                              timeout=60)
        r = post("ana", "ml")
        assert r.status_code == 201 and r.json()["user"] == "ana"
        r = post("bo", "ml")
        assert r.status_code == 403 and r.json()["detail"] == (
            "team: 'ml' is not allowed: user 'bo' is not a member of team 'ml' (teams.ml.members of the policy in "
            "force (version 1): ana, carol)")
        assert post("ana", "data").status_code == 403  # a group unknown to the machine has no members
        assert post("bo", "open").status_code == 201  # no members list: the token's teams, as before
        job_id = post("ana", "ml").json()["id"]
        r = httpx.post(f"{s.url}/jobs/{job_id}/cancel", headers={"Authorization": f"Bearer {tokens['bo']}"})
        assert r.status_code == 403 and "user 'bo' is not a member of team 'ml'" in r.json()["detail"]
    finally:
        s.stop()


def test_a_metrics_token_reads_metrics_only(tmp_path):
    s = Server(tmp_path)
    scrape = create_token(s.data, "--user", "prometheus", "--scope", "metrics")
    res = shepherd("token", "create", "--data-dir", str(s.data), "--user", "p", "--scope", "metrics", "--team", "ml")
    assert res.exit_code == 2 and "--scope metrics: not allowed with --team" in res.output
    s.start()
    try:
        auth = {"Authorization": f"Bearer {scrape}"}
        r = httpx.get(s.url + "/metrics", headers=auth)
        assert r.status_code == 200 and "gpushepherd_" in r.text
        for method, path in (("GET", "/jobs"), ("GET", "/nodes"), ("POST", "/jobs")):
            r = httpx.request(method, s.url + path, headers=auth, json=job(s, "ml"))
            assert r.status_code == 403 and r.json()["detail"] == (
                "this token is a metrics scrape token (token 1): valid on /metrics only"), (method, path)
    finally:
        s.stop()


# -- transport -------------------------------------------------------------------------------
def _server_run(s: Server, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", "server", "--data-dir", str(s.data),
                           "--policy", str(s.policy), "--inventory", "static", "--port", str(free_port()), *extra],
                          capture_output=True, text=True, timeout=120, check=False)


def test_a_public_address_without_tls_is_refused_at_start(tmp_path):
    s = Server(tmp_path)
    create_token(s.data, "--user", "ana", "--team", "ml")
    r = _server_run(s, "--host", "0.0.0.0")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert r.stderr.startswith("error: --host 0.0.0.0: plain HTTP is not allowed on an address other than loopback")
    assert "--tls-cert FILE --tls-key FILE, or --insecure-http" in r.stderr
    r = _server_run(s, "--tls-cert", str(tmp_path / "cert.pem"))
    assert r.returncode == 2 and r.stderr == "error: --tls-key: missing: --tls-cert and --tls-key go together\n"
    (tmp_path / "junk.pem").write_text("not a certificate")
    r = _server_run(s, "--tls-cert", str(tmp_path / "junk.pem"), "--tls-key", str(tmp_path / "junk.pem"))
    assert r.returncode == 2 and "cannot be loaded as a PEM certificate and its private key" in r.stderr


def test_tls_serves_https_with_a_self_signed_certificate(tmp_path, monkeypatch):
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl on PATH to make a self-signed certificate (the cryptography package is not "
                    "installed either)")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # httpx trusts it (the CLI's client too)
    s = Server(tmp_path)
    s.scheme = "https"
    s.token = create_token(s.data, "--user", "ana", "--team", "ml")
    s.start(extra=("--host", "0.0.0.0", "--tls-cert", str(cert), "--tls-key", str(key)))  # no --insecure-http
    try:
        assert s.url.startswith("https://")
        r = httpx.get(s.url + "/whoami", headers=s.headers)
        assert r.status_code == 200 and r.json()["user"] == "ana"
        with pytest.raises(httpx.TransportError):  # plain HTTP on the TLS port gets no answer
            httpx.get(s.url.replace("https://", "http://") + "/healthz", timeout=5)
        res = shepherd("queue", "--server", s.url, "--token", s.token)
        assert res.exit_code == 0, res.output
        assert " serving https://0.0.0.0:" in s.log.read_text()
    finally:
        s.stop()


def test_a_socket_named_by_shepherd_socket_is_used_and_named_when_it_is_missing(tmp_path, monkeypatch):
    # set explicitly, it is never passed over for HTTP to a default port (newcomer report)
    from typer.testing import CliRunner

    from gpushepherd.cli.main import app

    missing = tmp_path / "nope.sock"
    monkeypatch.delenv("SHEPHERD_SERVER", raising=False)
    r = CliRunner().invoke(app, ["queue"], env={"SHEPHERD_SOCKET": str(missing)})
    assert r.exit_code != 0
    assert f"no gpushepherd server at unix:{missing}" in r.output


def test_token_and_audit_times_are_in_the_policy_s_zone_and_labelled(tmp_path):
    """Issue 14, point 4c: `shepherd token list`, `token create` and `shepherd audit` print
    times (a token's expiry too, in the audit detail) in the policy's clock.timezone, named
    in the header and each cell - not this machine's zone, not epoch seconds."""
    from datetime import datetime
    from zoneinfo import ZoneInfo

    berlin = ZoneInfo("Europe/Berlin")
    s = Server(tmp_path)
    s.policy.write_text(POLICY + "clock: {timezone: Europe/Berlin}\n")
    s.start()  # the policy is in the database before the tokens are made
    try:
        res = shepherd("token", "create", "--data-dir", str(s.data), "--user", "ana", "--team", "ml", "--admin",
                       "--expires", "30d")
        assert res.exit_code == 0, res.output
        s.token = res.stdout.strip()
        store = Store(Store.sqlite_url(s.data))
        expires = store.tokens()[0]["expires"]
        store.close()
        shown = datetime.fromtimestamp(expires, berlin).strftime("%Y-%m-%d %H:%M:%S %Z")
        assert shown.endswith((" CET", " CEST")) and f"expires {shown}" in res.stderr, res.stderr
        listed = shepherd("token", "list", "--data-dir", str(s.data), env={"COLUMNS": "300"}).stdout
        assert "EXPIRES (Europe/Berlin)" in listed and shown in listed, listed
        assert str(int(expires)) not in listed
        res = shepherd("audit", "--server", s.url, "--token", s.token, "--action", "token-create",
                       env={"COLUMNS": "300"})
        assert res.exit_code == 0, res.output
        assert "TIME (Europe/Berlin)" in res.stdout and f"expires={shown}" in res.stdout, res.stdout
        assert str(int(expires)) not in res.stdout
    finally:
        s.stop()
