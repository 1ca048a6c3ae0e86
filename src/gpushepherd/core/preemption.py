"""Preemption: which running jobs to evict so that a higher-priority job fits.

Rules (R6 and the public scenario conventions):

* only jobs of a strictly lower class priority, that are preemptible, that have run at
  least the policy's minimum runtime, and - for classes that say so (training) - that
  checkpoint; production inference is never preemptible;
* victim order on a node: lowest class first; within a class the most recently
  started first; ties: highest job id first;
* victims are chosen node by node (as KAI-Scheduler and Volcano evaluate victims per
  node): for each piece of the preemptor (the whole job, each pod, or each whole node
  of a multi-node gang) the node whose victim set is cheapest - lowest highest victim
  class, then fewest victims, then fewest GPU-seconds of work lost - ties by lowest
  node index. A victim set is minimal on its node: a victim whose GPUs are not needed
  is dropped;
* nothing is evicted unless the whole preemptor then fits (planned on a copy of the
  free GPUs, KAI's statement with checkpoint/rollback); gangs count whole on both
  sides: a victim frees all its GPUs, the preemptor must fit entirely.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpushepherd.core.placement import Counts, members_of, place_counts
from gpushepherd.core.state import INF, Job
from gpushepherd.model.job import GPU_UNITS, JobState, natural_key

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


def lower_candidates(sched: "Scheduler", job: Job):
    """RUNNING preemptible jobs of a lower class priority than ``job``'s."""
    p = job.cls.priority
    for q, jobs in sched.preemptible_by_priority().items():
        if q < p:
            yield from jobs.values()


def _neg_natural(text: str) -> tuple:
    # invert a natural key so that ascending order puts the highest id first
    return tuple((-a, -b, _invert(c)) for a, b, c in natural_key(text)) + ((2, 0, ()),)


def _invert(s: str) -> tuple:
    return tuple(-ord(ch) for ch in s) + (1,)


def _cost(victims: list[Job], now: float) -> tuple:
    if not victims:
        return (-1, 0, 0.0, 0)
    lost = sum(0.0 if v.checkpointable else (now - v.run_start) * v.gpus for v in victims)
    return (max(v.cls.priority for v in victims), len(victims), lost, sum(v.gpus for v in victims))


def _needs(sched: "Scheduler", job: Job, cand: list[int]) -> list[int]:
    """The pieces the preemptor is placed in: per piece, GPUs on one node."""
    shape = job.shape
    if shape.mode == "single":
        return [shape.k]
    if shape.mode == "pods":
        return [shape.per_pod] * shape.pods
    size = max(sched.ledger.slots[i].healthy for i in cand)
    whole, rest = divmod(shape.k, size)
    return [size] * whole + ([rest] if rest else [])


