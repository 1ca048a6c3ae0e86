"""Ray backend (design note 013, "Ray"): gpushepherd decides, Ray launches.

Through Ray's core API (plain ``ray``, imported only here; ``pip install
'gpushepherd[ray]'``):

* inventory: ``ray.nodes()`` - alive nodes, their ``GPU`` count, the GPU type from a
  ``gpu_type:<T>`` (the operator's) or ``accelerator_type:<T>`` (Ray's) resource (or the
  ``ray.io/accelerator-type`` label), named by their ``shepherd-node:<name>`` resource
  (else their hostname);
* a run is one detached named actor per placed node (``shepherd-<job>-<run>-<rank>`` in
  the namespace ``gpushepherd``) with ``num_gpus``, pinned with
  ``NodeAffinitySchedulingStrategy(soft=False)``, or a gang's bundle of a detached
  ``STRICT_SPREAD`` placement group whose bundles carry each node's pin resource; the
  actor (``ray_actor.RunActor``) runs ``gpushepherd.daemon.runner`` in its own process
  group, so the exit file lands in the (shared) data directory as with the other backends;
* signals: ``os.killpg`` inside the actor; the end of a grace period or a cancel:
  ``SIGKILL`` of the group, then ``ray.kill`` of the actor and removal of the group;
* exits: each rank's ``done()`` call (``ray.wait(timeout=0)``) and the exit files;
* re-attach after a controller restart: the actors by name (``runs/<job>/<run>/ray.json``
  lists the ranks).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import signal as _signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gpushepherd.backends import BackendError, EngineNode, RunFiles, contract_env, read_exit_code
from gpushepherd.model.placement import Placement

log = logging.getLogger("gpushepherd.daemon")

#: the Ray namespace of gpushepherd's actors and placement groups
NAMESPACE = "gpushepherd"
#: the custom resource naming a Ray node as a policy node: ``shepherd-node:<name>``
NODE_RESOURCE = "shepherd-node:"
#: how much of a node's pin resource each bundle of a gang asks for
PIN_AMOUNT = 0.001
#: seconds to wait for an actor to SIGKILL its job's process group before ``ray.kill``
KILL_WAIT_S = 10.0


def actor_name(job_id: str, run: int, rank: int) -> str:
    """The name of rank ``rank``'s actor of run ``run`` of a job."""
    return f"shepherd-{job_id}-{run}-{rank}"


def group_name(job_id: str, run: int) -> str:
    """The name of a gang run's placement group."""
    return f"shepherd-{job_id}-{run}"


def exit_file_of(rdir: Path, rank: int) -> Path:
    """Rank 0 writes ``exit`` (as on every backend), rank r ``exit.<r>``."""
    return rdir / ("exit" if rank == 0 else f"exit.{rank}")


def run_code(codes: list[int | None]) -> int | None:
    """A run's exit code from its ranks' (rank order; ``None``: ended without one):
    the first non-zero code, else 0 when every rank exited 0, else ``None`` (lost)."""
    for c in codes:
        if c is not None and c != 0:
            return c
    return 0 if all(c == 0 for c in codes) else None


def node_of(info: dict) -> EngineNode | None:
    """An alive node of ``ray.nodes()`` as an ``EngineNode`` (``None`` for a dead one).
    Its name: the ``shepherd-node:<name>`` resource, else the hostname."""
    if not info.get("Alive", info.get("alive")):
        return None
    res = info.get("Resources") or {}
    labels = {"ray.io/node-id": str(info.get("NodeID", "")), **{k: str(v) for k, v in (info.get("Labels") or {}).items()}}
    names = sorted(k.removeprefix(NODE_RESOURCE) for k in res if k.startswith(NODE_RESOURCE))
    name = names[0] if names else str(info.get("NodeManagerHostname") or info.get("NodeManagerAddress") or "")
    gpu_type = next((k.split(":", 1)[1] for prefix in ("gpu_type:", "accelerator_type:")
                     for k in sorted(res) if k.startswith(prefix)), labels.get("ray.io/accelerator-type", ""))
    return EngineNode(name, gpu_type, int(res.get("GPU", 0)), int(res.get("memory", 0)) // (1024 * 1024),
                      tuple(sorted(labels.items())), "alive")


