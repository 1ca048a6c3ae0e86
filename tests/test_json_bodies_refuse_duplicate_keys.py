"""A JSON body that gives a key twice in one object is refused with a 422 naming the key
and where it is (note 084), on every route that takes a body, as the policy's YAML loader
refuses a key given twice. Before the fix ``POST /jobs`` with ``"class"`` twice was
accepted, the last one winning."""

from __future__ import annotations

import json

import pytest
import yaml

from builders import in_process_api
from test_daemon import POLICY, wait_for

JSON = {"content-type": "application/json"}


def test_a_key_given_twice_is_a_422_naming_it_on_every_body(tmp_path):
    with in_process_api(tmp_path, POLICY) as api:
        twice = ('{"class": "batch", "team": "ml", "user": "ana", "command": ["true"], "cwd": "/", "hold": true, '
                 '"class": "sandbox"}')
        r = api.post("/jobs", content=twice, headers=JSON)
        assert r.status_code == 422, r.text
        (d,) = r.json()["detail"]
        assert d["loc"] == ["body", "class"] and "'class' appears twice" in d["msg"], d
        assert api.get("/jobs").json() == []  # nothing submitted

        nested = ('{"class": "batch", "team": "ml", "user": "ana", "command": ["true"], "cwd": "/", '
                  '"env": {"A": "1", "A": "2"}}')
        r = api.post("/jobs", content=nested, headers=JSON)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "env", "A"], r.text

        ok = api.post("/jobs", json={"class": "batch", "team": "ml", "user": "ana", "command": ["true"], "cwd": "/",
                                     "hold": True})
        assert ok.status_code == 201, ok.text
        job = ok.json()["id"]
        r = api.patch(f"/jobs/{job}", content='{"nice": 5, "nice": -10000}', headers=JSON)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "nice"], r.text
        assert api.get(f"/jobs/{job}").json().get("nice", 0) == 0

        pol = json.dumps({"policy": yaml.safe_load(POLICY), "source": "p.yaml"})
        teams = pol.replace('"teams": {"ml": {}}', '"teams": {"ml": {}, "ml": {"max_gpus": 0}}')
        assert teams != pol
        r = api.post("/policy", content=teams, headers=JSON)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "policy", "teams", "ml"], r.text
        assert [h["version"] for h in api.get("/policy/history").json()] == [1]

        listed = '{"nodes": [{"name": "x", "name": "y"}]}'  # inside a list: its index named
        r = api.post("/whatif", content=listed, headers=JSON)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "nodes", 0, "name"], r.text

        # a body without repeated keys is read as before, and a malformed one keeps FastAPI's answer
        assert api.post("/jobs", content="{not json", headers=JSON).json()["detail"][0]["type"] == "json_invalid"


def test_a_caller_is_authenticated_before_its_body_keys_are_checked(tmp_path):
    """Review of note 084: the check ran before the principal, so on a server with tokens
    a request without a token, or with a wrong one, and a duplicate key got 422 (not 401)
    and a wrong token wrote no ``token-refused`` row. Now 401 first, the row written; a
    valid token gets the 422."""
    with in_process_api(tmp_path, POLICY) as api:
        _, token = api.daemon.store.create_token("ana", ["ml"])
        twice = '{"class": "batch", "team": "ml", "command": ["true"], "cwd": "/", "class": "sandbox"}'
        assert api.post("/jobs", content=twice, headers=JSON).status_code == 401
        bad = {**JSON, "authorization": "Bearer not-a-token"}
        r = api.post("/jobs", content=twice, headers=bad)
        assert r.status_code == 401, r.text
        wait_for("a token-refused row", lambda: api.daemon.store.audit_entries(actions=["token-refused"]))
        good = {**JSON, "authorization": f"Bearer {token}"}
        r = api.post("/jobs", content=twice, headers=good)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "class"], r.text


def test_only_a_route_that_reads_a_body_checks_its_keys(tmp_path):
    """Review of note 084: ``POST /jobs/1/hold`` (no body parameter) with a body naming a
    key twice was 422, as a GET with one; such a body is ignored, as before."""
    with in_process_api(tmp_path, POLICY) as api:
        ok = api.post("/jobs", json={"class": "batch", "team": "ml", "user": "ana", "command": ["true"],
                                     "cwd": "/", "hold": True})
        job = ok.json()["id"]
        r = api.post(f"/jobs/{job}/release", content='{"a": 1, "a": 2}', headers=JSON)
        assert r.status_code == 200, r.text
        r = api.post(f"/jobs/{job}/hold", content='{"a": 1, "a": 2}', headers=JSON)
        assert r.status_code in (200, 409), r.text  # hold: no body read (409: it started meanwhile)
        r = api.request("GET", "/jobs", content='{"a": 1, "a": 2}', headers=JSON)
        assert r.status_code == 200, r.text


