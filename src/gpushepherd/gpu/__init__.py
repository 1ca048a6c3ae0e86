"""GPU inventory (design note 008, "GPU inventory and samples"): what GPUs this
machine has and what runs on them.

Two sources behind one interface (:class:`~gpushepherd.gpu.inventory.Inventory`):
:mod:`gpushepherd.gpu.nvml` (NVIDIA's NVML through nvidia-ml-py) and
:mod:`gpushepherd.gpu.static` (the policy's node, samples scripted from a JSON file).
:func:`open_inventory` picks one.
"""

from __future__ import annotations

from gpushepherd.gpu.inventory import (
    Discovery,
    GpuInfo,
    GpuProcess,
    GpuSample,
    Inventory,
    InventoryError,
    JobDevices,
    JobUsage,
    MigDevice,
    Sample,
)

__all__ = ["Discovery", "GpuInfo", "GpuProcess", "GpuSample", "Inventory", "InventoryError", "JobDevices",
           "JobUsage", "MigDevice", "Sample", "open_inventory"]

INVENTORY_KINDS = ("auto", "nvml", "static")


def open_inventory(kind: str, node, data_dir) -> Inventory:
    """The inventory of this machine.

    Args:
        kind: ``nvml`` (NVML must find a GPU), ``static`` (the policy's node), ``auto``
            (NVML when it finds a GPU, else static).
        node: the policy's ``Node`` this server is (the static inventory's GPUs).
        data_dir: the server's data directory (the static source's sample file).

    Raises:
        InventoryError: ``kind`` is not one of auto, nvml, static; or ``nvml`` and NVML
            finds no GPU (the message says why: no library, no driver, no device).
    """
    from gpushepherd.gpu.nvml import NvmlInventory, nvml_unavailable
    from gpushepherd.gpu.static import StaticInventory

    if kind not in INVENTORY_KINDS:
        raise InventoryError(f"--inventory: {kind!r} is not allowed: {', '.join(INVENTORY_KINDS)}")
    if kind in ("auto", "nvml"):
        why = nvml_unavailable()
        if why is None:
            return NvmlInventory()
        if kind == "nvml":
            raise InventoryError(f"--inventory nvml: NVML finds no GPU ({why}); use --inventory static on a "
                                 f"machine without NVIDIA GPUs")
    return StaticInventory(node, data_dir)
