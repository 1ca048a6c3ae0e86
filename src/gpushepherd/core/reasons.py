"""Why a job waits: the admission rule's verdict in the policy's words (the reason codes
of ``model/reasons.py``; the conventions' vocabulary is mapped in docs/scenarios.md).

The code comes from the rule that refused; the detail names the blocker - the limit and
its use, the claim, the class reservation, the constraint that leaves free GPUs unusable.
"""

from __future__ import annotations

from gpushepherd.core import admission as A, typed
from gpushepherd.core.filters import describe, share_fits_card
from gpushepherd.core.ledger import FULL_MILLI, bits
from gpushepherd.core.placement import members_of, place_counts
from gpushepherd.core.shares import best_card_for
from gpushepherd.core.preemption import kept_by_cohort, plan as preemption_plan, share_plan
from gpushepherd.core.room import lower_jobs_would_make_room, lower_shares_would_make_room, unevictable_lower
from gpushepherd.core.state import INF, Job
from gpushepherd.model.job import GPU_UNITS, JobState, natural_key
from gpushepherd.model.reasons import PendingReason, ReasonCode, time_text

#: ``NoPreemptibleVictims`` detail when evicting lower classes would make room but some
#: of that work may not be evicted (a class that is not preemptible)
NOT_PREEMPTIBLE = "lower-priority jobs may not be preempted"

R = ReasonCode


def in_progress(job: Job) -> PendingReason:
    return PendingReason(R.PREEMPTION_IN_PROGRESS, ",".join(sorted(job.victims, key=natural_key)))


def preempted_reason(book, job: Job) -> str | None:
    """Why a job in its preemption grace period (``PREEMPTING``) is being stopped, in
    Kueue's word for an evicted workload (``Preempted``): ``Preempted(by job 7, class
    production-inference)``, ``Preempted(by job 7, class training, reclaim)`` (its
    cohort's lender took its quota back), ``Preempted(window closed: classes.batch.max_gpus)``
    (its class's ``checkpoint-and-stop``); ``None`` for a job in any other state."""
    if job.state is not JobState.PREEMPTING:
        return None
    cause = job.stop_reason
    if cause.startswith("window-closed:"):
        return f"Preempted(window closed: {cause.removeprefix('window-closed:')})"
    by = book.jobs.get(job.preempted_by)
    cls = cause.removeprefix("priority:") if cause.startswith("priority:") else \
        by.spec.workload_class if by is not None else ""
    parts = [f"by job {job.preempted_by}" if job.preempted_by else "", f"class {cls}" if cls else "",
             "reclaim" if cause == "reclaim" else ""]
    detail = ", ".join(p for p in parts if p)
    return f"Preempted({detail})" if detail else "Preempted"


def reason_of(book, adm, profile, job: Job, v: A.Verdict, may_preempt: bool = True) -> PendingReason:
    """The reason a user reads for ``job`` refused by verdict ``v``; ``may_preempt``
    False: the job may not preempt now (behind the strict order's stop), so a capacity
    reason never names victims."""
    quota = book.quota
    rule = v.rule
    if rule == A.HARD_NEVER:
        i, together = v.limit
        lim = quota.limits[i]
        if together:  # each windowed limit alone allows it, never all at the same time
            others = [quota.limits[k].path for k in quota.never_together(v.charges) if k != i]
            return PendingReason(R.EXCEEDS_CAPACITY, f"{lim.path} with {' and '.join(others)}: their windows "
                                 "never allow it at the same time")
        return PendingReason(R.EXCEEDS_CAPACITY, f"{lim.path}={lim.loosest}")
    if rule == A.HARD_NOW:
        i, used = v.limit
        lim, now_max, window = quota.limits[i], quota.current[i], quota.window[i]
        if lim.windows:  # the limit in force is a time window's
            where = f"@{window}" if window else "@outside windows"
            return PendingReason(R.WINDOW_LIMIT, f"{lim.path}{where}={quota.fmt(i, now_max)}, in use {quota.fmt(i, used)}")
        return PendingReason(R.QUOTA_EXCEEDED, f"{lim.path}={quota.fmt(i, now_max)}, in use {quota.fmt(i, used)}")
    if rule == A.NEVER_FITS:
        return never_fits_reason(book, adm, job)
    if rule == A.ORDER:
        return PendingReason(R.PRIORITY, v.head)
    if rule == A.FREE:
        return unmanaged_reason(book, job) or capacity_reason(book, adm, profile, job, may_preempt)
    if rule == A.COHORT:
        i, used = v.limit
        return PendingReason(R.COHORT_QUOTA, f"{quota.limits[i].path}={quota.fmt(i, quota.current[i])}, "
                             f"in use {quota.fmt(i, used)}")
    if rule == A.ANTI:
        return PendingReason(R.NO_FIT, "anti-affinity")
    if rule == A.CLASS_HOLD:
        return PendingReason(R.RESERVED_FOR, f"classes.{v.holder}.reserved_gpus")
    if rule == A.CLAIMS:
        b = v.blocker or adm.blocker_of(job, profile, v.charges)
        if b is None:  # pragma: no cover - a CLAIMS verdict has a claim to name
            return PendingReason(R.RESERVED_FOR)
        return PendingReason(R.HELD_FOR_PREEMPTOR if b.hold else R.RESERVED_FOR, b.job_id)
    raise ValueError(f"no reason for an admitted job {job.id}")  # pragma: no cover


