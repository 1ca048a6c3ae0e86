"""``shepherd demo``: a real server, real processes, the seed's mixed workload.

It starts a server (the reconcile loop and the HTTP API on a free loopback port) on a
temporary data directory under the bundled ``demo-server-policy.yaml`` (the small-team
policy with times shortened), submits over HTTP, as users would, the workload of the
seed document, shows the live queue and the GPU map while it runs, and ends with the
per-team usage table. The script of the workload (seconds from the start):

* 0 - ``ml-platform`` starts its inference service (production inference, 2 GPUs);
  ``research`` a checkpointing training job (4 GPUs); ``alice`` a notebook (sandbox,
  1 GPU) she then leaves idle; ``data`` a chunked batch job (an array of 6 chunks, one
  at a time), whose chunk 3 fails once.
* 8 - a burst of inference traffic: ``ml-platform`` needs 4 more GPUs at once. The
  server is full, so the core preempts the training job (lower priority, preemptible):
  it gets SIGTERM, saves its checkpoint and exits 85; it is requeued, and resumes from
  its checkpoint when the burst is over.
* the notebook's GPU stays idle and it is stopped (idle auto-stop, where the policy
  and the inventory provide it); the failed chunk is retried.

Every check the demo makes is printed at the end; the command fails (exit 1) when one
of them did not hold.

With ``backend="slurm"`` the same server runs the same workload through the Slurm
backend on a fake Slurm cluster of one 8-GPU node (``fake1``) that the demo starts in
its data directory and stops at the end (design note 013, "Bench and demo on Slurm").
Slurm nodes give no GPU samples, so idle auto-stop cannot happen there: that check
reads ``n/a`` and the demo cancels the idle notebook once the rest has ended.
"""

from __future__ import annotations

import logging
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable

TIMELINE_NOTE = "seconds since the demo started"
HOLDING = ("RUNNING", "PREEMPTING", "STOPPING")


def demo_policy_path() -> Path:
    """The bundled policy of the demo (a file inside the installed package)."""
    return Path(str(resources.files("gpushepherd") / "data" / "demo-server-policy.yaml"))


DEMO_GPUS = 8
BACKENDS = ("local", "slurm")
NOT_AVAILABLE_UNDER_SLURM = "not available under Slurm: idle auto-stop needs GPU samples, which Slurm nodes do not give"


def slurm_policy(data_dir: Path) -> Path:
    """The demo's policy on the fake Slurm cluster: its node renamed ``fake1``, GPU
    type ``A100`` (the fake cluster's GRES type); written into ``data_dir``."""
    import yaml

    policy = yaml.safe_load(demo_policy_path().read_text())
    policy["cluster"]["nodes"][0].update(name="fake1", gpu_type="A100")
    path = Path(data_dir) / "demo-policy-slurm.yaml"
    path.write_text(yaml.safe_dump(policy, sort_keys=False))
    return path


def real_gpus_policy(data_dir: Path, say: Callable[[str], None] | None = None) -> tuple[Path, str]:
    """The demo's policy and inventory kind: the bundled policy on a static 8-GPU node,
    or - when NVML finds at least 8 GPUs (all of one model, none in MIG mode) - the same
    policy on this machine's GPUs (``nvml``). Returns ``(policy file, inventory kind)``."""
    import yaml

    from gpushepherd.gpu.inventory import type_name
    from gpushepherd.gpu.nvml import NvmlInventory, nvml_unavailable

    if nvml_unavailable() is not None:
        return demo_policy_path(), "static"
    inv = NvmlInventory()
    try:
        found = inv.discover()
    finally:
        inv.close()
    gpus = found.gpus
    names = sorted({g.name for g in gpus})
    if len(gpus) < DEMO_GPUS or len(names) != 1 or any(g.mig_enabled for g in gpus):
        if say:
            say(f"NVML found {len(gpus)} GPU(s) ({', '.join(names)}): the demo's workload needs {DEMO_GPUS} GPUs of "
                "one model without MIG, so it runs on a static 8-GPU node")
        return demo_policy_path(), "static"
    policy = yaml.safe_load(demo_policy_path().read_text())
    policy["cluster"]["nodes"] = [{"name": "local", "gpus": len(gpus), "gpu_type": type_name(names[0]),
                                   "gpu_mem_mib": min(g.memory_mib for g in gpus)}]
    path = Path(data_dir) / "demo-policy.yaml"
    path.write_text(yaml.safe_dump(policy, sort_keys=False))
    if say:
        say(f"NVML found {len(gpus)} x {names[0]}: the demo runs on this machine's GPUs")
    return path, "nvml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Submission:
    """One submission of the script: at ``at`` seconds, ``body`` to ``POST /jobs``."""

    at: float
    name: str
    body: dict[str, Any]
    id: str | None = None


