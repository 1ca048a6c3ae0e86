"""GPU usage of running jobs: idle detection and peak memory against the declaration.

The rules are design note 009's; this module holds the per-job record and the pure
functions over it, the scheduler owns the records and turns them into decisions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpushepherd.model.job import JobSpec

#: share kinds whose memory is not isolated from the card's other holders
SHARED_MEMORY_KINDS = ("fraction", "time_slice", "mps")


@dataclass(slots=True)
class UsageTrack:
    """What the samples of one job said.

    Attributes:
        run: the run (``Job.runs``) the per-run fields are about.
        samples: samples of that run.
        last_util: GPU utilisation of the last sample, percent (``None``: no sample yet).
        last_t: time of the last sample, seconds.
        idle_since: start of the current idle stretch, seconds (``None``: not idle, or
            the class has no idle stop).
        run_peak_mib: the highest ``mem_used_mib`` of this run, MiB.
        peak_mib: the highest over all runs, MiB.
        over_at: when this run's memory first exceeded the declaration (``None``: never).
        over_runs: how many runs exceeded it.
    """

    run: int = 0
    samples: int = 0
    last_util: float | None = None
    last_t: float | None = None
    idle_since: float | None = None
    run_peak_mib: int = 0
    peak_mib: int = 0
    over_at: float | None = None
    over_runs: int = 0

    def new_run(self, run: int) -> None:
        """Forget the per-run fields: ``run`` has no samples yet (unknown is not idle)."""
        self.run = run
        self.samples = 0
        self.last_util = None
        self.last_t = None
        self.idle_since = None
        self.run_peak_mib = 0
        self.over_at = None

    def to_dict(self) -> dict:
        return {f: getattr(self, f) for f in self.__slots__}

    @classmethod
    def from_dict(cls, raw: dict) -> "UsageTrack":
        return cls(**{f: raw[f] for f in cls.__slots__ if f in raw})


def declared_mib(spec: JobSpec) -> int | None:
    """GPU memory the job declared, MiB summed over its GPUs (as samples are): a
    share's declared memory (MPS: times its clients); else ``gpu_mem_mib x gpus`` for a
    whole-GPU job that asked for a minimum; else ``None`` (nothing declared: never
    flagged). A MIG instance's memory is the hardware's limit, not a declaration."""
    share = spec.share
    if share is not None:
        if share.kind == "mig":
            return None
        mem = share.need()[1]
        return mem or None
    return spec.gpu_mem_mib * spec.gpus if spec.gpu_mem_mib else None


def sample_error(job_id: str, util: object, mem: object) -> str | None:
    """Why a ``UsageSample`` cannot be taken (field, value, what is allowed), or ``None``."""
    if isinstance(util, bool) or not isinstance(util, (int, float)) or not math.isfinite(util) \
            or not 0 <= util <= 100:
        return f"usage sample of job {job_id!r}: gpu_util_pct: {util!r} is not allowed: a number 0..100"
    if isinstance(mem, bool) or not isinstance(mem, int) or mem < 0:
        return f"usage sample of job {job_id!r}: mem_used_mib: {mem!r} is not allowed: an integer >= 0 (MiB)"
    return None
