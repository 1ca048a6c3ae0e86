"""gpushepherd against Kueue (+ kube-scheduler) on the same KWOK cluster and the same
Philly-shaped workload, measured in one run (issue 15; design note 016).

``.venv/bin/python bench/k8s_compare.py [--jobs 300] [--nodes 4] [--span-s 180]
[--seed 7] [--modes gpushepherd,kueue]`` (binaries from ``deploy/k8s/build.sh all``):

* the workload: ``bench/slurm_compare.py``'s (the first ``--jobs`` jobs of the bundled
  Philly excerpt, arrivals scaled to ``--span-s``, durations on 2-20 s, 15 %
  production-inference / 45 % training / 40 % batch), each job a ``batch/v1`` Job of
  one pod asking for its GPUs, its team drawn from ``ml`` / ``research`` by the same
  seed. KWOK runs the pod for its duration (``kwok.gpushepherd.io/duration``); a
  training or batch pod deleted by a preemption ends 85 first (it checkpoints), and the
  Job's ``podFailurePolicy`` ignores that and ``DisruptionTarget``: the Job controller
  makes a new pod;
* one policy for both: the three standard classes (400 / 300 / 200; training and batch
  preemptible, grace 5 s), teams ``ml`` and ``research`` with ``nominal_gpus`` half the
  cluster each in one cohort;
* mode ``gpushepherd``: ``shepherd server --backend kubernetes`` under that policy; the
  Jobs' pods have ``schedulerName: gpushepherd``;
* mode ``kueue``: Kueue's controller with the objects ``shepherd policy export --kueue``
  makes of that policy (ClusterQueues in a cohort, LocalQueues, a ResourceFlavor,
  WorkloadPriorityClasses), kube-scheduler placing the pods; Jobs are created suspended
  with ``kueue.x-k8s.io/queue-name`` and ``kueue.x-k8s.io/priority-class``;
* the modes run one after the other, each on a fresh cluster of the same nodes.

Figures, from the pods as the bench's own watch sees them (one clock): per class the
mean / p95 queueing delay (Job created -> its first pod bound), preemptions (pods that
ended 85), priority inversions (production-inference jobs during whose wait a
lower-class job's pod was bound), GPU-seconds idle while jobs waited (min(free GPUs,
GPUs the waiting jobs ask for), sampled every 0.5 s), makespan (first create -> last
pod Succeeded), and scheduling throughput: a burst of ``--burst`` 1-GPU, 1 s Jobs
created at once after the workload, bound pods per second from the first create to the
last bind. Not a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from slurm_compare import CLASSES, HIGH, RANK, BenchJob, p95, workload  # noqa: E402

from gpushepherd.backends import BackendError, kubecluster  # noqa: E402
from gpushepherd.backends.fakeslurm import free_ports  # noqa: E402

TEAMS = ("ml", "research")
GRACE_S = 5


def policy_text(nodes: int) -> str:
    half = nodes * 8 // 2
    lines = ["name: k8s-compare", "cluster:", "  nodes:"]
    lines += [f"    - {{name: fake{i}, gpus: 8, gpu_type: A100, gpu_mem_mib: 81920}}" for i in range(1, nodes + 1)]
    lines += ["classes:", "  production-inference: {priority: 400}",
              f"  training: {{priority: 300, grace_period_s: {GRACE_S}}}",
              f"  batch: {{priority: 200, grace_period_s: {GRACE_S}}}",
              "teams:", f"  ml: {{nominal_gpus: {half}}}", f"  research: {{nominal_gpus: {half}}}",
              "cohorts:", "  shared: {members: [ml, research]}", "preemption: {enabled: true}"]
    return "\n".join(lines) + "\n"


def job_body(j: BenchJob, team: str, mode: str, duration_s: int | None = None) -> dict:
    preemptible = j.cls != HIGH
    ann = {"kwok.gpushepherd.io/exit-code": "0", "kwok.gpushepherd.io/duration": f"{duration_s or j.duration_s}s"}
    if preemptible:
        ann["kwok.gpushepherd.io/on-term-exit"] = "85"
    labels = {"bench/job": j.name, "gpushepherd.io/class": j.cls, "gpushepherd.io/team": team}
    if preemptible:
        labels["gpushepherd.io/checkpointable"] = "true"
    spec = {"restartPolicy": "Never", "terminationGracePeriodSeconds": GRACE_S,
            "containers": [{"name": "job", "image": "busybox:stable",
                            "resources": {"limits": {"nvidia.com/gpu": str(j.gpus)},
                                          "requests": {"nvidia.com/gpu": str(j.gpus)}}}]}
    if mode == "gpushepherd":
        spec["schedulerName"] = "gpushepherd"
    meta = {"name": j.name, "namespace": team, "labels": {"bench/job": j.name}}
    body = {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
            "spec": {"backoffLimit": 0, "completions": 1, "parallelism": 1,
                     "podFailurePolicy": {"rules": [
                         {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
                         {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [85]}}]},
                     "template": {"metadata": {"labels": labels, "annotations": ann}, "spec": spec}}}
    if mode == "kueue":
        meta["labels"].update({"kueue.x-k8s.io/queue-name": team, "kueue.x-k8s.io/priority-class": j.cls})
        body["spec"]["suspend"] = True
    return body


class PodWatch:
    """The bench's own view of the pods (one watch, the bench's clock): first bind per
    job, pods that ended 85, jobs done, GPUs held; samples idle GPUs while jobs wait."""

    def __init__(self, core, capacity: int, gpus_of: dict[str, int]):
        from kubernetes import watch
        self.core, self.capacity, self.gpus_of = core, capacity, gpus_of
        self.bound: dict[str, float] = {}  # job -> first bind
        self.binds: list[float] = []
        self.done: dict[str, float] = {}
        self.preempted: dict[str, int] = {}
        self.running: dict[str, str] = {}  # pod uid -> job
        self.created: dict[str, float] = {}
        self.idle_gpu_s = 0.0
        self._seen_bound: set[str] = set()
        self._ended: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._w = watch.Watch()
        threading.Thread(target=self._run, daemon=True).start()
        threading.Thread(target=self._sample, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for ev in self._w.stream(self.core.list_pod_for_all_namespaces, label_selector="bench/job",
                                         timeout_seconds=60):
                    self._pod(ev["raw_object"], ev["type"])
            except Exception:  # noqa: BLE001 - a dropped watch: watch again
                time.sleep(0.5)

    def _pod(self, p: dict, kind: str) -> None:
        now = time.monotonic()
        uid, job = p["metadata"]["uid"], p["metadata"]["labels"]["bench/job"]
        status = p.get("status") or {}
        with self._lock:
            if p["spec"].get("nodeName") and uid not in self._seen_bound:
                self._seen_bound.add(uid)
                self.binds.append(now)
                self.bound.setdefault(job, now)
                self.running[uid] = job
            term = [cs["state"]["terminated"] for cs in status.get("containerStatuses") or []
                    if (cs.get("state") or {}).get("terminated")]
            ended = status.get("phase") in ("Succeeded", "Failed") or bool(term) or kind == "DELETED"
            if ended and uid not in self._ended:
                self._ended.add(uid)
                self.running.pop(uid, None)
                if term and term[0].get("exitCode") == 85:
                    self.preempted[job] = self.preempted.get(job, 0) + 1
                if status.get("phase") == "Succeeded":
                    self.done.setdefault(job, now)

    def _sample(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(0.5):
            now = time.monotonic()
            with self._lock:
                held = sum(self.gpus_of.get(j, 0) for j in self.running.values())
                busy = set(self.running.values())
                waiting = sum(self.gpus_of[j] for j in self.created if j not in self.done and j not in busy)
            if waiting:
                self.idle_gpu_s += min(max(0, self.capacity - held), waiting) * (now - last)
            last = now

    def stop(self) -> None:
        self._stop.set()
        self._w.stop()


def kueue_up(cluster: kubecluster.KubeCluster, policy_path: Path, work: Path) -> subprocess.Popen:
    """Install Kueue's CRDs and the exported objects, start its controller (webhooks
    served on a throwaway certificate but not registered: Jobs come suspended)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from gpushepherd.policy.kueue import export_kueue
    from gpushepherd.policy.load import load_policy

    api = cluster.api()
    kubecluster.install_kueue_crds(api)
    core = client.CoreV1Api(api)
    try:
        core.create_namespace({"metadata": {"name": "kueue-system"}})
    except ApiException:
        pass
    certs = work / "kueue-certs"
    certs.mkdir(parents=True, exist_ok=True)
    pki = cluster.dir / "pki"
    subprocess.run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(certs / "tls.key"), "-out",
                    str(certs / "tls.csr"), "-subj", "/CN=kueue"], check=True, capture_output=True)
    subprocess.run(["openssl", "x509", "-req", "-in", str(certs / "tls.csr"), "-CA", str(pki / "ca.crt"), "-CAkey",
                    str(pki / "ca.key"), "-CAcreateserial", "-out", str(certs / "tls.crt"), "-days", "2",
                    "-extfile", str(pki / "server.ext")], check=True, capture_output=True)
    # with its own certificate management off, Kueue reads its metrics certificate from a
    # fixed path: made here (and removed after the run) only when it does not exist
    metrics = Path("/etc/kueue/metrics/certs")
    made = not metrics.exists()
    if made:
        metrics.mkdir(parents=True)
        for f in ("tls.crt", "tls.key"):
            (metrics / f).write_bytes((certs / f).read_bytes())
    base = free_ports(4)
    cfg = work / "kueue-config.yaml"
    cfg.write_text(json.dumps({
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration", "namespace": "kueue-system",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{base}"}, "metrics": {"bindAddress": f"127.0.0.1:{base + 2}"},
        "webhook": {"port": base + 1, "host": "127.0.0.1", "certDir": str(certs)},
        "leaderElection": {"leaderElect": False}, "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False, "integrations": {"frameworks": ["batch/job"]},
        "clientConnection": {"qps": 200, "burst": 400}}))
    log = open(work / "kueue.log", "ab")
    # VisibilityOnDemand off: its server would read another fixed certificate path
    proc = subprocess.Popen([str(kubecluster.binary("kueue")), f"--config={cfg}",
                             f"--visibility-server-port={base + 3}", "--feature-gates=VisibilityOnDemand=false"], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}, start_new_session=True)
    proc.made_metrics_dir = metrics.parent.parent if made else None  # type: ignore[attr-defined]
    kubecluster.create_kueue_objects(api, export_kueue(load_policy(policy_path))[0])
    time.sleep(3)
    if proc.poll() is not None:
        raise BackendError(f"kueue exited: {(work / 'kueue.log').read_text()[-2000:]}")
    return proc


