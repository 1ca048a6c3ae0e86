"""The Kubernetes backend (design note 016).

The pure parts (nodes from GFD labels, pods as job specs, placements cut into pods, exit
codes) run everywhere. The rest runs a real `shepherd server --backend kubernetes`
against a real control plane - etcd, kube-apiserver and kube-controller-manager built
from Go modules by `deploy/k8s/build.sh` - with KWOK's fake 8-GPU nodes, started once for
the module on 127.0.0.1 (`gpushepherd.backends.kubecluster`). It skips, saying why, where
the binaries are not built (no Go) or the `kubernetes` client is missing.

No process runs in a KWOK pod: the engine cases shared with Slurm and Ray
(`engine_cases.py`) are asserted here from the API objects - the pod's binding, its
`gpushepherd.io/gpus` annotation, its conditions and events, deletions and their grace
periods - where Slurm and Ray assert from the job's own output. A pod "runs" until the
test sets `kwok.gpushepherd.io/exit-code`; `kwok.gpushepherd.io/on-term-exit: 85` makes
it exit 85 when deleted (a job that checkpoints on SIGTERM).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import pytest
from engine_cases import engine_policy, refused_case
from test_daemon import Server, wait_for

from gpushepherd.backends import kubecluster
from gpushepherd.backends.kubernetes import assign, node_of, pod_exit, spec_from_pods
from gpushepherd.model.placement import Placement

ROOT = Path(__file__).resolve().parent.parent
POLICY = engine_policy("k8s-test")
NS = "default"
EXIT = "kwok.gpushepherd.io/exit-code"
ON_TERM = "kwok.gpushepherd.io/on-term-exit"
AUX_POLICY = """\
name: k8s-aux
cluster:
  nodes:
    - name: mig1
      gpus: 8
      gpu_type: A100-80GB
      gpu_mem_mib: 81920
      mig: {0: {layout: [1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb]}}
    - {name: plain1, gpus: 8, gpu_type: A100-80GB, gpu_mem_mib: 81920, labels: {host: plain1}}
    - {name: plain2, gpus: 8, gpu_type: A100-80GB, gpu_mem_mib: 81920, labels: {host: plain2}}
classes:
  production-inference: {sharing: [whole, mig], avoid_nodes_with: [sandbox]}
  sandbox: {sharing: [whole, mig, time_slice]}
  batch: {grace_period_s: 5}
teams:
  ml: {}
