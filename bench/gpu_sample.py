"""What one GPU sample costs the daemon's loop (design note 008, "GPU inventory and
samples") on a machine without GPUs: the ``/proc`` scan for the jobs' process groups
plus the static inventory's sample (its file and the CPU stand-in), for JOBS real
sleeping processes, each its own process group.

``.venv/bin/python bench/gpu_sample.py [JOBS] [SAMPLES]`` prints milliseconds per
sample. NVML's own calls are not measured here (no GPU on the machines it was written on).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpushepherd.gpu import JobDevices, procs
from gpushepherd.gpu.static import StaticInventory
from gpushepherd.model.cluster import Node


def main(jobs: int = 8, samples: int = 50) -> None:
    children = [subprocess.Popen(["sleep", "300"], start_new_session=True) for _ in range(jobs)]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            inv = StaticInventory(Node("n", 8, "FAKE", 16384), Path(tmp))
            t0 = time.perf_counter()
            for _ in range(samples):
                members = procs.group_members(p.pid for p in children)
                inv.sample({str(i): JobDevices((i % 8,), members[p.pid]) for i, p in enumerate(children)})
            ms = (time.perf_counter() - t0) * 1000 / samples
        print(f"{jobs} jobs, {samples} samples: {ms:.2f} ms per sample (/proc scan + static sample)")
    finally:
        for p in children:
            p.kill()
            p.wait()


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
