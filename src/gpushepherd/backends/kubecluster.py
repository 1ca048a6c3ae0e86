"""A real Kubernetes control plane on 127.0.0.1 with KWOK's fake GPU nodes (design note
016, "Test cluster"), for the tests, ``deploy/k8s/cluster.sh`` and ``bench/k8s_compare.py``.

The binaries come from ``deploy/k8s/build.sh`` (Go modules, built once into
``~/.cache/gpushepherd/k8s/bin`` or ``$GPUSHEPHERD_K8S_CACHE/bin``): etcd,
kube-apiserver, kube-controller-manager, KWOK, and for the Kueue comparison
kube-scheduler and Kueue. Certificates and keys are throwaway ones made with
``openssl`` in the cluster's directory; every component listens on 127.0.0.1 only.

    python -m gpushepherd.backends.kubecluster start DIR [--nodes 2]   # prints the kubeconfig's path
    python -m gpushepherd.backends.kubecluster stop DIR
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

from gpushepherd.backends import BackendError
from gpushepherd.backends.fakeslurm import free_ports

#: the control plane's binaries the tests need; kube-controller-manager is started when
#: built (Jobs, garbage collection, service accounts), kube-scheduler and kueue on request
CORE_BINARIES = ("etcd", "kube-apiserver", "kwok")
#: starts of one cluster: a component that finds its port taken (``address already in
#: use``: another cluster starting on this machine, or an outgoing connection's ephemeral
#: port) makes the start begin again on fresh ports, every process of the try stopped
START_TRIES = 3
#: the longest a start waits for another cluster of this machine to finish starting
#: (``start_lock``), seconds
START_LOCK_WAIT_S = 600.0
#: what a Go component's log says when its port is taken
PORT_TAKEN = "address already in use"
#: seconds a probe of the API server (``_wait``'s) may take: a port that accepts and never
#: answers (a socket another process listens on) must not hold a wait past its timeout
PROBE_TIMEOUT_S = 5

log = logging.getLogger("gpushepherd.kubecluster")


class PortTaken(BackendError):
    """A component of the cluster exited because a port it was given was taken."""


@contextmanager
def start_lock(timeout: float = START_LOCK_WAIT_S) -> Iterator[None]:
    """Hold ``start.lock`` in the cache directory (``flock``: released when the process
    ends, whatever the way) while a cluster picks its ports and its components bind them,
    so that two clusters starting at once on one machine (two test runs) never pick the
    same ports; waits at most ``timeout`` seconds for another start.

    Raises:
        BackendError: another start held it for ``timeout`` seconds (its pid named).
    """
    path = cache_dir() / "start.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        end = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= end:
                    f.seek(0)
                    raise BackendError(f"kubernetes test cluster: another cluster start (pid {f.read().strip() or '?'}) "
                                       f"held {path} for {timeout:.0f} s") from None
                time.sleep(0.2)
        try:
            f.seek(0)
            f.truncate()
            f.write(str(os.getpid()))
            f.flush()
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def cache_dir() -> Path:
    """Where ``deploy/k8s/build.sh`` puts the binaries (``bin/``)."""
    return Path(os.environ.get("GPUSHEPHERD_K8S_CACHE") or Path.home() / ".cache" / "gpushepherd" / "k8s")


def binary(name: str) -> Path:
    return cache_dir() / "bin" / name


def unavailable(extra: tuple[str, ...] = ()) -> str:
    """Why a cluster cannot start here ('' when it can): a binary not built, no openssl,
    no ``kubernetes`` Python client."""
    missing = [b for b in (*CORE_BINARIES, *extra) if not os.access(binary(b), os.X_OK)]
    if missing:
        return (f"not built: {', '.join(missing)} (in {cache_dir() / 'bin'}; run deploy/k8s/build.sh, which needs "
                "Go and the Go module proxy)")
    if shutil.which("openssl") is None:
        return "no `openssl` on PATH (for the cluster's throwaway certificates)"
    import importlib.util
    if importlib.util.find_spec("kubernetes") is None:
        return "the `kubernetes` Python client is not installed (pip install 'gpushepherd[kubernetes]')"
    return ""


def stages_path() -> Path:
    """KWOK's stages for the fake nodes and pods (``data/k8s/kwok-stages.yaml``)."""
    return Path(str(resources.files("gpushepherd") / "data" / "k8s" / "kwok-stages.yaml"))


def _openssl(*args: str, cwd: Path) -> None:
    p = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise BackendError(f"openssl {' '.join(args[:2])} failed: {p.stderr.strip()}")


