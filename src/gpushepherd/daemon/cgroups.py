"""Containment of local jobs in cgroups (design notes 023 and 036).

Each run gets a cgroup ``<parent>/gpushepherd/<instance>/job-<id>-run-<run>`` in each
hierarchy it uses, where ``<parent>`` is the server's own cgroup in that hierarchy
(``/proc/self/cgroup``: the root, or a subtree systemd delegated to the service) under the
hierarchy's mount (``/proc/self/mountinfo``) and ``<instance>`` is named after the data
directory (two servers on one machine never share a cgroup; a restarted one finds its
runs' cgroups again). The runner moves itself into the run's cgroups before it starts
anything, so every process of the job - ``setsid``/double-forked ones included - is in
them.

* **cgroup v2** (``/sys/fs/cgroup``, or ``/sys/fs/cgroup/unified`` on a hybrid v1/v2 host)
  holds the processes where it is writable: a stop writes ``cgroup.kill`` (Linux >= 5.14;
  else SIGKILL to each pid of ``cgroup.procs``); the GPUs are handed on only once
  ``cgroup.events`` says ``populated 0``. ``memory.max`` (and ``memory.swap.max`` 0) and
  ``cpu.max`` where those controllers reach our subtree; ``memory.events``' ``oom_kill``
  tells an out-of-memory kill; an eBPF device program (``gpu_devices``) lets the run open
  only its own GPUs where v1 has no devices controller.
* **cgroup v1** (a hybrid host, note 036: the controllers are bound to v1 hierarchies and
  the unified one has none): ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes``,
  so that swap does not dodge it) with ``memory.oom_control``'s ``oom_kill``;
  ``cpu.cfs_quota_us``/``cpu.cfs_period_us``; ``devices.deny`` of every NVIDIA GPU minor
  that is not the run's; and, where the unified hierarchy cannot hold processes (or
  ``SHEPHERD_CGROUP=v1``), the ``freezer`` (or ``pids``) hierarchy's ``cgroup.procs`` as
  the run's process list: a stop freezes the cgroup, kills every process, thaws it.

``SHEPHERD_CGROUP``: ``auto`` (the default), ``off`` (process groups), ``v1`` (cgroup v1
hierarchies only), or the absolute path of a cgroup v2 directory to put
``gpushepherd/<instance>`` under (a delegated one; v1 hierarchies as ``auto``). Where no
cgroup is writable (some containers), jobs are tracked by process group as before, and
the server says so at start and in ``GET /nodes``.
"""

from __future__ import annotations

import errno
import hashlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpushepherd.daemon.gpu_devices import attach_gpu_filter, bpf_devices_refusal, deny_gpus

CGROUP_ENV = "SHEPHERD_CGROUP"
#: the controllers a job's limits need: --mem (memory.max), --cpus (cpu.max)
LIMIT_CONTROLLERS = ("memory", "cpu")
#: the cgroup v1 controllers used on a hybrid host (note 036): limits, devices, and the
#: two that can list a run's processes where cgroup v2 cannot hold them
V1_CONTROLLERS = ("memory", "cpu", "devices", "freezer", "pids")
#: v1 hierarchies that list a run's processes, best first (the freezer stops forks during a kill)
V1_TRACKERS = ("freezer", "pids")
#: the smallest --mem: the runner and its keeper (two Pythons, ~15 MiB) are in the cgroup too
MIN_MEM_MIB = 32
#: cpu.max's period, microseconds (the kernel's default)
CPU_PERIOD_US = 100_000
#: how long a freeze is waited for before the processes are killed anyway (seconds)
FREEZE_WAIT_S = 1.0


def _mountinfo(mountinfo: str) -> list[tuple[str, str, list[str]]]:
    """``(mount point, fstype, super options)`` of each mount."""
    out = []
    try:
        with open(mountinfo) as f:
            for line in f:
                left, _, right = line.partition(" - ")
                parts = right.split()
                if len(parts) >= 3 and len(left.split()) > 4:
                    out.append((left.split()[4].replace("\\040", " "), parts[0], parts[2].split(",")))
    except OSError:
        pass
    return out


