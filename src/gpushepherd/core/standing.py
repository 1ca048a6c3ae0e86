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

from gpushepherd.core import typed
from gpushepherd.core.planning import reservation_for
from gpushepherd.core.profile import Profile
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
            and profile.consumed_until <= c.start)