def run_mode(mode: str, jobs: list[BenchJob], teams: dict[str, str], nodes: int, burst: int, work: Path,
             drain_s: float) -> dict:
    from kubernetes import client
    work.mkdir(parents=True, exist_ok=True)
    t_wall = time.monotonic()
    cluster = kubecluster.KubeCluster(work / "cluster", scheduler=(mode == "kueue"))
    cluster.start()
    server = kueue = None
    try:
        names = [f"fake{i}" for i in range(1, nodes + 1)]
        for n in names:
            cluster.add_node(n, product="A100")
        cluster.wait_nodes_ready(names)
        api = cluster.api()
        core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
        for t in TEAMS:
            core.create_namespace({"metadata": {"name": t}})
            core.create_namespaced_service_account(t, {"metadata": {"name": "default"}}) \
                if not os.access(kubecluster.binary("kube-controller-manager"), os.X_OK) else None
        policy = work / "policy.yaml"
        policy.write_text(policy_text(nodes))
        if mode == "gpushepherd":
            port = free_ports(1)
            server = subprocess.Popen([sys.executable, "-m", "gpushepherd.cli.main", "server", "--data-dir",
                                       str(work / "data"), "--policy", str(policy), "--port", str(port),
                                       "--backend", "kubernetes", "--kubeconfig", str(cluster.kubeconfig)],
                                      stdout=open(work / "server.log", "ab"), stderr=subprocess.STDOUT)
            import httpx
            end = time.monotonic() + 120
            while time.monotonic() < end:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/nodes", timeout=5).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.3)
        else:
            kueue = kueue_up(cluster, policy, work)
        gpus_of = {j.name: j.gpus for j in jobs}
        gpus_of.update({f"burst{i:03d}": 1 for i in range(burst)})
        watch = PodWatch(core, nodes * 8, gpus_of)
        t0 = time.monotonic()
        for j in jobs:
            delay = t0 + j.at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            watch.created[j.name] = time.monotonic()
            batch.create_namespaced_job(teams[j.name], job_body(j, teams[j.name], mode))
        end = time.monotonic() + drain_s
        while len(watch.done) < len(jobs) and time.monotonic() < end:
            time.sleep(0.5)
        burst_jobs = [BenchJob(f"burst{i:03d}", 0, 1, 1, "batch") for i in range(burst)]
        binds_before = len(watch.binds)
        tb = time.monotonic()
        for j in burst_jobs:
            watch.created[j.name] = time.monotonic()
            batch.create_namespaced_job(TEAMS[0], job_body(j, TEAMS[0], mode))
        end = time.monotonic() + max(60.0, burst)
        while len(watch.binds) - binds_before < burst and time.monotonic() < end:
            time.sleep(0.1)
        watch.stop()
        burst_binds = watch.binds[binds_before:]
        throughput = len(burst_binds) / (max(burst_binds) - tb) if burst_binds else float("nan")
        return measure(jobs, watch, throughput) | {"wall_s": time.monotonic() - t_wall}
    finally:
        for p in (server, kueue):
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
        if kueue is not None and kueue.made_metrics_dir is not None:
            import shutil
            shutil.rmtree(kueue.made_metrics_dir, ignore_errors=True)
        cluster.stop()


