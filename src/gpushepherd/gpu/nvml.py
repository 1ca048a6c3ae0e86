"""Discovery and samples through NVML (NVIDIA's management library), with
nvidia-ml-py's ``pynvml`` binding.

Nothing here raises for a machine without NVIDIA GPUs: no ``pynvml``, no
``libnvidia-ml.so`` or no driver make :func:`nvml_unavailable` return why, and
:func:`gpushepherd.gpu.open_inventory` then takes the static inventory. A query a
device does not support (utilisation, temperature or power of a MIG device,
per-process utilisation without samples, ...) gives ``None`` for that field.

Units as NVML gives them, converted: memory bytes -> MiB, power mW -> W; the CUDA
version integer ``12040`` -> ``12.4``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gpushepherd.gpu.inventory import (
    Discovery,
    GpuInfo,
    GpuProcess,
    GpuSample,
    InventoryError,
    JobDevices,
    MigDevice,
    Sample,
    usage_from_processes,
)

MIB = 1 << 20
#: NVML's "not available" marker for a process's memory (an unsigned -1)
_NOT_AVAILABLE = (1 << 64) - 1
#: a MIG device's name ends with its profile: ``NVIDIA A100-SXM4-80GB MIG 1g.10gb``
_PROFILE = re.compile(r"(\d+g\.\d+gb(?:\+\w+)?)\s*$", re.IGNORECASE)


def _module(module: Any = None) -> Any:
    if module is not None:
        return module
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def nvml_unavailable(module: Any = None) -> str | None:
    """``None`` when NVML works and finds at least one GPU, else why not (a sentence).
    ``module``: a ``pynvml``-like module (tests); default the real one."""
    nv = _module(module)
    if nv is None:
        return "nvidia-ml-py (pynvml) is not installed"
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        return f"NVML cannot start: {exc}"
    try:
        count = nv.nvmlDeviceGetCount()
    except nv.NVMLError as exc:
        return f"NVML cannot count GPUs: {exc}"
    finally:
        _shutdown(nv)
    return None if count > 0 else "NVML finds no GPU"


def _shutdown(nv: Any) -> None:
    try:
        nv.nvmlShutdown()
    except nv.NVMLError:
        pass


def _text(v: Any) -> str:
    if v is None:
        return ""
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def cuda_version(v: int | None) -> str:
    """NVML's CUDA driver version integer as text: ``12040`` -> ``12.4`` ('' for ``None``)."""
    return "" if v is None else f"{v // 1000}.{v % 1000 // 10}"