def cgroup2_mount(mountinfo: str = "/proc/self/mountinfo") -> Path | None:
    """The mount point of the cgroup v2 hierarchy (``/sys/fs/cgroup`` preferred), or ``None``."""
    found = [mnt for mnt, fstype, _opts in _mountinfo(mountinfo) if fstype == "cgroup2"]
    if not found:
        return None
    return Path("/sys/fs/cgroup") if "/sys/fs/cgroup" in found else Path(sorted(found)[0])


def v1_mounts(mountinfo: str = "/proc/self/mountinfo") -> dict[str, Path]:
    """``{controller: mount point}`` of the cgroup v1 hierarchies of ``V1_CONTROLLERS``
    (``cpu`` of a ``cpu,cpuacct`` mount too); ``{}`` on a pure cgroup v2 host."""
    out: dict[str, Path] = {}
    for mnt, fstype, opts in _mountinfo(mountinfo):
        if fstype == "cgroup":
            for ctl in V1_CONTROLLERS:
                if ctl in opts and ctl not in out:
                    out[ctl] = Path(mnt)
    return out


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


def own_cgroups_v1(proc_cgroup: str = "/proc/self/cgroup") -> dict[str, str]:
    """This process's cgroup v1 path in each v1 hierarchy: ``{controller: path}``."""
    out = {}
    try:
        with open(proc_cgroup) as f:
            for line in f:
                num, _, rest = line.strip().partition(":")
                ctls, _, path = rest.partition(":")
                if num != "0":
                    for ctl in ctls.split(","):
                        out[ctl] = path or "/"
    except OSError:
        pass
    return out


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
    """A flat-keyed cgroup file (``cgroup.events``, ``memory.events``,
    ``memory.oom_control``) as ``{key: int}``."""
    out = {}
    for line in _read(path).splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            out[key] = int(value)
    return out


def pids(cg: Path) -> list[int]:
    """The processes in cgroup ``cg`` (``cgroup.procs``, v1 or v2); ``[]`` when it is gone."""
    return [int(x) for x in _read(cg / "cgroup.procs").split() if x.isdigit()]


def populated(cg: Path) -> bool:
    """Whether a process is in ``cg`` or a cgroup below it (``cgroup.events``; v1: its
    ``cgroup.procs``); a cgroup that is gone is empty."""
    events = _keyed(cg / "cgroup.events")
    if "populated" in events:
        return events["populated"] == 1
    return bool(pids(cg))


def _kill_listed(cg: Path, rounds: int) -> None:
    """SIGKILL each pid of ``cgroup.procs``, ``rounds`` times (children forked meanwhile)."""
    for _ in range(rounds):
        listed = pids(cg)
        if not listed:
            return
        for pid in listed:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def kill_all(cg: Path) -> None:
    """SIGKILL every process of the cgroup v2 ``cg``: ``cgroup.kill`` (atomic, forks
    included), else each pid of ``cgroup.procs`` (repeated once for children forked
    meanwhile). Never raises."""
    try:
        (cg / "cgroup.kill").write_text("1")
        return
    except OSError:
        pass
    _kill_listed(cg, 2)


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
        return True
    except OSError:
        return False


def freeze_kill_thaw(cg: Path) -> None:
    """SIGKILL every process of the cgroup v1 freezer cgroup ``cg``: frozen first (no fork
    can slip past the kill; waited for at most ``FREEZE_WAIT_S``), each pid killed, thawed
    (the kills are delivered). Never raises."""
    frozen = _write(cg / "freezer.state", "FROZEN")
    end = time.monotonic() + FREEZE_WAIT_S
    while frozen and _read(cg / "freezer.state").strip() not in ("FROZEN", "") and time.monotonic() < end:
        time.sleep(0.01)
    _kill_listed(cg, 2)
    if frozen:
        _write(cg / "freezer.state", "THAWED")