def make_certs(d: Path) -> None:
    """A CA, the API server's serving certificate (127.0.0.1, localhost), an admin
    client certificate (``system:masters``) and a service-account key pair, in ``d``."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "30",
             "-subj", "/CN=gpushepherd-test-ca", cwd=d)
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,"
                                  "DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, subj, ext in (("server", "/CN=kube-apiserver", "server.ext"),
                            ("admin", "/O=system:masters/CN=admin", "client.ext")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj",
                 subj, cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "30", "-extfile", ext, cwd=d)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)


def kubeconfig_text(server: str, ca: Path, cert: Path | None = None, key: Path | None = None,
                    token: str | None = None) -> str:
    """A kubeconfig for ``server`` with a client certificate or a bearer token."""
    user = {"token": token} if token else {"client-certificate": str(cert), "client-key": str(key)}
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "test", "user": user}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}]}, indent=1)


class KubeCluster:
    """Start (``with`` or ``start()``) and stop a control plane in ``directory``:
    etcd, kube-apiserver, kube-controller-manager and KWOK (``scheduler=True`` adds
    kube-scheduler). Nodes are added with ``add_node``. ``kubeconfig``: the admin's.

    Raises:
        BackendError: a binary is missing or a component did not come up (its log named).
    """

    def __init__(self, directory: Path, scheduler: bool = False):
        self.dir = Path(directory).resolve()
        self.scheduler = scheduler
        self.procs: dict[str, subprocess.Popen] = {}
        self.kubeconfig = self.dir / "admin.kubeconfig"
        self.port = 0
        self.timings: dict[str, float] = {}
        self._log_at: dict[str, int] = {}  # where each component's log of this try begins

    def __enter__(self) -> "KubeCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def _spawn(self, name: str, args: list[str]) -> None:
        path = self.dir / f"{name}.log"
        self._log_at[name] = path.stat().st_size if path.exists() else 0
        with open(path, "ab") as out:
            self.procs[name] = subprocess.Popen([str(binary(name)), *args], stdout=out, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, start_new_session=True)
        (self.dir / f"{name}.pid").write_text(str(self.procs[name].pid))

    def _log_tail(self, name: str) -> str:
        """The last 3000 characters of what ``name`` logged in this try."""
        with open(self.dir / f"{name}.log", "rb") as f:
            f.seek(self._log_at.get(name, 0))
            return f.read().decode(errors="replace")[-3000:]

    def _wait(self, what: str, ok, timeout: float = 120.0) -> None:
        """Poll ``ok`` (each call bounded: ``PROBE_TIMEOUT_S``) until it is true, at most
        ``timeout`` seconds; a component that exits ends the wait at once (``PortTaken``
        when its port was taken)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    tail = self._log_tail(name)
                    kind = PortTaken if PORT_TAKEN in tail else BackendError
                    raise kind(f"kubernetes test cluster: {name} exited with {p.returncode}: {tail}")
            try:
                if ok():
                    return
            except Exception:  # noqa: BLE001 - not up yet
                pass
            time.sleep(0.2)
        raise BackendError(f"kubernetes test cluster: {what} not up after {timeout:.0f} s (logs in {self.dir})")

    def start(self) -> "KubeCluster":
        """Start the control plane, bounded: under ``start_lock`` (one start at a time on
        this machine), at most ``START_TRIES`` tries, each on fresh ports, when a component
        exits with its port taken; every wait has a timeout. Whatever fails, every process
        this start launched is stopped before the error is raised.

        Raises:
            BackendError: a binary is missing, a component did not come up (its log
                named), its ports were taken ``START_TRIES`` times.
        """
        why = unavailable(("kube-scheduler",) if self.scheduler else ())
        if why:
            raise BackendError(f"kubernetes test cluster: {why}")
        t0 = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        pki = self.dir / "pki"
        if not (pki / "sa.pub").exists():
            make_certs(pki)
        try:
            with start_lock():
                attempt = 1
                while True:
                    try:
                        return self._start_once(t0)
                    except PortTaken as exc:
                        self.stop()
                        shutil.rmtree(self.dir / "etcd", ignore_errors=True)  # it names the old peer port
                        if attempt >= START_TRIES:
                            raise BackendError(f"{exc} (ports taken in each of {START_TRIES} tries)") from None
                        log.warning("kubernetes test cluster: a port was taken (try %d of %d); again on fresh ports",
                                    attempt, START_TRIES)
                        attempt += 1
        except BaseException:
            self.stop()  # nothing this start launched outlives it
            raise

    def _start_once(self, t0: float) -> "KubeCluster":
        """One try of ``start`` on fresh ports (``PortTaken`` when a component found its
        port taken)."""
        pki = self.dir / "pki"
        base = free_ports(8)
        etcd_client, etcd_peer, self.port, kcm_port, kwok_port, sched_port = range(base, base + 6)
        (self.dir / "ports.json").write_text(json.dumps({"apiserver": self.port, "etcd": etcd_client}))
        self.kubeconfig.write_text(kubeconfig_text(self.server, pki / "ca.crt", pki / "admin.crt", pki / "admin.key"))
        self.timings["certs_s"] = time.monotonic() - t0
        self._spawn("etcd", [
            "--name=default", f"--data-dir={self.dir / 'etcd'}", f"--listen-client-urls=http://127.0.0.1:{etcd_client}",
            f"--advertise-client-urls=http://127.0.0.1:{etcd_client}",
            f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-cluster=default=http://127.0.0.1:{etcd_peer}", "--unsafe-no-fsync",
            "--quota-backend-bytes=2147483648", "--log-level=warn"])
        self._spawn("kube-apiserver", [
            f"--etcd-servers=http://127.0.0.1:{etcd_client}", f"--secure-port={self.port}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
            f"--tls-cert-file={pki / 'server.crt'}", f"--tls-private-key-file={pki / 'server.key'}",
            f"--client-ca-file={pki / 'ca.crt'}", f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--authorization-mode=Node,RBAC", "--service-cluster-ip-range=10.96.0.0/16", "--profiling=false",
            "--enable-priority-and-fairness=false", "--event-ttl=1h", "--v=1"])
        self._wait("kube-apiserver", self._healthy, timeout=180)
        self.timings["apiserver_s"] = time.monotonic() - t0
        kcm = os.access(binary("kube-controller-manager"), os.X_OK)
        if kcm:
            self._spawn("kube-controller-manager", [
                f"--kubeconfig={self.kubeconfig}", f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}", "--bind-address=127.0.0.1",
                f"--secure-port={kcm_port}",
                f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
                "--leader-elect=false", "--controllers=*,-nodeipam",
                "--concurrent-job-syncs=10", "--v=1"])
        else:  # what its service-account controller would make
            self.core().create_namespaced_service_account("default", {"metadata": {"name": "default"}})
        self._spawn("kwok", [
            f"--kubeconfig={self.kubeconfig}", "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake", "--node-ip=127.0.0.1",
            f"--server-address=127.0.0.1:{kwok_port}", f"--config={stages_path()}", "--node-lease-duration-seconds=40"])
        if self.scheduler:
            self._spawn("kube-scheduler", [
                f"--kubeconfig={self.kubeconfig}", f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}", "--bind-address=127.0.0.1",
                f"--secure-port={sched_port}", "--leader-elect=false", "--v=1"])
        self._wait("the default service account", self._default_sa, timeout=120)
        self.timings["ready_s"] = time.monotonic() - t0
        return self

    def api(self):
        """A ``kubernetes`` ApiClient for the admin."""
        from kubernetes import config
        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def core(self):
        from kubernetes import client
        return client.CoreV1Api(self.api())

    def _healthy(self) -> bool:
        # made by the API server's bootstrap once it serves
        self.core().read_namespace("default", _request_timeout=PROBE_TIMEOUT_S)
        return True

    def _default_sa(self) -> bool:
        self.core().read_namespaced_service_account("default", "default", _request_timeout=PROBE_TIMEOUT_S)
        return True

    def stop(self) -> None:
        """Stop every component this object started, by its pid: all but etcd, then etcd
        (an API server whose etcd went first waits for it; SIGKILL after 15 s)."""
        names = [n for n in reversed(list(self.procs)) if n != "etcd"] + ["etcd"] * ("etcd" in self.procs)
        for group in (names[:-1], names[-1:]):
            for name in group:
                if self.procs[name].poll() is None:
                    self.procs[name].terminate()
            for name in group:
                try:
                    self.procs[name].wait(timeout=15)
                except subprocess.TimeoutExpired:
                    self.procs[name].kill()
                    self.procs[name].wait()
                (self.dir / f"{name}.pid").unlink(missing_ok=True)  # `stop DIR` never signals a reused pid
        self.procs.clear()

    # -------------------------------------------------------------- nodes
    def add_node(self, name: str, gpus: int = 8, product: str = "A100", memory_mib: int = 81920,
                 labels: dict[str, str] | None = None, taints: list[str] | None = None,
                 mig: dict[str, int] | None = None, healthy_gpus: int | None = None) -> dict:
        """A KWOK node advertising what the NVIDIA device plugin and GPU Feature
        Discovery would: ``nvidia.com/gpu`` (``healthy_gpus``, default ``gpus`` minus
        the MIG GPUs' share), ``nvidia.com/mig-<profile>`` counts (``mig``), the GFD
        labels, ``taints`` (``key=value:Effect``). Returns the node as created."""
        mig = mig or {}
        labels = {"type": "kwok", "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": product,
                  "nvidia.com/gpu.memory": str(memory_mib), "nvidia.com/gpu.count": str(gpus),
                  "nvidia.com/mig.strategy": "mixed" if mig else "none", "kubernetes.io/hostname": name,
                  **(labels or {})}
        alloc = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(
            gpus if healthy_gpus is None else healthy_gpus)}
        alloc.update({f"nvidia.com/mig-{p}": str(n) for p, n in mig.items()})
        spec_taints = []
        for t in taints or []:
            kv, _, effect = t.partition(":")
            key, _, value = kv.partition("=")
            spec_taints.append({"key": key, "value": value or None, "effect": effect or "NoSchedule"})
        body = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": labels, "annotations": {"kwok.x-k8s.io/node": "fake",
                                                                              "node.alpha.kubernetes.io/ttl": "0"}},
                "spec": {"taints": spec_taints},
                "status": {"allocatable": alloc, "capacity": alloc, "phase": "Running"}}
        return self.core().create_node(body).to_dict()

    def wait_nodes_ready(self, names: list[str], timeout: float = 120.0) -> None:
        def ready() -> bool:
            nodes = {n.metadata.name: n for n in self.core().list_node(_request_timeout=PROBE_TIMEOUT_S).items}
            return all(n in nodes and any(c.type == "Ready" and c.status == "True"
                                          for c in nodes[n].status.conditions or []) for n in names)
        self._wait(f"nodes {', '.join(names)} Ready", ready, timeout)


