"""Whether a pass's reservations stand on the state it leaves (design note 015,
section 3): the check after each pass that makes the decisions of an instant those of a
full pass on its final state (``Scheduler._schedule`` runs another pass when they do
not).

A job started after a reservation never delays it (the claims refuse that), but it
changes the state the reserved job's turn was decided on:

* the free GPUs a reservation's placement is chosen by (seed 12903: a share backfilled
  beside a reservation made another node the best fit for it);
* the rule that refuses the reserved job: a job started later that is charged under
  the same hard limit can turn a capacity refusal into a quota refusal (``HARD_NOW``).
  That changes what its turn gives - the GPU type a job of several types is decided on
  (per-type quotas, note 038: ``Admission.decide`` ranks the types by their refusals),
  whether its reservation lends its cohort's borrowers its GPUs, a preemption within
  the team (note 035), whether a reservation can be planned at all (seed 1912: a batch
  job started beside a reservation on the A100s put its team at its A100 limit; a full
  pass then decided the reserved job on the L40S type, where no start can be planned,
  and started the job the stale reservation had kept back).
"""

from __future__ import annotations

from bisect import bisect_right

from gpushepherd.core import typed
from gpushepherd.core.planning import reservation_for
from gpushepherd.core.profile import Profile
from gpushepherd.core.releases import node_releases
from gpushepherd.core.state import INF
from gpushepherd.core.verdict import FREE
from gpushepherd.model.job import JobState


def reservations_stand(turn) -> bool:
    """Whether each job given a slot of the reservation depth before the pass's last
    start (``Turn.slots[:Turn.slots_before_start]``) would take the same turn on the
    state the pass leaves: refused by the same rule, on the same GPU type, with the same
    reservation (or none) - each decided and recomputed in order against the holds in
    force and the reservations before it, as a full pass would. Asked once a pass."""
    n, turn.slots_before_start = turn.slots_before_start, 0
    if not n:
        return True
    book = turn.book
    claims = {c.job_id: c for c in turn.profile.claims if not c.hold}
    if n == 1 and _stands_unchanged(turn, claims):
        return True
    again = Profile(book)
    for p in sorted(book.preemptors.values(), key=lambda j: j.key):
        again.add_hold(p)
    for job, rule, tv in turn.slots[:n]:
        if any(d is job for d in turn.deferred):
            continue  # not computed yet: it will be, as of the pass's instant
        if job.state is not JobState.PENDING or job.id in book.preemptors:
            return False
        v = turn.adm.decide(job, again)
        if v.rule != rule or (job.variants and v.variant != tv):
            return False
        c = claims.get(job.id)
        with typed.turned(job):
            found = reservation_for(book, again, job)
            if (found is None) != (c is None):
                return False
            if found is None:
                continue
            if found[0] != c.start or sorted(found[1]) != sorted(c.gpus.items()):
                return False
            again.add_reservation(job, found[0], found[1], "", found[2] or None, c.lend)
    return True


def _stands_unchanged(turn, claims: dict) -> bool:
    """Whether the pass's one reservation to check stands without computing it again
    (note 052): it was computed at the pass's instant against no claim (no hold ever, the
    first slot), its job was refused for free GPUs (rule 5) with nothing that charges it,
    holds it to one island, avoids a class or is reserved for a class, and every job
    started since is planned to end by the reservation's start.

    Then on the state the pass leaves each whole GPU is planned to be free at
    ``max(t, e)`` where it was at ``t`` before (``e``: a started job's planned end, at
    most the start ``s``): at every instant from ``s`` on the free GPUs are the same, so
    the earliest start is ``s`` again (none before it: fewer GPUs free, and a placement
    refused stays refused with fewer - the lemma of ``Walk``'s memo) with the same best
    fit, and rule 5 still refuses the job now (fewer GPUs free). ``False``: not known - and always for the reference pass, which the
    oracle holds this shortcut equal to."""
    book = turn.book
    job, rule, _tv = turn.slots[0]
    c = claims.get(job.id)
    profile = turn.profile
    return (c is not None and rule == FREE and not turn.sched.reference and book.now == turn.t and not profile.had_holds
            and not book.preemptors and not job.variants and not job.charges and not book.reserved
            and not book.anti and not job.shape.island and job.shape.mode != "share"
            and job.state is JobState.PENDING and not any(d is job for d in turn.deferred)
            and (profile.consumed_until <= c.start or _outlivers_fit_worse(turn, job, c)))


