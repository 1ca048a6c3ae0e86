"""Containment of local jobs with cgroup v2 (design note 023, "Containment").

Each run gets a cgroup ``<parent>/gpushepherd/<instance>/job-<id>-run-<run>``, where
``<parent>`` is the server's own cgroup (``/proc/self/cgroup``: the cgroup v2 root, or a
subtree systemd delegated to the service) under the cgroup v2 mount
(``/proc/self/mountinfo``: ``/sys/fs/cgroup`` on a unified system, ``/sys/fs/cgroup/unified``
on a hybrid one), and ``<instance>`` is named after the data directory (two servers on
one machine never share a cgroup; a restarted one finds its runs' cgroups again). The
runner moves itself into the run's cgroup before it starts anything, so every process
of the job - ``setsid``/double-forked ones included - is in it; a stop writes
``cgroup.kill`` (Linux >= 5.14; else SIGKILL to each pid of ``cgroup.procs``); the GPUs
are handed on only once ``cgroup.events`` says ``populated 0``. A job's ``mem_mib`` and
``cpus`` become ``memory.max`` (and ``memory.swap.max`` 0) and ``cpu.max`` where the
memory and cpu controllers reach our subtree; ``memory.events``' ``oom_kill`` tells an
out-of-memory kill.

``SHEPHERD_CGROUP``: ``auto`` (the default), ``off`` (process groups), or the absolute
path of a cgroup v2 directory to put ``gpushepherd/<instance>`` under (a delegated one).
Where no cgroup v2 is mounted or writable (some containers), jobs are tracked by process
group as before, and the server says so at start and in ``GET /nodes``.
"""

from __future__ import annotations

import errno
import hashlib
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

CGROUP_ENV = "SHEPHERD_CGROUP"
#: the controllers a job's limits need: --mem (memory.max), --cpus (cpu.max)
LIMIT_CONTROLLERS = ("memory", "cpu")
#: the smallest --mem: the runner and its keeper (two Pythons, ~15 MiB) are in the cgroup too
MIN_MEM_MIB = 32
#: cpu.max's period, microseconds (the kernel's default)
CPU_PERIOD_US = 100_000


def cgroup2_mount(mountinfo: str = "/proc/self/mountinfo") -> Path | None:
    """The mount point of the cgroup v2 hierarchy (``/sys/fs/cgroup`` preferred), or ``None``."""
    found = []
    try:
        with open(mountinfo) as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split(" ", 1)[0] == "cgroup2":
                    found.append(left.split()[4].replace("\\040", " "))
    except OSError:
        return None
    if not found:
        return None
    return Path("/sys/fs/cgroup") if "/sys/fs/cgroup" in found else Path(sorted(found)[0])


def own_cgroup(proc_cgroup: str = "/proc/self/cgroup") -> str | None:
    """This process's cgroup v2 path (``/``, ``/system.slice/x.service``), or ``None``."""
    try:
        with open(proc_cgroup) as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].strip() or "/"
    except OSError:
        pass
    return None


def instance_name(data_dir: Path) -> str:
    """The cgroup name of the server of ``data_dir``: ``d`` + 12 hex digits of the
    SHA-256 of its absolute path."""
    return "d" + hashlib.sha256(str(Path(data_dir).resolve()).encode()).hexdigest()[:12]


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _keyed(path: Path) -> dict[str, int]:
    """A flat-keyed cgroup file (``cgroup.events``, ``memory.events``) as ``{key: int}``."""
    out = {}
    for line in _read(path).splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            out[key] = int(value)
    return out


def pids(cg: Path) -> list[int]:
    """The processes in cgroup ``cg`` (``cgroup.procs``); ``[]`` when it is gone."""
    return [int(x) for x in _read(cg / "cgroup.procs").split() if x.isdigit()]


def populated(cg: Path) -> bool:
    """Whether a process is in ``cg`` or a cgroup below it (``cgroup.events``); a cgroup
    that is gone is empty."""
    events = _keyed(cg / "cgroup.events")
    if "populated" in events:
        return events["populated"] == 1
    return bool(pids(cg))