def never_fits_reason(book, adm, job: Job) -> PendingReason:
    unmanaged = unmanaged_reason(book, job, capacity=True)
    if unmanaged is not None:
        return unmanaged
    ledger = book.ledger
    if book.reserved:
        cand = members_of(ledger, book.groups_for(job))
        totals = {i: ledger.slots[i].healthy for i in cand}
        if (place_counts(dict(totals), cand, totals, job.shape) is not None if job.shape.mode != "share"
                else not adm._share_never_fits(job)):  # only the reservations bind
            names = [c for c in book.reserved if c != job.cls.name]
            detail = ",".join(f"classes.{c}.reserved_gpus={book.reserved[c] // GPU_UNITS}" for c in names)
            return PendingReason(R.EXCEEDS_CAPACITY, detail)
    text = describe(job.cls, job.spec)
    if job.shape.mode == "single" and job.spec.one_node:
        text += ",same_node" if job.spec.same_node else f",gpus_per_pod={job.spec.gpus_per_pod}"
    if job.shape.island:
        text += ",nvlink-island"
    return PendingReason(R.EXCEEDS_CAPACITY, text)


def unmanaged_reason(book, job: Job, capacity: bool = False) -> PendingReason | None:
    """``Resources(unmanaged:NODE:GPU,...)`` when GPUs the job may use run processes the
    scheduler did not start and the job would fit were they free (``capacity``: were
    they in service, all GPUs empty); else ``None``."""
    if not book.any_unmanaged:
        return None
    ledger = book.ledger
    cand = [i for i in members_of(ledger, book.groups_for(job))
            if ledger.slots[i].unmanaged_mask or any(c.unmanaged for c in ledger.slots[i].migs.values())]
    if not cand:
        return None
    names = []
    for i in cand:
        slot = ledger.slots[i]
        names.extend(f"{slot.node.name}:{g}" for g in range(slot.total)
                     if (slot.migs[g].unmanaged if g in slot.migs else slot.unmanaged_mask >> g & 1))
    detail = PendingReason(R.RESOURCES, "unmanaged:" + ",".join(names))
    if job.shape.mode == "share":
        return detail  # a share could take a card of any of them
    cand = members_of(ledger, book.groups_for(job))
    extra = {i: (ledger.slots[i].unmanaged_mask & ~ledger.slots[i].sick_mask).bit_count() for i in cand}
    idle = {i: extra[i] - sum(1 for g in bits(ledger.slots[i].unmanaged_mask) if ledger.slots[i].holder[g])
            for i in cand}
    totals = {i: ledger.slots[i].healthy + extra[i] for i in cand}
    avail = dict(totals) if capacity else {i: ledger.slots[i].free + idle[i] for i in cand}
    return detail if place_counts(avail, cand, totals, job.shape) is not None else None


