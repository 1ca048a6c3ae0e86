"""Pages of ``GET /jobs`` (issue 16 point 3, design note 029): ``limit`` and an opaque
``cursor``, in job-number order, every job on exactly one page, stable under
submissions between pages, bad values refused naming the field, the value and what is
allowed; the unpaged list as before. An in-process server (``Daemon`` + ``make_app``
under Starlette's test client, as tests/test_queue.py)."""

from __future__ import annotations

import base64
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from test_queue import wait_for

from gpushepherd.daemon import jobpages
from gpushepherd.daemon.jobpages import decode_cursor, encode_cursor, parse_limit
from gpushepherd.daemon.jobquery import QueryError

POLICY = """\
name: pages-test
cluster:
  nodes:
    - {name: local, gpus: 1, gpu_type: FAKE, gpu_mem_mib: 16384}
classes:
  batch: {grace_period_s: 1}
teams:
  ml: {}
  cv: {}
"""


def waiting(flag: Path) -> list[str]:
    code = (f"import os, time\nt0 = time.time()\nwhile not os.path.exists({str(flag)!r}) and "
            "time.time() - t0 < 120:\n    time.sleep(0.05)\n")
    return [sys.executable, "-c", code]


@pytest.fixture
def served(tmp_path):
    """``(client, submit(team=..., user=..., **body) -> id, daemon)``: one GPU, so one job
    runs (until the fixture ends) and the others pend."""
    from gpushepherd.daemon.api import make_app
    from gpushepherd.daemon.server import Daemon

    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    d = Daemon(tmp_path / "data", policy_path=policy, poll_s=0.05)
    d.start()
    flag = tmp_path / "flag"
    try:
        with TestClient(make_app(d)) as client:
            def submit(team="ml", user="ana", **extra) -> str:
                body = {"class": "batch", "team": team, "user": user, "gpus": 1, "command": waiting(flag),
                        "cwd": str(tmp_path), "time_limit_s": 3600, **extra}
                r = client.post("/jobs", json=body)
                assert r.status_code == 201, r.text
                return r.json()["id"]
            yield client, submit, d
    finally:
        flag.touch()
        d.stop()


def all_pages(client, limit: int | None, **params) -> tuple[list[str], int]:
    """The ids of every page, following ``next``; and how many pages."""
    got, cursor, pages = [], None, 0
    while True:
        q = {**params, **({"limit": limit} if limit is not None else {}), **({"cursor": cursor} if cursor else {})}
        r = client.get("/jobs", params=q)
        assert r.status_code == 200, r.text
        body = r.json()
        assert set(body) == {"jobs", "next", "limit"} and body["limit"] == (limit or jobpages.PAGE_LIMIT)
        assert len(body["jobs"]) <= body["limit"]
        got += [j["id"] for j in body["jobs"]]
        pages += 1
        cursor = body["next"]
        if cursor is None:
            return got, pages
        assert pages < 1000, "next never ends"


def test_every_job_is_on_exactly_one_page_in_the_order_of_the_unpaged_list(served):
    client, submit, _d = served
    made = [submit(team="cv" if i % 3 == 0 else "ml", user=f"u{i % 4}") for i in range(23)]
    made.append(submit(hold=True))  # kept from the core (note 021): on the pages too
    wait_for("the first job to run", lambda: client.get(f"/jobs/{made[0]}").json()["state"] == "RUNNING")
    unpaged = client.get("/jobs").json()
    assert isinstance(unpaged, list) and [j["id"] for j in unpaged] == made  # as before: a list
    for limit in (1, 5, 7, 24, 500):
        got, pages = all_pages(client, limit)
        assert got == made, limit
        assert pages == -(-len(made) // limit), (limit, pages)  # the last page says there is no next
    # filters apply to pages as to the list
    for params in ({"state": "PD"}, {"team": "cv"}, {"user": "u1,u2", "state": "PENDING"}, {"state": "R"}):
        want = [j["id"] for j in client.get("/jobs", params=params).json()]
        assert want, params
        assert all_pages(client, 4, **params)[0] == want, params
    # a page's views are the unpaged list's views
    first = client.get("/jobs", params={"limit": 3}).json()["jobs"]
    assert [{k: v for k, v in j.items() if k != "priority"} for j in first] == \
        [{k: v for k, v in j.items() if k != "priority"} for j in unpaged[:3]]
    # a cursor alone pages by the default size
    nxt = client.get("/jobs", params={"limit": 10}).json()["next"]
    body = client.get("/jobs", params={"cursor": nxt}).json()
    assert body["limit"] == jobpages.PAGE_LIMIT and [j["id"] for j in body["jobs"]] == made[10:]
    assert body["next"] is None


def test_pages_are_stable_under_submissions_between_pages(served):
    client, submit, _d = served
    before = [submit() for _ in range(12)]
    seen, cursor, later = [], None, []
    for _ in range(100):
        body = client.get("/jobs", params={"limit": 5, **({"cursor": cursor} if cursor else {})}).json()
        seen += [j["id"] for j in body["jobs"]]
        if len(later) < 6:  # two submissions after each page
            later += [submit(team="cv"), submit()]
        cursor = body["next"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen)), "a job on two pages"
    assert seen[:len(before)] == before  # every job there at the first page, in order
    assert seen == before + later  # the ones submitted meanwhile come after, once each