def install_kueue_crds(api, timeout: float = 120.0) -> None:
    """Create Kueue's CRDs (``deploy/k8s/build.sh kueue-crds`` copies them into the
    cache) on the API server of ``api`` (an ApiClient) and wait until they are
    established; CRDs already there are kept.

    Raises:
        BackendError: the CRDs are not in the cache, or not established in time.
    """
    from kubernetes import client, utils
    from kubernetes.client.exceptions import ApiException

    files = sorted((cache_dir() / "kueue-crds").glob("*.yaml"))
    if not files:
        raise BackendError(f"Kueue's CRDs are not in {cache_dir() / 'kueue-crds'} (deploy/k8s/build.sh kueue-crds)")
    for f in files:
        try:
            utils.create_from_yaml(api, str(f))
        except utils.FailToCreateError as exc:
            if not all(isinstance(e, ApiException) and e.status == 409 for e in exc.api_exceptions):
                raise
    ext = client.ApiextensionsV1Api(api)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        crds = [d for d in ext.list_custom_resource_definition(_request_timeout=PROBE_TIMEOUT_S).items
                if d.spec.group == "kueue.x-k8s.io"]
        if crds and all(any(c.type == "Established" and c.status == "True" for c in (d.status.conditions or []))
                        for d in crds):
            return
        time.sleep(0.3)
    raise BackendError(f"Kueue's CRDs not established after {timeout:.0f} s")