def capacity_reason(book, adm, profile, job: Job, may_preempt: bool = True) -> PendingReason:
    """Why no free GPUs take the job: when evicting lower classes would make room but no
    victim set works, ``NoPreemptibleVictims`` if some of that work may not be evicted
    (saying when a too-young victim comes of age), or the rule that refused the job with
    its victims gone (``_no_victims``, note 058); else the shape that does not fit, else
    ``Resources``."""
    ledger = book.ledger
    groups = book.groups_for(job)
    if job.shape.mode == "share":
        if may_preempt and book.rules.preemption_enabled and lower_shares_would_make_room(book, job):
            why: list = []
            found, until = share_plan(book, adm, profile, job, why)
            told = _no_victims(book, adm, profile, job, until, why) if found is None else None
            if told is not None:
                return told
        return share_reason(book, job)
    if job.shape.island:  # enough free GPUs on a node, but on no node inside one island
        cand = members_of(ledger, groups)
        if place_counts({i: ledger.slots[i].free for i in cand}, cand, {}, job.shape) is not None:
            return PendingReason(R.NO_FIT, "nvlink-island")
    if (may_preempt and book.rules.preemption_enabled and any(q < job.cls.priority for q in book.running_prio)
            and lower_jobs_would_make_room(book, job)):
        why = []
        found, until = preemption_plan(book, adm, profile, job, why=why)
        told = _no_victims(book, adm, profile, job, until, why) if found is None else None
        if told is not None:
            return told
    free_here = ledger.free_in(groups)
    if free_here >= job.shape.k:
        what = {"single": "single-node", "multi": "whole-nodes", "pods": "pods"}[job.shape.mode]
        return PendingReason(R.NO_FIT, what)
    if ledger.free_total >= job.shape.k and len(groups) < len(ledger.groups):
        return PendingReason(R.NO_FIT, constraint_names(job))
    if room_as_shares(book, job):
        return PendingReason(R.NO_FIT, "whole-gpu")  # capacity left only as shares or MIG instances
    return PendingReason(R.RESOURCES)


def room_as_shares(book, job: Job) -> bool:
    """Whether a node ``job`` may use has room left on a shared card in service (the
    tightest of its compute, memory and slots left above 0) or a free MIG instance in
    service: the free capacity of ``stranded.py`` that whole GPUs are not. Without it a
    whole-GPU job waits ``Resources``, not ``NoFit(whole-gpu)`` (note 063)."""
    ledger = book.ledger
    for n in sorted(book.nodes_for(job)):
        slot = ledger.slots[n]
        if any(card.key and card.room_fraction() > 0 for card in slot.cards.values()):
            return True
        if any(card.free_count() for card in slot.migs.values()):
            return True
    return False


def card_room(book, job: Job, dim: str) -> bool:
    """Whether a card in service of share ``job``'s kind on its nodes has compute
    (``dim`` ``gpu-fraction``) or memory (``gpu-memory``) left: the room a
    ``NoFit(<dim>)`` says is too small (note 063); ``dim`` ``replica``: a card of its
    kind is open at all - the replicas "no free replica" says are all taken (note 076)."""
    ledger = book.ledger
    kind = job.share.kind
    for n in sorted(book.nodes_for(job)):
        for card in ledger.slots[n].cards.values():
            if card.key and card.mode == kind and (dim == "replica" or (
                    card.milli < FULL_MILLI if dim == "gpu-fraction" else card.mem < card.cap_mem)):
                return True
    return False


def replica_free(book, job: Job) -> bool:
    """Whether a card in service of share ``job``'s kind on its nodes would take it but
    for memory: the replicas (time-slicing) or MPS clients it asks are free, and an MPS
    client's SM percentage with them (an MPS replica is a client and its part of the SMs;
    note 076). ``best_card_for(..., memory=False)`` without its tie-break."""
    ledger = book.ledger
    for n in sorted(book.nodes_for(job)):
        milli, _mem, slots = job.share.need(ledger.slots[n].node)
        if any(card.key and card.mode == job.share.kind and card.fits(milli, 0, slots)
               for card in ledger.slots[n].cards.values()):
            return True
    return False