def kill_all(cg: Path) -> None:
    """SIGKILL every process of ``cg``: ``cgroup.kill`` (atomic, forks included), else each
    pid of ``cgroup.procs`` (repeated once for children forked meanwhile). Never raises."""
    try:
        (cg / "cgroup.kill").write_text("1")
        return
    except OSError:
        pass
    for _ in range(2):
        for pid in pids(cg):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def oom_kills(cg: Path) -> int:
    """How many processes of ``cg`` the kernel's OOM killer ended (``memory.events``
    ``oom_kill``; 0 without the memory controller)."""
    return _keyed(cg / "memory.events").get("oom_kill", 0)


def remove(cg: Path) -> bool:
    """Remove the empty cgroup ``cg``; ``False`` when it still has processes (or children)."""
    try:
        cg.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


@dataclass
class Containment:
    """Where this server's jobs are contained.

    Attributes:
        base: ``<parent>/gpushepherd/<instance>``, the parent of the runs' cgroups;
            ``None``: process groups only.
        limits: the controllers enabled for the runs' cgroups (``memory``, ``cpu``).
        why: why process groups (``base`` ``None``), or why a limit is unavailable.
    """

    base: Path | None
    limits: frozenset[str] = field(default_factory=frozenset)
    why: str = ""

    def path(self, job_id: str, run: int) -> Path | None:
        """The cgroup of run ``run`` of a job (``None``: process groups)."""
        return None if self.base is None else self.base / f"job-{job_id}-run-{run}"

    def refusal(self, mem_mib: int, cpus: float) -> str | None:
        """Why a job's ``mem_mib`` / ``cpus`` cannot be enforced here (``None``: they can,
        or none is asked)."""
        for name, asked, ctl in (("mem_mib", mem_mib, "memory"), ("cpus", cpus, "cpu")):
            if asked and ctl not in self.limits:
                where = "jobs are not in cgroups here" if self.base is None else \
                    f"the {ctl} controller is not enabled for {self.base}"
                return f"{name}: {asked:g} is not allowed on this server: {where} ({self.why or 'no reason known'})"
        return None

    def create(self, job_id: str, run: int, mem_mib: int = 0, cpus: float = 0.0) -> Path | None:
        """Make the run's cgroup with its limits (``memory.max`` and ``memory.swap.max`` 0
        for ``mem_mib``, ``cpu.max`` for ``cpus``); ``None`` with process groups.

        Raises:
            OSError: it cannot be made or a limit cannot be written.
        """
        cg = self.path(job_id, run)
        if cg is None:
            return None
        cg.mkdir(exist_ok=True)
        if mem_mib:
            (cg / "memory.max").write_text(str(int(mem_mib) * 1024 * 1024))
            if (cg / "memory.swap.max").exists():  # a hard limit: no swapping past it
                (cg / "memory.swap.max").write_text("0")
        if cpus:
            (cg / "cpu.max").write_text(f"{max(1000, round(cpus * CPU_PERIOD_US))} {CPU_PERIOD_US}")
        return cg

    def text(self) -> str:
        """One line for the log and ``shepherd nodes``."""
        if self.base is None:
            return (f"process groups ({self.why}): a stop kills the job's process group; a process that leaves "
                    "it (setsid) escapes, and --mem/--cpus are refused")
        limits = (f"limits {', '.join(sorted(self.limits))}" if self.limits
                  else "no --mem/--cpus limits") + (f" ({self.why})" if self.why else "")
        return f"cgroup v2 at {self.base}: every process of a job in its cgroup, a stop kills the cgroup; {limits}"

    def view(self) -> dict:
        """``GET /nodes``' ``containment``: ``kind`` (``cgroup-v2`` or ``process-group``),
        ``path``, ``limits``, ``detail`` (``text``)."""
        return {"kind": "process-group" if self.base is None else "cgroup-v2",
                "path": None if self.base is None else str(self.base), "limits": sorted(self.limits),
                "detail": self.text()}


