"""Auth of the daemon (issue #5 item 6): tokens stored hashed, 401 without a valid
token, a token acts for its teams only (403 otherwise), an admin for all; a server
without tokens listens on loopback only. Against a real `shepherd server`."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import httpx
import pytest
from test_daemon import POLICY, Server, free_port, wait_for, wait_for_file
from typer.testing import CliRunner

from gpushepherd.cli.main import app
from gpushepherd.daemon.store import Store

TWO_TEAMS = POLICY.replace("  ml: {}", "  ml: {}\n  data: {}")


def shepherd(*args: str, env: dict | None = None):
    return CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)


def where(s: Server) -> list[str]:
    """The token commands' options for ``s``'s database."""
    return ["--data-dir", str(s.data)] + (["--db", s.db] if s.db else [])


def create_token(data, *args: str, db: str | None = None) -> str:
    if db is None and not (data / "shepherd.db").exists():  # token create never makes the database: db upgrade does
        assert shepherd("db", "upgrade", "--data-dir", str(data)).exit_code == 0
    res = shepherd("token", "create", "--data-dir", str(data), *(["--db", db] if db else []), *args)
    assert res.exit_code == 0, res.output
    return res.stdout.strip()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def authed(request, tmp_path_factory):
    db = request.getfixturevalue("pg_server").new_database() if request.param == "postgresql" else None
    s = Server(tmp_path_factory.mktemp("auth"), db=db)
    s.policy.write_text(TWO_TEAMS)
    s.tokens = {"ml": create_token(s.data, "--user", "ana", "--team", "ml", db=db),
                "data": create_token(s.data, "--user", "bo", "--team", "data", db=db),
                "admin": create_token(s.data, "--user", "root", "--admin", db=db)}
    s.token = s.tokens["ml"]
    s.start()
    yield s
    s.stop()


@pytest.fixture
def plain(tmp_path):
    """A server not started yet, on a database without tokens."""
    s = Server(tmp_path)
    yield s
    s.stop()


def call(s: Server, method: str, path: str, token: str | None, **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.request(method, s.url + path, headers=headers, timeout=60, **kw)


def body(s: Server, code: str = "print('hi')", **extra) -> dict:
    return {"class": "batch", "team": "ml", "gpus": 1, "command": [sys.executable, "-c", code],
            "cwd": str(s.data.parent), **extra}


def test_tokens_are_stored_hashed_and_checked(tmp_path):
    store = Store(Store.sqlite_url(tmp_path))
    token_id, token = store.create_token("ana", ["ml", "data"])
    assert token.startswith("shp_") and len(token) > 40
    p = store.authenticate(token)
    assert (p.token_id, p.user, p.teams, p.admin) == (token_id, "ana", ("ml", "data"), False)
    assert store.authenticate(token + "x") is None and store.authenticate("") is None
    raw = b"".join(f.read_bytes() for f in tmp_path.glob("shepherd.db*"))  # the database and its WAL
    assert token.encode() not in raw
    assert hashlib.sha256(token.encode()).hexdigest().encode() in raw
    assert "hash" not in store.tokens()[0]
    assert store.revoke_token(token_id) and not store.revoke_token(token_id)
    assert store.authenticate(token) is None


def test_without_a_valid_token_every_request_is_401(authed):
    for method, path in (("GET", "/jobs"), ("GET", "/nodes"), ("GET", "/usage"), ("POST", "/jobs/1/cancel")):
        r = call(authed, method, path, None)
        assert r.status_code == 401 and "Bearer" in r.json()["detail"], (path, r.text)
        assert r.headers["WWW-Authenticate"] == "Bearer"
        assert call(authed, method, path, "shp_wrong").status_code == 401
    assert call(authed, "POST", "/jobs", None, json=body(authed)).status_code == 401
    for token in authed.tokens.values():  # reads: any valid token
        assert call(authed, "GET", "/jobs", token).status_code == 200
        assert call(authed, "GET", "/usage", token).status_code == 200


def test_a_team_acts_on_its_own_jobs_only_and_an_admin_on_all(authed, tmp_path):
    go = tmp_path / "go"
    r = call(authed, "POST", "/jobs", authed.tokens["ml"], json=body(authed, wait_for_file(go)))
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    assert r.json()["user"] == "ana"  # the token's user
    authed.wait_state(job_id, "RUNNING")
    assert call(authed, "GET", f"/jobs/{job_id}", authed.tokens["data"]).status_code == 200  # reads are open

    r = call(authed, "POST", f"/jobs/{job_id}/cancel", authed.tokens["data"])
    assert r.status_code == 403 and "team 'ml'" in r.json()["detail"] and "data only" in r.json()["detail"]
    r = call(authed, "GET", f"/jobs/{job_id}/logs", authed.tokens["data"])
    assert r.status_code == 403 and "read the logs of" in r.json()["detail"]
    assert call(authed, "GET", f"/jobs/{job_id}/logs", authed.tokens["ml"]).status_code == 200
    assert authed.job(job_id)["state"] == "RUNNING"  # the refused cancel did nothing

    r = call(authed, "POST", f"/jobs/{job_id}/cancel", authed.tokens["admin"])
    assert r.status_code == 200 and r.json()["state"] == "CANCELLED"
    assert call(authed, "POST", "/jobs/999/cancel", authed.tokens["data"]).status_code == 404
    assert wait_for("all GPUs free", lambda: authed.free_gpus() == 4)


def test_a_submission_for_another_team_or_user_is_403(authed):
    r = call(authed, "POST", "/jobs", authed.tokens["ml"], json=body(authed, team="data"))
    assert r.status_code == 403
    assert r.json()["detail"] == "team: 'data' is not allowed: this token's teams are ml"
    r = call(authed, "POST", "/jobs", authed.tokens["ml"], json=body(authed, user="mallory"))
    assert r.status_code == 403 and r.json()["detail"] == "user: 'mallory' is not allowed: this token is user 'ana'"
    assert call(authed, "POST", "/jobs", authed.tokens["ml"], json=body(authed, user="ana")).status_code == 201
    r = call(authed, "POST", "/jobs", authed.tokens["admin"], json=body(authed, team="data", user="bo"))
    assert r.status_code == 201 and r.json()["user"] == "bo" and r.json()["team"] == "data"


def test_client_commands_send_the_token_and_print_refusals(authed):
    server = ["--server", authed.url]
    res = shepherd("submit", *server, "--token", authed.tokens["ml"], "--class", "batch", "--team", "ml", "--",
                   sys.executable, "-c", "print('from the cli')")
    assert res.exit_code == 0, res.output
    job_id = res.stdout.split()[-1]
    assert authed.wait_state(job_id, "COMPLETED", "FAILED")["user"] == "ana"
    res = shepherd("logs", job_id, *server, env={"SHEPHERD_TOKEN": authed.tokens["ml"]})
    assert res.exit_code == 0 and res.stdout == "from the cli\n"
    res = shepherd("logs", job_id, *server, env={"SHEPHERD_TOKEN": authed.tokens["data"]})
    assert res.exit_code == 2 and "error: job " in res.output and "may read the logs of jobs of teams data" in res.output
    res = shepherd("cancel", job_id, *server, "--token", authed.tokens["data"])
    assert res.exit_code == 2 and f"error: job '{job_id}' is team 'ml''s" in res.output
    res = shepherd("queue", *server, env={"SHEPHERD_TOKEN": ""})
    assert res.exit_code == 2 and "error: no token" in res.output


def test_token_list_and_revoke(authed):
    temp = create_token(authed.data, "--user", "tmp", "--team", "ml", db=authed.db)
    assert call(authed, "GET", "/jobs", temp).status_code == 200
    listed = shepherd("token", "list", *where(authed)).stdout
    row = next(x.split() for x in listed.splitlines() if x.split()[1:2] == ["tmp"])
    assert row[2:4] == ["ml", "no"] and row[-1] == "-"
    assert temp not in listed
    res = shepherd("token", "revoke", row[0], *where(authed))
    assert res.exit_code == 0 and "revoked" in res.stdout
    assert call(authed, "GET", "/jobs", temp).status_code == 401
    res = shepherd("token", "revoke", row[0], *where(authed))
    assert res.exit_code == 2 and "no such token, or already revoked" in res.output
    res = shepherd("token", "create", "--user", "x", *where(authed))
    assert res.exit_code == 2 and "--team" in res.output


def test_without_tokens_the_server_listens_on_loopback_only(plain):
    s = plain

    def serve(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", "server", "--data-dir", str(s.data),
                               "--policy", str(s.policy), "--host", "0.0.0.0", "--port", str(free_port()), *extra],
                              capture_output=True, text=True, timeout=120)

    r = serve()  # plain HTTP off loopback is refused first, before the data dir is opened
    assert r.returncode == 2 and r.stderr.startswith("error: --host 0.0.0.0: plain HTTP is not allowed")
    r = serve("--insecure-http")  # TLS aside: no token in the database, so loopback only
    lines = r.stderr.splitlines()
    assert r.returncode == 2
    assert lines[-1].startswith("error: --host 0.0.0.0: only a loopback address") and "shepherd token create" in lines[-1]
    s.start()  # loopback without tokens: open, as before
    assert call(s, "GET", "/jobs", None).status_code == 200


def test_auth_required_refuses_requests_even_without_tokens(plain):
    s = plain.start(extra=("--auth", "required"))
    assert call(s, "GET", "/nodes", None).status_code == 401
    assert call(s, "GET", "/nodes", "shp_anything").status_code == 401


def test_on_a_public_address_auth_stays_required_after_every_token_is_revoked(plain):
    token = create_token(plain.data, "--user", "ana", "--team", "ml")
    plain.token = token
    plain.start(extra=("--host", "0.0.0.0", "--insecure-http"))  # plain HTTP off loopback: note 025
    assert call(plain, "GET", "/jobs", token).status_code == 200
    assert "warning: --host 0.0.0.0 --insecure-http: plain HTTP on a network address" in plain.log.read_text()
    assert shepherd("token", "revoke", "1", "--data-dir", str(plain.data)).exit_code == 0
    assert call(plain, "GET", "/jobs", None).status_code == 401  # never open while reachable from outside
