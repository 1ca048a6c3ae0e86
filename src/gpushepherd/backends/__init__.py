"""Where jobs really run (design note 013): the interface every backend implements.

The daemon (``gpushepherd.daemon.server``) drives a backend only through ``Backend``;
the core never knows which one runs a job. Implementations: ``LocalBackend``
(``gpushepherd.daemon.local``: process groups on this server) and ``SlurmBackend``
(``gpushepherd.backends.slurm``), ``RayBackend`` (``gpushepherd.backends.ray``) and
``KubernetesBackend`` (``gpushepherd.backends.kubernetes``, note 016).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpushepherd.model.placement import Placement


#: the backends ``make_backend`` knows
BACKENDS = ("local", "slurm", "ray", "kubernetes")


class BackendError(RuntimeError):
    """The engine refused or failed a command; ``str()`` names the command and its error."""


@dataclass(frozen=True, slots=True)
class EngineNode:
    """One node as the engine reports it.

    Attributes:
        name: the engine's node name (must equal the policy's node name).
        gpu_type: GPU type (Slurm: the GRES type, ``a100``); '' when untyped.
        gpus: GPU count.
        memory_mib: the node's memory in MiB (0: unknown).
        labels: ``(key, value)`` pairs (Slurm features: ``(feature, "")``).
        state: the engine's word for it (``idle``, ``mixed``, ``allocated``, ``down`` ...).
    """

    name: str
    gpu_type: str
    gpus: int
    memory_mib: int = 0
    labels: tuple[tuple[str, str], ...] = ()
    state: str = ""


class Handle(Protocol):
    """A started run: ``pid`` is the engine's id of it (a process group, a Slurm job
    id), stored in the jobs table's ``pid`` column; ``start`` tells a reused id
    (``None`` where ids are not reused)."""

    job_id: str
    run: int
    pid: int
    start: str | None


class Backend(Protocol):
    """What the daemon needs from an engine (note 013). Runs are keyed by job id: a job
    has at most one live run."""

    #: ``local``, ``slurm``, ``ray``, ``kubernetes``
    kind: str

    def discover(self) -> list[EngineNode]:
        """The engine's nodes, sorted by name.

        Raises:
            BackendError: the engine cannot be asked.
        """

    def start(self, job_id: str, run: int, argv: list[str], *, shell: bool, env: dict[str, str], cwd: str,
              placement: Placement, time_limit_s: float | None = None) -> Handle:
        """Start run ``run`` of a job on ``placement`` (``time_limit_s``: seconds after
        which the engine may end it itself, a backstop behind the core's own stop).

        Raises:
            OSError, BackendError: it could not be started (the daemon records the run
                as failed); ValueError: the placement cannot be expressed to the engine.
        """

    def signal(self, job_id: str, sig: int) -> None:
        """Send ``sig`` to every process of the job's run (nothing if it is gone)."""

    def kill(self, job_id: str) -> None:
        """End the job's run at once (its grace period is over, or it was cancelled)."""

    def exits(self) -> list[tuple[str, int | None]]:
        """Runs that ended since the last call: ``(job id, exit code)``; a signal S is
        ``-S``; ``None`` for a run that ended without an exit code: lost, or ended by
        ``kill`` - a backend whose ``kill`` leaves no exit code lists those job ids in a
        ``killed_ends`` set (the local one does), so that the daemon logs them as the
        cancel or grace period's end they were, at INFO, not as lost runs."""

    def attach(self, job_id: str, run: int, pid: int | None, start: str | None) -> Handle | None:
        """Re-attach to a run an earlier server started (``pid``, ``start`` as recorded;
        ``pid`` ``None``: never recorded, look the run up). ``None``: the run is gone
        and left no exit code (lost)."""

    def running(self, job_id: str) -> bool:
        """Whether the job's attached run still runs (has not ended)."""

    def run_dir(self, job_id: str, run: int) -> Path:
        """The run's directory: ``stdout``, ``stderr``, ``exit``."""

    def checkpoint_dir(self, job_id: str) -> Path:
        """``SHEPHERD_CHECKPOINT_DIR`` of the job, kept across runs and requeues."""


class RunFiles:
    """The data directory's layout, the same for every backend (on a cluster the
    directory is shared): ``runs/<job>/<run>/`` (``stdout``, ``stderr``, ``exit``) and
    ``checkpoints/<job>/`` (``SHEPHERD_CHECKPOINT_DIR``, kept across runs)."""

    data_dir: Path

    def run_dir(self, job_id: str, run: int) -> Path:
        """``<data>/runs/<job>/<run>``: the run's stdout, stderr and exit file."""
        return Path(os.path.join(self.data_dir, "runs", job_id, str(run)))  # one Path, not three joins (note 032)

    def checkpoint_dir(self, job_id: str) -> Path:
        """``<data>/checkpoints/<job>``: ``SHEPHERD_CHECKPOINT_DIR``, kept across runs."""
        return self.data_dir / "checkpoints" / job_id

    def prepare_run(self, job_id: str, run: int) -> tuple[Path, Path, Path]:
        """Create the run's and the checkpoint's directories, remove a stale exit file;
        returns ``(run dir, checkpoint dir, exit file)``."""
        rdir, ckpt = self.run_dir(job_id, run), self.checkpoint_dir(job_id)
        rdir.mkdir(parents=True, exist_ok=True)
        ckpt.mkdir(parents=True, exist_ok=True)
        exit_file = rdir / "exit"
        exit_file.unlink(missing_ok=True)
        return rdir, ckpt, exit_file


def read_exit_code(exit_file: Path) -> int | None:
    """The code a runner wrote to ``exit_file`` (``{"code": N}``), ``None`` when it is
    missing or unreadable."""
    try:
        return int(json.loads(exit_file.read_text())["code"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def package_root() -> str:
    """The directory that holds the ``gpushepherd`` package (what the runner's
    ``PYTHONPATH`` starts with)."""
    return str(Path(__file__).resolve().parents[2])


def contract_env(job_id: str, run: int, ckpt: Path, share: str, env: dict[str, str],
                 inherit: bool = True) -> dict[str, str]:
    """The variables of the checkpoint contract (note 008) every backend gives a job, and
    the ``PYTHONPATH`` that lets the runner import gpushepherd (this package's root
    first, then the job's own or - ``inherit`` - the server's)."""
    from gpushepherd.daemon.local import REQUEUE_EXIT_CODE

    pkg_root = package_root()
    theirs = env.get("PYTHONPATH") or (os.environ.get("PYTHONPATH") if inherit else None)
    return {
        "SHEPHERD_JOB_ID": job_id,
        "SHEPHERD_RUN": str(run),
        "SHEPHERD_CHECKPOINT_DIR": str(ckpt),
        "SHEPHERD_REQUEUE_EXIT_CODE": str(REQUEUE_EXIT_CODE),
        "SHEPHERD_GPU_SHARE": share,
        "PYTHONPATH": os.pathsep.join(p for p in (pkg_root, theirs) if p),
    }


def node_mismatches(policy_nodes, engine_nodes: list[EngineNode]) -> list[str]:
    """Where the policy's nodes (``model.Node``: name, gpus, gpu_type) and the engine's
    differ, each naming both sides: a policy node the engine lacks, a GPU count or type
    that differs (types compared case-insensitively; an untyped engine node matches any
    type). Engine nodes the policy does not name are ignored (gpushepherd uses only its
    own). Empty: they match."""
    by_name = {n.name: n for n in engine_nodes}
    out = []
    for node in policy_nodes:
        e = by_name.get(node.name)
        if e is None:
            names = ", ".join(sorted(by_name)) or "none"
            out.append(f"node {node.name!r} of the policy is not in the engine (its nodes: {names})")
            continue
        if e.gpus != node.gpus:
            out.append(f"node {node.name!r}: the policy says {node.gpus} GPUs, the engine has {e.gpus}")
        if e.gpu_type and e.gpu_type.lower() != node.gpu_type.lower():
            out.append(f"node {node.name!r}: the policy says GPU type {node.gpu_type!r}, the engine {e.gpu_type!r}")
    return out


def make_backend(kind: str, data_dir: Path, *, partition: str = "shepherd", ray_address: str = "auto",
                 k8s: dict | None = None) -> Backend:
    """The backend named ``kind`` (``local``, ``slurm``, ``ray`` or ``kubernetes``) for
    ``data_dir`` (``partition``: Slurm's; ``ray_address``: the Ray cluster's, ``auto`` as
    ``ray.init``; ``k8s``: ``KubernetesBackend``'s keyword arguments).

    Raises:
        ValueError: an unknown kind (names the allowed ones).
    """
    if kind == "local":
        from gpushepherd.daemon.local import LocalBackend
        return LocalBackend(data_dir)
    if kind == "slurm":
        from gpushepherd.backends.slurm import SlurmBackend
        return SlurmBackend(data_dir, partition=partition)
    if kind == "ray":
        from gpushepherd.backends.ray import RayBackend
        return RayBackend(data_dir, address=ray_address)
    if kind == "kubernetes":
        from gpushepherd.backends.kubernetes import KubernetesBackend
        return KubernetesBackend(data_dir, **(k8s or {}))
    raise ValueError(f"backend: {kind!r} is not allowed: {', '.join(BACKENDS[:-1])} or {BACKENDS[-1]}")