@pytest.mark.parametrize("depth", [400, 2000, 100_000])
def test_a_deeply_nested_body_is_a_422_never_a_500(tmp_path, depth):
    """Review of note 084: the parse caught ValueError only and the walk for the key's path
    recursed (two frames a level): depth 400 was 500, depth 2000 a RecursionError (500).
    Now: a body too deep to parse is a 422 saying so; the walk is iterative."""
    with in_process_api(tmp_path, POLICY) as api:
        for body in ('{"policy": ' + '[' * depth + ']' * depth + "}",
                     '{"policy": ' + '{"a": ' * depth + '1' + '}' * depth + "}",
                     '{"policy": ' + '{"a": ' * depth + '{"k": 1, "k": 2}' + '}' * depth + "}"):
            r = api.post("/policy", content=body, headers=JSON)
            assert r.status_code == 422, (depth, r.status_code, r.text[:300])


def test_the_walk_finds_a_deep_key_and_names_an_empty_one(tmp_path):
    from gpushepherd.daemon.api import _KeysOnce, _shown, _twice_at

    keys = _KeysOnce()  # a doc deeper than json.loads reads: the walk alone, on a built one
    inner = keys.hook([("", 1), ("", 2)])
    doc = [0, inner]
    for _ in range(5000):
        doc = keys.hook([("a", doc)])
    at = _twice_at(doc)
    assert at == ("a",) * 5000 + (1, "")
    assert _shown(("env", "", "A")) == 'env."".A' and _shown(("nodes", 0, "a.b")) == 'nodes.0."a.b"'
    with in_process_api(tmp_path, POLICY) as api:
        r = api.post("/jobs", content='{"class": "batch", "team": "ml", "user": "ana", "command": ["true"], '
                                      '"cwd": "/", "env": {"": "1", "": "2"}}', headers=JSON)
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["body", "env", ""] and '(at env."")' in r.json()["detail"][0]["msg"]


def test_a_body_that_is_no_json_is_refused_after_the_caller_is_known(tmp_path):
    """Note 084 left open: FastAPI parses a body before the app's dependencies, so on a
    server with tokens a request without one and a malformed body got FastAPI's 422
    ("JSON decode error", no position in words), not 401. Now 401 first; a valid token
    gets the 422 saying what is wrong and where."""
    with in_process_api(tmp_path, POLICY) as api:
        _, token = api.daemon.store.create_token("ana", ["ml"])
        good = {**JSON, "authorization": f"Bearer {token}"}
        for body in ('{"class": ', b'{"class": "\xff"}'):
            assert api.post("/jobs", content=body, headers=JSON).status_code == 401
        r = api.post("/jobs", content='{"class": ', headers=good)
        assert r.status_code == 422, r.text
        assert r.json()["detail"] == [{"loc": ["body", 10], "type": "json_invalid", "msg": (
            "JSON decode error: Expecting value at line 1, column 11 (character 10): the body must be one JSON "
            "object")}]
        r = api.post("/jobs", content=b'{"class": "\xff"}', headers=good)
        assert r.status_code == 422 and r.json()["detail"][0]["type"] == "json_invalid", r.text
        assert "UTF-8" in r.json()["detail"][0]["msg"]
        assert api.daemon.store.audit_entries(actions=["submit"]) == []  # nothing submitted


