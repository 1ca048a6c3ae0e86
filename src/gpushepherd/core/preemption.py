"""Preemption: which running jobs to evict so that a higher-priority job fits.

Rules (R6 and the public scenario conventions):

* only jobs of a strictly lower class priority, that are preemptible, that have run at
  least the policy's minimum runtime, and - for classes that say so (training) - that
  checkpoint; production inference is never preemptible;
* victim order: lowest class first; within a class the most recently started first;
  ties: highest job id first;
* a minimal set: victims are added in that order on a scratch copy of the free GPUs
  until the preemptor fits, then every victim whose removal keeps the fit is dropped
  (last added first). Nothing is evicted unless the plan works (KAI-Scheduler's
  statement with checkpoint/rollback, done here on a copy);
* gangs are counted whole on both sides: a victim frees all its GPUs, the preemptor
  must fit entirely.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpushepherd.core.placement import Counts, members_of, place_counts
from gpushepherd.core.state import Job
from gpushepherd.model.job import JobState, natural_key

if TYPE_CHECKING:  # pragma: no cover
    from gpushepherd.core.scheduler import Scheduler


def may_preempt(preemptor: Job, victim: Job, now: float, min_runtime_s: float) -> bool:
    """Whether ``victim`` may be evicted for ``preemptor`` (the rules above)."""
    if victim.state is not JobState.RUNNING or victim.cls.priority >= preemptor.cls.priority:
        return False
    if not victim.preemptible:
        return False
    if victim.cls.preempt_only_if_checkpointable and not victim.checkpointable:
        return False
    return now - victim.run_start >= min_runtime_s


def victim_order_key(job: Job) -> tuple:
    """Lowest class first, most recently started first, highest job id first."""
    return (job.cls.priority, -job.run_start, _neg_natural(job.id))


def _neg_natural(text: str) -> tuple:
    # invert a natural key so that ascending order puts the highest id first
    return tuple((-a, -b, _invert(c)) for a, b, c in natural_key(text)) + ((2, 0, ()),)


def _invert(s: str) -> tuple:
    return tuple(-ord(ch) for ch in s) + (1,)


def victims_for(sched: "Scheduler", job: Job, now: float) -> tuple[list[Job], Counts] | None:
    """A minimal victim set for ``job`` and the placement counts it would get.

    Returns ``None`` when no set of preemptible victims makes the job fit.
    """
    ledger = sched.ledger
    groups = sched.groups_for(job)
    cand_nodes = members_of(ledger, groups)
    node_set = set(cand_nodes)
    victims = [
        v for v in sched.holding()
        if may_preempt(job, v, now, sched.rules.preemption_min_runtime_s)
        and any(idx in node_set for idx, _ in v.alloc)
    ]
    if not victims:
        return None
    avail = {i: ledger.slots[i].free for i in cand_nodes}
    gain = sum(m.bit_count() for v in victims for idx, m in v.alloc if idx in node_set)
    if sum(avail.values()) + gain < job.gpus:
        return None
    totals = {i: ledger.slots[i].healthy for i in cand_nodes}
    victims.sort(key=victim_order_key)
    chosen: list[Job] = []
    placed = None
    for v in victims:
        _add(avail, v, node_set, +1)
        chosen.append(v)
        placed = place_counts(avail, cand_nodes, totals, job.shape)
        if placed is not None:
            break
    if placed is None:
        return None
    for v in reversed(chosen[:-1]):
        _add(avail, v, node_set, -1)
        trial = place_counts(avail, cand_nodes, totals, job.shape)
        if trial is None:
            _add(avail, v, node_set, +1)
        else:
            chosen.remove(v)
            placed = trial
    placed = place_counts(avail, cand_nodes, totals, job.shape)
    assert placed is not None
    return chosen, placed


def lower_jobs_would_make_room(sched: "Scheduler", job: Job) -> bool:
    """Whether evicting *every* lower-priority running job (preemptible or not) would
    make ``job`` fit: then the blocker is "no preemptible victims", not capacity."""
    ledger = sched.ledger
    groups = sched.groups_for(job)
    cand_nodes = members_of(ledger, groups)
    node_set = set(cand_nodes)
    avail = {i: ledger.slots[i].free for i in cand_nodes}
    lower = [v for v in sched.holding() if v.cls.priority < job.cls.priority and v.state is JobState.RUNNING]
    if not lower:
        return False
    for v in lower:
        _add(avail, v, node_set, +1)
    totals = {i: ledger.slots[i].healthy for i in cand_nodes}
    return place_counts(avail, cand_nodes, totals, job.shape) is not None


def _add(avail: dict[int, int], victim: Job, node_set: set[int], sign: int) -> None:
    for idx, mask in victim.alloc:
        if idx in node_set:
            avail[idx] += sign * mask.bit_count()
