"""A job's GPU types are refused at submit (422, naming the field, the value and the
form allowed) when no node could ever carry them: a node's ``gpu_type`` is a policy name
(``cluster.nodes[].gpu_type``), so ``-1``, an empty string or one with control characters
never matches. A newcomer's ``--gpu-type -1`` was taken and only rejected later by the
core ("no node offers ..."). A well-formed type the cluster lacks is still the core's
rejection, which names the types the cluster has."""

from __future__ import annotations

import sys

import pytest
from builders import in_process_api

POLICY = """\
name: gpu-types
cluster:
  nodes:
    - {name: local, gpus: 2, gpu_type: FAKE, gpu_mem_mib: 16384}
"""


@pytest.fixture
def api(tmp_path):
    with in_process_api(tmp_path, POLICY) as client:
        yield client


def body(tmp_path, **kw) -> dict:
    return {"class": "batch", "team": "ml", "command": [sys.executable, "-c", "pass"], "cwd": str(tmp_path), **kw}


@pytest.mark.parametrize("types", [["-1"], [""], ["FAKE", "A100\x1b[2J"], ["H100 80GB"], ["x" * 129]])
def test_a_gpu_type_no_node_could_carry_is_refused_at_submit(api, tmp_path, types):
    r = api.post("/jobs", json=body(tmp_path, gpu_type=types))
    assert r.status_code == 422, r.text
    (entry,) = r.json()["detail"]
    assert entry["loc"][:2] == ["body", "gpu_type"]
    assert "is not allowed: a GPU type as the policy names one (cluster.nodes[].gpu_type" in entry["msg"]
    assert api.get("/jobs", params={"all": "true"}).json() == []  # nothing queued


def test_too_many_gpu_types_are_refused(api, tmp_path):
    r = api.post("/jobs", json=body(tmp_path, gpu_type=[f"T{i}" for i in range(65)]))
    assert r.status_code == 422 and "65 GPU types is not allowed: at most 64" in r.text


def test_a_well_formed_type_is_taken_and_one_the_cluster_lacks_is_the_cores_rejection(api, tmp_path):
    ok = api.post("/jobs", json=body(tmp_path, gpu_type=["FAKE"]))
    assert ok.status_code in (200, 201), ok.text
    lacks = api.post("/jobs", json=body(tmp_path, gpu_type=["H100-80GB"]))
    assert lacks.status_code in (200, 201), lacks.text
    job = api.get(f"/jobs/{lacks.json()['id']}").json()
    assert job["state"] == "REJECTED" and "the cluster has FAKE" in (job.get("reason") or ""), job
