"""Step 1 of the cycle, expire: stop what passed its time limit, its declared GPU memory
(on a shared card) or its idle limit, and what a closing time window no longer allows
(design notes 003 and 009). Each stop keeps the job's GPUs through the grace its class
gives; its planned end moves to the end of that grace.
"""

from __future__ import annotations

import heapq

from gpushepherd.core import typed
from gpushepherd.core.admission import CLASS_HOLD, ORDER
from gpushepherd.core.amend import timer_at
from gpushepherd.core.lifecycle import idle_entry_live
from gpushepherd.core.usage import declared_mib
from gpushepherd.model.decisions import Decision
from gpushepherd.model.job import JobState


def windows_at(book, t: float) -> list[tuple[int, int]]:
    """Bring time-windowed limits to ``t``; a change is a configuration change with its
    own full pass. Returns the limits that tightened, with their new value."""
    if not book.quota.windowed:
        return []
    changes = book.quota.set_time(t)
    if changes:
        book.dirty = True
    return [(i, new) for i, old, new in changes if new < old]


def close_windows(book, tightened: list[tuple[int, int]], out: list[Decision]) -> None:
    """A window closed: jobs over the new limit whose class says ``checkpoint-and-stop``
    are preempted (victim order: youngest first, with their grace period) until the usage
    fits; ``drain`` classes keep running."""
    quota = book.quota
    for i, new_max in tightened:
        over: dict[str, int] = {}
        for (li, user), used in quota.usage.items():
            if li == i and used > new_max:
                over[user] = used - new_max
        if not over:
            continue
        candidates = sorted(
            (j for j in book.running.values()
             if j.state is JobState.RUNNING and j.preemptible and j.cls.on_window_close == "checkpoint-and-stop"),
            key=lambda j: j.vkey)
        for job in candidates:
            for li, user, amount in job.run_charges:
                if li == i and over.get(user, 0) > 0:
                    over[user] -= amount
                    book.preempt(job, None, out, reason=f"window-closed:{quota.limits[i].path}")
                    break


def expire(book, out: list[Decision]) -> None:
    """Stop jobs past their time limit, over their declared memory on a shared card
    (``memory_overrun: stop``), or idle past their class's ``idle_stop``."""
    timers = book.timers
    while timers and timers[0][0] <= book.now:
        _t, _seq, run, job_id = heapq.heappop(timers)
        job = book.jobs[job_id]
        if job.state is not JobState.RUNNING or job.runs != run or _t != timer_at(job):
            continue  # stale: the run ended, or its time limit changed since (``amend``)
        book.stop(job, "time-limit", job.stop_grace, "time limit reached", out)
    if book.mem_stops:
        stops, book.mem_stops = book.mem_stops, []
        for job in sorted(stops, key=lambda j: j.seq):
            if job.state is JobState.RUNNING:
                tr = book.tracks[job.id]
                book.stop(job, "memory-overrun", 0.0,
                          f"stopped: GPU memory {tr.run_peak_mib} MiB over the {declared_mib(job.spec)} MiB "
                          "declared, on a shared GPU", out)
    idle = book.idle_timers
    while idle and idle[0][0] <= book.now:
        entry = heapq.heappop(idle)
        if not idle_entry_live(book, entry):
            continue
        job = book.jobs[entry[3]]
        rule = job.cls.idle_stop
        grace = job.stop_grace
        book.stop(job, "idle", grace, f"idle for {book.now - entry[4]:g} s below {rule.below_util_pct:g} % GPU "
                  f"utilisation (grace {grace:g} s)", out)


def next_timer(book) -> float | None:
    """The earliest live time-limit or idle deadline (stale entries dropped)."""
    t_limit = None
    timers = book.timers
    while timers:
        t, _seq, run, job_id = timers[0]
        job = book.jobs[job_id]
        if job.state is JobState.RUNNING and job.runs == run and t == timer_at(job):
            t_limit = t
            break
        heapq.heappop(timers)
    idle = book.idle_timers
    while idle:
        entry = idle[0]
        if idle_entry_live(book, entry):
            t_limit = entry[0] if t_limit is None else min(t_limit, entry[0])
            break
        heapq.heappop(idle)
    return t_limit


def _boundary_may_start(book, adm, job) -> bool:
    """Whether a window boundary may start ``job`` as bound now (one GPU type of a job
    at rest: ``decide`` then judges that type alone, note 038): it could ever fit, and
    it is not refused for a reason no window changes - other classes' ``reserved_gpus``
    (static, never windowed: a finish or a submit can loosen them) or the head of its
    strict FIFO queue (rule 4 reads no window; the head is judged on its own; seed
    437809, note 081). Judged per type: one type's verdict must not hide another's
    windowed limit (the review of note 081)."""
    if not adm.may_ever_start(job, book.charges_with(job, job.units, book.coverage_for(job, job.units))):
        return False
    if not (book.reserved or job.strict_q is not None):
        return True
    rule = adm.decide(job, None).rule
    return not ((book.reserved and rule == CLASS_HOLD) or rule == ORDER)


def window_matters(book, adm) -> bool:
    """Whether a window boundary can change anything: a pending job counts against a
    windowed limit (and could ever fit it and the healthy nodes: ``adm.never_fits``), or
    a running job could be stopped."""
    windowed = set(book.quota.windowed)
    for sig_jobs in book.queue.subs.values():
        job = sig_jobs[0]
        if not any(i in windowed for i, _u, _a in job.charges):
            continue
        if typed.any_variant(job, lambda j: _boundary_may_start(book, adm, j)):
            return True
    # a running job a closing window could stop: a windowed limit it counts in may
    # tighten below what is in use of it
    quota = book.quota
    for j in book.running.values():
        if j.cls.on_window_close != "checkpoint-and-stop" or j.state is not JobState.RUNNING:
            continue
        for i, user, _a in j.run_charges:
            if i in windowed:
                lim = quota.limits[i]
                tightest = min([lim.max] + [m for _w, m in lim.windows]) * quota.scale[i]
                if quota.usage.get((i, user), 0) > tightest:
                    return True
    return False
