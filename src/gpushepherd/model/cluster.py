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
    """

    name: str
    gpus: int
    gpu_type: str = "generic"
    gpu_mem_mib: int = 0
    pool: str = "default"
    labels: tuple[tuple[str, str], ...] = field(default=())
    nvlink_islands: tuple[tuple[int, ...], ...] = field(default=())

    def shape_key(self) -> tuple:
        """Everything static a placement filter may look at, minus the name.

        Nodes with equal shape keys are interchangeable for filtering, so the core
        groups them and filters a group once instead of node by node.
        """
        return (self.gpus, self.gpu_type, self.gpu_mem_mib, self.pool, self.labels)

    def label(self, key: str) -> str | None:
        for k, v in self.labels:
            if k == key:
                return v
        return None
