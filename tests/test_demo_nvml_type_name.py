"""On a machine whose NVML finds 8 GPUs of one model, ``shepherd demo`` writes a policy
on them; it wrote NVML's name (``NVIDIA H100 80GB HBM3``) as the node's ``gpu_type``,
which the policy refuses (a name: letters, digits and ``._-``), so the demo could not
start on the first real GPU server (found by a review; no GPU has run it yet). The name
is now written as a policy name whose tokens are NVML's, so the server's inventory
check agrees with the GPUs it finds. NVML is replaced by a fake here (CI has no GPU)."""

from __future__ import annotations

import pytest

from gpushepherd.daemon.demo import real_gpus_policy
from gpushepherd.gpu import nvml
from gpushepherd.gpu.inventory import Discovery, GpuInfo, node_mismatches, type_name
from gpushepherd.policy.load import load_policy

H100 = "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize("name, typed", [
    (H100, "NVIDIA-H100-80GB-HBM3"), ("NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB"),
    ("Tesla V100 (PCIe) 32GB", "Tesla-V100-PCIe-32GB"), (" ", "generic")])
def test_a_gpu_name_as_a_policy_name(name, typed):
    assert type_name(name) == typed


def test_the_demo_policy_on_nvml_gpus_loads_and_agrees_with_them(tmp_path, monkeypatch):
    found = Discovery("nvml", "560.35", "12.6", tuple(GpuInfo(i, f"GPU-{i}", H100, 81559) for i in range(8)))

    class Fake:
        def discover(self):
            return found

        def close(self):
            pass

    monkeypatch.setattr(nvml, "nvml_unavailable", lambda: None)
    monkeypatch.setattr(nvml, "NvmlInventory", Fake)
    path, kind = real_gpus_policy(tmp_path)
    assert kind == "nvml"
    node, = load_policy(path).rules.nodes
    assert node.gpu_type == "NVIDIA-H100-80GB-HBM3" and node.gpus == 8
    assert node_mismatches(node, found) == []