def measure(jobs: list[BenchJob], w: PodWatch, throughput: float) -> dict:
    cls = {j.name: j.cls for j in jobs}
    delays = {c: [w.bound[j.name] - w.created[j.name] for j in jobs if j.cls == c and j.name in w.bound]
              for c in CLASSES}
    starts = sorted((t, n) for n, t in w.bound.items() if n in cls)
    high = [j for j in jobs if j.cls == HIGH and j.name in w.bound]
    behind = sum(1 for j in high if any(w.created[j.name] < t < w.bound[j.name] and RANK[cls[n]] > RANK[HIGH]
                                        for t, n in starts))
    ends = [w.done[j.name] for j in jobs if j.name in w.done]
    return {"per_class": {c: {"jobs": sum(1 for j in jobs if j.cls == c), "started": len(delays[c]),
                              "mean_s": statistics.fmean(delays[c]) if delays[c] else float("nan"),
                              "p95_s": p95(delays[c]),
                              "preemptions": sum(n for j, n in w.preempted.items() if cls.get(j) == c)}
                          for c in CLASSES},
            "high_waited_behind_lower": behind, "high_jobs": len(high), "ended": len(ends),
            "idle_gpu_s_while_waiting": w.idle_gpu_s,
            "makespan_s": (max(ends) - min(w.created[j.name] for j in jobs)) if ends else float("nan"),
            "binds_per_s": throughput}