def victims_for(sched: "Scheduler", job: Job, now: float, only: set[int] | None = None,
                exclude: frozenset[int] = frozenset()) -> tuple[tuple[list[Job], Counts] | None, float]:
    """A victim set for ``job`` and the placement counts it would get (or ``None``),
    and the time until which a failure stays valid (when a too-young job passes the
    minimum runtime). With ``only``, single-node shapes look at those nodes alone (the
    others are known not to work); nodes in ``exclude`` are not used."""
    ledger = sched.ledger
    groups = sched.groups_for(job)
    cand = members_of(ledger, groups)
    if only is not None or exclude:
        cand = [i for i in cand if (only is None or i in only) and i not in exclude]
    node_set = set(cand)
    prio = job.cls.priority
    size = sched.uniform_nodes()
    if job.shape.mode == "multi" and size and sched.makeable_nodes(prio, True) < job.shape.k // size:
        return None, INF  # not enough nodes could be emptied (minimum runtime aside)
    # necessary, from per-node counters: the job fits once every lower job that may be
    # a victim is gone (no walk over the running jobs when even that fails)
    upper = {i: ledger.slots[i].free + sched.lower_gpus(i, prio, True) for i in cand}
    if place_counts(upper, cand, {i: ledger.slots[i].healthy for i in cand}, job.shape) is None:
        return None, INF if sched.rules.preemption_min_runtime_s <= 0 else now + sched.rules.preemption_min_runtime_s
    minrt = sched.rules.preemption_min_runtime_s
    on_node: dict[int, list[Job]] = {}
    gain = 0
    until = INF
    for v in lower_candidates(sched, job):
        if v.cls.preempt_only_if_checkpointable and not v.checkpointable:
            continue
        if now - v.run_start < minrt:
            until = min(until, v.run_start + minrt)
            continue
        for idx, mask in v.alloc:
            if idx in node_set:
                on_node.setdefault(idx, []).append(v)
                gain += _freed(ledger, idx, mask)
    if not on_node:
        return None, until
    avail = {i: ledger.slots[i].free for i in cand}
    if sum(avail.values()) + gain < job.gpus:
        return None, until
    # necessary: the job fits once every possible victim is gone
    upper = {i: avail[i] + sum(_on(v, i, ledger) for v in on_node.get(i, ())) for i in cand}
    totals = {i: ledger.slots[i].healthy for i in cand}
    if place_counts(upper, cand, totals, job.shape) is None:
        return None, until
    for lst in on_node.values():
        lst.sort(key=_vkey)
    chosen: dict[str, Job] = {}
    used_nodes: set[int] = set()
    distinct = job.shape.mode == "multi"
    for need in _needs(sched, job, cand):
        best = None
        for n in cand:
            if distinct and n in used_nodes:
                continue
            plan = _node_plan(n, need, avail, on_node.get(n, ()), chosen, ledger)
            if plan is None:
                continue
            key = (_cost(plan, now), n)
            if best is None or key < best[0]:
                best = (key, n, plan)
        if best is None:
            return None, until
        _, n, plan = best
        for v in plan:
            chosen[v.id] = v
            for idx, mask in v.alloc:
                if idx in avail:
                    avail[idx] += _freed(ledger, idx, mask)
        avail[n] -= need
        used_nodes.add(n)
    final = {i: ledger.slots[i].free for i in cand}
    for v in chosen.values():
        for idx, mask in v.alloc:
            if idx in final:
                final[idx] += _freed(ledger, idx, mask)
    placed = place_counts(final, cand, totals, job.shape)
    if placed is None:
        return None, until
    victims = sorted(chosen.values(), key=_vkey)
    return (victims, placed), until


def _vkey(job: Job) -> tuple:
    return job.vkey


def _node_plan(n: int, need: int, avail: dict[int, int], victims, chosen: dict[str, Job], ledger) -> list[Job] | None:
    """The fewest victims (in victim order) on node ``n`` that make ``need`` GPUs free
    there, given what is free now and what already chosen victims free."""
    have = avail[n]
    if have >= need:
        return []
    plan = []
    for v in victims:
        if v.id in chosen:
            continue
        plan.append(v)
        have += _on(v, n, ledger)
        if have >= need:
            break
    else:
        return None
    # minimal: drop a victim whose GPUs are not needed (last added first)
    for v in reversed(plan[:-1]):
        if have - _on(v, n, ledger) >= need:
            plan.remove(v)
            have -= _on(v, n, ledger)
    return plan


def _on(v: Job, n: int, ledger) -> int:
    for idx, mask in v.alloc:
        if idx == n:
            return _freed(ledger, idx, mask)
    return 0


def _freed(ledger, idx: int, mask: int) -> int:
    """GPUs of ``mask`` on node ``idx`` that evicting their holder makes free: those in
    service (an unmanaged GPU stays out when its holder leaves)."""
    return (mask & ledger.slots[idx].healthy_mask).bit_count()


def lower_jobs_would_make_room(sched: "Scheduler", job: Job, only: set[int] | None = None) -> bool:
    """Whether evicting *every* lower-priority running job (preemptible or not) would
    make ``job`` fit: then the blocker is "no preemptible victims", not capacity.
    With ``only``, single-node shapes look at those nodes alone."""
    ledger = sched.ledger
    cand = members_of(ledger, sched.groups_for(job))
    if only is not None:
        cand = [i for i in cand if i in only]
    prio = job.cls.priority
    size = sched.uniform_nodes()
    if job.shape.mode == "multi" and size and sched.makeable_nodes(prio, False) < job.shape.k // size:
        return False
    lower = {i: sched.lower_gpus(i, prio, False) for i in cand}
    if not any(lower.values()):
        return False
    avail = {i: ledger.slots[i].free + lower[i] for i in cand}
    totals = {i: ledger.slots[i].healthy for i in cand}
    return place_counts(avail, cand, totals, job.shape) is not None


