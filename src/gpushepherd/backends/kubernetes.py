"""Kubernetes backend (design note 016): gpushepherd is the scheduler of GPU pods.

Through the official ``kubernetes`` client (imported only here; ``pip install
'gpushepherd[kubernetes]'``):

* inventory: the Nodes matching ``node_selector`` - GPU count from GPU Feature
  Discovery's ``nvidia.com/gpu.count`` (else allocatable ``nvidia.com/gpu``), type from
  ``nvidia.com/gpu.product``, memory from allocatable ``memory``, labels, Ready state;
* pods with ``spec.schedulerName`` = ours become jobs (``intake``: class, team, user,
  GPUs, MIG, gangs, selectors and tolerations from the pod, ``spec_from_pods``); pods of
  jobs submitted through gpushepherd's API are created when the core places them;
* a start binds each pod of the run to its node through ``pods/binding``;
* signals: a ``DisruptionTarget`` condition, then a delete with the class's grace period
  (the kubelet sends SIGTERM, then SIGKILL); the end of a grace period or a cancel: a
  delete with grace 0;
* exits: the pods' phases and container exit codes (85: checkpointed), from one watch of
  pods and nodes (a cache: the reconcile loop never lists);
* node NotReady or deleted: ``NodeLost``; Ready again: ``NodeAdded``; allocatable
  ``nvidia.com/gpu`` below the count: ``GpuHealthChanged``;
* pending reasons: the pod condition ``PodScheduled=False`` and a ``FailedScheduling``
  Event, on each change.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import signal as _signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpushepherd.backends import BackendError, EngineNode, RunFiles, contract_env
from gpushepherd.model.job import GpuShare, JobSpec
from gpushepherd.model.placement import Placement

log = logging.getLogger("gpushepherd.daemon")

#: label and annotation prefix of gpushepherd's own keys
PREFIX = "gpushepherd.io/"
JOB_LABEL = PREFIX + "job"
RUN_LABEL = PREFIX + "run"
RANK_LABEL = PREFIX + "rank"
GROUP_LABEL = PREFIX + "pod-group"
MIN_MEMBER = PREFIX + "min-member"
GPUS_ANNOTATION = PREFIX + "gpus"
GPU = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
#: the job environment entry that ties an intake job to its pods (no schema change)
INTAKE_ENV = "SHEPHERD_K8S_INTAKE"
#: a job environment entry (JSON object) of annotations for the pods gpushepherd creates
ANNOTATIONS_ENV = "SHEPHERD_K8S_POD_ANNOTATIONS"
#: seconds an owner (a Job) has to create the replacement pod of a requeued run
OWNER_WAIT_S = 300.0


def _name(text: str) -> str:
    """A DNS-1123 name part of a job id (``7_3.2`` -> ``7-3.2``)."""
    return re.sub(r"[^a-z0-9.-]", "-", text.lower()).strip("-.") or "x"


def pod_name(job_id: str, run: int, rank: int) -> str:
    """The name of rank ``rank``'s pod of run ``run`` of a job gpushepherd creates."""
    return f"shepherd-{_name(job_id)}-{run}-{rank}"


def _qty(text: Any) -> float:
    """A Kubernetes quantity (``8``, ``64Gi``, ``1500m``) as a number (bytes for
    binary suffixes)."""
    s = str(text).strip()
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "m": 1e-3, "k": 1e3, "M": 1e6,
             "G": 1e9, "T": 1e12}
    for suffix in sorted(units, key=len, reverse=True):
        if s.endswith(suffix):
            return float(s[: -len(suffix)]) * units[suffix]
    return float(s)


def _ready(node: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (node.get("status") or {}).get("conditions") or [])


