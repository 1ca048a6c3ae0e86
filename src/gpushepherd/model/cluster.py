"""Nodes: what a GPU server offers to the scheduler."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Node:
    """One GPU server.

    Attributes:
        name: unique node name (``gpu-001``); the tie-break key of placement after
            the node's position in the cluster list.
        gpus: number of physical GPUs (>= 1), indexed ``0 .. gpus-1``.
        gpu_type: GPU model, e.g. ``H100-80GB``; matched exactly by a job's
            ``gpu_types`` constraint.
        gpu_mem_mib: memory of each GPU in MiB.
        pool: node pool the node belongs to (``default`` when the policy names none).
        labels: ``(key, value)`` pairs, sorted by key, for node selectors.
        nvlink_islands: groups of GPU indices joined by NVLink; empty when unknown.
        gpu_uuids: each GPU's UUID by index (NVML's ``GPU-...``; empty when unknown).
        driver / cuda: NVIDIA driver and CUDA versions ('' when unknown).
        taints: ``key=value`` (or ``key``) taints; only jobs that tolerate every one
            of them may use the node (Kubernetes' NoSchedule).
        cached: model or dataset cache keys the node holds.
        fractions: whether its non-MIG GPUs may host ``fraction`` shares.
        ts_replicas: time-slicing replicas per GPU (0: no time-slicing).
        mps_clients: MPS clients (replicas) per GPU (0: no MPS).
        mps_mem_mib: GPU memory each MPS client may pin, MiB (0: no cap;
            ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``).
        mig: ``(gpu index, layout)`` for each GPU in MIG mode; a layout is a tuple of
            ``gpushepherd.model.mig.MigInstance``. Such a GPU is never handed out whole.
    """

    name: str
    gpus: int
    gpu_type: str = "generic"
    gpu_mem_mib: int = 0
    pool: str = "default"
    labels: tuple[tuple[str, str], ...] = field(default=())
    nvlink_islands: tuple[tuple[int, ...], ...] = field(default=())
    gpu_uuids: tuple[str, ...] = field(default=())
    driver: str = ""
    cuda: str = ""
    taints: tuple[str, ...] = field(default=())
    cached: tuple[str, ...] = field(default=())
    fractions: bool = True
    ts_replicas: int = 0
    mps_clients: int = 0
    mig: tuple = field(default=())
    mps_mem_mib: int = 0

    def supports(self, kind: str) -> bool:
        """Whether the node offers this kind of share (``mig``: has a MIG GPU)."""
        if kind == "fraction":
            return self.fractions and len(self.mig) < self.gpus
        if kind == "time_slice":
            return self.ts_replicas > 0 and len(self.mig) < self.gpus
        if kind == "mps":
            return self.mps_clients > 0 and len(self.mig) < self.gpus
        if kind == "mig":
            return bool(self.mig)
        return len(self.mig) < self.gpus

    def shape_key(self) -> tuple:
        """Everything static a placement filter may look at, minus the name.

        Nodes with equal shape keys are interchangeable for filtering, so the core
        groups them and filters a group once instead of node by node (NVLink islands
        included: whether a group has islands is read from one of its nodes).
        """
        return (self.gpus, self.gpu_type, self.gpu_mem_mib, self.pool, self.labels, self.driver, self.taints,
                self.cached, self.fractions, self.ts_replicas, self.mps_clients, self.mig, self.nvlink_islands,
                self.mps_mem_mib)

    def label(self, key: str) -> str | None:
        for k, v in self.labels:
            if k == key:
                return v
        return None
