"""Local backend: each job runs as its own process group on this server.

Layout under the data directory:

* ``runs/<job>/<run>/stdout``, ``stderr``: the run's output;
* ``runs/<job>/<run>/exit``: ``{"code": N}``, written by the runner when the job ends;
* ``checkpoints/<job>/``: ``SHEPHERD_CHECKPOINT_DIR``, kept across runs and requeues.

The checkpoint contract: a job that saved its state into ``SHEPHERD_CHECKPOINT_DIR``
and exits with ``REQUEUE_EXIT_CODE`` (85) is requeued (``ExitStatus.PREEMPTED``) and
finds the directory again on its next run. Preemption and stops (time limit, window,
idle) send the class's ``stop_signal`` (SIGTERM by default) to the group, then
SIGKILL after the grace period.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from gpushepherd.backends import EngineNode, RunFiles, contract_env
from gpushepherd.gpu.inventory import Discovery
from gpushepherd.gpu.procs import stat_fields as _stat
from gpushepherd.model.job import ExitStatus
from gpushepherd.model.placement import Placement

log = logging.getLogger("gpushepherd.daemon")

#: "checkpointed, requeue me" (the number Slurm users know from ``--requeue`` scripts)
REQUEUE_EXIT_CODE = 85


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
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
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
    (requeue), anything else (a signal is negative) -> ``FAILED``. The core turns a
    failure of a job it was preempting or stopping into a requeue or a ``TIMEOUT``."""
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


@dataclass(slots=True)
class Proc:
    """One run's process group: ``pid`` (the runner, the group leader) == ``pgid``."""

    job_id: str
    run: int
    pid: int
    start: str | None
    exit_file: Path
    popen: subprocess.Popen | None = None  # None: re-attached after a restart (not our child)


class LocalBackend(RunFiles):
    """Starts, signals and watches job processes on this server (``backends.Backend``).

    Args:
        data_dir: the server's data directory (logs, exit files, checkpoints).
    """

    kind = "local"

    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir)
        self.procs: dict[str, Proc] = {}
        #: job -> why its last run ended without an exit code (``exits`` returned ``None``)
        self.lost_causes: dict[str, str] = {}
        #: this server's node and what its inventory found (GPU and MIG UUIDs for
        #: ``CUDA_VISIBLE_DEVICES``); set by the daemon, ``None``: indices
        self.node = ""
        self.found: Discovery | None = None

    def discover(self) -> list[EngineNode]:
        """This server's node as its inventory found it (set by the daemon); ``[]``
        before that or for a cluster simulated on this machine."""
        if not self.node or self.found is None:
            return []
        mem = self.found.gpus[0].memory_mib if self.found.gpus else 0
        return [EngineNode(self.node, self.found.gpus[0].name if self.found.gpus else "", len(self.found.gpus),
                           mem, (), "up")]

    def start(self, job_id: str, run: int, argv: list[str], *, shell: bool, env: dict[str, str], cwd: str,
              placement: Placement, time_limit_s: float | None = None) -> Proc:
        """Start run ``run`` of a job on ``placement``; returns its process
        (``time_limit_s`` is unused: the core's stop is the only limit here).

        Raises:
            OSError: the runner could not be started (the job's own command failing to
                start is an exit code 127, reported like any exit).
        """
        rdir, ckpt, exit_file = self.prepare_run(job_id, run)
        full_env = dict(os.environ)
        full_env.update(env)
        unresolved = unresolved_mig(placement, self.node, self.found)
        if unresolved:
            log.warning("job %s: MIG device %s has no known UUID (static inventory?): it sees its whole GPU; "
                        "SHEPHERD_MIG_DEVICE names the device", job_id, unresolved)
            full_env["SHEPHERD_MIG_DEVICE"] = unresolved
        full_env["CUDA_VISIBLE_DEVICES"] = visible_devices(placement, self.node, self.found)
        # the runner must import gpushepherd even when the job's cwd or env differ
        full_env.update(contract_env(job_id, run, ckpt, placement.share, env))
        cmd = [sys.executable, "-m", "gpushepherd.daemon.runner"] + (["--shell"] if shell else [])
        cmd += [str(exit_file), "--", *argv]
        with open(rdir / "stdout", "ab") as out, open(rdir / "stderr", "ab") as err:
            popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=cwd,
                                     env=full_env, start_new_session=True, close_fds=True)
        proc = Proc(job_id, run, popen.pid, proc_start_time(popen.pid), exit_file, popen)
        self.procs[job_id] = proc
        return proc

    def attach(self, job_id: str, run: int, pid: int | None, start: str | None) -> Proc | None:
        """Re-attach to a run started by an earlier server (``pid``: its runner, ``None``
        when it was never recorded: looked up by its environment). Returns ``None`` if
        its process group is gone and it left no exit file (the run is lost)."""
        exit_file = self.run_dir(job_id, run) / "exit"
        if pid is None:
            found = find_runner(job_id, run, exit_file)
            if found is None and not exit_file.exists():
                return None
            pid, start = found or (0, None)
        proc = Proc(job_id, run, pid, start, exit_file)
        if exit_file.exists() or self._alive(proc):
            self.procs[job_id] = proc
            return proc
        self.lost_causes[job_id] = (f"no process of its group and no exit file when this server started; stderr: "
                                    f"{self.run_dir(job_id, run) / 'stderr'}")
        return None

    def _alive(self, proc: Proc) -> bool:
        """Whether the run still runs: its runner, or else any process of its group (the
        keeper and the job outlive a killed runner and record the exit, note 017)."""
        if proc.popen is not None:
            return proc.popen.poll() is None or group_running(proc.pid)
        if proc.pid <= 0:
            return False
        fields = _stat(proc.pid)
        if fields is None or fields[0] in "ZX" or (proc.start is not None and fields[19] != proc.start):
            return group_running(proc.pid)  # the leader is gone (or its pid reused): is its group?
        return True

    def exits(self) -> list[tuple[str, int | None]]:
        """Runs that ended since the last call: ``(job id, exit code)``, ``None`` for
        a run that ended without an exit code (lost)."""
        out = []
        for job_id, proc in list(self.procs.items()):
            if not proc.exit_file.exists() and self._alive(proc):
                continue
            if proc.popen is not None:
                proc.popen.wait()  # reap the runner
            if proc.pid > 0 and group_running(proc.pid):
                self.kill_group(proc.pid)  # the job ended: what it left behind in its group goes too
            code = None
            try:
                code = int(json.loads(proc.exit_file.read_text())["code"])
            except (OSError, ValueError, KeyError):
                status = proc.popen.returncode if proc.popen is not None else None
                cause = (f"its runner exited with status {status} without an exit code" if status is not None
                         else "its process group ended without an exit code (not this server's child)")
                if status is not None and status < 0:
                    cause += f" (killed by signal {-status})"
                self.lost_causes[job_id] = f"{cause}; stderr: {self.run_dir(job_id, proc.run) / 'stderr'}"
                log.warning("job %s: run %d ended without an exit code: %s", job_id, proc.run,
                            self.lost_causes[job_id])
            del self.procs[job_id]
            out.append((job_id, code))
        return out

    def signal(self, job_id: str, sig: int) -> None:
        """Send ``sig`` to the job's process group (nothing if it is gone)."""
        proc = self.procs.get(job_id)
        if proc is None or proc.pid <= 0:
            return
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self, job_id: str) -> None:
        """SIGKILL the job's process group (nothing if it is gone)."""
        self.signal(job_id, signal.SIGKILL)

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