class NvmlInventory:
    """This machine's GPUs through NVML (:class:`~gpushepherd.gpu.inventory.Inventory`).

    Args:
        module: a ``pynvml``-like module (tests pass a fake); default ``pynvml``.

    Raises:
        InventoryError: NVML cannot be started (no library, no driver).
    """

    source = "nvml"

    def __init__(self, module: Any = None):
        self.nv = _module(module)
        if self.nv is None:
            raise InventoryError("--inventory nvml: nvidia-ml-py (pynvml) is not installed")
        try:
            self.nv.nvmlInit()
        except self.nv.NVMLError as exc:
            raise InventoryError(f"--inventory nvml: NVML cannot start: {exc}") from None
        self._handles: list[Any] = []
        self._mig_handles: dict[int, list[tuple[str, Any]]] = {}  # GPU index -> (MIG UUID, handle)
        self._util_ts: dict[int, int] = {}  # GPU index -> last per-process utilisation timestamp (us)
        self._found: Discovery | None = None

    def _q(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)``, or ``None`` when NVML says it cannot (not supported, not found,
        no permission, GPU lost, ...)."""
        try:
            return fn(*args)
        except self.nv.NVMLError:
            return None

    def close(self) -> None:
        _shutdown(self.nv)

    def discover(self) -> Discovery:
        """Driver and CUDA versions; per GPU index, UUID, name, memory and MIG devices."""
        nv = self.nv
        gpus, self._handles, self._mig_handles = [], [], {}
        for index in range(self._q(nv.nvmlDeviceGetCount) or 0):
            h = self._q(nv.nvmlDeviceGetHandleByIndex, index)
            if h is None:
                continue
            self._handles.append((index, h))
            mem = self._q(nv.nvmlDeviceGetMemoryInfo, h)
            mode = self._q(nv.nvmlDeviceGetMigMode, h)
            enabled = bool(mode) and mode[0] == getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1)
            migs = self._mig_devices(index, h) if enabled else ()
            gpus.append(GpuInfo(index=index, uuid=_text(self._q(nv.nvmlDeviceGetUUID, h)),
                                name=_text(self._q(nv.nvmlDeviceGetName, h)),
                                memory_mib=int(mem.total // MIB) if mem is not None else 0,
                                mig_enabled=enabled, mig=migs))
        self._found = Discovery("nvml", _text(self._q(nv.nvmlSystemGetDriverVersion)),
                                cuda_version(self._q(nv.nvmlSystemGetCudaDriverVersion)), tuple(gpus))
        return self._found

    def _mig_devices(self, index: int, h: Any) -> tuple[MigDevice, ...]:
        nv = self.nv
        out, handles = [], []
        for j in range(self._q(nv.nvmlDeviceGetMaxMigDeviceCount, h) or 0):
            mh = self._q(nv.nvmlDeviceGetMigDeviceHandleByIndex, h, j)
            if mh is None:  # no MIG device at this slot
                continue
            uuid = _text(self._q(nv.nvmlDeviceGetUUID, mh))
            m = _PROFILE.search(_text(self._q(nv.nvmlDeviceGetName, mh)))
            start = -1  # unknown: reading GPU instances may need privileges
            gi_id = self._q(nv.nvmlDeviceGetGpuInstanceId, mh)
            gi = self._q(nv.nvmlDeviceGetGpuInstanceById, h, gi_id) if gi_id is not None else None
            info = self._q(nv.nvmlGpuInstanceGetInfo, gi) if gi is not None else None
            if info is not None:
                start = int(info.placement.start)
            out.append(MigDevice(uuid, m.group(1).lower() if m else "", start))
            handles.append((uuid, mh))
        self._mig_handles[index] = handles
        return tuple(sorted(out, key=lambda d: (d.start, d.uuid)))

    def _processes(self, h: Any, mig_uuid: str = "") -> list[GpuProcess]:
        out = []
        for p in self._q(self.nv.nvmlDeviceGetComputeRunningProcesses, h) or ():
            used = getattr(p, "usedGpuMemory", None)
            out.append(GpuProcess(int(p.pid), None if used is None or used >= _NOT_AVAILABLE else int(used // MIB),
                                  mig_uuid))
        return out

    def _process_util(self, index: int, h: Any) -> tuple[tuple[int, float], ...]:
        samples = self._q(self.nv.nvmlDeviceGetProcessUtilization, h, self._util_ts.get(index, 0))
        if not samples:
            return ()
        per: dict[int, list[float]] = {}
        for s in samples:
            per.setdefault(int(s.pid), []).append(float(s.smUtil))
            self._util_ts[index] = max(self._util_ts.get(index, 0), int(s.timeStamp))
        return tuple((pid, sum(v) / len(v)) for pid, v in sorted(per.items()))

    def sample(self, jobs: Mapping[str, JobDevices]) -> Sample:
        """Each GPU (utilisation, memory, temperature, power, compute processes on it
        and on its MIG devices, per-process utilisation) and each job's usage
        (:func:`~gpushepherd.gpu.inventory.usage_from_processes`)."""
        nv = self.nv
        if self._found is None:
            self.discover()
        gpus = []
        for index, h in self._handles:
            util = self._q(nv.nvmlDeviceGetUtilizationRates, h)
            mem = self._q(nv.nvmlDeviceGetMemoryInfo, h)
            temp = self._q(nv.nvmlDeviceGetTemperature, h, getattr(nv, "NVML_TEMPERATURE_GPU", 0))
            power = self._q(nv.nvmlDeviceGetPowerUsage, h)
            procs = {p.pid: p for p in self._processes(h)}
            for mig_uuid, mh in self._mig_handles.get(index, ()):
                procs.update({p.pid: p for p in self._processes(mh, mig_uuid)})  # attributed to its MIG device
            gpus.append(GpuSample(
                index=index, util_pct=float(util.gpu) if util is not None else None,
                mem_used_mib=int(mem.used // MIB) if mem is not None else None,
                mem_total_mib=int(mem.total // MIB) if mem is not None else None,
                temperature_c=float(temp) if temp is not None else None,
                power_w=power / 1000.0 if power is not None else None,
                processes=tuple(sorted(procs.values(), key=lambda p: p.pid)),
                process_util=self._process_util(index, h)))
        gpus_t = tuple(gpus)
        return Sample(gpus_t, {job_id: usage_from_processes(gpus_t, dev) for job_id, dev in sorted(jobs.items())})
