"""Changing a job after submit (Slurm's ``scontrol update``; design note 039): its time
limit and its nice, for pending and running jobs.

``update_error`` is the rule (also the daemon's, for jobs it keeps from the core, note
021); ``check`` applies it to a ``JobUpdated`` before anything of its instant is
applied; ``apply`` makes the change. A pending job is taken out of the queue and put
back under its new order key and signature (planned run, estimate band); a running
job's planned end and time-limit timer move, and the nodes it holds are touched so that
every cache of their release times (``core/releases.py``) is recomputed. The change
marks the book dirty: the next pass is a full one (no fast path sees a stale order or
profile).
"""

from __future__ import annotations

import heapq
from dataclasses import replace

from gpushepherd.core.intake import SpecError, estimate_for, time_limit
from gpushepherd.model.events import JobUpdated
from gpushepherd.model.job import MAX_NICE, JobSpec, JobState


def update_error(spec: JobSpec | None, cls, time_limit_s: float | None, nice: int | None,
                 admin: bool) -> str | None:
    """What is wrong with changing job ``spec`` (of class ``cls``) to ``time_limit_s``
    seconds and/or ``nice`` score points (``None``: unchanged), as ``admin`` or not;
    ``None``: allowed. The message names the field, the value and what is allowed.
    Without ``spec`` (and ``cls``) only the values are checked.

    Rules (Slurm's ``scontrol update``): the time limit is seconds > 0 and at most the
    class's ``max_runtime_s``; only an admin may raise it above the job's time limit now
    (its own, else its class's default or max runtime; none: any limit is lower). The
    nice is an integer within +-``MAX_NICE``; only an admin may lower it (raise the job's
    priority): a user may only raise it.
    """
    if time_limit_s is None and nice is None:
        return "time_limit_s, nice: nothing to change is not allowed: give time_limit_s or nice"
    if time_limit_s is not None:
        if isinstance(time_limit_s, bool) or not isinstance(time_limit_s, (int, float)) \
                or not 0 < time_limit_s < float("inf"):
            return f"time_limit_s: {time_limit_s!r} is not allowed: seconds > 0"
        if spec is None:
            pass
        elif cls.max_runtime_s is not None and time_limit_s > cls.max_runtime_s:
            return (f"time_limit_s: {time_limit_s:g} is not allowed: at most the max runtime of class {cls.name} "
                    f"({cls.max_runtime_s:g} s)")
        elif not admin and (now := time_limit(spec, cls)) is not None and time_limit_s > now:
            return (f"time_limit_s: {time_limit_s:g} is not allowed: at most the job's time limit now ({now:g} s): "
                    "only an admin may raise it")
    if nice is not None:
        if isinstance(nice, bool) or not isinstance(nice, int) or abs(nice) > MAX_NICE:
            return f"nice: {nice!r} is not allowed: an integer from -{MAX_NICE} to {MAX_NICE}"
        if spec is not None and not admin and nice < spec.nice:
            return (f"nice: {nice} is not allowed: at least the job's nice now ({spec.nice}): only an admin may "
                    "lower it (raise the job's priority)")
    return None


def check(book, e: JobUpdated) -> None:
    """Refuse an update that breaks a rule (``update_error``) of a job the core knows;
    one of an unknown or ended job is left to ``apply`` (a no-op, as a requeue of a job
    that is not running).

    Raises:
        SpecError: naming the job, the field, the value and what is allowed.
    """
    job = book.jobs.get(e.job_id)
    live = job is not None and not job.state.terminal
    bad = update_error(job.spec if live else None, job.cls if live else None, e.time_limit_s, e.nice, e.admin)
    if bad is not None:
        raise SpecError(f"job {e.job_id!r}: {bad}")


def apply(book, e: JobUpdated) -> None:
    """Change the job (see the module docstring); a time limit at or below what the
    running job has run is stopped by ``expire`` in the same instant (its time-limit
    stop, with its grace); a pending job whose banked work reaches its new limit ends
    ``TIMEOUT`` at once. Checked again against the state of now (an earlier update of
    the same instant may have changed it): a refused one is a no-op noted in its history."""
    job = book.jobs.get(e.job_id)
    if job is None or job.state.terminal:
        return
    bad = update_error(job.spec, job.cls, e.time_limit_s, e.nice, e.admin)
    if bad is not None:
        book.log(job, job.state, job.state, f"update refused: {bad}")
        return
    changes = {}
    said = []
    if e.time_limit_s is not None:
        changes["time_limit_s"] = float(e.time_limit_s)
        was = job.time_limit_s
        said.append(f"time limit {'none' if was is None else format(was, 'g') + ' s'} -> {e.time_limit_s:g} s")
    if e.nice is not None:
        changes["nice"] = e.nice
        said.append(f"nice {job.spec.nice} -> {e.nice}")
    pending = job.state is JobState.PENDING
    if pending:  # out under its old key and signature
        book.queue.remove(job)
        if job.share is not None:
            book.pending_shares -= 1
    job.spec = replace(job.spec, **changes)
    if "time_limit_s" in changes:
        job.time_limit_s = time_limit(job.spec, job.cls)
        job.estimate_s = estimate_for(book, job.spec, job.time_limit_s)
    job.key = book.order_key(job)
    book.log(job, job.state, job.state, "updated: " + ", ".join(said) + (" (admin)" if e.admin else ""))
    if pending and job.run_limit() is not None and job.run_limit() <= 0:
        # its banked work (a checkpointing job's earlier runs) used all of the new limit:
        # it ends as a requeue that reaches its limit does (``Book.requeue``)
        book.clear_victims(job)
        job.state = JobState.TIMEOUT
        book.log(job, JobState.PENDING, JobState.TIMEOUT, "no time left of its time limit")
    elif pending:
        book.enqueue(job)
    elif job.state is JobState.RUNNING and "time_limit_s" in changes:
        book.ends_remove(job)
        book.ends_add(job, job.run_start + job.planned_run())
        for idx, _mask in job.alloc:  # its planned end moved
            book.ledger.touch(idx)
        heapq.heappush(book.timers, (timer_at(job), job.seq, job.runs, job.id))  # the old one is stale now
    # PREEMPTING and STOPPING jobs leave at the end of their grace as before; the new
    # limit and nice are theirs when they are queued again
    book.dirty = True


def timer_at(job) -> float:
    """When the current run's time limit stops it (seconds; ``INF``: no limit). A
    time-limit timer of another time is stale (the limit changed since)."""
    limit = job.run_limit()
    return float("inf") if limit is None else job.run_start + limit
