"""A JSON body that gives a key twice in one object is refused with a 422 naming the key
and where it is (note 084), on every route that takes a body, as the policy's YAML loader
refuses a key given twice. Before the fix ``POST /jobs`` with ``"class"`` twice was
accepted, the last one winning."""

from __future__ import annotations

import json

import yaml

from builders import in_process_api
from test_daemon import POLICY

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