def create_kueue_objects(api, objects: list[dict]) -> list[dict]:
    """Create ``shepherd policy export --kueue``'s objects (and the LocalQueues'
    namespaces); returns them as the API server stored them."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    out = []
    for o in objects:
        plural = o["kind"].lower() + ("es" if o["kind"].endswith("s") else "s")
        ns = o["metadata"].get("namespace")
        if ns:
            try:
                core.create_namespace({"metadata": {"name": ns}})
            except ApiException as exc:
                if exc.status != 409:
                    raise
            out.append(custom.create_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", ns, plural, o))
        else:
            out.append(custom.create_cluster_custom_object("kueue.x-k8s.io", "v1beta2", plural, o))
    return out


def _stop_dir(d: Path) -> None:
    for name in ("kueue", "kube-scheduler", "kwok", "kube-controller-manager", "kube-apiserver", "etcd"):
        f = d / f"{name}.pid"
        if f.exists():
            try:
                os.kill(int(f.read_text()), signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                pass
            f.unlink()


def main(argv: list[str]) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="kubecluster", description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=["start", "stop"])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--nodes", type=int, default=2, help="fake 8-GPU A100 nodes fake1..fakeN")
    ap.add_argument("--scheduler", action="store_true", help="also kube-scheduler")
    a = ap.parse_args(argv)
    if a.action == "stop":
        _stop_dir(a.dir.resolve())
        return 0
    c = KubeCluster(a.dir, scheduler=a.scheduler)
    try:
        c.start()
        names = [f"fake{i}" for i in range(1, a.nodes + 1)]
        for n in names:
            c.add_node(n, labels={"gpushepherd.io/pool": "default"})
        c.wait_nodes_ready(names)
    except BackendError as exc:
        c.stop()
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for p in c.procs.values():  # left running: `stop DIR` ends them by their pid files
        p.returncode = 0
    print(f"cluster up in {c.timings['ready_s']:.1f} s; export KUBECONFIG={c.kubeconfig}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