def test_a_body_that_is_not_json_or_is_empty_is_a_422_saying_so_after_the_caller_is_known(tmp_path):
    """Found by a newcomer: a body sent as text/plain (or with no Content-Type) got
    pydantic's "Input should be a valid dictionary or object to extract fields from", an
    empty one "Field required", both at loc ``body`` - true of the parsed value, not of
    what the caller did wrong. Now a 422 (as FastAPI's own strict Content-Type check
    answers, and as every other refusal of a body here: a ``detail`` list) naming the
    problem, on every route that takes a body, after a 401 of a caller without a token."""
    with in_process_api(tmp_path, POLICY) as api:
        _, token = api.daemon.store.create_token("ana", ["ml"], True)
        auth = {"authorization": f"Bearer {token}"}
        body = json.dumps({"class": "batch", "team": "ml", "command": ["true"], "cwd": "/"})
        plain = {"content-type": "text/plain"}
        for content, headers in ((body, plain), ("", JSON), (body, {})):
            assert api.post("/jobs", content=content, headers=headers).status_code == 401
        need = "the body must be a JSON object (Content-Type: application/json)"
        for route in ("/jobs", "/policy", "/whatif", "/services"):
            for content, headers, msg in (
                    (body, plain, f"{need}, not 'text/plain'"),
                    (body, {"content-type": "application/x-www-form-urlencoded"},
                     f"{need}, not 'application/x-www-form-urlencoded'"),
                    (body, {}, f"{need}: the request has no Content-Type"),
                    ("", JSON, "the body is empty: a JSON object is required"),
                    ("", plain, "the body is empty: a JSON object is required"),
                    ("[1, 2]", JSON, "the body must be a JSON object ({...}), not an array"),
                    ('"x"', JSON, "the body must be a JSON object ({...}), not a string")):
                r = api.post(route, content=content, headers={**headers, **auth})
                assert r.status_code == 422, (route, headers, r.text)
                assert r.json()["detail"] == [{"loc": ["body"], "type": "body_type", "msg": msg}], (route, r.text)
        r = api.patch("/jobs/1", content="", headers={**JSON, **auth})
        assert r.status_code == 422 and r.json()["detail"][0]["msg"].startswith("the body is empty"), r.text
        r = api.post("/jobs", content=body, headers={"content-type": "application/json; charset=utf-8", **auth})
        assert r.status_code == 201, r.text
        assert len(api.daemon.store.audit_entries(actions=["submit"])) == 1  # only the last one submitted


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32", "latin-1"])
def test_a_body_not_in_utf8_is_a_422_saying_so(tmp_path, encoding):
    # RFC 8259: JSON exchanged between systems is UTF-8; before, a UTF-16 or UTF-32 body
    # was read (json.loads of bytes guesses the encoding) and the job submitted
    body = json.dumps({"class": "batch", "team": "ml", "user": "ana", "command": ["true"], "cwd": "/",
                       "env": {"GREETING": "café"}, "hold": True}, ensure_ascii=False)
    with in_process_api(tmp_path, POLICY) as api:
        r = api.post("/jobs", content=body.encode(encoding), headers=JSON)
        assert r.status_code == 422, r.text
        (d,) = r.json()["detail"]
        assert d["loc"] == ["body"] and d["msg"].startswith("the body is not UTF-8 (byte "), d
        assert api.get("/jobs").json() == []  # nothing submitted
        for ok in (body.encode(), b"\xef\xbb\xbf" + body.encode()):  # UTF-8, with a BOM or not
            r = api.post("/jobs", content=ok, headers=JSON)
            assert r.status_code == 201, r.text


def test_a_lone_surrogate_escape_is_a_422_naming_where(tmp_path):
    # a tester's find: a policy whose text held "\ud800" was applied (version 2), its answer
    # was a 500, and GET /policy stayed a 500 - after a restart too
    with in_process_api(tmp_path, POLICY) as api:
        pol = json.dumps({"policy": yaml.safe_load(POLICY), "source": "p.yaml"})
        r = api.post("/policy", content=pol.replace('"p.yaml"', '"p\\ud800.yaml"'), headers=JSON)
        assert r.status_code == 422, r.text
        (d,) = r.json()["detail"]
        assert d["loc"] == ["body", "source"] and "surrogate" in d["msg"], d
        assert [h["version"] for h in api.get("/policy/history").json()] == [1]
        assert api.get("/policy").status_code == 200
        job = ('{"class": "batch", "team": "ml", "user": "ana", "command": ["true"], "cwd": "/", "hold": true, '
               '"env": {"A": "x\\udc00"}}')
        r = api.post("/jobs", content=job, headers=JSON)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "env", "A"], r.text
        # a whole pair is a character (U+1F600): accepted
        r = api.post("/jobs", content=job.replace("x\\udc00", "x\\ud83d\\ude00"), headers=JSON)
        assert r.status_code == 201, r.text
