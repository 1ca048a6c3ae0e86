"""A fake Slurm cluster on this machine (design note 013, "Bench and demo on Slurm"):
N nodes ``fake1..fakeN`` of 8 fake A100s each (GRES type ``a100``) on 127.0.0.1,
Slurm 22.05 from Debian's ``slurm-wlm``, started by the bundled
``data/fake-slurm-cluster.sh`` (also ``deploy/slurm/fake-cluster.sh``). Root only.

Used by ``shepherd demo --backend slurm``, ``bench/slurm_compare.py`` and the tests.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from importlib import resources
from pathlib import Path

from gpushepherd.backends import BackendError


def script_path() -> Path:
    """The bundled script that starts and stops a fake cluster."""
    return Path(str(resources.files("gpushepherd") / "data" / "fake-slurm-cluster.sh"))


def unavailable() -> str:
    """Why a fake cluster cannot start here ('' when it can): no Slurm, or not root."""
    if shutil.which("slurmctld") is None or shutil.which("sbatch") is None:
        return "no slurmctld/sbatch on PATH (Debian: apt-get install slurm-wlm)"
    if os.geteuid() != 0:
        return "the fake Slurm cluster's daemons run as root, and this is not root"
    return ""


def free_ports(count: int) -> int:
    """A port ``p`` such that ``p`` .. ``p + count - 1`` are free on 127.0.0.1 now."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count > 65535:
            continue
        try:
            socks = []
            for p in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise BackendError(f"no {count} consecutive free ports on 127.0.0.1")


class FakeSlurmCluster:
    """Start (``with`` or ``start()``) and stop a fake cluster in ``directory``.

    Args:
        directory: an absolute path; it is emptied and holds the config, state and logs.
        nodes: how many 8-GPU nodes (``fake1`` ..).
        extra_conf: lines added to ``slurm.conf`` (``PreemptType=...``).
        partitions: partition lines replacing the default one (partition ``shepherd``
            over all nodes, for gpushepherd); the first one is waited on.

    ``conf`` is the absolute ``slurm.conf`` path (``SLURM_CONF`` for every Slurm command).

    Raises:
        BackendError: (on start) the cluster did not come up (the script's output).
    """

    def __init__(self, directory: Path, nodes: int = 1, extra_conf: str = "", partitions: str = ""):
        self.dir = Path(directory).resolve()
        self.nodes = nodes
        self.extra_conf, self.partitions = extra_conf, partitions
        self.conf = self.dir / "slurm.conf"

    def start(self) -> "FakeSlurmCluster":
        base = free_ports(self.nodes + 2)  # the controller on base, node n on base + 1 + n
        env = {**os.environ, "SLURM_CTLD_PORT": str(base), "SLURM_NODE_PORT": str(base + 1)}
        if self.extra_conf:
            env["SLURM_EXTRA_CONF"] = self.extra_conf
        if self.partitions:
            env["SLURM_PARTITIONS"] = self.partitions
        p = subprocess.run(["bash", str(script_path()), "start", str(self.dir), str(self.nodes)], env=env,
                           capture_output=True, text=True, timeout=180)
        if p.returncode != 0:
            self.stop()
            raise BackendError(f"the fake Slurm cluster did not start (exit {p.returncode}): "
                               f"{p.stdout.strip()} {p.stderr.strip()}")
        return self

    def stop(self) -> None:
        """Stop its daemons by their pid files (never by name)."""
        subprocess.run(["bash", str(script_path()), "stop", str(self.dir)], capture_output=True, timeout=60)

    def env(self) -> dict[str, str]:
        """This process's environment with ``SLURM_CONF`` pointing at the cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def __enter__(self) -> "FakeSlurmCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