@dataclass
class DemoResult:
    """What the demo saw: job views at the end, the checks, the wall time (s)."""

    jobs: list[dict]
    #: (name, True passed | False failed | None not available on this backend, detail)
    checks: list[tuple[str, bool | None, str]] = field(default_factory=list)
    wall_s: float = 0.0
    usage: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(ok is not False for _name, ok, _detail in self.checks)


def workload(cwd: str, python: str = sys.executable) -> list[Submission]:
    """The seed's mixed workload as submissions (see the module docstring)."""
    job = [python, "-m", "gpushepherd.daemon.demo_jobs"]
    return [
        Submission(0, "inference-api", {"class": "production-inference", "team": "ml-platform", "user": "ops",
                                        "gpus": 2, "command": [*job, "inference", "50"], "cwd": cwd}),
        Submission(0, "train-llm", {"class": "training", "team": "research", "user": "bob", "gpus": 4,
                                    "checkpointable": True, "command": [*job, "train", "24"], "cwd": cwd}),
        Submission(0, "notebook", {"class": "sandbox", "team": "research", "user": "alice", "gpus": 1,
                                   "command": [*job, "notebook"], "cwd": cwd}),
        Submission(0, "embed-batch", {"class": "batch", "team": "data", "user": "carol", "gpus": 1,
                                      "array": "0-5%1", "max_retries": 2, "command": [*job, "chunk", "3", "3"],
                                      "cwd": cwd}),
        Submission(8, "inference-burst", {"class": "production-inference", "team": "ml-platform", "user": "ops",
                                          "gpus": 4, "command": [*job, "inference", "14"], "cwd": cwd}),
    ]