def node_of(node: dict) -> EngineNode:
    """A Node (the API's JSON) as an ``EngineNode``: GPUs from ``nvidia.com/gpu.count``
    (else allocatable ``nvidia.com/gpu``), type from ``nvidia.com/gpu.product``, memory
    (MiB) from allocatable ``memory``, labels, state ``ready`` / ``notready`` (``,cordoned``)."""
    meta, status = node.get("metadata") or {}, node.get("status") or {}
    labels = meta.get("labels") or {}
    alloc = status.get("allocatable") or {}
    try:
        gpus = int(labels.get("nvidia.com/gpu.count") or _qty(alloc.get(GPU, 0)))
    except ValueError:
        gpus = 0
    try:
        mem = int(_qty(alloc.get("memory", 0)) // 2**20)
    except ValueError:
        mem = 0
    state = "ready" if _ready(node) else "notready"
    if (node.get("spec") or {}).get("unschedulable"):
        state += ",cordoned"
    return EngineNode(meta.get("name", ""), labels.get("nvidia.com/gpu.product", ""), gpus, mem,
                      tuple(sorted(labels.items())), state)


def pod_gpus(pod: dict) -> tuple[int, str]:
    """``(whole GPUs, MIG profile or '')`` a pod asks for: the sum of its containers'
    ``nvidia.com/gpu`` (limits, else requests) and the one ``nvidia.com/mig-<profile>``
    it names.

    Raises:
        ValueError: more than one MIG instance, or MIG and whole GPUs together.
    """
    whole, migs = 0, []
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        want = {**(res.get("requests") or {}), **(res.get("limits") or {})}
        for k, v in want.items():
            if k == GPU:
                whole += int(_qty(v))
            elif k.startswith(MIG_PREFIX):
                migs.extend([k.removeprefix(MIG_PREFIX)] * int(_qty(v)))
    if len(migs) > 1 or (migs and whole):
        raise ValueError(f"resources: {', '.join([f'{whole} {GPU}'] * bool(whole) + [MIG_PREFIX + m for m in migs])}"
                         " is not allowed: whole GPUs, or one MIG instance")
    return whole, (migs[0] if migs else "")


def _tolerations(pod: dict) -> tuple[str, ...]:
    out = []
    for t in (pod.get("spec") or {}).get("tolerations") or []:
        key = t.get("key")
        if not key:
            continue
        out.append(key if t.get("operator") == "Exists" or not t.get("value") else f"{key}={t['value']}")
    return tuple(sorted(set(out)))


def _bool_label(labels: dict, key: str) -> bool | None:
    v = labels.get(PREFIX + key)
    if v is None:
        return None
    if v.lower() not in ("true", "false"):
        raise ValueError(f"label {PREFIX + key}: {v!r} is not allowed: true or false")
    return v.lower() == "true"


def node_selector(selector: dict[str, str], k8s_labels: dict[str, dict[str, str]] | None = None
                  ) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """A pod's ``nodeSelector`` as the core's ``(node_selector, gpu_types)``:
    ``gpushepherd.io/<key>: v`` is the policy's node label ``<key>=v``;
    ``nvidia.com/gpu.product: T`` is the GPU type ``T``; any other term must hold on
    every managed node (``k8s_labels``: node -> its labels), where it constrains nothing
    and is dropped.

    Raises:
        ValueError: a term that selects only some of the nodes (say it as a policy node
            label, ``gpushepherd.io/<key>``).
    """
    pairs, types = [], []
    for k, v in sorted(selector.items()):
        if k.startswith(PREFIX):
            pairs.append((k.removeprefix(PREFIX), v))
        elif k == "nvidia.com/gpu.product":
            types.append(v)
        elif k8s_labels is not None and not all(labels.get(k) == v for labels in k8s_labels.values()):
            raise ValueError(f"nodeSelector: {k}={v} is not allowed: it selects only some of the nodes; give the "
                             f"policy's nodes a label and select it as {PREFIX}<label> (or use "
                             "nvidia.com/gpu.product for a GPU type)")
    return tuple(pairs), tuple(types)


def spec_from_pods(pods: list[dict], classes, k8s_labels: dict[str, dict[str, str]] | None = None) -> JobSpec:
    """The job of a pod, or of a gang's pods (all of one ``gpushepherd.io/pod-group``),
    as the core's ``JobSpec`` (``id`` and ``submit_time`` are the server's to set).

    Class: label ``gpushepherd.io/class``, else ``priorityClassName`` when ``classes``
    has it, else ``batch``. Team: label ``gpushepherd.io/team``, else the namespace. User:
    label ``gpushepherd.io/user``, else the namespace. Time limit: the smallest
    ``activeDeadlineSeconds``. Node selector: ``node_selector``. A single pod stays on
    one node; a gang's pods take ``gpus_per_pod`` each (pods may share a node).

    Raises:
        ValueError: naming the pod, the field, the value and what is allowed.
    """
    first = pods[0]
    meta, spec = first.get("metadata") or {}, first.get("spec") or {}
    labels = meta.get("labels") or {}
    where = f"pod {meta.get('namespace')}/{meta.get('name')}"
    counts = []
    profile = ""
    for p in pods:
        try:
            n, prof = pod_gpus(p)
        except ValueError as exc:
            raise ValueError(f"pod {p['metadata'].get('namespace')}/{p['metadata']['name']}: {exc}") from None
        counts.append(n)
        profile = profile or prof
    if len(set(counts)) != 1:
        raise ValueError(f"{where}: pod-group {labels.get(GROUP_LABEL)!r}: {GPU} {sorted(set(counts))} is not "
                         "allowed: the same GPU count on every pod of a gang")
    if profile and len(pods) > 1:
        raise ValueError(f"{where}: a gang of MIG pods is not allowed: MIG instances are for single pods")
    if not profile and counts[0] < 1:
        raise ValueError(f"{where}: resources: no {GPU} or {MIG_PREFIX}<profile> request: a pod for gpushepherd "
                         "asks for GPUs")
    cls = labels.get(PREFIX + "class") or (spec.get("priorityClassName")
                                           if spec.get("priorityClassName") in classes else None) or "batch"
    deadlines = [p["spec"].get("activeDeadlineSeconds") for p in pods if p["spec"].get("activeDeadlineSeconds")]
    try:
        preemptible, checkpointable = _bool_label(labels, "preemptible"), _bool_label(labels, "checkpointable")
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    ns = meta.get("namespace", "default")
    try:
        selector, gpu_types = node_selector(spec.get("nodeSelector") or {}, k8s_labels)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    return JobSpec(
        id="", team=labels.get(PREFIX + "team") or ns, workload_class=cls, gpus=1 if profile else sum(counts),
        user=labels.get(PREFIX + "user") or ns, project=labels.get(PREFIX + "project", ""),
        gpus_per_pod=counts[0] if len(pods) > 1 else None, same_node=len(pods) == 1 and not profile,
        time_limit_s=float(min(deadlines)) if deadlines else None, preemptible=preemptible,
        checkpointable=checkpointable, share=GpuShare("mig", profile=profile) if profile else None,
        node_selector=selector, gpu_types=gpu_types, tolerations=_tolerations(first))


def assign(placement: Placement, n_pods: int) -> list[tuple[str, tuple[int, ...]]]:
    """Each pod's ``(node, GPU indices)`` of a placement: one pod per part when
    ``n_pods`` is the number of parts, else the parts' GPUs cut into ``n_pods`` equal
    runs in order (pods of a gang may share a node).

    Raises:
        ValueError: the GPUs do not divide into ``n_pods`` pods, each on one node.
    """
    if n_pods == len(placement.parts):
        return [(n, tuple(g)) for n, g in placement.parts]
    total = placement.gpu_count
    if n_pods < 1 or total % n_pods:
        raise ValueError(f"placement {placement}: {total} GPUs do not divide into {n_pods} pods")
    per, out = total // n_pods, []
    for node, gpus in placement.parts:
        if len(gpus) % per:
            raise ValueError(f"placement {placement}: node {node}'s {len(gpus)} GPUs are not whole pods of {per}")
        out.extend((node, tuple(gpus[i:i + per])) for i in range(0, len(gpus), per))
    return out


def pod_exit(pod: dict) -> tuple[bool, int | None]:
    """``(ended, exit code)`` of a pod: ``Succeeded`` is 0, ``Failed`` the first
    terminated container's code (``None`` when none terminated: evicted, lost)."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    if phase == "Succeeded":
        return True, 0
    if phase == "Failed":
        for cs in status.get("containerStatuses") or []:
            term = (cs.get("state") or {}).get("terminated")
            if term is not None:
                return True, int(term.get("exitCode", 1))
        return True, None
    return False, None


def _terminated_code(pod: dict) -> int | None:
    """The exit code of a pod whose containers all terminated, even while it is being
    deleted (phase still ``Running``); ``None`` otherwise."""
    ended, code = pod_exit(pod)
    if ended:
        return code
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    terms = [(cs.get("state") or {}).get("terminated") for cs in statuses]
    if statuses and all(t is not None for t in terms):
        codes = [int(t.get("exitCode", 1)) for t in terms]
        return next((c for c in codes if c != 0), 0)
    return None


@dataclass(slots=True)
class KubeRun:
    """One run as pods: ``pods`` are ``(namespace, name)`` by rank; ``pid`` a number
    derived from rank 0's uid (``start``)."""

    job_id: str
    run: int
    pid: int
    pods: list[tuple[str, str]]
    start: str | None = None
    uids: dict[tuple[str, str], str] = field(default_factory=dict)
    codes: dict[tuple[str, str], int | None] = field(default_factory=dict)  # ended pods' codes
    assign: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    waiting_until: float | None = None  # intake run: its owner's pods are not there yet
    bound: bool = False
    deleting: bool = False  # gpushepherd deleted its pods (a signal or a kill)
    user_deleted: bool = False  # a pod was deleted by someone else: the job is cancelled


class KubernetesBackend(RunFiles):
    """Binds gpushepherd's jobs' pods on a Kubernetes cluster (``backends.Backend``,
    note 016).

    Args:
        data_dir: the server's data directory (saved pod specs of bare intake pods).
        kubeconfig: a kubeconfig file; ``None``: ``$KUBECONFIG`` / ``~/.kube/config``,
            else the in-cluster service account.
        scheduler_name: the ``spec.schedulerName`` of the pods this server schedules.
        node_selector: a label selector of the nodes it manages ('' : all).
        namespace: where it creates the pods of API-submitted jobs.
        image: their container image.
        reason_every: seconds between passes writing pending reasons onto pods.

    Raises (from the first call that needs the API):
        BackendError: ``kubernetes`` is not installed, or the API server cannot be reached.
    """

    kind = "kubernetes"

    def __init__(self, data_dir: Path, kubeconfig: str | None = None, scheduler_name: str = "gpushepherd",
                 node_selector: str = "", namespace: str = "default", image: str = "busybox:stable",
                 reason_every: float = 5.0):
        self.data_dir = Path(data_dir)
        self.kubeconfig = kubeconfig
        self.scheduler_name = scheduler_name
        self.node_selector = node_selector
        self.namespace = namespace
        self.image = image
        self.reason_every = reason_every
        self.runs: dict[str, KubeRun] = {}
        self.daemon = None
        self._api = None
        self._core = None
        self._lock = threading.RLock()  # the caches below
        self.pods: dict[tuple[str, str], dict] = {}
        self.gone: dict[str, dict] = {}  # uid -> the last state of a deleted pod
        self.nodes: dict[str, dict] = {}
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.intake_of: dict[str, str] = {}  # pod uid or owner uid -> job id
        self.refused: dict[str, str] = {}  # pod uid -> why the intake refused it
        self._reasons: dict[str, str] = {}  # job -> the reason last written onto its pods
        self._lost: set[str] = set()  # nodes the core has as lost
        self._sick: set[tuple[str, int]] = set()  # GPUs the core has as unhealthy
        self._expected: dict[str, set[str]] = {}  # job -> uids of the pods re-created for its next run
        self._cancelled: set[str] = set()  # jobs this backend asked the daemon to cancel
        self._info: dict[str, dict | None] = {}  # job -> its intake record (None: not from Kubernetes)

    # -------------------------------------------------------------- the API
    def core(self):
        """The ``CoreV1Api`` (connected once).

        Raises:
            BackendError: ``kubernetes`` is missing or no configuration is found.
        """
        if self._core is not None:
            return self._core
        if importlib.util.find_spec("kubernetes") is None:
            raise BackendError("kubernetes: the `kubernetes` package is not installed: pip install "
                               "'gpushepherd[kubernetes]' to use --backend kubernetes")
        from kubernetes import client, config

        try:
            if self.kubeconfig:
                api = config.new_client_from_config(config_file=self.kubeconfig)
            else:
                try:
                    api = config.new_client_from_config()
                except config.ConfigException:
                    config.load_incluster_config()
                    api = client.ApiClient()
        except Exception as exc:  # noqa: BLE001 - ConfigException, OSError, yaml errors
            where = self.kubeconfig or "kubeconfig or in-cluster"
            raise BackendError(f"kubernetes: no usable configuration ({where}): {exc}") from None
        self._api = api
        self._core = client.CoreV1Api(api)
        return self._core

    def _call(self, what: str, fn, *args, ok: tuple[int, ...] = (), **kw):
        """Call the API; a status in ``ok`` (404 ...) returns ``None``.

        Raises:
            BackendError: naming ``what`` and the API's answer.
        """
        from kubernetes.client.exceptions import ApiException
        try:
            return fn(*args, **kw)
        except ApiException as exc:
            if exc.status in ok:
                return None
            reason = exc.reason
            try:
                reason = json.loads(exc.body or "{}").get("message") or reason
            except ValueError:
                pass
            raise BackendError(f"kubernetes: {what}: {exc.status} {reason}") from None
        except Exception as exc:  # noqa: BLE001 - urllib3 connection errors
            raise BackendError(f"kubernetes: {what}: {exc}") from None

    def _list(self, fn, **kw) -> tuple[list[dict], str]:
        resp = self._call("list", fn, _preload_content=False, **kw)
        data = json.loads(resp.data)
        return data.get("items") or [], (data.get("metadata") or {}).get("resourceVersion", "")

    # -------------------------------------------------------------- watches
    def _start_watches(self) -> None:
        if self._threads:
            return
        core = self.core()
        self._relist_pods()
        self._relist_nodes()
        for name, target in (("pods", self._watch_pods), ("nodes", self._watch_nodes)):
            t = threading.Thread(target=target, name=f"shepherd-k8s-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        self._synced.set()
        del core

    def _pod_selector(self) -> dict:
        return {"field_selector": f"spec.schedulerName={self.scheduler_name}"}

    def _relist_pods(self) -> str:
        items, rv = self._list(self.core().list_pod_for_all_namespaces, **self._pod_selector())
        with self._lock:
            fresh = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in items}
            for key, old in self.pods.items():
                if key not in fresh or fresh[key]["metadata"]["uid"] != old["metadata"]["uid"]:
                    self.gone[old["metadata"]["uid"]] = old
            self.pods = fresh
        return rv

    def _relist_nodes(self) -> str:
        kw = {"label_selector": self.node_selector} if self.node_selector else {}
        items, rv = self._list(self.core().list_node, **kw)
        with self._lock:
            self.nodes = {n["metadata"]["name"]: n for n in items}
        return rv

    def _watch(self, relist, fn, apply, **kw) -> None:
        from kubernetes import watch
        rv = ""
        while not self._stop.is_set():
            try:
                if not rv:
                    rv = relist()
                w = watch.Watch()
                for ev in w.stream(fn, resource_version=rv, timeout_seconds=60, allow_watch_bookmarks=True, **kw):
                    if self._stop.is_set():
                        w.stop()
                        return
                    obj = ev.get("raw_object") or {}
                    if ev["type"] == "ERROR":
                        rv = ""  # 410 Gone: list again
                        break
                    rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                    if ev["type"] != "BOOKMARK":
                        apply(ev["type"], obj)
            except Exception as exc:  # noqa: BLE001 - a dropped connection, an expired version
                if self._stop.is_set():
                    return
                log.warning("kubernetes watch: %s; listing again", exc)
                rv = ""
                time.sleep(1.0)

    def _watch_pods(self) -> None:
        self._watch(self._relist_pods, self.core().list_pod_for_all_namespaces, self._apply_pod,
                    **self._pod_selector())

    def _watch_nodes(self) -> None:
        kw = {"label_selector": self.node_selector} if self.node_selector else {}
        self._watch(self._relist_nodes, self.core().list_node, self._apply_node, **kw)

    def _apply_pod(self, kind: str, obj: dict) -> None:
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        with self._lock:
            if kind == "DELETED":
                old = self.pods.pop(key, None)
                self.gone[obj["metadata"]["uid"]] = obj if old is None or _terminated_code(obj) is not None else (
                    old if _terminated_code(old) is not None else obj)
            else:
                self.pods[key] = obj
        if self.daemon is not None:
            self.daemon.wake.set()

    def _apply_node(self, kind: str, obj: dict) -> None:
        with self._lock:
            if kind == "DELETED":
                self.nodes.pop(obj["metadata"]["name"], None)
            else:
                self.nodes[obj["metadata"]["name"]] = obj

    # -------------------------------------------------------------- the interface
    def discover(self) -> list[EngineNode]:
        """The managed Nodes, sorted by name.

        Raises:
            BackendError: the API server cannot be asked.
        """
        self._start_watches()
        with self._lock:
            nodes = [node_of(n) for n in self.nodes.values()]
        return sorted(nodes, key=lambda n: n.name)

    def serve(self, daemon) -> None:
        """Start feeding ``daemon`` (called once its core is rebuilt): the pod intake and
        the pending-reason writer; the core's lost nodes and unhealthy GPUs as the log
        left them."""
        self.daemon = daemon
        self._start_watches()
        snap = daemon.sched.snapshot()
        self._lost = set(snap.get("lost_nodes", snap.get("lost")) or ())
        self._sick = {(n, int(g)) for n, g in snap.get("unhealthy") or ()}
        for row in daemon.store.job_rows().values():
            info = json.loads(row["env"] or "{}").get(INTAKE_ENV)
            if info:
                info = json.loads(info)
                for key in info.get("keys", []):
                    self.intake_of[key] = row["id"]
        for name, target in (("intake", self._intake_loop), ("reasons", self._reason_loop)):
            t = threading.Thread(target=target, name=f"shepherd-k8s-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def close(self) -> None:
        """Stop the watches and the intake (their connections closed, their threads
        joined for a moment: a process that exits next leaves no thread mid-write)."""
        self._stop.set()
        if self._api is not None:
            try:
                self._api.rest_client.pool_manager.clear()  # the watches' reads end now
            except Exception:  # noqa: BLE001
                pass
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=2.0)

    def _grace(self, job_id: str) -> int | None:
        d = self.daemon
        job = d.sched.jobs.get(job_id) if d is not None and d.sched is not None else None
        return None if job is None else int(round(job.cls.grace_period_s))

    def start(self, job_id: str, run: int, argv: list[str], *, shell: bool, env: dict[str, str], cwd: str,
              placement: Placement, time_limit_s: float | None = None) -> KubeRun:
        """Bind the run's pods to ``placement``'s nodes: an intake job's pods (its
        owner's new pods, or re-created bare pods for a later run), else new pods with
        the job's command.

        Raises:
            ValueError: the placement cannot be cut into the job's pods.
            BackendError: the API server refused a create or a bind.
        """
        self._start_watches()
        intake = json.loads(env[INTAKE_ENV]) if env.get(INTAKE_ENV) else None
        if intake is None:
            handle = self._create_run(job_id, run, argv, shell, env, cwd, placement, time_limit_s)
        else:
            n = len(intake["pods"])
            handle = KubeRun(job_id, run, 0, [], assign=assign(placement, n))
            if placement.share:
                handle.assign = [(placement.parts[0][0], placement.parts[0][1])]
            handle.waiting_until = time.monotonic() + OWNER_WAIT_S
        self.runs[job_id] = handle
        if intake is not None:
            self._bind_intake(handle, intake, placement)
        return handle

    def _create_run(self, job_id: str, run: int, argv: list[str], shell: bool, env: dict[str, str], cwd: str,
                    placement: Placement, time_limit_s: float | None) -> KubeRun:
        parts = assign(placement, len(placement.parts))
        _rdir, ckpt, _exit = self.prepare_run(job_id, run)
        base = {k: v for k, v in env.items() if k not in (ANNOTATIONS_ENV, "CUDA_VISIBLE_DEVICES")}
        base.update({k: v for k, v in contract_env(job_id, run, ckpt, placement.share, env).items()
                     if k != "PYTHONPATH"})
        try:
            annotations = json.loads(env.get(ANNOTATIONS_ENV) or "{}")
        except ValueError:
            raise ValueError(f"env {ANNOTATIONS_ENV}: {env[ANNOTATIONS_ENV][:60]!r} is not allowed: a JSON object")
        job = self.daemon.sched.jobs.get(job_id) if self.daemon is not None else None
        tolerations = [({"key": t.split("=", 1)[0], "operator": "Equal", "value": t.split("=", 1)[1]}
                        if "=" in t else {"key": t, "operator": "Exists"})
                       for t in (job.spec.tolerations if job else ())]
        command = ["/bin/sh", "-c", argv[0] if len(argv) == 1 else " ".join(argv)] if shell else list(argv)
        grace = self._grace(job_id)
        handle = KubeRun(job_id, run, 0, [], assign=parts)
        for rank, (node, gpus) in enumerate(parts):
            name = pod_name(job_id, run, rank)
            renv = dict(base, SHEPHERD_NODE_RANK=str(rank), SHEPHERD_NNODES=str(len(parts)))
            resources = ({MIG_PREFIX + placement.share.split(":", 1)[1].split("@")[0]: "1"}
                         if placement.share.startswith("mig:") else {GPU: str(len(gpus))})
            if placement.share and not placement.share.startswith("mig:"):
                raise ValueError(f"placement {placement}: the kubernetes backend runs whole GPUs and MIG instances "
                                 f"(share {placement.share!r} is not supported)")
            body = {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": self.namespace,
                             "labels": {JOB_LABEL: job_id, RUN_LABEL: str(run), RANK_LABEL: str(rank)},
                             "annotations": {str(k): str(v) for k, v in annotations.items()}},
                "spec": {"schedulerName": self.scheduler_name, "restartPolicy": "Never",
                         "tolerations": tolerations,
                         "containers": [{"name": "job", "image": self.image, "command": command,
                                         "workingDir": cwd or None,
                                         "env": [{"name": k, "value": v} for k, v in sorted(renv.items())],
                                         "resources": {"limits": resources, "requests": resources}}]},
            }
            if grace is not None:
                body["spec"]["terminationGracePeriodSeconds"] = grace
            if time_limit_s is not None:
                body["spec"]["activeDeadlineSeconds"] = max(1, int(time_limit_s))
            if len(parts) > 1:
                body["metadata"]["labels"][GROUP_LABEL] = f"shepherd-{_name(job_id)}-{run}"
            got = self._call(f"create pod {self.namespace}/{name}", self.core().create_namespaced_pod,
                             self.namespace, body, ok=(409,))
            if got is None:  # already there (a restart between create and record): use it
                got = self._call(f"read pod {self.namespace}/{name}", self.core().read_namespaced_pod, name,
                                 self.namespace)
            key = (self.namespace, name)
            handle.pods.append(key)
            handle.uids[key] = got.metadata.uid
        handle.start = handle.uids[handle.pods[0]]
        handle.pid = int(handle.start.replace("-", "")[:15], 16)
        self._bind_all(handle, placement)
        log.info("job %s run %d: pods %s bound to %s", job_id, run, ", ".join(n for _ns, n in handle.pods), placement)
        return handle

    def _bind_all(self, handle: KubeRun, placement: Placement) -> None:
        """Bind every pod of the run (all or none: a failed bind deletes the run's pods)."""
        from kubernetes import client
        core = self.core()
        try:
            for key, (node, gpus) in zip(handle.pods, handle.assign):
                ns, name = key
                self._call(f"annotate pod {ns}/{name}", core.patch_namespaced_pod, name, ns, {"metadata": {
                    "labels": {JOB_LABEL: handle.job_id}, "annotations": {
                        GPUS_ANNOTATION: f"{node}:{','.join(map(str, gpus))}" + (
                            f"[{placement.share}]" if placement.share else ""), RUN_LABEL: str(handle.run)}}})
                body = client.V1Binding(metadata=client.V1ObjectMeta(name=name, namespace=ns),
                                        target=client.V1ObjectReference(api_version="v1", kind="Node", name=node))
                # the generated client cannot read the answer (a Status, not a Binding)
                self._call(f"bind pod {ns}/{name} to {node}", core.create_namespaced_pod_binding, name, ns, body,
                           _preload_content=False, ok=(409,))
        except BackendError:
            self._delete(handle, 0)
            raise
        handle.bound = True
        handle.waiting_until = None

    def _bind_intake(self, handle: KubeRun, intake: dict, placement: Placement) -> bool:
        """Bind an intake run's pods once they exist: run 1 the pods the job came from;
        later runs the owner's new pods, or bare pods re-created from their saved specs.
        Returns whether it bound them."""
        with self._lock:
            if handle.run == 1 or not intake.get("owner"):
                uids = set(intake["uids"]) if handle.run == 1 else set()
                mine = [p for p in self.pods.values() if p["metadata"]["uid"] in uids]
            else:
                owner = intake["owner"]
                mine = [p for p in self.pods.values()
                        if any(r.get("uid") == owner for r in p["metadata"].get("ownerReferences") or [])
                        and not p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
                        and pod_exit(p)[1] is None and not pod_exit(p)[0]
                        and (not intake.get("group") or p["metadata"]["labels"].get(GROUP_LABEL) == intake["group"])]
        n = len(intake["pods"])
        if handle.run > 1 and not intake.get("owner"):
            mine = self._recreate(handle, intake)
        if len(mine) < n:
            return False
        mine = sorted(mine, key=lambda p: p["metadata"]["name"])[:n]
        handle.pods = [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in mine]
        handle.uids = {(p["metadata"]["namespace"], p["metadata"]["name"]): p["metadata"]["uid"] for p in mine}
        handle.start = mine[0]["metadata"]["uid"]
        handle.pid = int(handle.start.replace("-", "")[:15], 16)
        for p in mine:
            self.intake_of[p["metadata"]["uid"]] = handle.job_id
        self._bind_all(handle, placement)
        log.info("job %s run %d: pods %s bound to %s", handle.job_id, handle.run,
                 ", ".join(n for _ns, n in handle.pods), placement)
        return True

    def _saved(self, job_id: str) -> Path:
        return self.data_dir / "k8s" / f"{_name(job_id)}.json"

    def _recreate(self, handle: KubeRun, intake: dict) -> list[dict]:
        """Re-create a requeued job's bare pods from the specs saved at intake, named
        ``<name>-r<run>``; returns them."""
        try:
            saved = json.loads(self._saved(handle.job_id).read_text())
        except (OSError, ValueError):
            log.error("job %s: no saved pod specs to re-create its pods from", handle.job_id)
            return []
        out = []
        for body in saved:
            meta = body["metadata"]
            base = re.sub(r"-r\d+$", "", meta["name"])
            name = f"{base}-r{handle.run}"
            labels = {**(meta.get("labels") or {}), JOB_LABEL: handle.job_id, RUN_LABEL: str(handle.run)}
            fresh = {"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": name, "namespace": meta["namespace"], "labels": labels,
                                  "annotations": meta.get("annotations") or {}},
                     "spec": {k: v for k, v in body["spec"].items() if k != "nodeName"}}
            got = self._call(f"create pod {meta['namespace']}/{name}", self.core().create_namespaced_pod,
                             meta["namespace"], fresh, ok=(409,), _preload_content=False)
            if got is None:
                got = self._call(f"read pod {meta['namespace']}/{name}", self.core().read_namespaced_pod, name,
                                 meta["namespace"], _preload_content=False)
            out.append(json.loads(got.data))
        return out

    def signal(self, job_id: str, sig: int) -> None:
        """A preemption or stop: mark each pod with a ``DisruptionTarget`` condition, then
        delete it with the class's grace period (``SIGKILL``: ``kill``)."""
        r = self.runs.get(job_id)
        if r is None:
            return
        if sig == _signal.SIGKILL or not r.bound:
            self.kill(job_id)
            return
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for ns, name in r.pods:
            self._call(f"mark pod {ns}/{name}", self.core().patch_namespaced_pod_status, name, ns, {"status": {
                "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByGpushepherd",
                                "message": f"gpushepherd: {_signal.Signals(sig).name} of job {job_id}",
                                "lastTransitionTime": now}]}}, ok=(404, 409, 422))
        self._delete(r, self._grace(job_id))

    def kill(self, job_id: str) -> None:
        """Delete the run's pods at once (grace 0)."""
        r = self.runs.get(job_id)
        if r is not None:
            self._delete(r, 0)

    def _delete(self, r: KubeRun, grace: int | None) -> None:
        from kubernetes import client
        r.deleting = True
        r.waiting_until = None
        for ns, name in r.pods:
            uid = r.uids.get((ns, name))
            body = client.V1DeleteOptions(grace_period_seconds=grace,
                                          preconditions=client.V1Preconditions(uid=uid) if uid else None)
            self._call(f"delete pod {ns}/{name}", self.core().delete_namespaced_pod, name, ns, body=body,
                       ok=(404, 409))

    def _pod_state(self, r: KubeRun, key: tuple[str, str]) -> tuple[bool, int | None]:
        """``(ended, code)`` of one pod of a run, from the cache (and deleted pods)."""
        uid = r.uids.get(key)
        with self._lock:
            pod = self.pods.get(key)
            if pod is not None and pod["metadata"]["uid"] == uid:
                code = _terminated_code(pod)
                return (code is not None or pod_exit(pod)[0]), code
            last = self.gone.get(uid)
        return True, (_terminated_code(last) if last is not None else None)

    def _update(self, r: KubeRun) -> bool:
        """Collect the pods that ended; whether the run is over (every pod ended, or one
        ended with a non-zero code or was lost)."""
        if not r.bound:
            return r.deleting
        for key in r.pods:
            if key in r.codes:
                continue
            ended, code = self._pod_state(r, key)
            if ended:
                r.codes[key] = code
                if code is None and not r.deleting:
                    r.user_deleted = self._deleted_by_user(r, key)
        return len(r.codes) == len(r.pods) or any(c != 0 for c in r.codes.values())

    def _deleted_by_user(self, r: KubeRun, key: tuple[str, str]) -> bool:
        """Whether a pod gone without an exit code was deleted through the API (not
        evicted by the node's loss): gone from the cache, on a node that is Ready."""
        with self._lock:
            if key in self.pods and self.pods[key]["metadata"]["uid"] == r.uids.get(key):
                return False  # still there: failed without a code (evicted)
            nodes = [n for n, _g in r.assign]
            return all(n in self.nodes and _ready(self.nodes[n]) for n in nodes)

    def exits(self) -> list[tuple[str, int | None]]:
        """Runs that ended: their code (the first non-zero of their pods, else 0), ``None``
        when a pod ended without one (deleted, evicted, its node lost). Intake runs whose
        pods are not there yet are bound when they appear. A pod a user deleted cancels
        its job."""
        from gpushepherd.backends.ray import run_code

        out = []
        now = time.monotonic()
        for job_id in sorted(self.runs):
            r = self.runs[job_id]
            if not r.bound and not r.deleting:
                info = self._intake_info(job_id)
                placement = self.daemon.placements.get(job_id) if self.daemon is not None else None
                if info is not None and placement is not None:
                    try:
                        if self._bind_intake(r, info, placement):
                            continue
                    except (BackendError, ValueError) as exc:
                        log.error("job %s: cannot bind its pods: %s", job_id, exc)
                        r.waiting_until = 0.0
                if r.waiting_until is not None and now < r.waiting_until:
                    continue
                log.warning("job %s run %d: its pods did not appear: lost", job_id, r.run)
                out.append((job_id, None))
                continue
            if self._update(r):
                if r.user_deleted and self.daemon is not None:
                    log.info("job %s: a pod of it was deleted through the API: cancelling the job", job_id)
                    self._cancel_later(job_id)
                code = run_code([r.codes.get(k) for k in r.pods]) if r.bound else None
                if r.bound and any(k not in r.codes for k in r.pods):
                    self._delete(r, 0)  # a gang rank failed: end the others
                out.append((job_id, code))
        for job_id, _code in out:
            r = self.runs.pop(job_id)
            log.info("job %s run %d ended in Kubernetes: %s", job_id, r.run, "lost" if _code is None else
                     f"exit {_code}")
        return out

    def _cancel_later(self, job_id: str) -> None:
        """Queue a cancel of the job for the daemon's next step (its answer unread)."""
        from concurrent.futures import Future
        d = self.daemon
        d.commands.put(("cancel", job_id, Future()))
        d.wake.set()

    def _intake_info(self, job_id: str) -> dict | None:
        """What the intake recorded of a job's pods (``None``: not from Kubernetes), from
        its environment in the store, read once."""
        if job_id in self._info:
            return self._info[job_id]
        d = self.daemon
        if d is None:
            return None
        row = d.store.job_row(job_id)
        raw = json.loads(row["env"] or "{}").get(INTAKE_ENV) if row else None
        self._info[job_id] = json.loads(raw) if raw else None
        return self._info[job_id]

    def attach(self, job_id: str, run: int, pid: int | None, start: str | None) -> KubeRun | None:
        """Re-attach to a run an earlier server bound: its pods by label
        (``gpushepherd.io/job``, ``gpushepherd.io/run``). ``None`` when none is left and
        none ended with a code (lost).

        Raises:
            BackendError: the API server cannot be asked.
        """
        self._start_watches()
        with self._lock:
            mine = sorted((p for p in self.pods.values()
                           if (p["metadata"].get("labels") or {}).get(JOB_LABEL) == job_id
                           and ((p["metadata"].get("labels") or {}).get(RUN_LABEL)
                                or (p["metadata"].get("annotations") or {}).get(RUN_LABEL)) == str(run)
                           and p["spec"].get("nodeName")),
                          key=lambda p: ((p["metadata"].get("labels") or {}).get(RANK_LABEL, ""),
                                         p["metadata"]["name"]))
        if not mine:
            return None
        r = KubeRun(job_id, run, pid or 0, [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in mine],
                    start=start, bound=True)
        r.uids = {(p["metadata"]["namespace"], p["metadata"]["name"]): p["metadata"]["uid"] for p in mine}
        r.assign = [(p["spec"]["nodeName"], ()) for p in mine]
        self.runs[job_id] = r
        return r

    def running(self, job_id: str) -> bool:
        """Whether the job's attached run still runs (a pod of it is bound and not ended)."""
        r = self.runs.get(job_id)
        return r is not None and r.bound and not self._update(r)

    # -------------------------------------------------------------- nodes -> events
    def events(self) -> list:
        """Core events from the nodes (``t`` is the daemon's to set): ``NodeLost`` for a
        managed policy node NotReady or deleted, ``NodeAdded`` (the policy's node) when
        it is Ready again, ``GpuHealthChanged`` when allocatable ``nvidia.com/gpu``
        drops below its whole GPUs (the highest-numbered free GPUs first) or rises."""
        from gpushepherd.model.events import GpuHealthChanged, NodeAdded, NodeLost
        d = self.daemon
        if d is None or d.rules is None:
            return []
        out: list = []
        held: set[tuple[str, int]] = {(n, g) for j in d.sched.holding() for n, gs in d.placements[j.id].parts
                                      for g in gs}
        with self._lock:
            nodes = dict(self.nodes)
        for node in d.rules.nodes:
            k = nodes.get(node.name)
            alive = k is not None and _ready(k)
            if not alive and node.name not in self._lost:
                self._lost.add(node.name)
                self._sick = {s for s in self._sick if s[0] != node.name}
                log.warning("node %s is %s: its jobs are requeued", node.name, "gone" if k is None else "NotReady")
                out.append(NodeLost(0.0, node.name))
                continue
            if alive and node.name in self._lost:
                self._lost.discard(node.name)
                log.info("node %s is Ready again", node.name)
                out.append(NodeAdded(0.0, node))
            if not alive or node.mig:
                continue
            try:
                healthy = int(_qty(((k.get("status") or {}).get("allocatable") or {}).get(GPU, node.gpus)))
            except ValueError:
                continue
            want_sick = max(0, node.gpus - healthy)
            sick = sorted(g for n, g in self._sick if n == node.name)
            if len(sick) < want_sick:
                order = sorted(range(node.gpus), key=lambda g: ((node.name, g) in held, -g))
                for g in [g for g in order if g not in sick][: want_sick - len(sick)]:
                    self._sick.add((node.name, g))
                    out.append(GpuHealthChanged(0.0, node.name, g, False))
            elif len(sick) > want_sick:
                for g in sick[: len(sick) - want_sick]:
                    self._sick.discard((node.name, g))
                    out.append(GpuHealthChanged(0.0, node.name, g, True))
        return out

    # -------------------------------------------------------------- intake
    def _intake_loop(self) -> None:
        while not self._stop.wait(0.3):
            try:
                self.intake()
            except Exception:  # noqa: BLE001 - never kill the thread; retried next pass
                log.exception("kubernetes pod intake failed")

    def _owner(self, pod: dict) -> str:
        refs = [r for r in pod["metadata"].get("ownerReferences") or [] if r.get("controller")]
        return refs[0]["uid"] if refs else ""

    def intake(self) -> list[str]:
        """One pass: pods of ours, unbound and unknown, become jobs (a gang once all its
        ``min-member`` pods exist); an owner's new pod for a requeued job joins it.
        Returns the ids of the jobs submitted."""
        d = self.daemon
        if d is None or d.rules is None:
            return []
        with self._lock:
            fresh = [p for p in self.pods.values() if not p["spec"].get("nodeName")
                     and not p["metadata"].get("deletionTimestamp") and not pod_exit(p)[0]
                     and p["metadata"]["uid"] not in self.intake_of and p["metadata"]["uid"] not in self.refused
                     and JOB_LABEL not in (p["metadata"].get("labels") or {})]
        groups: dict[str, list[dict]] = {}
        for p in sorted(fresh, key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"])):
            owner = self._owner(p)
            if owner and owner in self.intake_of:  # a requeued job's replacement pod: its run binds it
                job = d.sched.jobs.get(self.intake_of[owner])
                if job is not None and not job.state.terminal:
                    continue
            g = (p["metadata"].get("labels") or {}).get(GROUP_LABEL)
            key = f"{p['metadata']['namespace']}/group/{g}" if g else p["metadata"]["uid"]
            groups.setdefault(key, []).append(p)
        self._recreate_requeued()
        self._cancel_deleted_pending()
        submitted = []
        for key, pods in groups.items():
            want = 1
            if len(pods) > 1 or (pods[0]["metadata"].get("labels") or {}).get(GROUP_LABEL):
                raw = (pods[0]["metadata"].get("annotations") or {}).get(MIN_MEMBER, str(len(pods)))
                try:
                    want = int(raw)
                except ValueError:
                    self._refuse(pods, f"annotation {MIN_MEMBER}: {raw!r} is not allowed: an integer")
                    continue
            if len(pods) < want:
                continue  # the gang is not complete yet
            pods = pods[:want]
            job_id = self._submit(pods, key)
            if job_id:
                submitted.append(job_id)
        return submitted

    def _recreate_requeued(self) -> None:
        """Re-create the pods of requeued bare-pod jobs at once (as a Job's controller
        would), so that the waiting job is visible with its reason; its next start binds
        them."""
        d = self.daemon
        with d.lock:
            if d.sched is None:
                return
            want = [(j.id, d.runs[j.id] + 1) for j in d.sched.pending_jobs() if d.runs[j.id] >= 1]
        with self._lock:
            live = {(p["metadata"].get("labels") or {}).get(JOB_LABEL) for p in self.pods.values()
                    if not p["metadata"].get("deletionTimestamp") and not pod_exit(p)[0]}
        for job_id, run in want:
            if job_id in live or job_id in self.runs:
                continue
            info = self._intake_info(job_id)
            if info is None or info.get("owner"):
                continue  # not from Kubernetes, or its owner makes the new pod
            made = self._recreate(KubeRun(job_id, run, 0, []), info)
            if made:
                self._expected[job_id] = {p["metadata"]["uid"] for p in made}
                log.info("job %s: its pods re-created for run %d", job_id, run)

    def _cancel_deleted_pending(self) -> None:
        """A waiting bare-pod job whose pods were all deleted through the API (``kubectl
        delete pod``) is cancelled, as a running one is (``exits``)."""
        d = self.daemon
        with d.lock:
            if d.sched is None:
                return
            pending = [(j.id, d.runs[j.id]) for j in d.sched.pending_jobs()]
        for job_id, runs in pending:
            if job_id in self.runs or job_id in self._cancelled:
                continue
            info = self._intake_info(job_id)
            if info is None or info.get("owner"):
                continue  # not from Kubernetes, or its owner decides
            expected = set(info["uids"]) if runs == 0 else self._expected.get(job_id, set())
            if not expected:
                continue
            with self._lock:  # deleted: seen by the watch, then gone (a pod just made may not be seen yet)
                gone = expected <= self.gone.keys()
            if gone:
                log.info("job %s: its waiting pods were deleted through the API: cancelling the job", job_id)
                self._cancelled.add(job_id)
                self._cancel_later(job_id)

    def _refuse(self, pods: list[dict], why: str) -> None:
        for p in pods:
            self.refused[p["metadata"]["uid"]] = why
        log.warning("pods %s refused: %s", ", ".join(p["metadata"]["name"] for p in pods), why)
        for p in pods:
            self._write_reason(p, f"refused: {why}", "FailedScheduling")

    def _submit(self, pods: list[dict], key: str) -> str | None:
        from gpushepherd.core.scheduler import SpecError
        d = self.daemon
        with self._lock:
            labels = {n: (k["metadata"].get("labels") or {}) for n, k in self.nodes.items()}
        try:
            spec = spec_from_pods(pods, d.rules.classes, labels)
        except ValueError as exc:
            self._refuse(pods, str(exc))
            return None
        owner = self._owner(pods[0])
        keys = [p["metadata"]["uid"] for p in pods] + ([owner] if owner else [])
        info = {"pods": [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pods],
                "uids": [p["metadata"]["uid"] for p in pods], "owner": owner,
                "group": (pods[0]["metadata"].get("labels") or {}).get(GROUP_LABEL, ""), "keys": keys}
        try:
            view = d.submit_view(spec, [f"kubernetes:{info['pods'][0]}"], env={INTAKE_ENV: json.dumps(info)}, cwd="/")
        except SpecError as exc:
            self._refuse(pods, str(exc))
            return None
        job_id = view["id"]
        self._info[job_id] = info
        for k in keys:
            self.intake_of[k] = job_id
        if not owner:  # a bare pod: kept to re-create it for a later run
            path = self._saved(job_id)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(pods))
        for p in pods:
            self._call(f"label pod {p['metadata']['name']}", self.core().patch_namespaced_pod, p["metadata"]["name"],
                       p["metadata"]["namespace"], {"metadata": {"labels": {JOB_LABEL: job_id}}}, ok=(404,))
        log.info("pods %s: job %s (%s, team %s, %d GPU(s))", ", ".join(info["pods"]), job_id, spec.workload_class,
                 spec.team, spec.gpus)
        return job_id

    # -------------------------------------------------------------- pending reasons
    def _reason_loop(self) -> None:
        while not self._stop.wait(self.reason_every):
            try:
                self.write_reasons()
            except Exception:  # noqa: BLE001
                log.exception("writing pending reasons onto pods failed")

    def write_reasons(self) -> int:
        """Write each pending intake job's reason onto its unbound pods (condition and
        Event) where it changed; returns how many pods were written."""
        d = self.daemon
        todo = []
        with d.lock:
            if d.sched is None:
                return 0
            pending = {j.id: str(d.sched.pending_reason(j.id) or "") for j in d.sched.pending_jobs()}
        with self._lock:
            for p in self.pods.values():
                job_id = (p["metadata"].get("labels") or {}).get(JOB_LABEL) or self.intake_of.get(p["metadata"]["uid"])
                if job_id in pending and not p["spec"].get("nodeName") and pending[job_id]:
                    if self._reasons.get(p["metadata"]["uid"]) != pending[job_id]:
                        todo.append((p, pending[job_id]))
        for p, reason in todo:
            self._write_reason(p, reason, "FailedScheduling")
            self._reasons[p["metadata"]["uid"]] = reason
        return len(todo)

    def _write_reason(self, pod: dict, reason: str, event_reason: str) -> None:
        from kubernetes import client
        meta = pod["metadata"]
        ns, name = meta["namespace"], meta["name"]
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        msg = f"gpushepherd: {reason}"
        try:
            self._call(f"condition of pod {ns}/{name}", self.core().patch_namespaced_pod_status, name, ns, {"status": {
                "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": msg,
                                "lastTransitionTime": now}]}}, ok=(404, 409, 422))
            ev = client.CoreV1Event(
                metadata=client.V1ObjectMeta(generate_name=f"{name}.", namespace=ns),
                involved_object=client.V1ObjectReference(kind="Pod", name=name, namespace=ns, uid=meta["uid"],
                                                         api_version="v1"),
                reason=event_reason, message=msg, type="Warning", count=1, first_timestamp=now, last_timestamp=now,
                source=client.V1EventSource(component=self.scheduler_name), reporting_component=self.scheduler_name,
                reporting_instance=self.scheduler_name)
            self._call(f"event of pod {ns}/{name}", self.core().create_namespaced_event, ns, ev, ok=(404, 409, 422))
        except BackendError as exc:
            log.warning("cannot write the reason onto pod %s/%s: %s", ns, name, exc)