def _no_victims(book, adm, profile, job: Job, until: float, why: list) -> PendingReason | None:
    """``NoPreemptibleVictims``: when a too-young victim comes of age (``until``), or why
    none may be evicted; or, when the plan found victims that would make room but
    another rule then refuses the job (``why``: the plan's refusals, the last with the
    most victims gone), that rule's reason: a class reservation the freed GPUs would go
    to, a claim, a quota (issue 20 point 12: the reason is the real blocker). ``None``
    when every lower-priority job on its nodes may be evicted: no preemption helps, and
    the capacity reason is the real one."""
    if until != INF:
        return PendingReason(R.NO_PREEMPTIBLE_VICTIMS, f"min_runtime: victims eligible at t={time_text(until)}")
    kept = kept_by_cohort(book, job)
    if kept:
        return PendingReason(R.NO_PREEMPTIBLE_VICTIMS, kept)
    if why:
        return reason_of(book, adm, profile, job, why[-1], False)
    if not unevictable_lower(book, job):
        return None  # every lower job may be evicted and that is of no use: capacity
    return PendingReason(R.NO_PREEMPTIBLE_VICTIMS, NOT_PREEMPTIBLE)


def constraint_names(job: Job) -> str:
    spec = job.spec
    names = []
    if job.cls.pools is not None:
        names.append("pool")
    if spec.gpu_types:
        names.append("gpu_type")
    if spec.gpu_mem_mib:
        names.append("gpu_memory")
    return "+".join(names) or "constraints"


def share_reason(book, job: Job) -> PendingReason:
    """Why no card takes a share now: the dimension that binds (the conventions'
    ``insufficient_gpu_memory``, ``insufficient_gpu_fraction``, ``no_free_mig_slice``,
    ``no_free_mps_replica``)."""
    share = job.share
    ledger = book.ledger
    groups = book.groups_for(job)
    if share.kind == "mig":
        nodes = book.nodes_for(job)
        coming = [f"{ledger.slots[i].node.name}:{g}" for (i, g), layout in sorted(book.mig_plans.items())
                  if i in nodes and any(p == share.profile for _s, p in layout)]
        if coming:
            return PendingReason(R.NO_FIT, f"mig-slice {share.profile}, reconfiguring {','.join(coming)}")
        return PendingReason(R.NO_FIT, f"mig-slice {share.profile}")
    if (any(share.need(ledger.groups[g].node)[1] for g in groups)
            and best_card_for(ledger, groups, share, memory=False) is not None
            and (share.milli or share.kind != "fraction" or card_room(book, job, "gpu-memory"))):
        return PendingReason(R.NO_FIT, "gpu-memory")  # a card takes it but for memory
    if share.kind in ("time_slice", "mps"):
        # "no free replica": cards of its kind are open and none has the replicas (MPS
        # clients and their SMs) it asks; none open at all is capacity (note 076)
        if card_room(book, job, "replica") and not replica_free(book, job):
            return PendingReason(R.NO_FIT, "time-slice-replica" if share.kind == "time_slice" else "mps-client")
        return PendingReason(R.RESOURCES)
    fresh = ledger.free_in([g for g in groups if share_fits_card(ledger.groups[g].node, share)]) > 0
    if fresh:  # pragma: no cover - a free GPU that fits would have been a spot
        return PendingReason(R.NO_FIT, "gpu")
    dim = "gpu-fraction" if share.milli else "gpu-memory"
    # a card with some of it left, too little; none left at all is capacity (note 063)
    return PendingReason(R.NO_FIT, dim) if card_room(book, job, dim) else PendingReason(R.RESOURCES)


def pending_reason(sched, job: Job) -> PendingReason:
    """The reason of a pending job now: the admission rule on the current state, with the
    claims that bind it (holds, and reservations of jobs ahead of it)."""
    book = sched.book
    if job.id in book.preemptors and job.victims:
        return in_progress(job)
    profile = sched.profile_for(job)
    adm = sched.admission
    v = adm.decide(job, profile)
    first = sched.last_turn.first_blocked if sched.last_turn is not None else None
    behind = not book.rules.backfill_enabled and first is not None and first.key < job.key
    if v.admitted:
        if behind:
            return PendingReason(ReasonCode.PRIORITY, first.id)
        return PendingReason(ReasonCode.PRIORITY, "not reached by the last pass")
    # behind the job that stops the strict order nothing acts, preemption included: the
    # reason is the capacity it lacks, never victims that would come of age (seed 4467)
    with typed.bound(job, v.variant):  # the GPU type its verdict is for (note 038)
        return reason_of(book, adm, profile, job, v, may_preempt=not behind)
