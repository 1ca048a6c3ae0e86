"""A static inventory for machines without NVIDIA GPUs: the policy's node is the
machine, and samples are scripted.

**The sample file** ``<data dir>/gpu-samples.json`` (re-read at every sample; absent:
nothing scripted). Every key is optional::

    {
      "gpus": {
        "0": {"util_pct": 35, "mem_used_mib": 2048, "temperature_c": 41, "power_w": 120,
              "processes": [{"pid": 4242, "used_mib": 2048}]}
      },
      "jobs": {
        "7": {"util_pct": 0, "mem_used_mib": 512}
      }
    }

``gpus`` by index (``0`` .. ``gpus - 1`` of the node): utilisation % (0-100), memory
used MiB, temperature C, power W, and compute processes (pid, MiB) - a pid in no job's
process group is a foreign process and makes the GPU unmanaged. ``jobs`` by job id: the
job's utilisation % and GPU memory MiB. A bad file (not JSON, an unknown key, a value
out of range) raises :class:`~gpushepherd.gpu.inventory.InventoryError` naming the
field, the value and what is allowed; the sample is then skipped as a whole.

**A job the file does not script** gets its GPU memory from the scripted processes
with its pids, and its utilisation from the **CPU use of its process group**: the CPU
ticks its processes used between two samples, as % of one CPU, capped at 100. This is a
stand-in, not a GPU measure: a sleeping notebook reads 0 %, a busy loop ~100 %, so idle
auto-stop can be shown with real processes on a machine without GPUs. The first sample
of a job has no previous reading: the job is left out of that sample.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpushepherd.gpu import procs
from gpushepherd.gpu.inventory import (
    Discovery,
    GpuInfo,
    GpuProcess,
    GpuSample,
    InventoryError,
    JobDevices,
    JobUsage,
    MigDevice,
    Sample,
    usage_from_processes,
)

SAMPLE_FILE = "gpu-samples.json"


#: the most memory a scripted sample may report, MiB (16 TiB: above any GPU; a larger
#: value would overflow the event log's integers)
MAX_MEM_MIB = 16 * 1024 * 1024


class _Proc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pid: int = Field(gt=0, strict=True)
    used_mib: int | None = Field(None, ge=0, le=MAX_MEM_MIB, strict=True)


class _Gpu(BaseModel):
    model_config = ConfigDict(extra="forbid")
    util_pct: float | None = Field(None, ge=0, le=100, allow_inf_nan=False)
    mem_used_mib: int | None = Field(None, ge=0, le=MAX_MEM_MIB, strict=True)
    temperature_c: float | None = Field(None, ge=-273, le=200, allow_inf_nan=False)
    power_w: float | None = Field(None, ge=0, allow_inf_nan=False)
    processes: list[_Proc] = Field(default_factory=list)


class _Job(BaseModel):
    model_config = ConfigDict(extra="forbid")
    util_pct: float = Field(ge=0, le=100, allow_inf_nan=False)
    mem_used_mib: int = Field(0, ge=0, le=MAX_MEM_MIB, strict=True)


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gpus: dict[str, _Gpu] = Field(default_factory=dict)
    jobs: dict[str, _Job] = Field(default_factory=dict)


def read_sample_file(path: Path, gpus: int) -> _File:
    """The scripted sample file, validated; an empty script when it does not exist.

    Raises:
        InventoryError: not JSON, an unknown key, a value out of range, a GPU index
            outside ``0 .. gpus - 1``; the message names the file, field and value.
    """
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return _File()
    except OSError as exc:
        raise InventoryError(f"{path}: cannot read: {exc}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InventoryError(f"{path}: not JSON ({exc}): an object with gpus and jobs") from None
    try:
        parsed = _File.model_validate(data)
    except ValidationError as exc:
        e = exc.errors()[0]
        where = ".".join(str(x) for x in e["loc"]) or "(top level)"
        raise InventoryError(f"{path}: {where}: {e.get('input')!r} is not allowed: {e['msg']}") from None
    for key in parsed.gpus:
        if not key.isdigit() or int(key) >= gpus:
            raise InventoryError(f"{path}: gpus.{key}: {key!r} is not allowed: a GPU index 0..{gpus - 1}")
    return parsed


class StaticInventory:
    """The policy's ``node`` as this machine's inventory, samples scripted by
    ``<data_dir>/gpu-samples.json`` (:class:`~gpushepherd.gpu.inventory.Inventory`).

    Args:
        node: a ``gpushepherd.model.cluster.Node``: its GPU count, type (the GPUs'
            name), memory, ``gpu_uuids``, driver / CUDA versions and MIG layouts (MIG
            device UUIDs are unknown: '').
        data_dir: where the sample file is.
        clock: seconds, monotonic (tests may pass their own).
    """

    source = "static"

    def __init__(self, node, data_dir: Path, clock: Callable[[], float] = time.monotonic):
        self.node = node
        self.path = Path(data_dir) / SAMPLE_FILE
        self.clock = clock
        self._cpu: dict[str, tuple[float, int]] = {}  # job -> (time, CPU ticks) at its last sample

    def discover(self) -> Discovery:
        n = self.node
        mig = dict(n.mig)
        gpus = tuple(GpuInfo(index=i, uuid=n.gpu_uuids[i] if n.gpu_uuids else "", name=n.gpu_type,
                             memory_mib=n.gpu_mem_mib, mig_enabled=i in mig,
                             mig=tuple(MigDevice("", inst.profile, inst.start) for inst in mig.get(i, ())))
                     for i in range(n.gpus))
        return Discovery("static", n.driver, n.cuda, gpus)

    def sample(self, jobs: Mapping[str, JobDevices]) -> Sample:
        """The scripted GPUs, and each job's scripted usage or its CPU stand-in.

        Raises:
            InventoryError: a bad sample file (nothing of the sample is used).
        """
        script = read_sample_file(self.path, self.node.gpus)
        gpus = []
        for i in range(self.node.gpus):
            g = script.gpus.get(str(i)) or _Gpu()
            gpus.append(GpuSample(
                index=i, util_pct=g.util_pct, mem_used_mib=g.mem_used_mib, mem_total_mib=self.node.gpu_mem_mib or None,
                temperature_c=g.temperature_c, power_w=g.power_w,
                processes=tuple(sorted((GpuProcess(p.pid, p.used_mib) for p in g.processes), key=lambda p: p.pid))))
        gpus_t = tuple(gpus)
        now = self.clock()
        out: dict[str, JobUsage] = {}
        for job_id, dev in sorted(jobs.items()):
            scripted = script.jobs.get(job_id)
            if scripted is not None:
                out[job_id] = JobUsage(scripted.util_pct, scripted.mem_used_mib)
                continue
            ticks = procs.cpu_ticks(dev.pids)
            prev = self._cpu.get(job_id)
            self._cpu[job_id] = (now, ticks)
            if prev is None or now <= prev[0]:
                continue  # no previous reading: nothing to compare with yet
            pct = 100.0 * max(0, ticks - prev[1]) / (procs.CLK_TCK * (now - prev[0]))
            out[job_id] = JobUsage(min(100.0, pct), usage_from_processes(gpus_t, dev).mem_used_mib)
        for gone in set(self._cpu) - set(jobs):
            del self._cpu[gone]
        return Sample(gpus_t, out)

    def close(self) -> None:
        pass