def oom_kills(cg: Path) -> int:
    """How many processes of the cgroup v2 ``cg`` the kernel's OOM killer ended
    (``memory.events`` ``oom_kill``; 0 without the memory controller)."""
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


@dataclass(frozen=True)
class RunGroup:
    """The cgroups of one run: ``v2`` (``None`` where cgroup v2 does not hold processes)
    and ``v1``, ``{controller: directory}`` of the v1 hierarchies used (note 036). The
    run's processes are listed by ``v2``, else by the v1 ``freezer`` or ``pids`` cgroup."""

    v2: Path | None
    v1: dict[str, Path] = field(default_factory=dict)

    @property
    def tracker(self) -> Path:
        """The cgroup that lists the run's processes."""
        if self.v2 is not None:
            return self.v2
        for ctl in V1_TRACKERS + tuple(sorted(self.v1)):
            if ctl in self.v1:
                return self.v1[ctl]
        raise ValueError("a RunGroup without a cgroup")

    def dirs(self) -> list[Path]:
        """Every cgroup directory of the run: the v1 ones by controller, then v2's."""
        return [self.v1[c] for c in sorted(self.v1)] + ([self.v2] if self.v2 is not None else [])

    def __str__(self) -> str:
        return str(self.tracker)

    def pids(self) -> list[int]:
        """The run's processes (``[]`` when its cgroup is gone)."""
        return pids(self.tracker)

    def populated(self) -> bool:
        """Whether any process of the run is left."""
        return populated(self.tracker)

    def kill_all(self) -> None:
        """SIGKILL every process of the run: ``cgroup.kill`` (v2), or freeze, kill, thaw
        (v1 freezer), or each pid a few times over (v1 pids). Never raises."""
        if self.v2 is not None:
            kill_all(self.v2)
        elif "freezer" in self.v1:
            freeze_kill_thaw(self.v1["freezer"])
        else:
            _kill_listed(self.tracker, 3)

    def oom_kills(self) -> int:
        """How many of the run's processes the kernel's OOM killer ended (v2
        ``memory.events``, v1 ``memory.oom_control``: ``oom_kill``)."""
        if "memory" in self.v1:
            return _keyed(self.v1["memory"] / "memory.oom_control").get("oom_kill", 0)
        return oom_kills(self.v2) if self.v2 is not None else 0

    def memory_limit(self) -> str:
        """The memory limit the run had, naming its file: ``memory.max 104857600 bytes``
        (v2) or ``memory.limit_in_bytes 104857600 bytes`` (v1); ``?`` when unknown."""
        name, d = (("memory.limit_in_bytes", self.v1["memory"]) if "memory" in self.v1 else
                   ("memory.max", self.v2))
        value = _read(d / name).strip() if d is not None else ""
        return f"{name} {value or '?'} bytes"

    def remove(self) -> bool:
        """Remove every cgroup of the run; ``False`` while one cannot be (processes left,
        or EBUSY a moment after the last one left)."""
        return all([remove(d) for d in self.dirs()])

    def exists(self) -> bool:
        """Whether any of the run's cgroup directories (one per hierarchy it uses, v2 and
        v1) is still there (note 036)."""
        return any(d.is_dir() for d in self.dirs())


