"""Quotas per GPU type (issue 13 point 4, design note 038): a job is charged against
the type it is placed on.

A job whose nodes all have one GPU type is charged that type's limits from intake on
(nothing else changes). A job that may run on several types, when some per-type limit
or cohort would count it, gets one *variant* per type (in ``Rules.gpu_types`` order,
the order nodes first name the types - as Kueue tries a ClusterQueue's flavors in
order): its shape and node filter confined to the type, its charges and its cohort
there. ``Admission.decide`` tries the variants in order (the first admitted one starts
the job); at rest a pending job is *bound* to its base (every type, the limits of every
type only), while running or preempting to the variant it was placed or planned on.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from gpushepherd.core.placement import Shape
from gpushepherd.core.state import Job


@dataclass(frozen=True, slots=True)
class Variant:
    """A job's shape, filter id, quota charges, cohort and units on one GPU type
    (``gpu_type`` ``None``: the base, every type)."""

    gpu_type: str | None
    shape: Shape
    fkey: int
    charges: tuple
    cohort: tuple | None
    units: int


def of_job(book, spec, cls, ckey: tuple, shape: Shape, units: int, evictable: bool, shape_for, units_of):
    """``(charges, cohort, base, variants)`` of a new job: ``variants`` empty when it is
    charged the same wherever it runs (its one type's limits, or no per-type limit
    counts it); else its base and one ``Variant`` per GPU type it may use."""
    quota = book.quota
    charges = quota.charges(spec.team, spec.workload_class, spec.user, units, evictable)
    cohort = book.cohort_of(spec.team, cls.pools)
    rules = book.rules
    if not rules.typed:
        return charges, cohort, None, ()
    types = [t for t in rules.gpu_types if any(book.ledger.groups[g].node.gpu_type == t
                                                for g in book.groups_of(ckey))]
    if len(types) == 1:
        return (quota.charges(spec.team, spec.workload_class, spec.user, units, evictable, types[0]),
                book.cohort_of(spec.team, cls.pools, types[0]), None, ())
    out = []
    for t in types:
        ck = (ckey[0], (t,), *ckey[2:])
        sh = shape_for(book, spec, ck)
        u = units_of(book, spec, ck)
        out.append(Variant(t, sh, book.filter_id(sh), quota.charges(spec.team, spec.workload_class, spec.user, u,
                                                                     evictable, t),
                           book.cohort_of(spec.team, cls.pools, t), u))
    if all(v.charges == charges and v.cohort == cohort for v in out):
        return charges, cohort, None, ()
    return charges, cohort, Variant(None, shape, book.filter_id(shape), charges, cohort, units), tuple(out)


def retype(book, job: Job, shape_for, units_of) -> None:
    """Derive a job's shape, units, charges, cohort and variants again, as a job submitted
    now gets them (a node was added: it may use more GPU types, a larger node, a card with
    more memory); it stays bound to the type it holds or planned on."""
    from gpushepherd.core.filters import job_filter

    ckey = job_filter(job.cls, job.spec)
    shape = shape_for(book, job.spec, ckey)
    units = units_of(book, job.spec, ckey)
    where = job.alloc or (job.plan if job.id in book.preemptors else [])
    was = bound_type(job) if job.id in book.preemptors else None  # a share's plan may name no node
    job.charges, job.cohort, job.base, job.variants = of_job(book, job.spec, job.cls, ckey, shape, units,
                                                             job.evictable, shape_for, units_of)
    job.shape, job.fkey, job.units, job.tv = shape, book.filter_id(shape), units, -1
    if where:
        at_node(book, job, where[0][0])
    elif was is not None:
        bind_type(job, was)


def bind(job: Job, v: Variant) -> None:
    """Make ``v`` the job's shape, filter, charges, cohort and units."""
    job.shape, job.fkey, job.charges, job.cohort, job.units = v.shape, v.fkey, v.charges, v.cohort, v.units


def rest(job: Job) -> None:
    """Bind a job of several types back to its base (a pending job at rest)."""
    if job.variants:
        bind(job, job.base)


def current(job: Job) -> Variant:
    """The job's present binding (shape, filter id, charges, cohort, units) as a
    ``Variant`` without a GPU type, so that ``bound`` can put it back (note 038)."""
    return Variant(None, job.shape, job.fkey, job.charges, job.cohort, job.units)


@contextmanager
def bound(job: Job, n: int):
    """Bind variant ``n`` (``-1``: leave the binding) for the duration, then put the
    binding back."""
    if not job.variants or n < 0:
        yield
        return
    was = current(job)
    bind(job, job.variants[n])
    try:
        yield
    finally:
        bind(job, was)


def at_node(book, job: Job, idx: int) -> None:
    """Bind a job of several types to the variant of node ``idx``'s GPU type (it is
    placed there: started, adopted or restored)."""
    if job.variants:
        gt = book.ledger.slots[idx].node.gpu_type
        for v in job.variants:
            if v.gpu_type == gt:
                bind(job, v)
                return


def bound_type(job: Job) -> str | None:
    """The GPU type a job of several types is bound to (``None``: at rest, or one type)."""
    if not job.variants or at_rest(job):
        return None
    return next((v.gpu_type for v in job.variants if v.fkey == job.fkey), None)


def bind_type(job: Job, gpu_type: str | None) -> None:
    """Bind a job of several types to its variant of ``gpu_type`` (none such: as it is)."""
    for v in job.variants:
        if gpu_type is not None and v.gpu_type == gpu_type:
            bind(job, v)
            return


def at_rest(job: Job) -> bool:
    """Whether a job of several types is bound to its base (not to one type)."""
    return bool(job.variants) and job.fkey == job.base.fkey


def any_variant(job: Job, pred) -> bool:
    """``pred(job)`` on some binding a job at rest may take (each variant bound in turn,
    the binding put back after), else on the job as it is bound."""
    if not at_rest(job):
        return bool(pred(job))
    for n in range(len(job.variants)):
        with bound(job, n):
            if pred(job):
                return True
    return False


def turned(job: Job):
    """Bound to the variant of its last turn while at rest (its reservation is for that
    type), else as it is."""
    return bound(job, job.tv if at_rest(job) else -1)


def cohorts_of(job: Job) -> list:
    """The cohorts (``(Cohort, CohortMember)``) a job may count in: its variants' while
    at rest, else its own."""
    if not at_rest(job):
        return [job.cohort] if job.cohort is not None else []
    return [v.cohort for v in job.variants if v.cohort is not None]


def member_in(cohort, job: Job):
    """The member of ``cohort`` whose GPUs ``job`` counts in (its charges name the
    member's limit), else ``None``. A job confined to a pool counts in the pool's cohort
    and in a cohort of every pool; ``Job.cohort`` names the first only (oracle seed
    143208: a job of another member there was taken for one outside the cohort)."""
    charged = {i for i, user, _a in (job.run_charges or job.charges) if not user}
    return next((m for m in cohort.members if m.limit in charged), None)


def borrows_from(job: Job, victim: Job) -> bool:
    """Whether ``victim`` counts as a job of another member of a cohort of ``job``'s
    (evicted to give back lent quota: a reclaim)."""
    return any((m := member_in(c[0], victim)) is not None and m is not c[1] for c in cohorts_of(job))


def may_evict(job: Job, victim: Job) -> bool:
    """Whether ``victim`` could ever be on ``job``'s victim list (a lower class, or a job
    of another member of its cohort)."""
    return victim.cls.priority < job.cls.priority or borrows_from(job, victim)
