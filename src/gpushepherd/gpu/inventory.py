"""The inventory's value types and the rules that need no hardware.

Units: memory in MiB, utilisation in percent (0-100), temperature in degrees Celsius,
power in watts. ``None`` means "not reported" (NVML does not support the query on this
device, or the static file does not give it), never zero.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol


class InventoryError(RuntimeError):
    """The inventory cannot be used as asked; ``str()`` names the field or flag, the
    value and what is allowed."""


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device (a GPU instance with its compute instance) of a GPU in MIG mode:
    ``uuid`` (``MIG-...``; '' when unknown), ``profile`` (``1g.10gb``), ``start`` (the
    first memory slice it occupies, as in ``nvidia-smi mig -lgi``'s placement)."""

    uuid: str
    profile: str
    start: int


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One physical GPU: NVML ``index``, ``uuid`` (``GPU-...``; '' when unknown),
    ``name`` (NVML's, e.g. ``NVIDIA H100 80GB HBM3``), ``memory_mib`` (total, MiB),
    ``mig_enabled`` (current MIG mode) and its ``mig`` devices by start."""

    index: int
    uuid: str
    name: str
    memory_mib: int
    mig_enabled: bool = False
    mig: tuple[MigDevice, ...] = ()


@dataclass(frozen=True, slots=True)
class Discovery:
    """What the machine has: ``source`` (``nvml`` or ``static``), the driver and CUDA
    versions ('' when unknown), its ``gpus`` by index."""

    source: str
    driver: str
    cuda: str
    gpus: tuple[GpuInfo, ...]


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A compute process on a GPU: ``pid`` (host pid), ``used_mib`` (its GPU memory,
    MiB; ``None`` when not reported), ``mig_uuid`` (the MIG device it runs on, '' for
    the whole GPU)."""

    pid: int
    used_mib: int | None = None
    mig_uuid: str = ""


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU at one sample: ``util_pct`` (SM utilisation over the driver's last
    sample period, %), ``mem_used_mib`` / ``mem_total_mib`` (MiB), ``temperature_c``
    (C), ``power_w`` (W), its compute ``processes`` (pid ascending) and
    ``process_util`` (``(pid, SM %)`` per process where NVML reports it)."""

    index: int
    util_pct: float | None = None
    mem_used_mib: int | None = None
    mem_total_mib: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    processes: tuple[GpuProcess, ...] = ()
    process_util: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class JobDevices:
    """What a sample needs to know of a running job: its GPU ``gpus`` (indices on this
    node), ``mig_uuid`` (its MIG device, '' if none), ``shared`` (a fraction,
    time-slicing or MPS share of its GPU: per-process utilisation is its own) and the
    ``pids`` of its process group."""

    gpus: tuple[int, ...]
    pids: frozenset[int]
    mig_uuid: str = ""
    shared: bool = False


@dataclass(frozen=True, slots=True)
class JobUsage:
    """A job at one sample: ``util_pct`` (mean over its GPUs, %; ``None``: cannot be
    measured) and ``mem_used_mib`` (GPU memory its processes hold, summed, MiB)."""

    util_pct: float | None
    mem_used_mib: int


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample: each GPU, and each job asked about (by id)."""

    gpus: tuple[GpuSample, ...]
    jobs: Mapping[str, JobUsage] = field(default_factory=dict)


class Inventory(Protocol):
    """A source of GPU facts: ``discover()`` once at start, ``sample(jobs)`` every
    sample period (``jobs``: job id -> :class:`JobDevices`), ``close()`` at the end.
    Neither raises for a query the hardware does not support (the field is ``None``);
    ``sample`` raises :class:`InventoryError` for a bad scripted sample file."""

    source: str

    def discover(self) -> Discovery: ...

    def sample(self, jobs: Mapping[str, JobDevices]) -> Sample: ...

    def close(self) -> None: ...


def usage_from_processes(sample_gpus: Iterable[GpuSample], dev: JobDevices) -> JobUsage:
    """A job's usage from a GPU sample: memory = the sum of its pids' compute-process
    memory (over its GPUs and MIG device); utilisation = the mean over its GPUs of the
    GPU's utilisation, or for a share the sum of its pids' per-process utilisation
    when reported (else the whole GPU's: it may look busier, never idler). A MIG
    device's utilisation is not reported by NVML: ``None``."""
    by_index = {g.index: g for g in sample_gpus}
    mem = 0
    utils: list[float | None] = []
    for index in dev.gpus:
        g = by_index.get(index)
        if g is None:
            utils.append(None)
            continue
        mem += sum(p.used_mib or 0 for p in g.processes if p.pid in dev.pids)
        if dev.mig_uuid:
            utils.append(None)
            continue
        own = [u for pid, u in g.process_util if pid in dev.pids]
        utils.append(min(100.0, sum(own)) if dev.shared and own else g.util_pct)
    util = None if not utils or any(u is None for u in utils) else sum(utils) / len(utils)
    return JobUsage(util, mem)


def foreign_processes(sample_gpus: Iterable[GpuSample], managed: frozenset[int] | set[int]) \
        -> dict[int, tuple[GpuProcess, ...]]:
    """Per GPU index, its compute processes whose pid is not ``managed`` (not in any
    job's process group), pid ascending; a GPU without any is absent."""
    out = {}
    for g in sample_gpus:
        procs = tuple(sorted((p for p in g.processes if p.pid not in managed), key=lambda p: p.pid))
        if procs:
            out[g.index] = procs
    return out


def type_name(gpu_name: str) -> str:
    """A GPU model's name as the policy's ``cluster.nodes[].gpu_type`` may write it (letters,
    digits and ``._-``, first a letter or digit): NVML's ``NVIDIA H100 80GB HBM3`` is
    ``NVIDIA-H100-80GB-HBM3``, whose tokens are the name's (``node_mismatches`` agrees
    with it); ``generic`` when nothing is left."""
    return re.sub(r"[^A-Za-z0-9_.\-]+", "-", gpu_name).strip("-._")[:128].rstrip("-._") or "generic"


def _tokens(text: str) -> set[str]:
    return {t for t in re.split(r"[\s_\-/]+", text.upper()) if t}


def node_mismatches(node, found: Discovery) -> list[str]:
    """How the policy's ``node`` (a ``gpushepherd.model.cluster.Node``) differs from
    what ``found`` shows; empty when they agree. Rules (note 008): GPU count equal;
    every token of ``gpu_type`` (split at ``-``, ``_``, ``/`` and spaces, case ignored)
    in each GPU's name, unless the type is ``generic``; each GPU's memory within 10 % of
    ``gpu_mem_mib`` (when given); ``gpu_uuids`` (when given) equal in index order; the
    MIG layout the policy declares for a GPU equal to its MIG devices (start, profile)."""
    out = []
    if len(found.gpus) != node.gpus:
        out.append(f"GPU count: the policy's node {node.name!r} has gpus: {node.gpus}, "
                   f"{found.source.upper()} found {len(found.gpus)}")
        return out
    want = _tokens(node.gpu_type)
    for g in found.gpus:
        if node.gpu_type != "generic" and not want <= _tokens(g.name):
            out.append(f"GPU {g.index} type: the policy's node {node.name!r} has gpu_type: {node.gpu_type}, "
                       f"{found.source.upper()} found {g.name!r}")
        if node.gpu_mem_mib and abs(g.memory_mib - node.gpu_mem_mib) > 0.1 * node.gpu_mem_mib:
            out.append(f"GPU {g.index} memory: the policy's node {node.name!r} has gpu_mem_mib: {node.gpu_mem_mib}, "
                       f"{found.source.upper()} found {g.memory_mib} MiB")
    if node.gpu_uuids:
        got = tuple(g.uuid for g in found.gpus)
        if tuple(node.gpu_uuids) != got:
            out.append(f"GPU UUIDs: the policy's node {node.name!r} has gpu_uuids: {list(node.gpu_uuids)}, "
                       f"{found.source.upper()} found {list(got)}")
    declared = {g: {(i.start, i.profile) for i in layout} for g, layout in node.mig}
    for g in found.gpus:
        have = {(m.start, m.profile) for m in g.mig} if g.mig_enabled else None
        if g.index in declared and have != declared[g.index]:
            what = "MIG mode off" if have is None else f"MIG devices {sorted(have)}"
            out.append(f"GPU {g.index} MIG layout: the policy's node {node.name!r} declares "
                       f"{sorted(declared[g.index])}, {found.source.upper()} found {what}")
        elif g.index not in declared and have:
            out.append(f"GPU {g.index} MIG layout: the policy's node {node.name!r} declares no MIG for it, "
                       f"{found.source.upper()} found MIG devices {sorted(have)}")
    return out