def reclaim_victims(sched: "Scheduler", job: Job, now: float,
                    exclude: frozenset[int] = frozenset()) -> tuple[tuple[list[Job], Counts] | None, float]:
    """Victims for a job that reclaims its team's lent nominal quota (Kueue's
    ``reclaimWithinCohort``), and the placement counts it then gets; the time until
    which a failure stays valid (a too-young victim passing the minimum runtime).

    Candidates: RUNNING preemptible jobs of the cohort's other members while that member
    holds more than its nominal quota (of any class, or only of lower classes with
    ``reclaim: lower_priority``), and - when class preemption applies - jobs of a lower
    class. They are taken in victim order until the job fits both the free GPUs (nodes
    in ``exclude`` aside) and every limit it counts against; then any victim whose GPUs
    and quota are not needed is dropped (last taken first). Nothing is returned unless
    the whole job fits."""
    cohort, member = job.cohort
    quota = sched.quota
    ledger = sched.ledger
    minrt = sched.rules.preemption_min_runtime_s
    lower_only = cohort.reclaim == "lower_priority"
    prio = job.cls.priority
    use = {m.team: quota.usage.get((m.limit, ""), 0) for m in cohort.members}
    nominal = {m.team: m.nominal * GPU_UNITS for m in cohort.members}
    until = INF
    cands: list[tuple[Job, str | None]] = []  # (victim, the member it borrows for, or None)
    for v in sched.holding():
        if v.state is not JobState.RUNNING or not v.preemptible:
            continue
        if v.cls.preempt_only_if_checkpointable and not v.checkpointable:
            continue
        lender = None
        if v.cohort is not None and v.cohort[0] is cohort and v.cohort[1] is not member:
            if not lower_only or v.cls.priority < prio:
                lender = v.cohort[1].team
        if lender is None and v.cls.priority >= prio:
            continue
        if now - v.run_start < minrt:
            until = min(until, v.run_start + minrt)
            continue
        if v.run_start >= now:
            continue  # placed in this very instant: never evicted at once (no churn)
        cands.append((v, lender))
    cands.sort(key=lambda c: _vkey(c[0]))
    cand_nodes = [i for i in members_of(ledger, sched.groups_for(job)) if i not in exclude]
    node_set = set(cand_nodes)
    totals = {i: ledger.slots[i].healthy for i in cand_nodes}
    avail = {i: ledger.slots[i].free for i in cand_nodes}
    need = {(i, user): quota.usage.get((i, user), 0) + amount - quota.current[i] for i, user, amount in job.charges}

    def apply(v: Job, sign: int) -> None:
        for idx, mask in v.alloc:
            if idx in node_set:
                avail[idx] += sign * _freed(ledger, idx, mask)
        for i, user, amount in v.charges:
            if (i, user) in need:
                need[(i, user)] -= sign * amount
        if v.cohort is not None and v.cohort[0] is cohort:
            use[v.cohort[1].team] -= sign * v.units

    def fits() -> Counts | None:
        if any(n > 0 for n in need.values()):
            return None
        return place_counts(dict(avail), cand_nodes, totals, job.shape)

    chosen: list[Job] = []
    placed = None
    for v, lender in cands:
        if lender is not None and v.cls.priority >= prio and use[lender] <= nominal[lender]:
            continue  # its member no longer borrows (and class preemption does not apply)
        chosen.append(v)
        apply(v, 1)
        placed = fits()
        if placed is not None:
            break
    if placed is None:
        return None, until
    for v in reversed(chosen[:-1]):
        apply(v, -1)
        if fits() is not None:
            chosen.remove(v)
        else:
            apply(v, 1)
    placed = fits()
    if placed is None:  # pragma: no cover - dropping only ever keeps a fitting set
        return None, until
    return (sorted(chosen, key=_vkey), placed), until
