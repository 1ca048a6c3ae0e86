"""A bad GPU share is refused naming the field as the user wrote it, the value and what
is allowed (fixes, point 2): the API's ``share.slots``, ``share.replica`` (an unknown key:
the keys a share takes and the one meant), ``shepherd submit --share time_slice:8`` on a
node of fewer replicas (the node's ``sharing.time_slicing.replicas``), a policy's
``time_slicing: {replica: 4}``."""

from __future__ import annotations

import pytest

from builders import in_process_api, job, node, policy, route_cli_to, scheduler
from gpushepherd.model.decisions import Reject
from gpushepherd.model.job import GpuShare
from gpushepherd.policy import PolicyError, policy_from_dict

POLICY = """\
name: share-errors
cluster:
  nodes:
    - {name: local, gpus: 1, gpu_type: FAKE, gpu_mem_mib: 16384, sharing: {time_slicing: {replicas: 4}}}
classes:
  batch: {grace_period_s: 0}
teams:
  ml: {}
"""


@pytest.fixture
def client(tmp_path):
    with in_process_api(tmp_path, POLICY) as c:
        yield c


def post(client, share):
    return client.post("/jobs", json={"class": "batch", "team": "ml", "user": "ana", "gpus": 1, "share": share,
                                      "command": ["true"], "cwd": str(client.daemon.data_dir)})


@pytest.mark.parametrize("share, loc, words", [
    ({"kind": "time_slice", "replica": 2, "mem_mib": 100}, "replica",
     ["share.replica: 'replica' is not allowed: a share's keys are kind, milli, mem_mib, slots, procs, profile",
      "did you mean 'slots'?"]),
    ({"kind": "fraction", "memory_mib": 100}, "memory_mib", ["share.memory_mib: 'memory_mib' is not allowed",
                                                             "did you mean 'mem_mib'?"]),
    ({"kind": "timeslice"}, "kind", ["share.kind: 'timeslice' is not allowed: one of fraction, time_slice, mps, mig"]),
    ({"slots": 2}, "kind", ["share.kind: missing", "one of fraction, time_slice, mps, mig"]),
    ({"kind": "time_slice", "slots": 0, "mem_mib": 100}, "slots", ["share.slots: 0 is not allowed: an integer from 1 "
                                                                   "to 1024"]),
    ({"kind": "fraction", "milli": 2000}, "milli", ["share.milli: 2000 is not allowed: an integer from 0 to 1000"]),
    ({"kind": "mps", "procs": 99}, "procs", ["share.procs: 99 is not allowed: an integer from 1 to 48"]),
    ({"kind": "time_slice", "slots": 2.5, "mem_mib": 100}, "slots", ["share.slots: 2.5 is not allowed: an integer"]),
    ({"kind": "fraction", "slots": 3, "milli": 100}, "slots",
     ["share.slots: 3 is not allowed for a fraction share: it takes kind, mem_mib, milli only"]),
    # the core's checks at submit, located and named the same way
    ({"kind": "time_slice", "slots": 2}, "mem_mib", ["share.mem_mib: 0 is not allowed for a time_slice share",
                                                     "MiB >= 1"]),
    ({"kind": "fraction", "milli": 0}, "milli", ["share.milli: 0 is not allowed for a fraction share: 1 to 1000",
                                                 "or 0 with share.mem_mib > 0"]),
    ({"kind": "mig", "profile": "9g.99gb"}, "profile", ["share.profile: '9g.99gb' is not allowed: a MIG profile",
                                                        "1g.10gb"]),
])
def test_a_bad_share_is_refused_naming_its_field_value_and_what_is_allowed(client, share, loc, words):
    r = post(client, share)
    assert r.status_code == 422, r.text
    d = r.json()["detail"][0]
    assert d["loc"] == ["body", "share", loc], d
    for w in words:
        assert w in d["msg"], (w, d["msg"])


def test_more_time_slice_replicas_than_a_node_offers_names_the_nodes_replicas(client, monkeypatch):
    r = post(client, {"kind": "time_slice", "slots": 8, "mem_mib": 100})
    assert r.status_code == 201 and r.json()["state"] == "REJECTED"
    reason = r.json()["reason"]
    assert reason.startswith("ExceedsCapacity(no GPU can hold share=time_slice:8 replicas:100MiB: ") and \
        "time_slice takes at most 4 replicas: sharing.time_slicing.replicas per GPU is 4 (local)" in reason, reason
    cli = route_cli_to(client, monkeypatch)
    args = ("submit", "-c", "batch", "-A", "ml", "-D", str(client.daemon.data_dir))
    code, _out, err = cli(*args, "--share", "time_slice:8", "--gpu-mem", "100", "--", "true")
    assert code == 3 and "at most 4 replicas: sharing.time_slicing.replicas per GPU is 4 (local)" in err, err
    code, _out, err = cli(*args, "--share", "time_slice:2", "--", "true")  # no --gpu-mem: the flag is named
    assert code == 2 and "--gpu-mem: 0 is not allowed for a time_slice share" in err, err


def test_a_refused_share_names_what_the_nodes_offer_of_its_kind():
    ts = node("ts", 1, gpu_mem_mib=24576, sharing={"time_slicing": {"replicas": 2}})
    ts4 = node("ts4", 1, gpu_mem_mib=24576, sharing={"time_slicing": {"replicas": 4}})
    mps = node("m", 1, gpu_mem_mib=40000, sharing={"mps": {"max_clients": 8, "max_memory_per_client_mib": 4096}})
    cases = [
        ([ts, ts4], GpuShare("time_slice", mem_mib=10, slots=6),
         "time_slice takes at most 4 replicas: sharing.time_slicing.replicas per GPU is 4 (ts4), 2 (ts)"),
        ([mps], GpuShare("mps", mem_mib=10, slots=9),
         "mps takes at most 8 replicas: sharing.mps.max_clients per GPU is 8 (m); "
         "sharing.mps.max_memory_per_client_mib is 4096 (m)"),
        ([ts], GpuShare("mps", mem_mib=10, slots=1), "share=mps:1x:10MiB: no node offers mps shares"),
    ]
    for nodes, share, words in cases:
        sched, out = scheduler(policy(nodes=nodes), job("s", share=share))
        rejected = [d.reason for d in out if isinstance(d, Reject)]
        assert len(rejected) == 1 and words in rejected[0], (share, rejected)


def test_a_policy_key_misspelled_is_named_with_the_one_meant():
    raw = {"name": "x", "teams": {"ml": {}}, "cluster": {"nodes": [
        {"name": "n1", "gpus": 1, "gpu_type": "A100", "sharing": {"time_slicing": {"replica": 4}}}]}}
    with pytest.raises(PolicyError) as exc:
        policy_from_dict(raw)
    assert ("cluster.nodes[0].sharing.time_slicing.replica: 'replica' is not allowed: unknown field; allowed fields "
            "here: replicas (did you mean 'replicas'?)") in str(exc.value)