@dataclass(slots=True)
class RayRun:
    """One run in Ray: ``pid`` is the first 60 bits of rank 0's actor id (hex prefix)."""

    job_id: str
    run: int
    pid: int
    rdir: Path
    ranks: int
    actors: dict[int, object] = field(default_factory=dict)  # rank -> actor handle
    pending: dict[object, int] = field(default_factory=dict)  # done() ref -> rank
    ended: dict[int, int | None] = field(default_factory=dict)  # rank -> done()'s code (None: the actor died)
    group: str | None = None
    start: str | None = None

    @property
    def exit_file(self) -> Path:
        return exit_file_of(self.rdir, 0)


class RayBackend(RunFiles):
    """Runs gpushepherd's jobs as Ray actors (``backends.Backend``, note 013 "Ray").

    Args:
        data_dir: the server's data directory; on a real cluster a path every Ray node
            mounts at the same place (logs, exit files, checkpoints).
        address: the Ray cluster (``ray.init(address=)``): ``auto`` (``RAY_ADDRESS`` or
            the cluster started on this machine), ``HOST:PORT``, ``ray://HOST:PORT``.

    Raises (from the first call that needs Ray):
        BackendError: ``ray`` is not installed, or the cluster cannot be reached.
    """

    kind = "ray"

    def __init__(self, data_dir: Path, address: str = "auto"):
        self.data_dir = Path(data_dir)
        self.address = address
        self.runs: dict[str, RayRun] = {}
        self.nodes: dict[str, dict] = {}  # policy node name -> {"id", "pin", "address"}, from discover()
        self._ray = None
        self._actor_cls = None

    # -------------------------------------------------------------- Ray itself
    def ray(self):
        """The ``ray`` module, connected to the cluster (once).

        Raises:
            BackendError: ``ray`` is missing or the cluster cannot be reached.
        """
        if self._ray is not None:
            return self._ray
        if importlib.util.find_spec("ray") is None:
            raise BackendError("ray: the `ray` package is not installed: pip install 'gpushepherd[ray]' "
                               "(ray>=2.9) to use --backend ray")
        import ray
        import ray.cloudpickle

        from gpushepherd.backends import ray_actor

        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        try:
            if not ray.is_initialized():
                ray.init(address=self.address, namespace=NAMESPACE, log_to_driver=False,
                         logging_level=logging.WARNING)
        except Exception as exc:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ValueError ...
            raise BackendError(f"ray: cannot connect to the Ray cluster at {self.address!r}: {exc}") from None
        ray.cloudpickle.register_pickle_by_value(ray_actor)  # the workers need not import gpushepherd
        self._actor_cls = ray.remote(ray_actor.RunActor)
        self._ray = ray
        return ray

    def discover(self) -> list[EngineNode]:
        """The cluster's alive nodes from ``ray.nodes()``, sorted by name.

        Raises:
            BackendError: Ray cannot be asked, or two alive nodes have the same name
                (both node ids named).
        """
        ray = self.ray()
        try:
            infos = ray.nodes()
        except Exception as exc:  # noqa: BLE001
            raise BackendError(f"ray: cannot list the nodes: {exc}") from None
        nodes: dict[str, EngineNode] = {}
        where: dict[str, dict] = {}
        for info in sorted(infos, key=lambda i: i.get("NodeID", "")):
            n = node_of(info)
            if n is None:
                continue
            if n.name in nodes:
                raise BackendError(f"ray: nodes {where[n.name]['id']} and {info['NodeID']} are both named {n.name!r};"
                                   f" give each a resource {NODE_RESOURCE}<name> (ray start --resources)")
            pin = NODE_RESOURCE + n.name
            if pin not in (info.get("Resources") or {}):
                pin = f"node:{info.get('NodeManagerAddress')}"
            nodes[n.name] = n
            where[n.name] = {"id": info["NodeID"], "pin": pin, "address": info.get("NodeManagerAddress", "")}
        self.nodes = where
        return [nodes[k] for k in sorted(nodes)]

    # -------------------------------------------------------------- the interface
    def start(self, job_id: str, run: int, argv: list[str], *, shell: bool, env: dict[str, str], cwd: str,
              placement: Placement, time_limit_s: float | None = None) -> RayRun:
        """Start run ``run`` of a job: one actor per placed node (``time_limit_s`` is not
        given to Ray, which has no time limit: the core's stop is the only one).

        Raises:
            ValueError: a part of a GPU (a share) was placed: Ray runs whole GPUs here.
            BackendError: Ray refused it, or a placed node is not in Ray.
        """
        if placement.share:
            raise ValueError(f"placement {placement}: the ray backend runs whole GPUs only "
                             f"(share {placement.share!r} is not supported)")
        self.ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import (NodeAffinitySchedulingStrategy,
                                                    PlacementGroupSchedulingStrategy)

        names = [n for n, _g in placement.parts]
        if any(n not in self.nodes for n in names):
            self.discover()
        missing = [n for n in names if n not in self.nodes]
        if missing:
            raise BackendError(f"ray: node(s) {', '.join(missing)} of placement {placement} are not in the Ray "
                               f"cluster (its nodes: {', '.join(sorted(self.nodes)) or 'none'})")
        rdir, ckpt, _exit = self.prepare_run(job_id, run)
        for rank in range(1, len(names)):
            exit_file_of(rdir, rank).unlink(missing_ok=True)
        (rdir / "ray.json").write_text(json.dumps({"ranks": len(names), "nodes": names}))
        runner = [sys.executable, "-m", "gpushepherd.daemon.runner", *(["--shell"] if shell else [])]
        base = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES" and not k.startswith("RAY_")}
        base.update(env)
        base.update(contract_env(job_id, run, ckpt, "", env))
        group = None
        if len(names) > 1:
            bundles = [{"GPU": float(len(g)), self.nodes[n]["pin"]: PIN_AMOUNT} for n, g in placement.parts]
            group = placement_group(bundles, strategy="STRICT_SPREAD", name=group_name(job_id, run),
                                    lifetime="detached")
        handle = RayRun(job_id, run, 0, rdir, len(names), group=group_name(job_id, run) if group else None)
        try:
            for rank, (node, gpus) in enumerate(placement.parts):
                renv = dict(base, SHEPHERD_NODE_RANK=str(rank), SHEPHERD_NNODES=str(len(names)),
                            SHEPHERD_MASTER_ADDR=self.nodes[names[0]]["address"])
                strategy = (PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank) if group
                            else NodeAffinitySchedulingStrategy(self.nodes[node]["id"], soft=False))
                actor = self._actor_cls.options(
                    name=actor_name(job_id, run, rank), namespace=NAMESPACE, lifetime="detached", num_cpus=0,
                    num_gpus=len(gpus), max_restarts=0, max_concurrency=4, scheduling_strategy=strategy,
                ).remote([*runner, str(exit_file_of(rdir, rank)), "--", *argv], renv, cwd, str(rdir / "stdout"),
                         str(rdir / "stderr"))
                handle.actors[rank] = actor
                handle.pending[actor.done.remote()] = rank
        except Exception as exc:  # noqa: BLE001 - a name taken, a bad option: undo what was made
            self._end(handle)
            raise BackendError(f"ray: cannot start job {job_id} run {run}: {exc}") from None
        actor_id = getattr(handle.actors[0], "_actor_id", None)
        if actor_id is not None:
            handle.start = actor_id.hex()
            handle.pid = int(handle.start[:15], 16)
        self.runs[job_id] = handle
        log.info("job %s run %d: Ray actor(s) %s on %s", job_id, run,
                 ", ".join(actor_name(job_id, run, r) for r in range(len(names))), placement)
        return handle

    def signal(self, job_id: str, sig: int) -> None:
        """Send ``sig`` to every rank's process group (``SIGKILL``: ``kill``)."""
        r = self.runs.get(job_id)
        if r is None:
            return
        if sig == _signal.SIGKILL:
            self.kill(job_id)
            return
        for rank in sorted(r.actors):
            if rank not in r.ended:
                r.actors[rank].signal.remote(int(sig))

    def kill(self, job_id: str) -> None:
        """SIGKILL every rank's process group, then end its actors and placement group
        (the run is reported by ``exits`` next)."""
        r = self.runs.get(job_id)
        if r is not None:
            self._end(r)

    def _end(self, r: RayRun) -> None:
        ray = self._ray
        refs = [a.signal.remote(int(_signal.SIGKILL)) for rank, a in sorted(r.actors.items()) if rank not in r.ended]
        if refs:  # the group first: ray.kill alone would leave the job running
            try:
                ray.wait(refs, num_returns=len(refs), timeout=KILL_WAIT_S)
            except Exception as exc:  # noqa: BLE001
                log.warning("job %s: Ray actors did not answer the kill: %s", r.job_id, exc)
        for _rank, a in sorted(r.actors.items()):
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        if r.group:
            from ray.util.placement_group import get_placement_group, remove_placement_group
            try:
                remove_placement_group(get_placement_group(r.group))
            except Exception:  # noqa: BLE001 - already gone
                pass

    def _update(self, r: RayRun) -> bool:
        """Collect the ranks that ended; whether the run is over (every rank ended, or
        one ended with a non-zero code or died)."""
        if r.pending:
            ray = self._ray
            ready, _ = ray.wait(list(r.pending), num_returns=len(r.pending), timeout=0)
            for ref in ready:
                rank = r.pending.pop(ref)
                try:
                    r.ended[rank] = int(ray.get(ref))
                except Exception:  # noqa: BLE001 - the actor died (killed, its node lost)
                    r.ended[rank] = None
        return not r.pending or any(c != 0 for c in r.ended.values())

    def _code(self, r: RayRun) -> int | None:
        codes = []
        for rank in range(r.ranks):
            code = read_exit_code(exit_file_of(r.rdir, rank))
            if code is None and rank in r.ended and r.ended[rank] is not None and r.ended[rank] >= 0:
                code = r.ended[rank]  # the runner ended by itself without writing (it could not start)
            codes.append(code)
        return run_code(codes)

    def exits(self) -> list[tuple[str, int | None]]:
        """Runs that ended: their code (``run_code`` of the ranks' exit files), ``None``
        when a rank ended without one (killed, its node lost); their actors and
        placement group are removed."""
        out = []
        for job_id in sorted(self.runs):
            r = self.runs[job_id]
            if self._update(r):
                code = self._code(r)
                self._end(r)
                del self.runs[job_id]
                log.info("job %s run %d ended in Ray: %s", job_id, r.run, "lost" if code is None else f"exit {code}")
                out.append((job_id, code))
        return out

    def attach(self, job_id: str, run: int, pid: int | None, start: str | None) -> RayRun | None:
        """Re-attach to a run an earlier server started: its actors by name (``pid`` and
        ``start`` are not needed). ``None`` when no actor of it lives and it left no exit
        file (lost).

        Raises:
            BackendError: Ray cannot be asked.
        """
        ray = self.ray()
        rdir = self.run_dir(job_id, run)
        try:
            ranks = int(json.loads((rdir / "ray.json").read_text())["ranks"])
        except (OSError, ValueError, KeyError):
            ranks = 1
        r = RayRun(job_id, run, pid or 0, rdir, ranks, start=start)
        if ranks > 1:
            r.group = group_name(job_id, run)
        for rank in range(ranks):
            try:
                actor = ray.get_actor(actor_name(job_id, run, rank), namespace=NAMESPACE)
            except ValueError:  # no such actor: it ended and was removed, or never started
                r.ended[rank] = None
                continue
            r.actors[rank] = actor
            r.pending[actor.done.remote()] = rank
        if not r.actors and not exit_file_of(rdir, 0).exists():
            return None
        self.runs[job_id] = r
        return r

    def running(self, job_id: str) -> bool:
        """Whether the job's attached run still runs in Ray (a rank's actor lives and
        its job has not ended)."""
        r = self.runs.get(job_id)
        return r is not None and not self._update(r)