preemption: {enabled: true}
"""


# ------------------------------------------------------------------ pure parts
def pod(name: str, gpus: int = 1, labels: dict | None = None, mig: str = "", ns: str = NS, **spec) -> dict:
    res = {f"nvidia.com/mig-{mig}": "1"} if mig else {"nvidia.com/gpu": str(gpus)}
    return {"metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "labels": labels or {}},
            "spec": {"schedulerName": "gpushepherd", "containers": [
                {"name": "c", "image": "x", "resources": {"limits": res}}], **spec}}


def test_a_node_is_read_from_gpu_feature_discovery_labels_and_allocatable():
    node = {"metadata": {"name": "gpu-1", "labels": {"nvidia.com/gpu.product": "H100-80GB", "nvidia.com/gpu.count": "8",
                                                     "pool": "a"}},
            "status": {"allocatable": {"nvidia.com/gpu": "4", "memory": "512Gi"},
                       "conditions": [{"type": "Ready", "status": "True"}]},
            "spec": {"unschedulable": True}}
    n = node_of(node)
    assert (n.name, n.gpu_type, n.gpus, n.memory_mib) == ("gpu-1", "H100-80GB", 8, 512 * 1024)
    assert n.state == "ready,cordoned" and ("pool", "a") in n.labels
    del node["metadata"]["labels"]["nvidia.com/gpu.count"]
    node["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    assert (node_of(node).gpus, node_of(node).state) == (4, "notready,cordoned")


def test_a_pod_becomes_a_job_spec_and_a_bad_one_is_refused_naming_the_field():
    classes = {"batch": None, "training": None}
    s = spec_from_pods([pod("p", 3, {"gpushepherd.io/team": "ml", "gpushepherd.io/checkpointable": "true"},
                            nodeSelector={"gpushepherd.io/pool": "a", "nvidia.com/gpu.product": "H100",
                                          "kubernetes.io/os": "linux"},
                            activeDeadlineSeconds=600, priorityClassName="training",
                            tolerations=[{"key": "gpu", "operator": "Exists"}, {"key": "d", "value": "x"}])], classes,
                       {"n1": {"kubernetes.io/os": "linux"}, "n2": {"kubernetes.io/os": "linux", "x": "1"}})
    assert (s.team, s.user, s.workload_class, s.gpus, s.same_node, s.gpus_per_pod) == ("ml", NS, "training", 3, True,
                                                                                       None)
    assert (s.time_limit_s, s.checkpointable, s.node_selector, s.tolerations) == (600.0, True, (("pool", "a"),),
                                                                                  ("d=x", "gpu"))
    assert s.gpu_types == ("H100",)  # kubernetes.io/os=linux holds on every node: dropped
    with pytest.raises(ValueError, match="nodeSelector: x=1 is not allowed: it selects only some of the nodes"):
        spec_from_pods([pod("q", 1, nodeSelector={"x": "1"})], classes, {"n1": {}, "n2": {"x": "1"}})
    gang = spec_from_pods([pod("g-0", 8, {"gpushepherd.io/pod-group": "g"}), pod("g-1", 8)], classes)
    assert (gang.gpus, gang.gpus_per_pod, gang.same_node, gang.workload_class) == (16, 8, False, "batch")
    m = spec_from_pods([pod("m", mig="1g.10gb")], classes)
    assert m.share.kind == "mig" and m.share.profile == "1g.10gb" and m.gpus == 1
    with pytest.raises(ValueError, match=r"pod default/g-0: pod-group 'g': nvidia.com/gpu \[4, 8\] is not allowed"):
        spec_from_pods([pod("g-0", 8, {"gpushepherd.io/pod-group": "g"}), pod("g-1", 4)], classes)
    with pytest.raises(ValueError, match="no nvidia.com/gpu or nvidia.com/mig-<profile> request"):
        spec_from_pods([pod("z", 0)], classes)
    with pytest.raises(ValueError, match="label gpushepherd.io/preemptible: 'yes' is not allowed: true or false"):
        spec_from_pods([pod("b", 1, {"gpushepherd.io/preemptible": "yes"})], classes)


def test_a_placement_is_cut_into_its_pods():
    p = Placement((("n1", (0, 1, 2, 3)), ("n2", (4, 5, 6, 7))))
    assert assign(p, 2) == [("n1", (0, 1, 2, 3)), ("n2", (4, 5, 6, 7))]
    assert assign(p, 4) == [("n1", (0, 1)), ("n1", (2, 3)), ("n2", (4, 5)), ("n2", (6, 7))]
    with pytest.raises(ValueError, match="do not divide into 3 pods"):
        assign(p, 3)


def test_a_pods_exit_is_its_phase_and_its_containers_code():
    assert pod_exit({"status": {"phase": "Succeeded"}}) == (True, 0)
    failed = {"status": {"phase": "Failed", "containerStatuses": [{"state": {"terminated": {"exitCode": 85}}}]}}
    assert pod_exit(failed) == (True, 85)
    assert pod_exit({"status": {"phase": "Failed", "reason": "Evicted"}}) == (True, None)
    assert pod_exit({"status": {"phase": "Running"}}) == (False, None)


def test_node_events_survive_the_event_log():
    from gpushepherd.daemon.store import event_from_row, event_row
    from gpushepherd.model.events import GpuHealthChanged, NodeAdded, NodeLost
    from gpushepherd.policy.load import parse_policy

    node = parse_policy(AUX_POLICY).rules.nodes[0]
    for e in (NodeLost(5.0, "mig1"), NodeAdded(5.0, node), GpuHealthChanged(5.0, "plain1", 3, False)):
        row = event_row(e)
        assert event_from_row(5.0, row["kind"], row["job_id"], row["payload"]) == e


def test_without_the_client_the_backend_says_how_to_get_it(tmp_path, monkeypatch):
    import importlib.util

    from gpushepherd.backends import BackendError, make_backend

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "kubernetes" else object())
    with pytest.raises(BackendError, match=r"pip install 'gpushepherd\[kubernetes\]'"):
        make_backend("kubernetes", tmp_path).discover()


# ------------------------------------------------------------------ a real cluster
@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = kubecluster.unavailable()
    if why:
        pytest.skip(f"Kubernetes: {why}")
    c = kubecluster.KubeCluster(tmp_path_factory.mktemp("k8s") / "cluster")
    try:
        c.start()
        for name in ("fake1", "fake2"):
            c.add_node(name, product="A100", labels={"gpushepherd.io/pool": "main"})
        c.add_node("mig1", product="A100-80GB", labels={"gpushepherd.io/pool": "aux"}, mig={"1g.10gb": 7},
                   healthy_gpus=7)
        for name in ("plain1", "plain2"):
            c.add_node(name, product="A100-80GB", labels={"gpushepherd.io/pool": "aux"})
        c.wait_nodes_ready(["fake1", "fake2", "mig1", "plain1", "plain2"])
    except Exception:
        c.stop()
        raise
    yield c
    c.stop()


def k8s_args(cluster, scheduler: str = "gpushepherd", pool: str = "main") -> tuple[str, ...]:
    return ("--backend", "kubernetes", "--kubeconfig", str(cluster.kubeconfig), "--k8s-scheduler-name", scheduler,
            "--k8s-node-selector", f"gpushepherd.io/pool={pool}")


@pytest.fixture(scope="module")
def core(cluster):
    return cluster.core()


@pytest.fixture(scope="module")
def server(cluster, tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("k8s-server"))
    s.policy.write_text(POLICY)
    s.start(extra=k8s_args(cluster))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def aux(cluster, tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("k8s-aux"))
    s.policy.write_text(AUX_POLICY)
    s.start(extra=k8s_args(cluster, "gpushepherd-aux", "aux"))
    yield s
    s.stop()


def make_pod(core, name: str, gpus: int = 1, *, cls: str = "batch", team: str = "ml", scheduler: str = "gpushepherd",
             annotations: dict | None = None, group: str | None = None, members: int | None = None, mig: str = "",
             labels: dict | None = None, **spec) -> dict:
    """A bare pod for gpushepherd (by its scheduler name) on the API server."""
    body = pod(name, gpus, {"gpushepherd.io/class": cls, "gpushepherd.io/team": team, **(labels or {})}, mig)
    del body["metadata"]["uid"]
    body["metadata"]["annotations"] = dict(annotations or {})
    if group:
        body["metadata"]["labels"]["gpushepherd.io/pod-group"] = group
        body["metadata"]["annotations"]["gpushepherd.io/min-member"] = str(members)
    body["spec"].update(schedulerName=scheduler, restartPolicy="Never", **spec)
    body["spec"]["containers"][0].update(name="job", image="busybox:stable")
    return core.create_namespaced_pod(NS, body).to_dict()


def read(core, name: str) -> dict | None:
    from kubernetes.client.exceptions import ApiException
    try:
        return core.api_client.sanitize_for_serialization(core.read_namespaced_pod(name, NS))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def bound(core, name: str) -> dict:
    return wait_for(f"pod {name} bound", lambda: (p := read(core, name)) and p["spec"].get("nodeName") and p)


def job_of(core, name: str) -> str:
    return wait_for(f"pod {name}'s job", lambda: ((read(core, name) or {}).get("metadata", {}).get("labels")
                                                  or {}).get("gpushepherd.io/job"))


def finish(core, name: str, code: int = 0) -> None:
    core.patch_namespaced_pod(name, NS, {"metadata": {"annotations": {EXIT: str(code)}}})


def events_of(core, name: str) -> list:
    return [e for e in core.list_namespaced_event(NS).items if e.involved_object.name == name]


def gpus_of(p: dict) -> tuple[str, list[int]]:
    node, idx = p["metadata"]["annotations"]["gpushepherd.io/gpus"].split("[")[0].split(":")
    return node, [int(i) for i in idx.split(",")]


def all_free(server, gpus: int = 16) -> bool:
    return server.free_gpus() == gpus


def delete_pods(core, *names: str) -> None:
    for n in names:
        try:
            core.delete_namespaced_pod(n, NS, grace_period_seconds=0)
        except Exception:  # noqa: BLE001 - already gone
            pass


class Deletions:
    """Records each pod's deletion grace period as the watch sees it (a pod deleted
    with a grace period first gets ``deletionTimestamp`` and
    ``deletionGracePeriodSeconds``)."""

    def __init__(self, core):
        from kubernetes import watch
        self.seen: dict[str, int] = {}
        self.conditions: dict[str, list] = {}
        self._w = watch.Watch()
        # the watch starts from the list's resourceVersion, read here: a change made after
        # this returns is seen however late the thread starts (CI on 6ce377c, two pytest
        # workers: a victim deleted 0.6 s later was missed, and the tests after it waited
        # on GPUs its resumed gang held)
        rv = core.list_namespaced_pod(NS).metadata.resource_version
        self._t = threading.Thread(target=self._run, args=(core, rv), daemon=True)
        self._t.start()

    def _run(self, core, rv: str) -> None:
        try:
            self._watch(core, rv)
        except Exception:  # noqa: BLE001 - the watch ends when the test stops it
            pass

    def _watch(self, core, rv: str) -> None:
        for ev in self._w.stream(core.list_namespaced_pod, NS, resource_version=rv, timeout_seconds=300):
            p = ev["raw_object"]
            name = p["metadata"]["name"]
            if p["metadata"].get("deletionTimestamp") and name not in self.seen:
                self.seen[name] = p["metadata"].get("deletionGracePeriodSeconds")
            conds = [c for c in (p.get("status") or {}).get("conditions") or [] if c["type"] == "DisruptionTarget"]
            if conds:
                self.conditions[name] = conds

    def stop(self) -> None:
        self._w.stop()


def test_a_pod_is_bound_to_a_chosen_node_with_its_gpu_count(server, core):
    make_pod(core, "hello", 3)
    p = bound(core, "hello")
    node, gpus = gpus_of(p)
    assert p["spec"]["nodeName"] == node and node in ("fake1", "fake2") and len(gpus) == 3
    assert any(c["type"] == "PodScheduled" and c["status"] == "True" for c in p["status"]["conditions"])
    job = server.job(job_of(core, "hello"))
    assert job["state"] == "RUNNING" and job["placement"] == f"{node}:{','.join(map(str, gpus))}"
    assert job["gpus"] == 3 and job["team"] == "ml" and job["class"] == "batch"
    finish(core, "hello")
    done = server.wait_state(job["id"], "COMPLETED", "FAILED")
    assert done["state"] == "COMPLETED" and done["exit_code"] == 0
    assert wait_for("the GPUs back", lambda: all_free(server))
    nodes = {n["name"]: n for n in httpx.get(server.url + "/nodes", timeout=60).json()}
    assert nodes["fake1"]["engine"]["kind"] == "kubernetes" and nodes["fake1"]["engine"]["gpus"] == 8
    assert "nvidia.com/gpu.product=A100" in nodes["fake1"]["engine"]["labels"]
    delete_pods(core, "hello")


def test_a_placed_node_reaches_the_pod(server, core):
    make_pod(core, "full", 8)
    first = bound(core, "full")["spec"]["nodeName"]
    make_pod(core, "second", 2)
    assert bound(core, "second")["spec"]["nodeName"] == ({"fake1", "fake2"} - {first}).pop()
    for n in ("full", "second"):
        finish(core, n)
    assert wait_for("the GPUs back", lambda: all_free(server))
    delete_pods(core, "full", "second")


def test_a_job_submitted_to_the_api_gets_pods_on_its_nodes(server, core):
    env = {"SHEPHERD_K8S_POD_ANNOTATIONS": json.dumps({EXIT: "0", "kwok.gpushepherd.io/duration": "1s"})}
    job_id = server.submit("print('hi')", gpus=16, env=env)
    job = server.wait_state(job_id, "COMPLETED", "FAILED")
    assert job["state"] == "COMPLETED" and job["runs"] == 1
    pods = [read(core, f"shepherd-{job_id}-1-{r}") for r in (0, 1)]
    assert sorted(p["spec"]["nodeName"] for p in pods) == ["fake1", "fake2"]  # a gang: one pod per node
    c = pods[0]["spec"]["containers"][0]
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "8"} and c["command"][-1] == "print('hi')"
    env_of = {e["name"]: e.get("value", "") for e in c["env"]}
    assert env_of["SHEPHERD_RUN"] == "1" and env_of["SHEPHERD_NNODES"] == "2" and "SHEPHERD_CHECKPOINT_DIR" in env_of
    assert pods[0]["spec"]["schedulerName"] == "gpushepherd" and pods[0]["metadata"]["labels"]["gpushepherd.io/job"] \
        == job_id
    assert wait_for("the GPUs back", lambda: all_free(server))
    delete_pods(core, *(p["metadata"]["name"] for p in pods))


def test_a_two_pod_gang_is_bound_together_or_not_at_all(server, core):
    make_pod(core, "gang-0", 8, group="g", members=2)
    make_pod(core, "gang-1", 8, group="g", members=2)
    a, b = bound(core, "gang-0"), bound(core, "gang-1")
    assert sorted([a["spec"]["nodeName"], b["spec"]["nodeName"]]) == ["fake1", "fake2"]
    assert job_of(core, "gang-0") == job_of(core, "gang-1")
    job = server.job(job_of(core, "gang-0"))
    assert job["gpus"] == 16 and job["state"] == "RUNNING"
    finish(core, "gang-0")
    finish(core, "gang-1", 3)  # one rank fails: the gang's code is its first non-zero
    assert server.wait_state(job["id"], "COMPLETED", "FAILED")["exit_code"] == 3
    assert wait_for("the GPUs back", lambda: all_free(server))
    delete_pods(core, "gang-0", "gang-1")


def test_a_lone_gang_member_waits_for_its_group(server, core):
    make_pod(core, "lone-0", 4, group="lone", members=2)
    make_pod(core, "other", 1)  # an intake pass that takes this pod has seen lone-0
    job_of(core, "other")
    p = read(core, "lone-0")
    assert not p["spec"].get("nodeName") and "gpushepherd.io/job" not in p["metadata"]["labels"]
    finish(core, "other")
    delete_pods(core, "lone-0", "other")
    assert wait_for("the GPUs back", lambda: all_free(server))


@pytest.mark.parametrize("on_term", ["85", "0"])  # 0: requeued all the same (note 048)
def test_preemption_deletes_with_the_grace_period_and_the_checkpointed_gang_resumes(server, core, on_term):
    seen = Deletions(core)
    try:
        for r in (0, 1):
            make_pod(core, f"victim-{r}", 8, cls="batch", group="victim", members=2,
                     labels={"gpushepherd.io/checkpointable": "true"}, annotations={ON_TERM: on_term})
        victim = job_of(core, "victim-0")
        server.wait_state(victim, "RUNNING")
        make_pod(core, "urgent", 8, cls="urgent")
        urgent = job_of(core, "urgent")
        bound(core, "urgent")
        assert seen.seen.get("victim-0") == 20 and seen.seen.get("victim-1") == 20  # batch's grace_period_s
        assert seen.conditions["victim-0"][0]["reason"] == "PreemptionByGpushepherd"
        # run 2: the bare pods are re-created (<name>-r2) and wait for the urgent job's GPUs
        wait_for("victim's run 2 pods", lambda: read(core, "victim-0-r2") and read(core, "victim-1-r2"))
        finish(core, "urgent")
        assert server.wait_state(urgent, "COMPLETED", "FAILED")["state"] == "COMPLETED"
        r2 = [bound(core, f"victim-{r}-r2") for r in (0, 1)]
        assert sorted(p["spec"]["nodeName"] for p in r2) == ["fake1", "fake2"]
        assert r2[0]["metadata"]["annotations"]["gpushepherd.io/run"] == "2"
        for r in (0, 1):
            finish(core, f"victim-{r}-r2")
        job = server.wait_state(victim, "COMPLETED", "FAILED")
        assert job["state"] == "COMPLETED" and job["runs"] == 2 and job["preemptions"] == 1
        assert [h["to"] for h in job["history"]][:4] == ["PENDING", "RUNNING", "PREEMPTING", "PENDING"]
        assert wait_for("the GPUs back", lambda: all_free(server))
    finally:
        seen.stop()
        delete_pods(core, "urgent", "victim-0-r2", "victim-1-r2")


def test_a_team_quota_holds_across_the_cluster_and_the_reason_is_on_the_pod(server, core):
    make_pod(core, "qa", 6, team="capped")
    bound(core, "qa")
    make_pod(core, "qb", 6, team="capped")  # a node has 8 free, but the team's 10 would be 12
    qb = job_of(core, "qb")
    cond = wait_for("qb's condition", lambda: [c for c in (read(core, "qb")["status"].get("conditions") or [])
                                               if c["type"] == "PodScheduled" and c["status"] == "False"])
    assert cond[0]["reason"] == "Unschedulable" and "max_gpus" in cond[0]["message"]
    assert cond[0]["message"].startswith("gpushepherd: ")
    ev = wait_for("qb's event", lambda: [e for e in events_of(core, "qb") if e.reason == "FailedScheduling"])
    assert "max_gpus" in ev[0].message and ev[0].source.component == "gpushepherd"
    assert server.job(qb)["state"] == "PENDING" and not read(core, "qb")["spec"].get("nodeName")
    finish(core, "qa")
    b = bound(core, "qb")
    a = read(core, "qa")
    ended = a["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"]
    scheduled = [c for c in b["status"]["conditions"] if c["type"] == "PodScheduled" and c["status"] == "True"]
    assert scheduled[0]["lastTransitionTime"] >= ended  # from the API's clocks: never both at once
    finish(core, "qb")
    assert server.wait_state(qb, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    assert wait_for("the GPUs back", lambda: all_free(server))
    delete_pods(core, "qa", "qb")


def test_cancel_deletes_the_pod_and_deleting_a_pod_cancels_its_job(server, core):
    make_pod(core, "cancelme", 4)
    bound(core, "cancelme")
    job_id = job_of(core, "cancelme")
    r = httpx.post(f"{server.url}/jobs/{job_id}/cancel", timeout=60)
    assert r.status_code == 200 and r.json()["state"] == "CANCELLED"
    wait_for("the pod gone", lambda: read(core, "cancelme") is None)
    make_pod(core, "deleteme", 2)
    bound(core, "deleteme")
    other = job_of(core, "deleteme")
    core.delete_namespaced_pod("deleteme", NS)  # what `kubectl delete pod` does
    assert server.wait_state(other, "CANCELLED", "COMPLETED", "FAILED")["state"] == "CANCELLED"
    assert wait_for("the GPUs back", lambda: all_free(server))
    for n in ("hold-1", "hold-2"):  # a waiting pod deleted: its job is cancelled too
        make_pod(core, n, 8, cls="urgent")
        bound(core, n)
    make_pod(core, "waiting", 1)
    waiting = job_of(core, "waiting")
    assert server.job(waiting)["state"] == "PENDING"
    core.delete_namespaced_pod("waiting", NS)
    assert server.wait_state(waiting, "CANCELLED", "RUNNING")["state"] == "CANCELLED"
    for n in ("hold-1", "hold-2"):
        finish(core, n)
    assert wait_for("the GPUs back", lambda: all_free(server))
    delete_pods(core, "hold-1", "hold-2")


def test_a_pod_the_policy_refuses_says_why_on_the_pod(server, core):
    make_pod(core, "nosuchteam", 1, team="nobody")
    cond = wait_for("the refusal", lambda: [c for c in (read(core, "nosuchteam")["status"].get("conditions") or [])
                                            if c["type"] == "PodScheduled" and c["status"] == "False"])
    assert "refused" in cond[0]["message"] and "nobody" in cond[0]["message"]
    delete_pods(core, "nosuchteam")


def test_a_policy_that_does_not_match_the_cluster_is_refused(cluster, tmp_path):
    refused_case(POLICY, tmp_path, k8s_args(cluster, "gpushepherd-refused"))


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request):
    return request.getfixturevalue("pg_url") if request.param == "postgresql" else None


def test_a_controller_restart_mid_run_loses_nothing_and_binds_nothing_twice(cluster, core, tmp_path, db):
    sched = f"gpushepherd-restart-{'pg' if db else 'sqlite'}"
    s = Server(tmp_path, "restart", db)
    s.policy.write_text(POLICY)
    s.start(extra=k8s_args(cluster, sched))
    names = [f"{sched}-a", f"{sched}-b"]
    try:
        for n in names:
            make_pod(core, n, 8, scheduler=sched)
        a, b = (job_of(core, n) for n in names)
        uids = {n: bound(core, n)["metadata"]["uid"] for n in names}
        s.kill9()
        finish(core, names[0])  # a ends while no controller runs
        wait_for("a Succeeded", lambda: read(core, names[0])["status"]["phase"] == "Succeeded")
        s.start(policy=False, extra=k8s_args(cluster, sched))
        assert s.wait_state(a, "COMPLETED", "FAILED")["state"] == "COMPLETED"
        assert s.job(b)["state"] == "RUNNING"  # re-attached, not re-bound or re-created
        assert read(core, names[1])["metadata"]["uid"] == uids[names[1]]
        finish(core, names[1])
        jb = s.wait_state(b, "COMPLETED", "FAILED")
        assert jb["state"] == "COMPLETED" and jb["runs"] == 1 and s.job(a)["runs"] == 1
        mine = [p for p in core.list_namespaced_pod(NS).items if p.spec.scheduler_name == sched]
        assert sorted(p.metadata.name for p in mine) == sorted(names)  # nothing created twice
    finally:
        s.stop()
        delete_pods(core, *names)


def test_a_mig_pod_gets_a_mig_instance_on_the_mig_node(aux, core):
    make_pod(core, "mig-pod", mig="1g.10gb", cls="production-inference", scheduler="gpushepherd-aux")
    p = bound(core, "mig-pod")
    assert p["spec"]["nodeName"] == "mig1"
    assert p["metadata"]["annotations"]["gpushepherd.io/gpus"].startswith("mig1:0[mig:1g.10gb@")
    job = aux.job(job_of(core, "mig-pod"))
    assert job["share"] and "1g.10gb" in job["share"]
    finish(core, "mig-pod")
    aux.wait_state(job["id"], "COMPLETED")
    delete_pods(core, "mig-pod")


def test_production_inference_avoids_a_node_with_sandbox_pods(aux, core):
    make_pod(core, "sbx", 1, cls="sandbox", scheduler="gpushepherd-aux", nodeSelector={"gpushepherd.io/host":
                                                                                      "plain1"})
    assert bound(core, "sbx")["spec"]["nodeName"] == "plain1"
    # best fit would put it beside the sandbox (plain1 is the fuller node); avoid_nodes_with says no
    make_pod(core, "inf", 1, cls="production-inference", scheduler="gpushepherd-aux")
    assert bound(core, "inf")["spec"]["nodeName"] != "plain1"
    for n in ("sbx", "inf"):
        finish(core, n)
    wait_for("the aux GPUs back", lambda: all_free(aux, 24))
    delete_pods(core, "sbx", "inf")


def test_a_lost_node_requeues_its_pod_and_a_gpu_gone_from_allocatable_is_not_handed_out(aux, core, cluster):
    make_pod(core, "onplain2", 2, cls="batch", scheduler="gpushepherd-aux",
             nodeSelector={"gpushepherd.io/host": "plain2"})
    first = bound(core, "onplain2")
    job_id = job_of(core, "onplain2")
    core.delete_node("plain2")  # the node is gone: its job is requeued
    job = wait_for("the requeue", lambda: (j := aux.job(job_id))["state"] == "PENDING" and j)
    assert any("node-lost" in (h["reason"] or "") for h in job["history"])
    cluster.add_node("plain2", product="A100-80GB", labels={"gpushepherd.io/pool": "aux"}, healthy_gpus=6)
    again = bound(core, "onplain2-r2")  # re-created and bound once the node is back
    assert again["spec"]["nodeName"] == "plain2" and first["metadata"]["uid"] != again["metadata"]["uid"]
    finish(core, "onplain2-r2")
    aux.wait_state(job_id, "COMPLETED")
    # 2 of plain2's 8 GPUs are unhealthy (allocatable 6): an 8-GPU pod for plain2 waits
    make_pod(core, "all8", 8, cls="batch", scheduler="gpushepherd-aux",
             nodeSelector={"gpushepherd.io/host": "plain2"})
    wait_for("all8's reason", lambda: [c for c in (read(core, "all8")["status"].get("conditions") or [])
                                       if c["type"] == "PodScheduled" and c["status"] == "False"])
    assert not read(core, "all8")["spec"].get("nodeName")
    core.patch_node_status("plain2", {"status": {"allocatable": {"nvidia.com/gpu": "8"},
                                                 "capacity": {"nvidia.com/gpu": "8"}}})
    assert bound(core, "all8")["spec"]["nodeName"] == "plain2"
    finish(core, "all8")
    wait_for("the aux GPUs back", lambda: all_free(aux, 24))
    delete_pods(core, "onplain2", "onplain2-r2", "all8")


def test_the_kueue_export_is_accepted_by_kueues_crds(cluster):
    if not (kubecluster.cache_dir() / "kueue-crds").is_dir():
        pytest.skip(f"Kueue's CRDs are not in {kubecluster.cache_dir() / 'kueue-crds'} (deploy/k8s/build.sh "
                    "kueue-crds)")
    from kubernetes import client

    from gpushepherd.policy.kueue import export_kueue
    from gpushepherd.policy.load import parse_policy
    from test_kueue_export import COHORTS

    api = cluster.api()
    kubecluster.install_kueue_crds(api)
    objects, _ = export_kueue(parse_policy(COHORTS))
    stored = kubecluster.create_kueue_objects(api, objects)
    assert [o["metadata"]["name"] for o in stored] == [o["metadata"]["name"] for o in objects]  # the schemas took them
    cq = client.CustomObjectsApi(api).get_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues", "ml")
    assert cq["spec"]["cohortName"] == "shared"
    quota = {f["name"]: f["resources"][0]["nominalQuota"] for f in cq["spec"]["resourceGroups"][0]["flavors"]}
    assert quota == {"a100-80gb-serve": "7", "h100-80gb-train": "8"}


def test_the_deploy_manifests_apply_and_their_rbac_is_enough_to_schedule(cluster, core, tmp_path):
    from kubernetes import client, utils

    from gpushepherd.policy.load import parse_policy

    manifests = ROOT / "deploy" / "k8s" / "manifests"
    api = cluster.api()
    for f in ("rbac.yaml", "policy-configmap.yaml", "deployment.yaml"):
        utils.create_from_yaml(api, str(manifests / f))
    cm = core.read_namespaced_config_map("gpushepherd-policy", "gpushepherd-system")
    assert parse_policy(cm.data["policy.yaml"]).rules.nodes  # the ConfigMap holds a valid policy
    dep = client.AppsV1Api(api).read_namespaced_deployment("gpushepherd", "gpushepherd-system")
    spec = dep.spec.template.spec
    assert spec.service_account_name == "gpushepherd" and spec.containers[0].command[:4] == [
        "shepherd", "server", "--backend", "kubernetes"]
    # the ServiceAccount's own token is enough to run the scheduler: bind, label, condition, event
    token = core.create_namespaced_service_account_token("gpushepherd", "gpushepherd-system", {
        "spec": {"expirationSeconds": 3600}}).status.token
    kc = tmp_path / "sa.kubeconfig"
    kc.write_text(kubecluster.kubeconfig_text(cluster.server, cluster.dir / "pki" / "ca.crt", token=token))
    s = Server(tmp_path, "sa")
    s.policy.write_text(POLICY)
    s.start(extra=("--backend", "kubernetes", "--kubeconfig", str(kc), "--k8s-scheduler-name", "gpushepherd-sa",
                   "--k8s-node-selector", "gpushepherd.io/pool=main"))
    try:
        make_pod(core, "rbac-a", 6, team="capped", scheduler="gpushepherd-sa")
        assert bound(core, "rbac-a")["metadata"]["labels"]["gpushepherd.io/job"]
        make_pod(core, "rbac-b", 6, team="capped", scheduler="gpushepherd-sa")
        wait_for("rbac-b's event", lambda: [e for e in events_of(core, "rbac-b") if e.reason == "FailedScheduling"])
        finish(core, "rbac-a")
        bound(core, "rbac-b")
        finish(core, "rbac-b")
        wait_for("the GPUs back", lambda: all_free(s))
        assert "403" not in s.log.read_text()
    finally:
        s.stop()
        delete_pods(core, "rbac-a", "rbac-b")


def test_a_preempted_jobs_pod_is_replaced_by_its_owner_and_bound_to_the_same_job(server, core, cluster):
    if not any(p == "kube-controller-manager" for p in cluster.procs):
        pytest.skip("Kubernetes: kube-controller-manager is not built (its Job controller makes the pods)")
    from kubernetes import client

    batch = client.BatchV1Api(cluster.api())
    make_pod(core, "filler", 8, cls="urgent")  # one node taken: the Job's pod gets the other
    bound(core, "filler")
    template = pod("x", 8)["spec"]
    template.update(restartPolicy="Never", schedulerName="gpushepherd")
    template["containers"][0].update(name="job", image="busybox:stable")
    body = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"},
            "spec": {"backoffLimit": 0, "podFailurePolicy": {"rules": [
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
                {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [85]}}]},
                "template": {"metadata": {"labels": {"gpushepherd.io/class": "batch", "gpushepherd.io/team": "ml",
                                                     "gpushepherd.io/checkpointable": "true", "app": "train"},
                                          "annotations": {ON_TERM: "85"}}, "spec": template}}}
    batch.create_namespaced_job(NS, body)
    try:
        def pods():
            return sorted((p for p in core.list_namespaced_pod(NS, label_selector="app=train").items),
                          key=lambda p: p.metadata.creation_timestamp)
        first = wait_for("the Job's pod bound", lambda: [p for p in pods() if p.spec.node_name])[0]
        job_id = first.metadata.labels["gpushepherd.io/job"]
        assert server.job(job_id)["gpus"] == 8 and server.job(job_id)["state"] == "RUNNING"
        make_pod(core, "urgent-job", 8, cls="urgent")
        bound(core, "urgent-job")
        second = wait_for("the Job's new pod", lambda: [p for p in pods() if p.metadata.uid != first.metadata.uid])[0]
        assert second.metadata.owner_references[0].kind == "Job"  # made by the Job controller, not gpushepherd
        finish(core, "urgent-job")
        finish(core, "filler")
        again = wait_for("the new pod bound", lambda: (p := core.read_namespaced_pod(second.metadata.name, NS))
                         .spec.node_name and p)
        assert again.metadata.labels["gpushepherd.io/job"] == job_id  # the same job, requeued, not a new one
        finish(core, second.metadata.name)
        job = server.wait_state(job_id, "COMPLETED", "FAILED")
        assert job["state"] == "COMPLETED" and job["runs"] == 2 and job["preemptions"] == 1
        wait_for("the Job complete", lambda: (batch.read_namespaced_job("train", NS).status.succeeded or 0) == 1)
        assert wait_for("the GPUs back", lambda: all_free(server))
    finally:
        batch.delete_namespaced_job("train", NS, propagation_policy="Background")
        delete_pods(core, "urgent-job", "filler")
