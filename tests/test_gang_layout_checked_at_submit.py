"""A tester's finds (stop 38): a kept job (``hold``, begin time, dependency) or an array
whose gang cannot be laid out on the nodes was accepted - the server's check counted
GPUs only, where the core's rejection also lays the gang out (``place_counts``) - and
was rejected only when released (an array's tasks all at once). The server now asks the
core's own rule of a spec (``Scheduler.spec_misfit``). And a single pod
(``gpus_per_pod`` equal to ``gpus``, Slurm's ``--gpus-per-task`` equal to ``--gpus``)
was spread over nodes when larger than any node: a pod never spans nodes, so it is one
node's or rejected (``JobSpec.one_node``)."""

from __future__ import annotations

from builders import in_process_api, job, policy
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.decisions import Reject, Start
from gpushepherd.model.events import JobSubmitted

POLICY = """\
name: gangs
cluster:
  nodes:
    - {name: a, gpus: 3, gpu_type: FAKE, gpu_mem_mib: 16384}
    - {name: b, gpus: 2, gpu_type: FAKE, gpu_mem_mib: 16384}
    - {name: c, gpus: 2, gpu_type: FAKE, gpu_mem_mib: 16384}
teams:
  ml: {}
"""


def _rules():
    return policy(nodes=[("a", 3), ("b", 2), ("c", 2)], teams={"ml": {}})


def test_a_single_pod_larger_than_any_node_is_rejected_not_spread():
    s = Scheduler(_rules())
    out = s.handle([JobSubmitted(0, job("P", 4, "batch", "ml", gpus_per_pod=4))])
    assert [type(d) for d in out] == [Reject]
    assert "gpus=4,gpus_per_pod=4: at most 3 on one node" in out[0].reason
    # the same GPUs with no pod size may be spread (whole nodes plus a remainder), and a
    # pod that fits a node is placed on one
    out = s.handle([JobSubmitted(1, job("Q", 3, "batch", "ml", gpus_per_pod=3))])
    out += s.handle([JobSubmitted(2, job("M", 4, "batch", "ml"))])
    starts = {d.job_id: d.placement.parts for d in out if isinstance(d, Start)}
    assert starts["Q"] == (("a", (0, 1, 2)),)
    assert starts["M"] == (("b", (0, 1)), ("c", (0, 1)))


def _body(**kw):
    return {"class": "batch", "team": "ml", "command": ["true"], "cwd": "/tmp", **kw}


def test_a_kept_or_array_gang_no_layout_holds_is_refused_at_submit(tmp_path):
    with in_process_api(tmp_path, POLICY) as client:
        # 6 GPUs as 2 pods of 3: only node a has 3, so no layout exists
        plain = client.post("/jobs", json=_body(gpus=6, gpus_per_pod=3))
        assert plain.status_code == 201 and plain.json()["state"] == "REJECTED"
        held = client.post("/jobs", json=_body(gpus=6, gpus_per_pod=3, hold=True))
        assert held.status_code == 201, held.text
        assert held.json()["state"] == "REJECTED", held.json()
        assert "the gang cannot be laid out" in held.json()["reason"]
        arr = client.post("/jobs", json=_body(gpus=6, gpus_per_pod=3, array="0-1"))
        assert arr.status_code == 422, arr.text
        assert "each task would be rejected" in arr.text and "the gang cannot be laid out" in arr.text
        # a gang that has a layout (3 pods of 2: a, b, c) is kept, held, and not warned about
        ok = client.post("/jobs", json=_body(gpus=6, gpus_per_pod=2, hold=True))
        assert ok.status_code == 201 and ok.json()["state"] == "PENDING" and ok.json()["never_fits"] is None


def test_a_lone_surrogate_in_a_body_is_a_422_not_a_500(tmp_path):
    with in_process_api(tmp_path, POLICY) as client:
        r = client.post("/jobs", content=b'{"class": "batch", "team": "ml", "gpus": 1, "command": ["echo", "\\ud800"],'
                                         b' "cwd": "/tmp"}', headers={"content-type": "application/json"})
        assert r.status_code == 422, r.text
        assert "\\\\ud800" in r.text or "\\ud800" in r.text