class DemoServer:
    """A server in this process: the daemon's loop and uvicorn on a free port."""

    def __init__(self, data_dir: Path, policy: Path, poll_s: float = 0.1, **daemon_kw: Any):
        from gpushepherd.daemon.server import Daemon

        self.daemon = Daemon(data_dir, None, policy, poll_s=poll_s, **daemon_kw)
        if self.daemon.backend.kind == "local":
            # a demo on this machine: its users are names, not Unix users - every job runs
            # as whoever runs the demo, root too (a single-user server, note 023)
            from gpushepherd.daemon import runas

            self.daemon.backend.run_as = runas.run_as({runas.RUN_AS_ENV: "server"})
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "DemoServer":
        import uvicorn

        from gpushepherd.daemon.api import make_app

        self.daemon.start(listen=f"http://127.0.0.1:{self.port}")  # the first log line says where (note 019)
        config = uvicorn.Config(make_app(self.daemon), host="127.0.0.1", port=self.port, log_level="warning",
                                proxy_headers=False)  # a caller's address is its socket's (note 087)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="shepherd-demo-api", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                self.__exit__(None, None, None)
                raise RuntimeError("the demo's API server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        # cancel what still runs (an interrupted demo): no process outlives the demo
        with self.daemon.lock:
            live = [j.id for j in self.daemon.sched.jobs.values() if not j.state.terminal]
        for job_id in live:
            try:
                self.daemon.cancel(job_id, timeout=10)
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
        deadline = time.monotonic() + 10
        backend = self.daemon.backend
        while (getattr(backend, "procs", None) or getattr(backend, "runs", None)) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.daemon.stop()


def gpu_seconds(view: dict, end: float) -> float:
    """GPU-seconds a job held: the time of each interval in which its state held GPUs
    (RUNNING, PREEMPTING, STOPPING), times its GPUs (a share counts as one GPU)."""
    total, since = 0.0, None
    for h in view.get("history", []):
        if h["to"] in HOLDING and since is None:
            since = h["t"]
        elif h["to"] not in HOLDING and since is not None:
            total += h["t"] - since
            since = None
    if since is not None:
        total += end - since
    return total * view["gpus"]


def run_demo(data_dir: Path, *, on_tick: Callable[[float, list[dict], list[dict]], None] | None = None,
             on_event: Callable[[float, str], None] | None = None, time_limit_s: float = 110.0,
             policy: Path | None = None, daemon_kw: dict | None = None, backend: str = "local") -> DemoResult:
    """Run the demo on ``data_dir``; returns what it saw.

    Args:
        backend: ``local`` (process groups here) or ``slurm`` (a fake Slurm cluster of
            one 8-GPU node, started in ``data_dir/slurm`` and stopped at the end;
            ``SLURM_CONF`` is not used).
        on_tick: called about twice a second with (seconds since start, job views,
            node views) for a live display.
        on_event: called with (seconds, text) for each state change of a job.
        time_limit_s: the demo gives up (and cancels what still runs) after this.

    Raises:
        ValueError: ``backend`` is not ``local`` or ``slurm``.
        BackendError: the fake Slurm cluster did not start (its script's output).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not allowed: {' or '.join(BACKENDS)}")
    data_dir = Path(data_dir).resolve()  # Slurm needs absolute paths (its config, the jobs' directories)
    work_dir = data_dir / "work"
    work_dir.mkdir(parents=True, exist_ok=True)
    subs = workload(str(work_dir))
    names: dict[str, str] = {}
    seen: dict[str, str] = {}
    kw = dict(daemon_kw or {})
    if backend == "slurm":
        return _run_on_slurm(data_dir, policy, kw, on_tick, on_event, time_limit_s)
    if policy is None:
        policy, kw["inventory"] = real_gpus_policy(data_dir, say=(lambda text: on_event(0.0, text)) if on_event
                                                   else None)
    kw.setdefault("sample_every", 1.0)
    # the server's log goes to <data>/server.log, not over the live display
    logger = logging.getLogger("gpushepherd")
    handler = logging.FileHandler(data_dir / "server.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    saved = (logger.level, logger.propagate)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        return _run(data_dir, subs, policy, kw, on_tick, on_event, time_limit_s, names, seen)
    finally:
        logger.removeHandler(handler)
        handler.close()
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


def _run_on_slurm(data_dir: Path, policy: Path | None, kw: dict, on_tick, on_event,
                  time_limit_s: float) -> DemoResult:
    """The demo through the Slurm backend on a fake cluster of its own."""
    import os

    from gpushepherd.backends.fakeslurm import FakeSlurmCluster

    say = (lambda text: on_event(0.0, text)) if on_event else (lambda text: None)
    cluster = FakeSlurmCluster(data_dir / "slurm", nodes=1)
    say(f"starting a fake Slurm cluster (one 8-GPU node, fake1) in {cluster.dir}")
    old = os.environ.get("SLURM_CONF")
    with cluster:
        os.environ["SLURM_CONF"] = str(cluster.conf)  # the backend's sbatch/squeue and the jobs read it
        try:
            kw.update(backend="slurm", slurm_partition="shepherd")
            return run_demo(data_dir, on_tick=on_tick, on_event=on_event, time_limit_s=time_limit_s,
                            policy=policy or slurm_policy(data_dir), daemon_kw=kw)
        finally:
            if old is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = old
            say("stopping the fake Slurm cluster")


def _run(data_dir: Path, subs: list[Submission], policy: Path, kw: dict, on_tick, on_event, time_limit_s: float,
         names: dict[str, str], seen: dict[str, str]) -> DemoResult:
    import httpx

    started = time.time()
    on_slurm = kw.get("backend") == "slurm"
    with DemoServer(data_dir, policy, **kw) as server, \
            httpx.Client(base_url=server.url, timeout=30) as http:
        # the script's times count from a server that answers: counted from before its
        # start, a slow start (a fresh clone's first run, a busy machine) ate into the 8 s
        # before the burst (a 6 s start left 2 s; a 9 s one sent everything at once)
        t0 = time.time()
        todo = list(subs)
        notebook = next(s for s in subs if s.name == "notebook")
        cancelled: set[str] = set()
        while True:
            now = time.time() - t0
            while todo and todo[0].at <= now:
                s = todo.pop(0)
                r = http.post("/jobs", json=s.body)
                r.raise_for_status()
                s.id = r.json()["id"]
                names[s.id] = s.name
                if on_event:
                    on_event(now, f"submitted {s.name} (job {s.id}): {s.body['class']}, team {s.body['team']}, "
                                  f"{s.body['gpus']} GPU(s)" + (f", array {s.body['array']}" if "array" in s.body
                                                                else ""))
            jobs = http.get("/jobs", params={"children": "true"}).json()
            for v in jobs:
                label = names.get(v["id"]) or _child_label(v["id"], names)
                if seen.get(v["id"]) != v["state"]:
                    if on_event and v["id"] in seen or (on_event and v["state"] != "PENDING"):
                        why = f" ({v['reason']})" if v.get("reason") and v["state"] == "PENDING" else ""
                        on_event(now, f"{label} (job {v['id']}): {seen.get(v['id'], 'new')} -> {v['state']}{why}")
                    seen[v["id"]] = v["state"]
            if on_tick:
                on_tick(now, jobs, http.get("/nodes").json())
            if not todo and all(v["state"] in _ENDED for v in jobs):
                break
            if on_slurm and not todo and notebook.id not in cancelled and all(v["state"] in _ENDED for v in jobs if v["id"] != notebook.id):
                # no GPU samples under Slurm: nothing would ever stop the idle notebook
                http.post(f"/jobs/{notebook.id}/cancel").raise_for_status()
                cancelled.add(notebook.id)
                if on_event:
                    on_event(now, f"notebook (job {notebook.id}) cancelled by the demo: {NOT_AVAILABLE_UNDER_SLURM}")
            if now > time_limit_s:
                if on_event:
                    on_event(now, f"time limit of the demo ({time_limit_s:.0f} s) reached: cancelling what is left")
                break
            time.sleep(0.5)
        end = time.time()
        views = {v["id"]: http.get(f"/jobs/{v['id']}", params={"history": "true"}).json()
                 for v in http.get("/jobs", params={"children": "true"}).json()}
        usage = http.get("/usage").json()["teams"]
    result = DemoResult(jobs=list(views.values()), wall_s=end - started, usage=usage)
    for v in result.jobs:
        v["name"] = names.get(v["id"]) or _child_label(v["id"], names)
        v["gpu_s"] = gpu_seconds(v, end) if "history" in v else 0.0
    result.checks = checks(subs, views, data_dir, on_slurm=on_slurm)
    return result


_ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "REJECTED")


def _child_label(job_id: str, names: dict[str, str]) -> str:
    head, _, rest = job_id.partition("_")
    return f"{names[head]}[{rest}]" if head in names and rest else job_id


def checks(subs: list[Submission], views: dict[str, dict], data_dir: Path,
           on_slurm: bool = False) -> list[tuple[str, bool | None, str]]:
    """What the demo promises, checked against the server's own views and logs
    (``on_slurm``: the idle auto-stop check is ``None``, not available)."""
    by = {s.name: views.get(s.id or "", {}) for s in subs}
    out = []
    train = by["train-llm"]
    preempted = train.get("preemptions", 0) >= 1
    runs = train.get("runs", 0)
    log = _all_output(data_dir, train.get("id", ""))
    resumed = "resuming from checkpoint" in log
    out.append(("training preempted, checkpointed, resumed and completed",
                preempted and resumed and train.get("state") == "COMPLETED",
                f"{train.get('preemptions', 0)} preemption(s), {runs} runs, state {train.get('state')}"
                + (", resumed from its checkpoint" if resumed else ", never resumed from a checkpoint")))
    burst = by["inference-burst"]
    out.append(("inference burst started at once by preemption",
                burst.get("state") == "COMPLETED" and burst.get("first_start") is not None
                and burst["first_start"] - burst["submit_time"] < 15,
                f"waited {(burst.get('first_start') or 0) - burst.get('submit_time', 0):.1f} s "
                "(the preempted job's grace period)"))
    api = by["inference-api"]
    out.append(("inference service never interrupted", api.get("state") == "COMPLETED" and api.get("runs") == 1,
                f"{api.get('runs')} run(s), state {api.get('state')}"))
    arr = by["embed-batch"]
    out.append(("batch chunks all done, the failed one retried",
                arr.get("state") == "COMPLETED" and arr.get("retries_used", 0) >= 1,
                f"{arr.get('done')}/{arr.get('tasks')} done, {arr.get('retries_used', 0)} retry"))
    nb = by["notebook"]
    if on_slurm:
        out.append(("idle notebook stopped", None, f"{NOT_AVAILABLE_UNDER_SLURM} (note 013); the demo cancelled "
                                                    f"it: state {nb.get('state')}"))
    else:
        out.append(("idle notebook stopped", nb.get("state") not in HOLDING + ("PENDING",),
                    f"state {nb.get('state')}: {_last_reason(nb)}"))
    return out


def _last_reason(view: dict) -> str:
    hist = view.get("history") or []
    return hist[-1]["reason"] if hist and hist[-1].get("reason") else ""


def _all_output(data_dir: Path, job_id: str) -> str:
    runs = data_dir / "runs" / job_id
    if not job_id or not runs.is_dir():
        return ""
    return "".join(p.read_text(errors="replace") for p in sorted(runs.glob("*/stdout")))


def temp_data_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="shepherd-demo-"))