def table(results: dict[str, dict], jobs: list[BenchJob]) -> str:
    """The figures side by side, as a Markdown table."""
    figures = []
    for c in CLASSES:
        n = sum(1 for j in jobs if j.cls == c)
        figures.append((f"{c} ({n} jobs): mean / p95 queueing delay s",
                        lambda r, c=c: f"{r['per_class'][c]['mean_s']:.1f} / {r['per_class'][c]['p95_s']:.1f}"))
    figures += [(f"preemptions of {c}", lambda r, c=c: str(r["per_class"][c]["preemptions"])) for c in CLASSES]
    figures += [
        (f"{HIGH} jobs that waited while a lower-class job was bound (priority inversions)",
         lambda r: f"{r['high_waited_behind_lower']} of {r['high_jobs']}"),
        ("GPU-seconds idle while jobs waited", lambda r: f"{r['idle_gpu_s_while_waiting']:.0f}"),
        ("jobs ended", lambda r: f"{r['ended']} of {len(jobs)}"),
        ("makespan s (first create -> last Succeeded)", lambda r: f"{r['makespan_s']:.0f}"),
        ("scheduling throughput, pods bound per second (burst)", lambda r: f"{r['binds_per_s']:.1f}"),
        ("wall time of the mode s", lambda r: f"{r['wall_s']:.0f}")]
    modes = list(results)
    head = ["| figure | " + " | ".join(modes) + " |", "|---|" + "---:|" * len(modes)]
    return "\n".join(head + [f"| {label} | " + " | ".join(f(results[m]) for m in modes) + " |"
                             for label, f in figures])


def main(argv: list[str] | None = None) -> int:
    import random
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--span-s", type=float, default=180.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--burst", type=int, default=64)
    ap.add_argument("--drain-s", type=float, default=600.0)
    ap.add_argument("--modes", default="gpushepherd,kueue")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    modes = a.modes.split(",")
    need = ("kube-scheduler", "kueue", "kueue-crds") if "kueue" in modes else ()
    why = kubecluster.unavailable(need)
    if why:
        print(f"k8s_compare: cannot run: {why}", file=sys.stderr)
        return 2
    jobs = workload(a.jobs, a.span_s, a.seed)
    rng = random.Random(a.seed + 1)
    teams = {j.name: rng.choice(TEAMS) for j in jobs}
    results, failed = {}, {}
    with tempfile.TemporaryDirectory(prefix="k8s-compare-") as tmp:
        for mode in modes:
            print(f"k8s_compare: mode {mode} ({len(jobs)} jobs over {a.span_s:.0f} s on {a.nodes} x 8 GPUs) ...",
                  file=sys.stderr, flush=True)
            try:
                results[mode] = run_mode(mode, jobs, teams, a.nodes, a.burst, Path(tmp) / mode, a.drain_s)
            except Exception as exc:  # noqa: BLE001 - report the mode as blocked, with its error, and go on
                failed[mode] = f"{type(exc).__name__}: {exc}"[:2000]
                print(f"k8s_compare: mode {mode} failed: {failed[mode]}", file=sys.stderr, flush=True)
    if results:
        print(table(results, jobs))
    for mode, why in failed.items():
        print(f"\nmode {mode}: blocked: {why}")
    if a.json:
        a.json.write_text(json.dumps({"results": results, "failed": failed}, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
