"""Local backend: each job runs as its own process group - and, where cgroup v2 is
writable, in its own cgroup - on this server (design notes 008, 023).

Layout under the data directory:

* ``runs/<job>/<run>/stdout``, ``stderr``: the run's output;
* ``runs/<job>/<run>/exit``: ``{"code": N}``, written by the runner when the job ends;
* ``checkpoints/<job>/``: ``SHEPHERD_CHECKPOINT_DIR``, kept across runs and requeues.

The checkpoint contract: a job that saved its state into ``SHEPHERD_CHECKPOINT_DIR``
and exits with ``REQUEUE_EXIT_CODE`` (85) is requeued (``ExitStatus.PREEMPTED``) and
finds the directory again on its next run. Preemption and stops (time limit, window,
idle) send the class's ``stop_signal`` (SIGTERM by default) to the group (to every
process of the run's cgroup), then SIGKILL after the grace period.

Run as root (note 023), a job runs as its user (``gpushepherd.daemon.runas``): its
stdout, stderr and exit file are the user's, mode 0600, in a run directory of root's
(mode 0711: the user reaches them by path, nobody else can open them, and the user
cannot plant a link or a FIFO where root writes); its checkpoint directory is the
user's, mode 0700; the data directory and ``runs/``, ``checkpoints/`` are root's, 0711.
A server that is not root keeps them 0700/0600 as its own.

Containment (``gpushepherd.daemon.cgroups``): a stop kills the run's cgroup, and the
GPUs of an ended or killed run are handed on only once its cgroup is empty
(``gpus_held``); an out-of-memory kill ends the job ``OUT_OF_MEMORY`` (``end_causes``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import stat
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpushepherd.backends import EngineNode, RunFiles, contract_env, package_root
from gpushepherd.daemon import cgroups, runas
from gpushepherd.daemon.runner import STOP_SIGNALS
from gpushepherd.daemon.terminal import Terminal, open_terminal
from gpushepherd.gpu.inventory import Discovery
from gpushepherd.gpu.procs import env_and_argv
from gpushepherd.gpu.procs import stat_fields as _stat
from gpushepherd.model.job import ExitStatus, mps_env
from gpushepherd.model.placement import Placement

log = logging.getLogger("gpushepherd.daemon")

#: "checkpointed, requeue me" (the number Slurm users know from ``--requeue`` scripts)
REQUEUE_EXIT_CODE = 85
#: the reason of a run the kernel's OOM killer ended in its cgroup (Slurm's job state)
OUT_OF_MEMORY = "OUT_OF_MEMORY"
#: the most of an exit file that is read (it is the job user's file)
EXIT_FILE_MAX = 4096


def proc_start_time(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks since boot, or ``None`` when
    there is no such process (or no ``/proc``): with the pid it names one process."""
    fields = _stat(pid)
    return fields[19] if fields else None