@dataclass
class Containment:
    """Where this server's jobs are contained.

    Attributes:
        base: ``<parent>/gpushepherd/<instance>`` in cgroup v2, the parent of the runs'
            cgroups, when cgroup v2 holds the processes; ``None``: it does not.
        limits: the controllers enabled for the runs' cgroups (``memory``, ``cpu``, and
            ``devices`` on cgroup v1), whichever hierarchy has them.
        why: why process groups (no cgroup), or why a limit is unavailable.
        v1: ``{controller: <parent>/gpushepherd/<instance>}`` of the cgroup v1
            hierarchies used (note 036); a controller here is used on v1.
        devices_why: why device isolation is off (``devices`` not in ``limits``).
    """

    base: Path | None
    limits: frozenset[str] = field(default_factory=frozenset)
    why: str = ""
    v1: dict[str, Path] = field(default_factory=dict)
    devices_why: str = ""

    @property
    def kind(self) -> str:
        """``cgroup-v2``, ``cgroup-v1`` (a freezer or pids hierarchy lists the
        processes) or ``process-group``."""
        if self.base is not None:
            return "cgroup-v2"
        return "cgroup-v1" if any(c in self.v1 for c in V1_TRACKERS) else "process-group"

    def path(self, job_id: str, run: int) -> RunGroup | None:
        """The cgroups of run ``run`` of a job (``None``: process groups)."""
        if self.kind == "process-group":
            return None
        name = run_name(job_id, run)
        return RunGroup(None if self.base is None else self.base / name, {c: d / name for c, d in self.v1.items()})

    def refusal(self, mem_mib: int, cpus: float) -> str | None:
        """Why a job's ``mem_mib`` / ``cpus`` cannot be enforced here (``None``: they can,
        or none is asked)."""
        for name, asked, ctl in (("mem_mib", mem_mib, "memory"), ("cpus", cpus, "cpu")):
            if asked and ctl not in self.limits:
                where = "jobs are not in cgroups here" if self.kind == "process-group" else \
                    f"the {ctl} controller is not enabled for {self.base or 'our cgroups'}"
                return f"{name}: {asked:g} is not allowed on this server: {where} ({self.why or 'no reason known'})"
        return None

    def create(self, job_id: str, run: int, mem_mib: int = 0, cpus: float = 0.0,
               gpu_minors: frozenset[int] | None = None) -> RunGroup | None:
        """Make the run's cgroups with its limits; ``None`` with process groups.
        ``mem_mib``: ``memory.max`` with ``memory.swap.max`` 0 (v2), or
        ``memory.limit_in_bytes`` with ``memory.memsw.limit_in_bytes`` (v1); ``cpus``:
        ``cpu.max`` (v2) or ``cpu.cfs_quota_us``/``cpu.cfs_period_us`` (v1);
        ``gpu_minors``: the ``/dev/nvidiaN`` minors the run may open - every other GPU
        minor is denied in its v1 devices cgroup, else by an eBPF device program on its
        cgroup v2 (``gpu_devices``; ``None``: no device rules).

        Raises:
            OSError: a cgroup cannot be made or a limit cannot be written (those made are
                removed again).
        """
        group = self.path(job_id, run)
        if group is None:
            return None
        try:
            for d in group.dirs():
                d.mkdir(exist_ok=True)
            if mem_mib:
                limit = str(int(mem_mib) * 1024 * 1024)
                if "memory" in group.v1:
                    mem = group.v1["memory"]
                    (mem / "memory.limit_in_bytes").write_text(limit)
                    if (mem / "memory.memsw.limit_in_bytes").exists():  # swap cannot dodge it (>= the limit)
                        (mem / "memory.memsw.limit_in_bytes").write_text(limit)
                elif group.v2 is not None:
                    (group.v2 / "memory.max").write_text(limit)
                    if (group.v2 / "memory.swap.max").exists():  # a hard limit: no swapping past it
                        (group.v2 / "memory.swap.max").write_text("0")
            if cpus:
                quota = max(1000, round(cpus * CPU_PERIOD_US))
                if "cpu" in group.v1:
                    (group.v1["cpu"] / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
                    (group.v1["cpu"] / "cpu.cfs_quota_us").write_text(str(quota))
                elif group.v2 is not None:
                    (group.v2 / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
            if gpu_minors is not None and "devices" in self.limits:
                if "devices" in group.v1:
                    deny_gpus(group.v1["devices"], gpu_minors)
                elif group.v2 is not None:
                    attach_gpu_filter(group.v2, gpu_minors)
        except OSError:
            group.remove()
            raise
        return group

    def isolation(self) -> dict[str, str | None]:
        """What each layer uses here: ``containment`` (``kind``), ``memory``, ``cpu``,
        ``devices`` (``cgroup-v1``, ``cgroup-v2``, or ``None``: off)."""
        def where(ctl: str) -> str | None:
            if ctl not in self.limits:
                return None
            return "cgroup-v1" if ctl in self.v1 else "cgroup-v2"
        return {"containment": self.kind, "memory": where("memory"), "cpu": where("cpu"),
                "devices": where("devices")}

    def _devices_text(self) -> str:
        if "devices" in self.limits:
            how = "cgroup v1 devices.deny" if "devices" in self.v1 else "cgroup v2 eBPF device program"
            return f"devices: {how} (a job may open only its own GPUs' /dev/nvidiaN, nvidiactl and the rest)"
        if self.kind == "process-group":
            return "devices: off (jobs are not in cgroups)"
        return ("devices: off (cgroup v2 needs an eBPF device program, BPF_PROG_TYPE_CGROUP_DEVICE, which could not "
                f"be loaded here: {self.devices_why or 'no reason known'}; a job can open another GPU's /dev/nvidiaN "
                "and ignore CUDA_VISIBLE_DEVICES)")

    def text(self) -> str:
        """One line for the log and ``shepherd nodes``: the containment kind and where
        memory, cpu and device isolation come from (or why they are off)."""
        if self.kind == "process-group":
            return (f"process groups ({self.why}): a stop kills the job's process group; a process that leaves "
                    "it (setsid) escapes, and --mem/--cpus are refused; devices: off (jobs are not in cgroups)")
        if self.base is not None:
            head = f"cgroup v2 at {self.base}: every process of a job in its cgroup, a stop kills the cgroup"
        else:
            ctl = next(c for c in V1_TRACKERS if c in self.v1)
            head = (f"cgroup v1 {ctl} at {self.v1[ctl]}: every process of a job in its cgroup, a stop "
                    f"{'freezes the cgroup, kills every process and thaws it' if ctl == 'freezer' else 'kills every process of the cgroup'}")
        iso = self.isolation()
        parts = [f"{ctl}: {'cgroup v1' if iso[ctl] == 'cgroup-v1' else 'cgroup v2'} ({knob})" if iso[ctl] else
                 f"{ctl}: off ({flag} refused)"
                 for ctl, knob, flag in (("memory", "--mem: memory.limit_in_bytes" if iso["memory"] == "cgroup-v1"
                                          else "--mem: memory.max", "--mem"),
                                         ("cpu", "--cpus: cpu.cfs_quota_us" if iso["cpu"] == "cgroup-v1"
                                          else "--cpus: cpu.max", "--cpus"))]
        why = f" ({self.why})" if self.why and not ("memory" in self.limits and "cpu" in self.limits) else ""
        return f"{head}; {'; '.join(parts)}{why}; {self._devices_text()}"

    def view(self) -> dict:
        """``GET /nodes``' ``containment``: ``kind`` (``cgroup-v2``, ``cgroup-v1`` or
        ``process-group``), ``path``, ``limits``, ``isolation`` (``isolation()``),
        ``detail`` (``text``)."""
        path = self.base if self.base is not None else next((self.v1[c] for c in V1_TRACKERS if c in self.v1), None)
        return {"kind": self.kind, "path": None if path is None else str(path), "limits": sorted(self.limits),
                "isolation": self.isolation(), "detail": self.text()}


def _top(env: dict[str, str]) -> tuple[Path | None, str]:
    """The cgroup v2 directory that ``gpushepherd/`` goes under (``SHEPHERD_CGROUP``), or
    ``None`` and why not.

    Raises:
        ValueError: ``SHEPHERD_CGROUP`` is neither ``auto``, ``off``, ``v1`` nor an absolute path.
    """
    setting = env.get(CGROUP_ENV, "").strip() or "auto"
    if setting in ("off", "v1"):
        return None, f"{CGROUP_ENV}={setting}"
    if setting != "auto":
        if not os.path.isabs(setting):
            raise ValueError(f"{CGROUP_ENV}: {setting!r} is not allowed: auto, off, v1, or the absolute path of a "
                             "cgroup v2 directory this server may write")
        top = Path(setting)
        return (top, "") if (top / "cgroup.procs").exists() else (None, f"{CGROUP_ENV}={setting}: not a cgroup v2 "
                                                                        "directory")
    mount, own = cgroup2_mount(), own_cgroup()
    if mount is None:
        return None, "no cgroup v2 hierarchy is mounted"
    if own is None:
        return None, "this process is in no cgroup v2"
    return mount / own.lstrip("/"), ""


def _v1_tops(env: dict[str, str]) -> dict[str, Path]:
    """``{controller: the server's own cgroup in its v1 hierarchy}`` (``{}`` with
    ``SHEPHERD_CGROUP=off``, or on a pure cgroup v2 host)."""
    if (env.get(CGROUP_ENV, "").strip() or "auto") == "off":
        return {}
    mounts, own = v1_mounts(), own_cgroups_v1()
    return {ctl: mnt / own[ctl].lstrip("/") for ctl, mnt in mounts.items() if ctl in own}


def instance_dir(data_dir: Path, env: dict[str, str] | None = None) -> Path | None:
    """``<parent>/gpushepherd/<instance>`` in cgroup v2 of the server of ``data_dir``
    (made or not); ``None`` without cgroup v2. Raises as ``open_containment``."""
    top, _why = _top(os.environ if env is None else env)
    return None if top is None else top / "gpushepherd" / instance_name(data_dir)


def instance_dirs_v1(data_dir: Path, env: dict[str, str] | None = None) -> dict[str, Path]:
    """``{controller: <parent>/gpushepherd/<instance>}`` in the cgroup v1 hierarchies
    (made or not) of the server of ``data_dir``."""
    return {c: top / "gpushepherd" / instance_name(data_dir)
            for c, top in _v1_tops(os.environ if env is None else env).items()}


def run_group(data_dir: Path, job_id: str, run: int, env: dict[str, str] | None = None) -> RunGroup | None:
    """The cgroups of a run of the server of ``data_dir`` that exist (a restarted server
    finding its runs again), looked up without making any; ``None``: none."""
    env = os.environ if env is None else env
    name = run_name(job_id, run)
    base = instance_dir(data_dir, env)
    v2 = base / name if base is not None and (base / name).is_dir() else None
    v1 = {c: d / name for c, d in instance_dirs_v1(data_dir, env).items() if (d / name).is_dir()}
    if v2 is None and not any(c in v1 for c in V1_TRACKERS):
        return None
    return RunGroup(v2, v1)


def _make_base(d: Path) -> str | None:
    """Make our cgroup ``d``; why it cannot be used (``None``: it can)."""
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"{d.parent.parent} is not writable: {exc.strerror or exc}"
    if not os.access(d / "cgroup.procs", os.W_OK):
        return f"{d} is not writable (cgroup.procs)"
    return None


def open_containment(data_dir: Path, env: dict[str, str] | None = None) -> Containment:
    """This server's ``Containment``: its cgroup ``<parent>/gpushepherd/<instance>`` made
    in cgroup v2 (``SHEPHERD_CGROUP``, see the module), the memory and cpu controllers
    enabled for its children where the parent offers them, and in each cgroup v1
    hierarchy of ``V1_CONTROLLERS`` (a hybrid host, note 036). What does not work is the
    ``why`` of a ``Containment`` without cgroups or without limits.

    Raises:
        ValueError: ``SHEPHERD_CGROUP`` is neither ``auto``, ``off``, ``v1`` nor an absolute path.
    """
    env = os.environ if env is None else env
    top, why = _top(env)
    v1, v1_why = {}, []
    for ctl, d in sorted(_v1_tops(env).items()):
        d = d / "gpushepherd" / instance_name(data_dir)
        bad = _make_base(d)
        if bad is None:
            v1[ctl] = d
        else:
            v1_why.append(f"cgroup v1 {ctl}: {bad}")
    base = None
    if top is not None:
        base = top / "gpushepherd" / instance_name(data_dir)
        bad = _make_base(base)
        if bad is not None:
            why, base = f"cgroup v2 at {bad}", None
    if base is not None:  # cgroup v2 holds the processes: the v1 freezer and pids lists are not needed
        for ctl in V1_TRACKERS:
            if ctl in v1:
                remove(v1.pop(ctl))
    elif not any(c in v1 for c in V1_TRACKERS):
        for d in v1.values():
            remove(d)
        reasons = [why] + v1_why if why else v1_why
        return Containment(None, why="; ".join(reasons) or "no cgroup v1 freezer or pids hierarchy either")
    missing = []
    if base is not None:
        parent = base.parent
        for d in (parent, base):  # ours, without processes: enabling controllers cannot be EBUSY
            offered = set(_read(d / "cgroup.controllers").split())
            enabled = set(_read(d / "cgroup.subtree_control").split())
            for ctl in LIMIT_CONTROLLERS:
                if ctl in offered and ctl not in enabled and ctl not in v1:
                    try:
                        (d / "cgroup.subtree_control").write_text(f"+{ctl}")
                    except OSError as exc:
                        missing.append(f"{ctl}: {d}/cgroup.subtree_control: {os.strerror(exc.errno or errno.EIO)}")
    on_v2 = set(_read(base / "cgroup.subtree_control").split()) if base is not None else set()
    limits = set((on_v2 & set(LIMIT_CONTROLLERS)) | (set(v1) & {"memory", "cpu", "devices"}))
    devices_why = ""
    if "devices" not in limits:
        devices_why = "no cgroup v2 holds the processes" if base is None else bpf_devices_refusal() or ""
        if not devices_why:
            limits.add("devices")  # an eBPF device program per run's cgroup v2
    absent = [c for c in LIMIT_CONTROLLERS if c not in limits]
    why = ""
    if absent:
        why = "; ".join(missing + v1_why) or (
            f"the {' and '.join(absent)} controller{'s' * (len(absent) > 1)} {'are' if len(absent) > 1 else 'is'} "
            f"not offered to {top} by its parent (cgroup.subtree_control) nor mounted as cgroup v1")
    return Containment(base, frozenset(limits), why, v1, devices_why)


def run_name(job_id: str, run: int) -> str:
    """The cgroup of run ``run`` of job ``job_id``, below the server's instance cgroup."""
    return f"job-{job_id}-run-{run}"


def remove_instance(data_dir: Path, env: dict[str, str] | None = None, kill: bool = False,
                    wait_s: float = 10.0, keep: frozenset[str] = frozenset()) -> None:
    """Remove the cgroups of the server of ``data_dir`` (its runs' and its own, in cgroup
    v2 and v1) that are empty - with ``kill``, after killing their processes and waiting
    for them at most ``wait_s`` seconds. ``keep``: names of run cgroups
    (``job-<id>-run-<n>``) never removed, empty or not - a run launched but whose
    runner has not entered its cgroup yet is empty for a moment, and a restart finds it
    there. For a stopping server, tests and a clean uninstall; never raises."""
    try:
        base = instance_dir(data_dir, env)
        v1 = instance_dirs_v1(data_dir, env)
    except ValueError:
        return
    bases = [b for b in [base, *v1.values()] if b is not None and b.is_dir()]
    names = sorted({cg.name for b in bases for cg in b.glob("job-*")} - keep)
    groups = []
    for name in names:
        v2 = base / name if base is not None and (base / name).is_dir() else None
        v1_dirs = {c: d / name for c, d in v1.items() if (d / name).is_dir()}
        if v2 is not None or v1_dirs:
            groups.append(RunGroup(v2, v1_dirs))
    if kill:
        for g in groups:
            g.kill_all()
            if g.v2 is None:  # killed from every v1 list it is in (a tracker may be missing)
                for d in g.v1.values():
                    _kill_listed(d, 2)
        end = time.monotonic() + wait_s
        while any(populated(d) for g in groups for d in g.dirs()) and time.monotonic() < end:
            time.sleep(0.05)
    for g in groups:
        g.remove()
    for b in bases:
        remove(b)  # gpushepherd/ itself stays: other servers' instances come and go in it
