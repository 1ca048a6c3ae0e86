"""gpushepherd.gpu without hardware: NVML through a fake ``pynvml`` module (discovery
with MIG devices, queries a device does not support, processes), the node check, and
the static inventory scripted from its sample file and real processes' CPU use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from gpushepherd.gpu import InventoryError, JobDevices, open_inventory, procs
from gpushepherd.gpu.inventory import (
    Discovery,
    GpuInfo,
    GpuProcess,
    GpuSample,
    MigDevice,
    foreign_processes,
    node_mismatches,
    usage_from_processes,
)
from gpushepherd.gpu.nvml import NvmlInventory, cuda_version, nvml_unavailable
from gpushepherd.gpu.static import SAMPLE_FILE, StaticInventory
from gpushepherd.model.cluster import Node
from gpushepherd.model.mig import MigInstance

MIB = 1 << 20


class FakeNvml:
    """A ``pynvml`` stand-in: GPU 0 a whole H100 with two processes, GPU 1 in MIG mode
    with a 1g.10gb device at start 3 (slot 0), an empty slot 1 and a 3g.40gb device at
    start 4 (slot 2) whose GPU instance cannot be read (no permission). Utilisation,
    per-process utilisation and power are not supported on GPU 1."""

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    class NVMLError_NotFound(NVMLError):
        pass

    class NVMLError_NoPermission(NVMLError):
        pass

    class NVMLError_LibraryNotFound(NVMLError):
        pass

    NVML_DEVICE_MIG_ENABLE = 1
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, init_error: Exception | None = None, count: int = 2):
        self.init_error = init_error
        self.count = count
        self.shutdowns = 0
        self.util_ts_asked: list[int] = []

    def nvmlInit(self):
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self):
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self):
        return 12040

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("gpu", i)

    def nvmlDeviceGetUUID(self, h):
        return {("gpu", 0): b"GPU-aaaa", ("gpu", 1): "GPU-bbbb", ("mig", 1, 0): "MIG-1111",
                ("mig", 1, 2): "MIG-2222"}[h]

    def nvmlDeviceGetName(self, h):
        return {("gpu", 0): "NVIDIA H100 80GB HBM3", ("gpu", 1): "NVIDIA H100 80GB HBM3",
                ("mig", 1, 0): "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
                ("mig", 1, 2): "NVIDIA H100 80GB HBM3 MIG 3g.40gb"}[h]

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=81559 * MIB, used=(1000 if h == ("gpu", 0) else 5000) * MIB)

    def nvmlDeviceGetMigMode(self, h):
        if h == ("gpu", 0):
            raise self.NVMLError_NotSupported("Not Supported")
        return (1, 1)

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 3

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, j):
        if j == 1:
            raise self.NVMLError_NotFound("Not Found")
        return ("mig", h[1], j)

    def nvmlDeviceGetGpuInstanceId(self, mh):
        return {0: 9, 2: 2}[mh[2]]

    def nvmlDeviceGetGpuInstanceById(self, h, gi_id):
        if gi_id == 2:
            raise self.NVMLError_NoPermission("Insufficient Permissions")
        return ("gi", gi_id)

    def nvmlGpuInstanceGetInfo(self, gi):
        return SimpleNamespace(placement=SimpleNamespace(start=3, size=1))

    def nvmlDeviceGetUtilizationRates(self, h):
        if h != ("gpu", 0):
            raise self.NVMLError_NotSupported("Not Supported")
        return SimpleNamespace(gpu=37, memory=5)

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 50 if h == ("gpu", 0) else 44

    def nvmlDeviceGetPowerUsage(self, h):
        if h != ("gpu", 0):
            raise self.NVMLError_NotSupported("Not Supported")
        return 250_500

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return {("gpu", 0): [SimpleNamespace(pid=222, usedGpuMemory=None),
                             SimpleNamespace(pid=111, usedGpuMemory=2048 * MIB)],
                ("gpu", 1): [SimpleNamespace(pid=444, usedGpuMemory=(1 << 64) - 1)],
                ("mig", 1, 0): [SimpleNamespace(pid=444, usedGpuMemory=5000 * MIB)],
                ("mig", 1, 2): []}[h]

    def nvmlDeviceGetProcessUtilization(self, h, ts):
        if h != ("gpu", 0):
            raise self.NVMLError_NotSupported("Not Supported")
        self.util_ts_asked.append(ts)
        return [SimpleNamespace(pid=111, smUtil=30, timeStamp=5), SimpleNamespace(pid=111, smUtil=50, timeStamp=6),
                SimpleNamespace(pid=333, smUtil=10, timeStamp=6)]


def test_no_nvml_library_or_driver_is_no_gpus_not_an_exception():
    nv = FakeNvml(init_error=FakeNvml.NVMLError_LibraryNotFound("NVML Shared Library Not Found"))
    assert "NVML Shared Library Not Found" in nvml_unavailable(nv)
    with pytest.raises(InventoryError, match="NVML cannot start"):
        NvmlInventory(nv)
    assert nvml_unavailable(FakeNvml(count=0)) == "NVML finds no GPU"
    assert nvml_unavailable(FakeNvml()) is None


def test_this_machine_without_nvml_falls_back_to_static(tmp_path):
    if nvml_unavailable() is None:
        pytest.skip("NVML finds a GPU here: the fallback is not taken")
    node = Node("n", 2, "FAKE", 1000)
    assert open_inventory("auto", node, tmp_path).source == "static"
    with pytest.raises(InventoryError, match="--inventory nvml: NVML finds no GPU .*--inventory static"):
        open_inventory("nvml", node, tmp_path)
    with pytest.raises(InventoryError, match="--inventory: 'gpu' is not allowed: auto, nvml, static"):
        open_inventory("gpu", node, tmp_path)


def test_nvml_discovery_with_mig_devices_and_unsupported_queries():
    inv = NvmlInventory(FakeNvml())
    found = inv.discover()
    assert (found.source, found.driver, found.cuda) == ("nvml", "550.54.15", "12.4")
    g0, g1 = found.gpus
    assert (g0.index, g0.uuid, g0.name, g0.memory_mib, g0.mig_enabled, g0.mig) == \
        (0, "GPU-aaaa", "NVIDIA H100 80GB HBM3", 81559, False, ())
    assert g1.mig_enabled and g1.uuid == "GPU-bbbb"
    # the empty slot is skipped; a GPU instance that cannot be read leaves its start unknown (-1)
    assert g1.mig == (MigDevice("MIG-2222", "3g.40gb", -1), MigDevice("MIG-1111", "1g.10gb", 3))


def test_nvml_samples_convert_units_and_attribute_mig_processes():
    nv = FakeNvml()
    inv = NvmlInventory(nv)
    s = inv.sample({"j1": JobDevices((0,), frozenset({111, 999})), "j2": JobDevices((1,), frozenset({444}), "MIG-1111"),
                    "j3": JobDevices((0,), frozenset({111}), shared=True)})
    g0, g1 = s.gpus
    assert (g0.util_pct, g0.mem_used_mib, g0.mem_total_mib, g0.temperature_c, g0.power_w) == \
        (37.0, 1000, 81559, 50.0, 250.5)
    assert g0.processes == (GpuProcess(111, 2048), GpuProcess(222, None))
    assert g0.process_util == ((111, 40.0), (333, 10.0))
    assert (g1.util_pct, g1.power_w, g1.temperature_c, g1.process_util) == (None, None, 44.0, ())
    assert g1.processes == (GpuProcess(444, 5000, "MIG-1111"),)  # the MIG device's view wins
    assert s.jobs["j1"].util_pct == 37.0 and s.jobs["j1"].mem_used_mib == 2048
    assert s.jobs["j2"].util_pct is None and s.jobs["j2"].mem_used_mib == 5000  # MIG: no utilisation
    assert s.jobs["j3"].util_pct == 40.0  # a share: its own processes' SM utilisation
    inv.sample({})
    assert nv.util_ts_asked == [0, 6]  # the next per-process query continues after the last sample seen
    inv.close()
    assert nv.shutdowns == 1


def test_usage_is_the_mean_over_the_jobs_gpus_and_the_sum_of_its_memory():
    gpus = (GpuSample(0, util_pct=20, processes=(GpuProcess(1, 100), GpuProcess(2, 50))),
            GpuSample(1, util_pct=60, processes=(GpuProcess(1, 300),)), GpuSample(2, util_pct=None))
    u = usage_from_processes(gpus, JobDevices((0, 1), frozenset({1})))
    assert (u.util_pct, u.mem_used_mib) == (40.0, 400)
    assert usage_from_processes(gpus, JobDevices((0, 2), frozenset({1}))).util_pct is None  # unknown stays unknown
    # a share without per-process samples: the whole GPU's utilisation
    assert usage_from_processes(gpus, JobDevices((0,), frozenset({2}), shared=True)).util_pct == 20


def test_foreign_processes_are_those_in_no_jobs_process_group():
    gpus = (GpuSample(0, processes=(GpuProcess(7), GpuProcess(5), GpuProcess(1))), GpuSample(1, processes=()),
            GpuSample(2, processes=(GpuProcess(1),)))
    assert foreign_processes(gpus, {1}) == {0: (GpuProcess(5), GpuProcess(7))}


def _found(*gpus: GpuInfo) -> Discovery:
    return Discovery("nvml", "550", "12.4", gpus)


def test_the_policys_node_is_checked_against_what_nvml_found():
    h100 = GpuInfo(0, "GPU-a", "NVIDIA H100 80GB HBM3", 81559)
    node = Node("srv", 1, "H100-80GB", 81920)
    assert node_mismatches(node, _found(h100)) == []
    assert node_mismatches(Node("srv", 1), _found(h100)) == []  # generic type, no memory given
    [msg] = node_mismatches(Node("srv", 2, "H100-80GB", 81920), _found(h100))
    assert "GPU count" in msg and "gpus: 2" in msg and "found 1" in msg
    [msg] = node_mismatches(Node("srv", 1, "A100-80GB", 81920), _found(h100))
    assert "gpu_type: A100-80GB" in msg and "'NVIDIA H100 80GB HBM3'" in msg
    [msg] = node_mismatches(Node("srv", 1, "H100", 40960), _found(h100))
    assert "gpu_mem_mib: 40960" in msg and "81559 MiB" in msg
    [msg] = node_mismatches(Node("srv", 1, "H100", gpu_uuids=("GPU-x",)), _found(h100))
    assert "gpu_uuids: ['GPU-x']" in msg and "['GPU-a']" in msg
    mig_node = Node("srv", 1, "H100", mig=((0, (MigInstance(0, "3g.40gb"), MigInstance(4, "3g.40gb"))),))
    [msg] = node_mismatches(mig_node, _found(h100))
    assert "MIG layout" in msg and "MIG mode off" in msg
    on = GpuInfo(0, "GPU-a", "NVIDIA H100", 81559, True, (MigDevice("MIG-1", "3g.40gb", 0),
                                                           MigDevice("MIG-2", "3g.40gb", 4)))
    assert node_mismatches(mig_node, _found(on)) == []
    [msg] = node_mismatches(Node("srv", 1, "H100"), _found(on))
    assert "declares no MIG" in msg


def test_static_discovery_is_the_policys_node(tmp_path):
    node = Node("srv", 2, "FAKE", 16384, gpu_uuids=("GPU-0", "GPU-1"), driver="550", cuda="12.4",
                mig=((1, (MigInstance(0, "3g.40gb"),)),))
    found = StaticInventory(node, tmp_path).discover()
    assert (found.source, found.driver, found.cuda) == ("static", "550", "12.4")
    assert found.gpus[0] == GpuInfo(0, "GPU-0", "FAKE", 16384)
    assert found.gpus[1] == GpuInfo(1, "GPU-1", "FAKE", 16384, True, (MigDevice("", "3g.40gb", 0),))


def test_static_samples_are_scripted_by_the_sample_file(tmp_path):
    inv = StaticInventory(Node("srv", 2, "FAKE", 16384), tmp_path)
    empty = inv.sample({})
    assert [(g.util_pct, g.processes, g.mem_total_mib) for g in empty.gpus] == [(None, (), 16384)] * 2
    (tmp_path / SAMPLE_FILE).write_text(json.dumps({
        "gpus": {"0": {"util_pct": 35, "mem_used_mib": 2048, "temperature_c": 41, "power_w": 120,
                       "processes": [{"pid": 4242, "used_mib": 2048}, {"pid": 17}]}},
        "jobs": {"7": {"util_pct": 0, "mem_used_mib": 512}}}))
    s = inv.sample({"7": JobDevices((1,), frozenset({1}))})
    g0 = s.gpus[0]
    assert (g0.util_pct, g0.mem_used_mib, g0.temperature_c, g0.power_w) == (35, 2048, 41, 120)
    assert g0.processes == (GpuProcess(17, None), GpuProcess(4242, 2048))
    assert (s.jobs["7"].util_pct, s.jobs["7"].mem_used_mib) == (0, 512)


@pytest.mark.parametrize("content, fragment", [
    ("{nope", "not JSON"),
    ('{"gpus": {"0": {"util_pct": 150}}}', "gpus.0.util_pct: 150 is not allowed"),
    ('{"gpus": {"5": {}}}', "gpus.5: '5' is not allowed: a GPU index 0..1"),
    ('{"gpus": {"0": {"processes": [{"pid": -3}]}}}', "gpus.0.processes.0.pid: -3 is not allowed"),
    ('{"jobz": {}}', "jobz: {} is not allowed"),
    ('{"jobs": {"4": {"mem_used_mib": 3}}}', "jobs.4.util_pct"),
    # regression: unbounded memory (1e23 MiB) was accepted
    ('{"gpus": {"0": {"mem_used_mib": 100000000000000000000000}}}', "gpus.0.mem_used_mib: 100000000000000000000000"),
    ('{"jobs": {"4": {"util_pct": 1, "mem_used_mib": 100000000000000000000000}}}', "jobs.4.mem_used_mib"),
])
def test_a_bad_sample_file_is_an_error_naming_the_field(tmp_path, content, fragment):
    (tmp_path / SAMPLE_FILE).write_text(content)
    with pytest.raises(InventoryError) as exc:
        StaticInventory(Node("srv", 2), tmp_path).sample({})
    assert fragment in str(exc.value) and SAMPLE_FILE in str(exc.value)


def _wait(fn, what: str, timeout: float = 60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if fn():
            return
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


def test_static_utilisation_of_an_unscripted_job_is_its_process_groups_cpu_use(tmp_path):
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    idle = subprocess.Popen(["sleep", "120"], start_new_session=True)
    try:
        _wait(lambda: (procs.stat_fields(idle.pid) or ["R"])[0] == "S" and procs.command(idle.pid) == "sleep 120",
              "sleep to be asleep")
        now = [100.0]
        inv = StaticInventory(Node("srv", 2), tmp_path, clock=lambda: now[0])
        members = procs.group_members([busy.pid, idle.pid])
        assert members[busy.pid] == {busy.pid} and members[idle.pid] == {idle.pid}
        jobs = {"b": JobDevices((0,), members[busy.pid]), "i": JobDevices((1,), members[idle.pid])}
        assert inv.sample(jobs).jobs == {}  # the first reading has nothing to compare with
        start = procs.cpu_ticks([busy.pid])
        _wait(lambda: procs.cpu_ticks([busy.pid]) - start >= procs.CLK_TCK // 2, "the busy loop to use CPU")
        now[0] += 1.0
        s = inv.sample(jobs)
        assert s.jobs["b"].util_pct >= 50.0
        assert s.jobs["i"].util_pct == 0.0  # a sleeping process: 0 %
    finally:
        for p in (busy, idle):
            p.kill()
            p.wait()


def test_process_owner_and_command_come_from_proc():
    import pwd
    assert procs.owner(os.getpid()) == pwd.getpwuid(os.getuid()).pw_name
    with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:  # as this process was started (maybe a relative path)
        argv0 = f.read().split(b"\0")[0].decode()
    assert procs.command(os.getpid()).split()[0] == argv0
    assert procs.owner(2**22 + 1) is None and procs.command(2**22 + 1) is None


def test_cuda_version_text():
    assert (cuda_version(12040), cuda_version(11080), cuda_version(None)) == ("12.4", "11.8", "")