def group_running(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies, which an init that does
    not reap may leave behind, do not count)."""
    if not os.path.isdir("/proc"):
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields and fields[2] == str(pgid) and fields[0] not in "ZX":
                return True
    return False


def find_runner(job_id: str, run: int, exit_file: Path) -> tuple[int, str | None] | None:
    """The process group of run ``run`` of a job, found in ``/proc``: a process whose
    environment has ``SHEPHERD_JOB_ID``/``SHEPHERD_RUN`` and whose command line names
    ``exit_file`` (a path inside this server's data directory: another server on the
    same machine - whose job ids and run numbers are the same small numbers - is never
    mistaken for this one) - the runner, or its keeper when the runner is gone (note 017).
    ``(process group id, the runner's start time or None)``, or ``None``. For a restart
    that finds a run launched but its pid never recorded (the server died between the
    fork and the commit)."""
    want = (f"SHEPHERD_JOB_ID={job_id}".encode(), f"SHEPHERD_RUN={run}".encode())
    path = os.fsencode(str(exit_file))
    if not os.path.isdir("/proc"):
        return None
    found = None
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        read = env_and_argv(pid)
        if read is None:
            continue
        env, argv = read
        fields = _stat(pid)
        # runner and keeper share that command line; the job's own processes do not
        if not (all(w in env for w in want) and path in argv and fields and fields[0] not in "ZX"):
            continue
        if fields[2] == entry:  # the runner, leading its group
            return pid, fields[19]
        found = (int(fields[2]), None)  # the keeper: its group is the runner's
    return found


def exit_status(code: int) -> ExitStatus:
    """The core's status for an exit code: 0 -> ``COMPLETED``, 85 -> ``PREEMPTED``
    (requeue), anything else (a signal is negative) -> ``FAILED``. The daemon counts an
    exit 0 of a run it signalled for preemption as ``PREEMPTED`` (``Daemon._exit_of``,
    note 048); the core turns a failure of a job it was preempting or stopping into a
    requeue or a ``TIMEOUT``."""
    if code == 0:
        return ExitStatus.COMPLETED
    if code == REQUEUE_EXIT_CODE:
        return ExitStatus.PREEMPTED
    return ExitStatus.FAILED


def _mig_share(placement: Placement) -> tuple[str, int] | None:
    """``(profile, start)`` of a MIG placement (share ``mig:1g.10gb@3``), else ``None``."""
    m = re.fullmatch(r"mig:(\S+)@(\d+)", placement.share)
    return (m.group(1), int(m.group(2))) if m else None


def mig_uuid(found: Discovery | None, gpu: int, profile: str, start: int) -> str:
    """The UUID of GPU ``gpu``'s MIG device of ``profile`` at ``start`` in ``found``;
    when NVML could not read starts, the one device of that profile on the GPU; ''
    when unknown."""
    if found is None or not 0 <= gpu < len(found.gpus):
        return ""
    devices = found.gpus[gpu].mig
    exact = [d.uuid for d in devices if d.profile == profile and d.start == start and d.uuid]
    if exact:
        return exact[0]
    loose = [d.uuid for d in devices if d.profile == profile and d.start < 0 and d.uuid]
    return loose[0] if len(loose) == 1 and not any(d.start == start for d in devices) else ""


def visible_devices(placement: Placement, node: str = "", found: Discovery | None = None) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a placement on this server (note 008), comma-separated:
    for the GPUs of ``node`` (this server) the GPU UUIDs ``found`` knows (NVML, or the
    policy's ``gpu_uuids``), for a MIG placement the MIG device's UUID; else - no
    inventory, unknown UUIDs, GPUs of another node - the GPU indices, ascending (a
    share: its one GPU; a MIG device of unknown UUID: its GPU)."""
    ids = []
    for name, gpus in placement.parts:
        for g in gpus:
            known = found is not None and name == node and 0 <= g < len(found.gpus)
            ids.append((g, found.gpus[g].uuid if known and found.gpus[g].uuid else str(g)))
    mig = _mig_share(placement)
    if mig is not None and len(ids) == 1 and placement.parts[0][0] == node:
        uuid = mig_uuid(found, ids[0][0], *mig)
        if uuid:
            return uuid
    return ",".join(text for _g, text in sorted(set(ids)))


def unresolved_mig(placement: Placement, node: str = "", found: Discovery | None = None) -> str:
    """The MIG device (``1g.10gb@3``) of a MIG placement whose UUID is unknown (the job
    then sees its whole GPU), else ''."""
    mig = _mig_share(placement)
    if mig is None:
        return ""
    gpu = placement.parts[0][1][0]
    return "" if placement.parts[0][0] == node and mig_uuid(found, gpu, *mig) else f"{mig[0]}@{mig[1]}"


def nvidia_minors(root: str = "/proc/driver/nvidia/gpus") -> dict[str, int]:
    """``{GPU UUID: device minor}`` from the NVIDIA driver's ``information`` files
    (``GPU UUID:``, ``Device Minor:``); ``{}`` without the driver."""
    out = {}
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return out
    for entry in entries:
        try:
            with open(os.path.join(root, entry, "information")) as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            out[fields["GPU UUID"].strip()] = int(fields["Device Minor"].strip())
        except (OSError, KeyError, ValueError):
            continue
    return out


@dataclass(slots=True)
class Proc:
    """One run's process group: ``pid`` (the runner, the group leader) == ``pgid``;
    ``cgroup``: its cgroups (``None``: the process group only); ``placement``: the
    GPUs it holds until every process of it is gone; ``killed``: a kill was sent."""

    job_id: str
    run: int
    pid: int
    start: str | None
    exit_file: Path
    popen: subprocess.Popen | None = None  # None: re-attached after a restart (not our child)
    cgroup: cgroups.RunGroup | None = None
    placement: Placement | None = None
    killed: bool = False


def _exit_code(exit_file: Path) -> int | None:
    """The code in a run's exit file (``None``: none, or unreadable). At most
    ``EXIT_FILE_MAX`` bytes of a plain file are read: the file is the job user's."""
    try:
        fd = os.open(exit_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return int(json.loads(os.read(fd, EXIT_FILE_MAX))["code"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    finally:
        os.close(fd)


def _private_dir(path: Path, mode: int, owner: runas.Identity | None = None) -> None:
    """Make ``path`` (its parents as needed) and give it ``mode`` and, with ``owner``,
    that user and primary group."""
    path.mkdir(parents=True, exist_ok=True)
    if owner is not None:
        os.chown(path, owner.uid, owner.gid, follow_symlinks=False)
    os.chmod(path, mode)


def _open_log(path: Path, owner: runas.Identity | None) -> int:
    """A run's stdout or stderr, opened to append: mode 0600, given to ``owner``.

    Raises:
        OSError: it cannot be opened, or is not a plain file with one link.
    """
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise OSError(f"{path}: not a plain file with one link")
        if owner is not None:
            os.fchown(fd, owner.uid, owner.gid)
        os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


class LocalBackend(RunFiles):
    """Starts, signals and watches job processes on this server (``backends.Backend``).

    Args:
        data_dir: the server's data directory (logs, exit files, checkpoints).
        run_as: how jobs run (``runas.run_as()``, from the process and
            ``SHEPHERD_RUN_AS``, by default).
        containment: the runs' cgroups (``cgroups.open_containment``, from
            ``SHEPHERD_CGROUP``, by default; opened at the first run).
    """

    kind = "local"

    def __init__(self, data_dir: Path, run_as: runas.RunAs | None = None,
                 containment: cgroups.Containment | None = None):
        self.data_dir = Path(data_dir)
        self.procs: dict[str, Proc] = {}
        #: job -> why its last run ended without an exit code (``exits`` returned ``None``)
        self.lost_causes: dict[str, str] = {}
        #: jobs whose last run ``exits`` reported ended without an exit code after this
        #: server's ``kill`` (a cancel, a grace period's end): not lost; the daemon says why
        self.killed_ends: set[str] = set()
        #: job -> ``(reason, detail)`` of its last run when the exit code alone does not say
        #: why it ended (``OUT_OF_MEMORY``); the daemon takes them when it records the exit
        self.end_causes: dict[str, tuple[str, str]] = {}
        #: ended or replaced runs with processes left, (job, run) -> Proc: their GPUs are held
        self.draining: dict[tuple[str, int], Proc] = {}
        #: this server's node and what its inventory found (GPU and MIG UUIDs for
        #: ``CUDA_VISIBLE_DEVICES``); set by the daemon, ``None``: indices
        self.node = ""
        self.found: Discovery | None = None
        self.run_as = run_as if run_as is not None else runas.run_as()
        if containment is None:
            cgroups.instance_dir(self.data_dir)  # a bad SHEPHERD_CGROUP is refused now (ValueError), not at a run
        self._containment = containment
        self._dirs_done = False
        #: job -> the terminal of its run started with ``pty`` (note 041); the API attaches to it
        self.terminals: dict[str, Terminal] = {}
        #: called ``(job id, run)`` when a pty run has had no client for the grace (set by the daemon)
        self.on_detached: Callable[[str, int], None] | None = None

    @property
    def containment(self) -> cgroups.Containment:
        """Where the runs are contained (opened on first use)."""
        if self._containment is None:
            self._containment = cgroups.open_containment(self.data_dir)
        return self._containment

    def after_stop(self) -> None:
        """After the server's loop has stopped: remove this server's own cgroups (``<parent>/gpushepherd/
        <instance>``, cgroup v2 and v1) when no run is left in them - a run still alive
        keeps its cgroup and so the instance's (a restart re-attaches), and a restart
        makes them again. Before this every server ever started left an empty
        directory per data dir behind (a newcomer counted 109). Never raises."""
        # by path (a restarted server that only re-attached never opened its containment);
        # an empty run cgroup left (its run ended, its removal not yet retried) goes too:
        # a restart finds such a run by its exit file, as before
        # a run still alive keeps its cgroup even while empty: a runner launched a moment
        # before the stop may not have entered it yet (it would then fail to, and the
        # restart would find its run lost); a run that ended (its exit file written, or
        # nothing of it left) lets its cgroup go, though not yet collected
        live = frozenset(cgroups.run_name(job_id, proc.run) for job_id, proc in sorted(self.procs.items())
                         if not proc.exit_file.exists() and self._alive(proc))
        cgroups.remove_instance(self.data_dir, keep=live)

    def describe(self) -> str:
        """How jobs run here, for the log: as whom, and their containment."""
        return f"{self.run_as.text()}; containment: {self.containment.text()}"

    def containment_view(self) -> dict:
        """``GET /nodes``' ``containment`` of this server (``Containment.view``) and
        ``run_as`` (``RunAs.text``)."""
        return {**self.containment.view(), "run_as": self.run_as.text()}

    def check_job(self, user: str, mem_mib: int = 0, cpus: float = 0.0) -> str | None:
        """Why a job of ``user`` with these limits cannot run here (an unknown Unix user
        when jobs run as their users; limits without their cgroup controller), or ``None``."""
        if self.run_as.per_user:
            try:
                runas.identity(user)
            except runas.UnknownUser as exc:
                return str(exc)
        return self.containment.refusal(mem_mib, cpus)

    def gpu_minors(self, placement: Placement) -> frozenset[int]:
        """The ``/dev/nvidiaN`` minors of this server's GPUs in ``placement`` (note 036): by
        UUID from the driver's ``/proc/driver/nvidia/gpus/*/information`` where the
        inventory knows the UUID, else the GPU's index (NVML's index and the device
        minor agree on most machines; a MIG device is its GPU's)."""
        by_uuid = nvidia_minors()
        out = set()
        for name, gpus in placement.parts:
            if name != self.node and self.node:
                continue
            for g in gpus:
                known = self.found is not None and 0 <= g < len(self.found.gpus) and self.found.gpus[g].uuid
                out.add(by_uuid.get(self.found.gpus[g].uuid, g) if known else g)
        return frozenset(out)

    def discover(self) -> list[EngineNode]:
        """This server's node as its inventory found it (set by the daemon); ``[]``
        before that or for a cluster simulated on this machine."""
        if not self.node or self.found is None:
            return []
        mem = self.found.gpus[0].memory_mib if self.found.gpus else 0
        return [EngineNode(self.node, self.found.gpus[0].name if self.found.gpus else "", len(self.found.gpus),
                           mem, (), "up")]

    def _prepare(self, job_id: str, run: int, owner: runas.Identity | None) -> tuple[Path, Path, Path]:
        """``prepare_run`` with the modes and owners of the module's docstring."""
        shared = 0o711 if owner is not None else 0o700
        if not self._dirs_done or owner is not None:
            for d in (self.data_dir, self.data_dir / "runs", self.data_dir / "checkpoints"):
                _private_dir(d, shared)
            self._dirs_done = owner is None
        rdir, ckpt = self.run_dir(job_id, run), self.checkpoint_dir(job_id)
        _private_dir(rdir.parent, shared)
        _private_dir(rdir, shared)  # root's: its user cannot put a link where root writes
        _private_dir(ckpt, 0o700, owner)
        exit_file = rdir / "exit"
        exit_file.unlink(missing_ok=True)
        return rdir, ckpt, exit_file

    def start(self, job_id: str, run: int, argv: list[str], *, shell: bool, env: dict[str, str], cwd: str,
              placement: Placement, time_limit_s: float | None = None, user: str = "", mem_mib: int = 0,
              cpus: float = 0.0, pty: bool = False) -> Proc:
        """Start run ``run`` of a job on ``placement``; returns its process
        (``time_limit_s`` is unused: the core's stop is the only limit here). ``user``:
        the Unix user it runs as when jobs run as their users; ``mem_mib`` / ``cpus``:
        its cgroup's ``memory.max`` / ``cpu.max`` (0: none); ``pty``: the job runs on a
        pseudo-terminal whose master this server relays (``terminals[job_id]``, note 041).

        Raises:
            OSError: the runner, the run's files or its cgroup could not be made (the
                job's own command failing to start is an exit code 127, reported like any
                exit); runas.UnknownUser (a ValueError): no such Unix user.
        """
        owner = runas.identity(user) if self.run_as.per_user else None
        self._retire(job_id)
        rdir, ckpt, exit_file = self._prepare(job_id, run, owner)
        cg = self.containment.create(job_id, run, mem_mib, cpus, self.gpu_minors(placement))
        job_env = runas.clean_env(owner, env) if owner is not None else {**os.environ, **env}
        unresolved = unresolved_mig(placement, self.node, self.found)
        if unresolved:
            log.warning("job %s: MIG device %s has no known UUID (static inventory?): it sees its whole GPU; "
                        "SHEPHERD_MIG_DEVICE names the device", job_id, unresolved)
            job_env["SHEPHERD_MIG_DEVICE"] = unresolved
        job_env["CUDA_VISIBLE_DEVICES"] = visible_devices(placement, self.node, self.found)
        # an MPS share's client limits, as the core resolved them on this node (note 037)
        job_env.update(mps_env(placement.share))
        # the runner must import gpushepherd even when the job's cwd or env differ
        job_env.update(contract_env(job_id, run, ckpt, placement.share, env, inherit=owner is None))
        if owner is not None:  # its runner gets this package's root apart (runner_env): the job's own
            # environment has the PYTHONPATH its submitter sent, or none (the clean environment, note 023)
            job_env.pop("PYTHONPATH", None)
            if env.get("PYTHONPATH"):
                job_env["PYTHONPATH"] = env["PYTHONPATH"]
        else:  # job_env is the runner's: it hands the job the PYTHONPATH the job would have had without it
            job_env[runas.JOB_PYTHONPATH_ENV] = env.get("PYTHONPATH") or os.environ.get("PYTHONPATH") or ""
        cmd = [sys.executable, "-m", "gpushepherd.daemon.runner"] + (["--shell"] if shell else [])
        for d in cg.dirs() if cg is not None else ():
            cmd += ["--cgroup", str(d)]
        runner_env = job_env
        if owner is not None:
            # the runner is root: it gets only what it needs (never the job's PYTHONPATH,
            # LD_PRELOAD ...); the job's environment goes to it in a file of root's
            env_file = rdir / "env.json"
            env_file.unlink(missing_ok=True)
            fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(job_env, f)
            cmd += ["--user", owner.runner_arg(), "--cwd", cwd, "--env-file", str(env_file)]
            runner_env = {"PATH": runas.DEFAULT_PATH, "PYTHONPATH": package_root(),
                          **{k: job_env[k] for k in ("SHEPHERD_JOB_ID", "SHEPHERD_RUN")}}
        cmd += (["--pty"] if pty else []) + [str(exit_file), "--", *argv]
        out = _open_log(rdir / "stdout", owner)
        master = slave = None
        try:
            err = _open_log(rdir / "stderr", owner)
            try:
                if pty:
                    master, slave = open_terminal(owner.uid if owner is not None else None)
                # the runner starts with the stop signals blocked (inherited through exec) until
                # its handlers are in place: a preemption sent at once no longer kills it
                mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
                try:
                    popen = subprocess.Popen(cmd, stdin=slave if pty else subprocess.DEVNULL, stdout=out, stderr=err,
                                             cwd="/" if owner is not None else cwd, env=runner_env,
                                             start_new_session=True, close_fds=True)
                finally:
                    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            except BaseException:
                if master is not None:
                    os.close(master)
                raise
            finally:
                os.close(err)
                if slave is not None:
                    os.close(slave)  # the runner's copy is the only one: its end is the master's EOF
            if master is not None:
                term = Terminal(job_id, run, master, os.dup(out), self.on_detached)
                old = self.terminals.pop(job_id, None)
                if old is not None:
                    old.close()
                self.terminals[job_id] = term
                term.start()
        finally:
            os.close(out)
        proc = Proc(job_id, run, popen.pid, proc_start_time(popen.pid), exit_file, popen, cg, placement)
        self.procs[job_id] = proc
        return proc

    def attach(self, job_id: str, run: int, pid: int | None, start: str | None,
               placement: Placement | None = None) -> Proc | None:
        """Re-attach to a run started by an earlier server (``pid``: its runner, ``None``
        when it was never recorded: looked up by its environment; ``placement``: the GPUs
        it holds), and to its cgroup when it has one. Returns ``None`` if no process of
        it is left and it left no exit file (the run is lost)."""
        exit_file = self.run_dir(job_id, run) / "exit"
        # the cgroups it was started in, if any (a run of a server before cgroups has none);
        # looked up without making this server's cgroups
        if self._containment is not None:
            cg = self._containment.path(job_id, run)
            cg = cg if cg is not None and cg.exists() else None
        else:
            cg = cgroups.run_group(self.data_dir, job_id, run)
        if pid is None:
            found = find_runner(job_id, run, exit_file)
            if found is None and not exit_file.exists() and not (cg is not None and cg.populated()):
                return None
            pid, start = found or (0, None)
        proc = Proc(job_id, run, pid, start, exit_file, cgroup=cg, placement=placement)
        if exit_file.exists() or self._alive(proc):
            self.procs[job_id] = proc
            return proc
        self.lost_causes[job_id] = (f"no process of its group and no exit file when this server started; stderr: "
                                    f"{self.run_dir(job_id, run) / 'stderr'}")
        if cg is not None:
            cg.remove()
        return None

    def _alive(self, proc: Proc) -> bool:
        """Whether the run still runs: a process in its cgroup, its runner, or else any
        process of its group (the keeper and the job outlive a killed runner and record
        the exit, note 017)."""
        if proc.cgroup is not None and proc.cgroup.populated():
            return True
        if proc.popen is not None:
            # with a cgroup the runner is in it from its start: the group is not looked up
            return proc.popen.poll() is None or (proc.cgroup is None and group_running(proc.pid))
        if proc.pid <= 0:
            return False
        fields = _stat(proc.pid)
        if fields is None or fields[0] in "ZX" or (proc.start is not None and fields[19] != proc.start):
            # the leader is gone (or its pid reused): is its group?
            return proc.cgroup is None and group_running(proc.pid)
        return True

    def _remains(self, proc: Proc) -> bool:
        """Whether any process of an ended or killed run is left."""
        if proc.cgroup is not None:
            return proc.cgroup.populated()
        return proc.pid > 0 and group_running(proc.pid)

    def _kill_all(self, proc: Proc) -> None:
        """SIGKILL every process of a run: its process group (the runner before it entered
        its cgroup) and its cgroup."""
        if proc.pid > 0:
            self.kill_group(proc.pid)
        if proc.cgroup is not None:
            proc.cgroup.kill_all()

    def _drained(self, proc: Proc) -> bool:
        """Whether nothing is left of an ended or killed run: no process, and its cgroup
        removed (an empty cgroup the kernel still refuses to remove, EBUSY while its last
        tasks are released, is waited for too)."""
        if self._remains(proc):
            return False
        return proc.cgroup is None or proc.cgroup.remove()

    def _drain(self, proc: Proc) -> None:
        """A run that ended or was replaced: what is left of it is killed, and its GPUs
        stay held (``gpus_held``) until nothing is (its cgroup removed)."""
        if self._remains(proc):
            self._kill_all(proc)
        if not self._drained(proc):
            self.draining[(proc.job_id, proc.run)] = proc

    def _retire(self, job_id: str) -> None:
        """Before a new run of a job: its earlier run, if still tracked, drains."""
        old = self.procs.pop(job_id, None)
        if old is not None:
            self._drain(old)

    def gpus_held(self, placement: Placement) -> str | None:
        """What still holds a GPU of ``placement`` (``job 5 run 1: its cgroup is not
        empty``): a run that ended or was killed while processes of it are left; ``None``:
        the GPUs may be handed on. Empty cgroups of ended runs are removed here."""
        for key, proc in sorted(self.draining.items()):
            if self._drained(proc):
                del self.draining[key]
            elif self._remains(proc):  # a process forked while it was killed (no cgroup.kill): again
                self._kill_all(proc)
        want = {(n, g) for n, gs in placement.parts for g in gs}
        holders = list(self.draining.values()) + [p for p in self.procs.values() if p.killed]
        for proc in sorted(holders, key=lambda p: (p.job_id, p.run)):
            pl = proc.placement
            if pl is None or not want & {(n, g) for n, gs in pl.parts for g in gs}:
                continue
            if proc.killed and (proc.job_id, proc.run) not in self.draining and self._drained(proc):
                continue  # killed in this step and already gone (exits() reports it next)
            where = f"its cgroup {proc.cgroup} is not empty or not removed yet" if proc.cgroup is not None else \
                f"its process group {proc.pid} still runs"
            return f"job {proc.job_id} run {proc.run}: {where}"
        return None

    def exits(self) -> list[tuple[str, int | None]]:
        """Runs that ended since the last call: ``(job id, exit code)``, ``None`` for
        a run that ended without an exit code: lost (logged here), or killed by ``kill``
        (put in ``killed_ends``, not logged here: the daemon knows why). A run whose cgroup saw an
        out-of-memory kill is reported with its code (-9 when it left none) and
        ``end_causes[job]`` = ``(OUT_OF_MEMORY, how)``."""
        out = []
        for job_id, proc in list(self.procs.items()):
            if not proc.exit_file.exists() and self._alive(proc):
                continue
            if proc.popen is not None:
                proc.popen.wait()  # reap the runner
            code = _exit_code(proc.exit_file)
            oom = proc.cgroup.oom_kills() if proc.cgroup is not None else 0
            if oom:
                self.end_causes[job_id] = (OUT_OF_MEMORY, f"the kernel killed {oom} process{'es' * (oom != 1)} of "
                                           f"it at its memory limit ({proc.cgroup.memory_limit()}, submit --mem)")
                log.warning("job %s: run %d: %s: %s", job_id, proc.run, *self.end_causes[job_id])
                if code is None:
                    code = -signal.SIGKILL
            if code is None:
                status = proc.popen.returncode if proc.popen is not None else None
                cause = (f"its runner exited with status {status} without an exit code" if status is not None
                         else "its process group ended without an exit code (not this server's child)")
                if status is not None and status < 0:
                    cause += f" (killed by signal {-status})"
                self.lost_causes[job_id] = f"{cause}; stderr: {self.run_dir(job_id, proc.run) / 'stderr'}"
                if proc.killed:  # this server's SIGKILL ended it (its runner too): what was planned
                    self.killed_ends.add(job_id)
                else:
                    log.warning("job %s: run %d ended without an exit code: %s", job_id, proc.run,
                                self.lost_causes[job_id])
            del self.procs[job_id]
            term = self.terminals.pop(job_id, None)
            if term is not None:  # anything of the run still on it (a shell's job) is hung up, then drained
                term.close()
            self._drain(proc)  # the job ended: what it left behind goes too, then its GPUs
            out.append((job_id, code))
        return out

    def signal(self, job_id: str, sig: int) -> None:
        """Send ``sig`` to every process of the job's cgroup - or, before its runner is in
        it and without one, to its process group (nothing if it is gone)."""
        proc = self.procs.get(job_id)
        if proc is None or proc.pid <= 0:
            return
        members = proc.cgroup.pids() if proc.cgroup is not None else []
        if proc.pid not in members:
            members = []
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in members:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def kill(self, job_id: str) -> None:
        """SIGKILL every process of the job's run (nothing if it is gone); its GPUs stay
        held (``gpus_held``) until none is left."""
        proc = self.procs.get(job_id)
        if proc is None or proc.pid <= 0:
            return
        proc.killed = True
        self._kill_all(proc)

    def running(self, job_id: str) -> bool:
        """Whether the job's tracked run has not ended (no exit file yet and alive)."""
        proc = self.procs.get(job_id)
        return proc is not None and not proc.exit_file.exists() and self._alive(proc)

    @staticmethod
    def kill_group(pgid: int) -> None:
        """SIGKILL a process group not (or no longer) tracked, e.g. a cancelled job's
        group found alive after a restart."""
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
