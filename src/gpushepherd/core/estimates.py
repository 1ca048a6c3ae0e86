"""An estimated start for every pending job (Slurm's ``squeue --start``; design note
015, section 7).

On demand, every pending job is planned in queue order on a copy of the time profile,
each taking its claim from its planned start (conservative backfill): a preemptor at its
victims' planned exits; a job refused by a quota when enough of it is planned to be free;
any other job at the earliest instant its GPUs and quota fit for its whole planned run
after the jobs ahead of it. The plan assumes no new submissions and running jobs ending
at their planned ends.

An estimate is never in the past and never "now" for a job the last pass did not start
(it is then the next instant anything is planned to change). ``basis`` says what it
rests on: ``estimates`` (every planned end it counts on is a runtime estimate shorter
than the job's time limit) or ``time limits`` (an upper bound: jobs usually end before
their limits - unless higher-priority work arrives).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpushepherd.core.profile import Profile, basis_of, earliest_start
from gpushepherd.core.state import INF
from gpushepherd.model.job import JobState


@dataclass(frozen=True, slots=True)
class Estimate:
    """A pending job's planned start: ``t`` (seconds, the scheduler's axis) and ``basis``
    (``estimates`` | ``time limits``)."""

    t: float
    basis: str


def plan_all(sched, limit: int | None = None) -> dict[str, Estimate]:
    """Plan the first ``limit`` pending jobs (all: ``None``) in queue order; a job whose
    start cannot be planned (it waits for jobs without an end) is left out."""
    book = sched.book
    now = book.now
    profile = Profile(book)
    out: dict[str, Estimate] = {}
    for p in sorted(book.preemptors.values(), key=lambda j: j.key):
        profile.add_hold(p)
    running_basis = basis_of(book, book.running.values())
    next_change = next((e for e, _s, _j in book.ends if e > now and e != INF), None)
    for n, job in enumerate(book.queue):
        if limit is not None and n >= limit:
            break
        if job.state is not JobState.PENDING:
            continue
        if job.id in book.preemptors and job.victims:
            exits = [book.jobs[v].end_est for v in job.victims]
            t = max([now] + exits)
            out[job.id] = Estimate(t if t > now else _after(now, next_change), running_basis)
            continue
        if job.shape.mode == "share":
            continue  # shares wait for a card; no claim to plan
        nodes, totals = book.nodes_and_totals(job)
        found = earliest_start(book, profile, job, nodes, totals)
        if found is None:
            continue
        t, counts = found
        profile.add_reservation(job, t, counts, running_basis)
        if t <= now:
            t = _after(now, next_change)
            if t is None:
                continue
        out[job.id] = Estimate(t, running_basis)
    return out


def _after(now: float, next_change: float | None) -> float | None:
    """The next instant anything is planned to change (a job that waits is never "now")."""
    return next_change if next_change is not None and next_change > now else None