def _outlivers_fit_worse(turn, job, c) -> bool:
    """Whether a single-node reservation ``[(r, k)]`` at ``s`` stands although jobs
    started since are planned to outlive ``s`` (note 055): ``r`` still has ``k`` GPUs
    free at ``s``, and every other node such a job took GPUs on has fewer than ``k`` free
    at ``s``, or more than ``r``, or as many with a higher index.

    Proof (with ``_stands_unchanged``'s other conditions): a start only moves release
    times later, so no node has ``k`` free before ``s`` (the earliest start is ``s``
    again: ``r`` has them at ``s``); at ``s`` a node no such job touched has what it had
    (a job ending by ``s`` has released its GPUs then), and it was a worse fit than ``r``,
    whose free GPUs only fell; so ``r`` is still the best fit (``ReleaseIndex.single_start``:
    fewest free at ``s``, then the lowest index)."""
    if job.shape.mode != "single" or len(c.gpus) != 1 or turn.profile.consumed_until == INF:
        return False
    book = turn.book
    s = c.start
    ((r, k),) = c.gpus.items()
    free_r = bisect_right(node_releases(book, r), s)
    if k != job.shape.k or free_r < k:
        return False
    for end, counts in turn.outlived:
        if end > s:
            for m, _x in counts:
                if m != r:
                    free_m = bisect_right(node_releases(book, m), s)
                    if free_m >= k and (free_m, m) < (free_r, r):
                        return False
    return True


def new_starts_covered(turn, new: list) -> bool:
    """Whether the claims of ``turn``'s pass are those of a full pass now, and starts of
    the jobs ``new`` (submitted since the pass, all queued behind its first
    capacity-blocked job and its last reserved one) leave every old job the turn it had -
    the lemma of ``cycle.continue_fast`` - as far as these go:

    * a reservation of the pass that begins before now (it was computed at the pass's
      instant, when the GPUs it claims were free until the claims after it): a full pass
      now computes it from now, over a later interval (seed 195860: a reservation from 4
      to 30 kept a share that ends at 29 from starting at 23; from now it begins at 70);

    * a job of a class with ``reserved_gpus`` that starts on a share or a MIG slice
      fills its class's reservation without taking a free whole GPU: the class hold of
      an old job refused by it loosens (seed 12899);
    * with per-GPU-type quotas (note 038) a start charged under one type's limit can
      turn an old job of several types queued behind it from a capacity refusal on that
      type to a quota refusal there, so it is decided on another type - where it may
      preempt (seed 116225: a MIG job put its team at its A100 limit; a full pass then
      decided a share on the H100 type, where it preempted);
    * with ``preemption.within_team`` and preemption off, a start charged under a team
      limit can turn an old job of that team from a capacity refusal to that limit's,
      which it may preempt within the team for (note 035).

    ``False``: one of these may be so (a full pass decides)."""
    book = turn.book
    if turn.profile and any(not c.hold and c.start < book.now for c in turn.profile.claims):
        return False
    reserved = book.reserved
    if reserved and any(j.cls.name in reserved for j in new):
        return False
    rules = book.rules
    within = rules.within_team if not rules.preemption_enabled else frozenset()
    if not rules.typed and not within:
        return True
    first = min(j.key for j in new)
    ids = {j.id for j in new}
    return not any(j.key > first and j.id not in ids and (j.variants or j.spec.team in within) for j in book.queue)
