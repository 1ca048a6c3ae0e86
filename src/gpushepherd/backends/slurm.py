"""Slurm backend (design note 013): gpushepherd decides, Slurm launches and isolates.

Through Slurm's commands (``SLURM_CONF`` names the cluster; no accounting database):

* inventory: ``sinfo --json`` - the partition's nodes, GRES ``gpu:<type>:N``, features
  as labels, state;
* a run is one ``sbatch`` into the partition gpushepherd owns, pinned to the placed
  node(s) with ``-w``, ``--gres=gpu:<type>:<N per node>``, its batch script running
  ``gpushepherd.daemon.runner`` so the exit file lands in the (shared) data directory
  as with the local backend; ``--comment gpushepherd job=<job> run=<run>`` finds it
  again after a restart;
* signals: ``scancel --full --signal=TERM``; the end of a grace period or a cancel:
  ``scancel --full --signal=KILL`` then ``scancel``;
* exits: the exit file, else ``squeue --json`` (the job's wait status), at most once
  per ``poll_s``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shlex
import signal as _signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from gpushepherd.backends import BackendError, EngineNode, RunFiles, contract_env, read_exit_code
from gpushepherd.model.placement import Placement

log = logging.getLogger("gpushepherd.daemon")

#: Slurm job states after which nothing of the job runs any more
TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                      "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED"})
#: states that end a job without it exiting by itself: no exit code to trust (lost)
NO_EXIT = frozenset({"CANCELLED", "NODE_FAIL", "BOOT_FAIL", "PREEMPTED", "REVOKED", "DEADLINE"})


def parse_gres(text: str) -> tuple[str, int]:
    """``(type, count)`` of the GPUs in a Slurm GRES string (``gpu:a100:8(S:0)``,
    ``gpu:8``, ``gpu:a100:4,gpu:a100:4``, ``(null)``): the first GPU type named (''
    when untyped), the count summed over every ``gpu`` entry."""
    gpu_type, count = "", 0
    for entry in re.sub(r"\([^)]*\)", "", text or "").split(","):
        parts = entry.strip().split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        if len(parts) >= 3:
            gpu_type = gpu_type or parts[1]
        try:
            count += int(parts[-1])
        except ValueError:
            continue
    return gpu_type, count


def wait_status_code(status: int) -> int:
    """An exit code from a wait status (what ``squeue --json`` reports as ``exit_code``:
    ``85 << 8`` is ``ExitCode=85:0``): the code, or ``-S`` for a signal S."""
    return -(status & 0x7F) if status & 0x7F else (status >> 8) & 0xFF


def comment_of(job_id: str, run: int) -> str:
    """The ``--comment`` that tags run ``run`` of a gpushepherd job in Slurm."""
    return f"gpushepherd job={job_id} run={run}"


@dataclass(slots=True)
class SlurmRun:
    """One run as a Slurm job: ``pid`` is the Slurm job id."""

    job_id: str
    run: int
    pid: int
    exit_file: Path
    start: str | None = None


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """A job as ``squeue --json`` shows it: state, wait status (``None``: not given),
    comment."""

    state: str
    status: int | None
    comment: str


class SlurmBackend(RunFiles):
    """Runs gpushepherd's jobs as Slurm jobs (``backends.Backend``, note 013).

    Args:
        data_dir: the server's data directory; on a real cluster a path every node mounts
            at the same place (logs, exit files, checkpoints).
        partition: the partition gpushepherd owns: nothing else submits to it.
        poll_s: seconds between ``squeue`` polls for runs that left no exit file.
    """

    kind = "slurm"

    def __init__(self, data_dir: Path, partition: str = "shepherd", poll_s: float = 1.0):
        self.data_dir = Path(data_dir)
        self.partition = partition
        self.poll_s = poll_s
        self.runs: dict[str, SlurmRun] = {}
        self.types: dict[str, str] = {}  # node -> GRES type, from discover()
        self._next_poll = 0.0

    # -------------------------------------------------------------- commands
    def _slurm(self, *args: str, check: bool = True, env: dict[str, str] | None = None,
               cwd: str | None = None) -> subprocess.CompletedProcess:
        try:
            p = subprocess.run(list(args), capture_output=True, text=True, timeout=60, env=env, cwd=cwd)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BackendError(f"slurm: `{args[0]}` cannot run: {exc}") from None
        if check and p.returncode != 0:
            raise BackendError(f"slurm: `{shlex.join(args)}` failed (exit {p.returncode}): {p.stderr.strip()}")
        return p

    def _jobs(self) -> dict[int, SlurmJob]:
        """Slurm's jobs (every state it still remembers), by Slurm job id."""
        data = json.loads(self._slurm("squeue", "--json").stdout or "{}")
        out = {}
        for j in data.get("jobs", []):
            state = j.get("job_state", "")
            state = state[0] if isinstance(state, list) and state else state
            status = j.get("exit_code")
            if isinstance(status, dict):  # newer Slurm: {"return_code": {"number": N}, "signal": {...}}
                sig = (status.get("signal") or {}).get("id") or 0
                rc = (status.get("return_code") or {}).get("number")
                status = (sig & 0x7F) if sig else (None if rc is None else (int(rc) & 0xFF) << 8)
            out[int(j["job_id"])] = SlurmJob(str(state), status if isinstance(status, int) else None,
                                             j.get("comment") or "")
        return out

    # -------------------------------------------------------------- the interface
    def discover(self) -> list[EngineNode]:
        """The partition's nodes from ``sinfo --json``, sorted by name.

        Raises:
            BackendError: ``sinfo`` failed (no controller, no ``SLURM_CONF``).
        """
        data = json.loads(self._slurm("sinfo", "--json").stdout or "{}")
        nodes = {}
        for n in data.get("nodes", []):
            if self.partition not in (n.get("partitions") or []):
                continue
            gpu_type, gpus = parse_gres(n.get("gres", ""))
            features = (n.get("active_features") or n.get("features") or "")
            labels = tuple((f, "") for f in sorted(set(filter(None, features.split(",")))))
            state = n.get("state", "")
            state = "+".join(state) if isinstance(state, list) else str(state)
            flags = [f for f in (n.get("state_flags") or []) if f]
            nodes[n["name"]] = EngineNode(n["name"], gpu_type, gpus, int(n.get("real_memory") or 0), labels,
                                          "+".join([state.lower(), *(f.lower() for f in flags)]))
        self.types.update({name: n.gpu_type for name, n in nodes.items()})
        return [nodes[k] for k in sorted(nodes)]

    def start(self, job_id: str, run: int, argv: list[str], *, shell: bool, env: dict[str, str], cwd: str,
              placement: Placement, time_limit_s: float | None = None) -> SlurmRun:
        """Submit run ``run`` of a job as one Slurm job on ``placement``'s nodes.

        Raises:
            ValueError: the placement cannot be asked of Slurm: a part of a GPU (a
                share), or a gang with different GPU counts per node.
            BackendError: ``sbatch`` refused it (its message).
        """
        if placement.share:
            raise ValueError(f"placement {placement}: the slurm backend runs whole GPUs only "
                             f"(share {placement.share!r} is not supported)")
        counts = sorted({len(g) for _n, g in placement.parts})
        if len(counts) != 1:
            raise ValueError(f"placement {placement}: the slurm backend runs a gang only with the same GPU count on "
                             f"each node (here {', '.join(map(str, counts))}); one --gres is per node")
        nodes = [n for n, _g in placement.parts]
        if any(n not in self.types for n in nodes):
            self.discover()
        gpu_type = self.types.get(nodes[0], "")
        gres = f"gpu:{gpu_type}:{counts[0]}" if gpu_type else f"gpu:{counts[0]}"
        rdir, ckpt, exit_file = self.prepare_run(job_id, run)
        script = rdir / "job.sh"
        runner = [sys.executable, "-m", "gpushepherd.daemon.runner", *(["--shell"] if shell else []),
                  str(exit_file), "--", *argv]
        script.write_text(f"#!/bin/sh\n# gpushepherd job {job_id} run {run}\nexec {shlex.join(runner)}\n")
        # the server's environment minus its own Slurm job's variables (Slurm sets the
        # job's, CUDA_VISIBLE_DEVICES included), plus the job's and the contract's
        full_env = {k: v for k, v in os.environ.items()
                    if (not k.startswith("SLURM_") or k == "SLURM_CONF") and k != "CUDA_VISIBLE_DEVICES"}
        full_env.update(env)
        full_env.update(contract_env(job_id, run, ckpt, "", env))
        args = ["sbatch", "--parsable", f"--partition={self.partition}", f"--job-name=shepherd-{job_id}",
                f"--comment={comment_of(job_id, run)}", f"--nodelist={','.join(nodes)}", f"--nodes={len(nodes)}",
                "--ntasks-per-node=1", f"--gres={gres}", "--no-requeue", f"--output={rdir / 'stdout'}",
                f"--error={rdir / 'stderr'}", f"--chdir={cwd}", "--export=ALL"]
        if time_limit_s is not None:
            args.append(f"--time={max(1, math.ceil(time_limit_s / 60))}")
        out = self._slurm(*args, str(script), env=full_env, cwd=cwd).stdout.strip()
        try:
            slurm_id = int(out.split(";")[0])
        except ValueError:
            raise BackendError(f"slurm: sbatch answered {out!r}, not a job id") from None
        handle = SlurmRun(job_id, run, slurm_id, exit_file)
        self.runs[job_id] = handle
        log.info("job %s run %d: Slurm job %d on %s (%s)", job_id, run, slurm_id, ",".join(nodes), gres)
        return handle

    def signal(self, job_id: str, sig: int) -> None:
        """``scancel --full --signal`` to every process of the job (a job Slurm has not
        started yet is cancelled: it ran nothing)."""
        r = self.runs.get(job_id)
        if r is None or r.pid <= 0:
            return
        if sig == _signal.SIGKILL:
            self.kill(job_id)
            return
        name = _signal.Signals(sig).name.removeprefix("SIG")
        # scancel --signal on a job still PENDING in Slurm sleeps 5 s and retries before
        # failing, holding up the daemon's loop (bench/slurm_compare.py found it): ask first
        state = self._slurm("squeue", "-h", "-j", str(r.pid), "-o", "%T", check=False).stdout.strip()
        if state == "PENDING":
            log.info("job %s: Slurm job %d has not started; cancelling it", job_id, r.pid)
            self._slurm("scancel", str(r.pid), check=False)
            return
        p = self._slurm("scancel", "--full", f"--signal={name}", str(r.pid), check=False)
        if p.returncode != 0:
            log.info("job %s: Slurm job %d took no signal (%s); cancelling it", job_id, r.pid, p.stderr.strip())
            self._slurm("scancel", str(r.pid), check=False)

    def kill(self, job_id: str) -> None:
        """SIGKILL every process of the job, then cancel the Slurm job."""
        r = self.runs.get(job_id)
        if r is None or r.pid <= 0:
            return
        self._slurm("scancel", "--full", "--signal=KILL", str(r.pid), check=False)
        self._slurm("scancel", str(r.pid), check=False)

    @staticmethod
    def _exit_code(r: SlurmRun) -> int | None:
        return read_exit_code(r.exit_file)

    def exits(self) -> list[tuple[str, int | None]]:
        """Runs that ended: by their exit file at once; a run without one when ``squeue``
        (polled at most every ``poll_s``) shows it ended or no longer knows it: its exit
        code if it exited by itself, else ``None`` (lost)."""
        out, unsure = [], []
        for job_id in sorted(self.runs):
            r = self.runs[job_id]
            if r.exit_file.exists():
                out.append((job_id, self._exit_code(r)))
            else:
                unsure.append(r)
        now = time.monotonic()
        if unsure and now >= self._next_poll:
            self._next_poll = now + self.poll_s
            try:
                known = self._jobs()
            except (BackendError, ValueError) as exc:  # the controller is away: ask again later
                log.warning("cannot read Slurm's jobs: %s", exc)
                known = None
            for r in unsure if known is not None else ():
                sj = known.get(r.pid)
                if sj is not None and sj.state not in TERMINAL:
                    continue
                code = self._exit_code(r)  # it may have appeared since
                if code is None and sj is not None and sj.state not in NO_EXIT and sj.status is not None:
                    code = wait_status_code(sj.status)
                log.info("job %s: Slurm job %d ended %s without an exit file: %s", r.job_id, r.pid,
                         sj.state if sj else "(forgotten by Slurm)", "lost" if code is None else f"exit {code}")
                out.append((r.job_id, code))
        for job_id, _code in out:
            del self.runs[job_id]
        return out

    def attach(self, job_id: str, run: int, pid: int | None, start: str | None) -> SlurmRun | None:
        """Re-attach to a run submitted by an earlier server (``pid``: its Slurm job id;
        ``None``: found by its ``--comment``). ``None`` when Slurm no longer knows it and
        it left no exit file.

        Raises:
            BackendError: Slurm cannot be asked (the run's fate is unknown).
        """
        exit_file = self.run_dir(job_id, run) / "exit"
        known = self._jobs()
        if pid is None:
            tag = comment_of(job_id, run)
            pid = max((i for i, j in known.items() if j.comment == tag), default=None)
        if pid is None and not exit_file.exists():
            return None
        if not exit_file.exists() and pid not in known:
            return None
        handle = SlurmRun(job_id, run, pid or 0, exit_file)
        self.runs[job_id] = handle
        return handle

    def running(self, job_id: str) -> bool:
        """Whether the job's run still runs in Slurm (no exit file, Slurm shows it live)."""
        r = self.runs.get(job_id)
        if r is None or r.exit_file.exists():
            return False
        sj = self._jobs().get(r.pid)
        return sj is not None and sj.state not in TERMINAL