def test_a_page_that_looks_at_few_jobs_ends_short_with_a_next_and_misses_none(served, monkeypatch):
    client, submit, _d = served
    made = [submit(team="cv" if i in (5, 17) else "ml") for i in range(20)]
    monkeypatch.setattr(jobpages, "MIN_SCAN", 4)
    monkeypatch.setattr(jobpages, "SCAN_PER_LIMIT", 1)
    first = client.get("/jobs", params={"team": "cv", "limit": 2}).json()
    assert first["jobs"] == [] and first["next"] is not None  # 4 jobs looked at, none of cv's: short
    got, pages = all_pages(client, 2, team="cv")
    assert got == [made[5], made[17]] and pages >= 5


BAD = [("limit", v, "a whole number from 1 to 5,000") for v in
       ("0", "5001", "-1", "1.5", "ten", "", "1e3", " 99999999999")]
BAD += [("cursor", v, "the 'next' value of an earlier page") for v in
        ("nope", "!!", base64.urlsafe_b64encode(b"v2:3").decode(), base64.urlsafe_b64encode(b"v1:-1").decode(),
         base64.urlsafe_b64encode(b"v1:007").decode(), "", "\u00e9")]


@pytest.mark.parametrize(("field", "value", "allowed"), BAD)
def test_a_bad_limit_or_cursor_is_422_naming_the_field_the_value_and_what_is_allowed(served, field, value, allowed):
    client, _submit, _d = served
    r = client.get("/jobs", params={field: value})
    assert r.status_code == 422, r.text
    [d] = r.json()["detail"]
    assert d["loc"] == ["query", field]
    assert f"{value!r} is not allowed: {allowed}" in d["msg"]


def test_cursor_and_limit_parse_round_trip_and_refuse_the_rest():
    for n in (0, 1, 41, 10**12):
        c = encode_cursor(n)
        assert decode_cursor(c) == n and "=" not in c and c.isascii()
    assert parse_limit("500") == 500 and parse_limit(" 7 ") == 7 and parse_limit("5000") == 5000
    for bad in ("5001", "0", "x"):
        with pytest.raises(QueryError) as exc:
            parse_limit(bad)
        assert exc.value.field == "limit"


def test_shepherd_queue_reads_every_page(served, monkeypatch):
    import json

    from builders import route_cli_to

    from gpushepherd.cli import daemon as cli_daemon

    client, submit, _d = served
    made = [submit(user=f"u{i}") for i in range(5)]
    run = route_cli_to(client, monkeypatch)
    asked = []
    real = cli_daemon._request

    def spy(server, method, path, token=None, **kw):
        asked.append(dict(kw.get("params") or {}))
        return real(server, method, path, token=token, **kw)
    monkeypatch.setattr(cli_daemon, "_request", spy)
    monkeypatch.setattr(cli_daemon, "QUEUE_PAGE", 2)
    code, out, err = run("queue", "--json")
    assert code == 0, err
    assert [j["id"] for j in json.loads(out)] == made
    assert [p.get("limit") for p in asked] == ["2", "2", "2"] and "cursor" not in asked[0] and asked[2]["cursor"]