def _top(env: dict[str, str]) -> tuple[Path | None, str]:
    """The cgroup that ``gpushepherd/`` goes under (``SHEPHERD_CGROUP``), or ``None`` and why not.

    Raises:
        ValueError: ``SHEPHERD_CGROUP`` is neither ``auto``, ``off`` nor an absolute path.
    """
    setting = env.get(CGROUP_ENV, "").strip() or "auto"
    if setting == "off":
        return None, f"{CGROUP_ENV}=off"
    if setting != "auto":
        if not os.path.isabs(setting):
            raise ValueError(f"{CGROUP_ENV}: {setting!r} is not allowed: auto, off, or the absolute path of a cgroup "
                             "v2 directory this server may write")
        top = Path(setting)
        return (top, "") if (top / "cgroup.procs").exists() else (None, f"{CGROUP_ENV}={setting}: not a cgroup v2 "
                                                                        "directory")
    mount, own = cgroup2_mount(), own_cgroup()
    if mount is None:
        return None, "no cgroup v2 hierarchy is mounted"
    if own is None:
        return None, "this process is in no cgroup v2"
    return mount / own.lstrip("/"), ""


def instance_dir(data_dir: Path, env: dict[str, str] | None = None) -> Path | None:
    """``<parent>/gpushepherd/<instance>`` of the server of ``data_dir`` (made or not);
    ``None`` without cgroup v2. Raises as ``open_containment``."""
    top, _why = _top(os.environ if env is None else env)
    return None if top is None else top / "gpushepherd" / instance_name(data_dir)


def open_containment(data_dir: Path, env: dict[str, str] | None = None) -> Containment:
    """This server's ``Containment``: its cgroup ``<parent>/gpushepherd/<instance>`` made
    (``SHEPHERD_CGROUP``, see the module), the memory and cpu controllers enabled for its
    children where the parent offers them. What does not work is the ``why`` of a
    ``Containment`` without cgroups or without limits.

    Raises:
        ValueError: ``SHEPHERD_CGROUP`` is neither ``auto``, ``off`` nor an absolute path.
    """
    top, why = _top(os.environ if env is None else env)
    if top is None:
        return Containment(None, why=why)
    parent, base = top / "gpushepherd", top / "gpushepherd" / instance_name(data_dir)
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return Containment(None, why=f"cgroup v2 at {top} is not writable: {exc.strerror or exc}")
    if not os.access(base / "cgroup.procs", os.W_OK):
        return Containment(None, why=f"cgroup v2 at {base} is not writable (cgroup.procs)")
    missing = []
    for d in (parent, base):  # ours, without processes: enabling controllers cannot be EBUSY
        offered = set(_read(d / "cgroup.controllers").split())
        enabled = set(_read(d / "cgroup.subtree_control").split())
        for ctl in LIMIT_CONTROLLERS:
            if ctl in offered and ctl not in enabled:
                try:
                    (d / "cgroup.subtree_control").write_text(f"+{ctl}")
                except OSError as exc:
                    missing.append(f"{ctl}: {d}/cgroup.subtree_control: {os.strerror(exc.errno or errno.EIO)}")
    limits = frozenset(set(_read(base / "cgroup.subtree_control").split()) & set(LIMIT_CONTROLLERS))
    absent = [c for c in LIMIT_CONTROLLERS if c not in limits]
    if absent:
        why = "; ".join(missing) or (f"the {' and '.join(absent)} controller{'s' * (len(absent) > 1)} "
                                     f"{'are' if len(absent) > 1 else 'is'} not offered to {top} by its parent "
                                     "(cgroup.subtree_control; on a hybrid cgroup v1/v2 system they are v1's)")
    return Containment(base, limits, why)


def remove_instance(data_dir: Path, env: dict[str, str] | None = None, kill: bool = False,
                    wait_s: float = 10.0) -> None:
    """Remove the cgroups of the server of ``data_dir`` (its runs' and its own) that are
    empty - with ``kill``, after killing their processes and waiting for them at most
    ``wait_s`` seconds. For tests and a clean uninstall; never raises."""
    import time

    try:
        base = instance_dir(data_dir, env)
    except ValueError:
        return
    if base is None or not base.is_dir():
        return
    runs = sorted(base.glob("job-*"))
    if kill:
        for cg in runs:
            kill_all(cg)
        end = time.monotonic() + wait_s
        while any(populated(cg) for cg in runs) and time.monotonic() < end:
            time.sleep(0.05)
    for cg in runs:
        remove(cg)
    remove(base)
