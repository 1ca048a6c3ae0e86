"""Step 5 of the cycle: which running jobs to evict so that a job refused for capacity
may start (R6; design note 015, section 4).

Candidates:

* *class preemption* - RUNNING jobs of a strictly lower class that may be evicted
  (whole-GPU jobs and shares but MIG instances: a share frees its card's GPU only with
  every other holder of the card, ``freed.py``; note 042)
  (preemptible, checkpointable where the class asks; production inference never), that
  have run ``preemption.min_runtime_s`` and were not placed at this very instant (they
  may be from the next second on: a wake-up is asked for then); in a
  cohort, a job of another member only while that member borrows (a member within its
  nominal quota keeps its guarantee) and only for a job whose team stays within its own
  nominal quota once it runs (Kueue's ``borrowWithinCohort: Never``: a job that would
  borrow preempts no other member, whose reclaim would undo it at once; issue 20);
* *reclaim* - in the job's cohort, while its team stays within its nominal quota once
  admitted: jobs of other members that borrow (hold more than their nominal), of any
  class or only lower ones (``reclaim: lower_priority``), Kueue's ``reclaimWithinCohort``,
  and that every other cohort of the two lets it take, as above;
* *within a team* - for a job that a limit of a team with ``preemption.within_team:
  lower_priority`` keeps waiting (rule 2), the evictable jobs of a lower class that count
  in that limit (Kueue's ``withinClusterQueue: LowerPriority``; note 035).

The plan, on a scratch copy of the allocation (KAI's ``Statement``; nothing is evicted
unless it works):

1. per piece of the job (the whole job, each pod, each whole node of a multi-node gang)
   the node whose victim set is cheapest (made of units: a whole-GPU victim, or a shared
   card with all its holders, ``_units``) - lowest highest victim class, fewest victims,
   least work lost, then a placement on one NVLink island, then the victims first in
   the global victim order (lowest class, most recently started, highest id), then the
   node index; the set is minimal on its node. A single-node job that does not fit one
   island after the fewest victims also weighs, on that node, the smallest set (victim
   order) after which it does - the only set for a job that requires one (note 037). GPUs held for another preemptor, claimed
   by a reservation the job would delay, or kept for other classes' ``reserved_gpus``
   are not room;
2. while the admission rule still refuses the job on the scratch state (a class hold, a
   cohort's capacity, ...), the next candidate in victim order is added;
3. victims whose removal keeps the job admitted are dropped (last added first);
4. the plan stands only if the admission rule admits the job on the scratch state.
"""

from __future__ import annotations

from gpushepherd.core import typed
from gpushepherd.core.admission import FREE, Admission, Scratch, Verdict
from gpushepherd.core.filters import share_fits_card
from gpushepherd.core.freed import card_of, freed_count, freed_masks, freed_parts
from gpushepherd.core.ledger import FULL_MILLI
from gpushepherd.core.placement import fits_island, members_of, place_counts
from gpushepherd.core.profile import Profile, held_for
from gpushepherd.core.state import INF, Job
from gpushepherd.core.typed import borrows_from, member_in
from gpushepherd.model.job import GPU_UNITS, JobState


def member_borrows(book, member) -> bool:
    """Whether cohort ``member`` uses more than its nominal quota (GPU units): it borrows."""
    return book.quota.usage.get((member.limit, ""), 0) > member.nominal * GPU_UNITS


def _lenders(book, job: Job) -> list[tuple]:
    """Per cohort ``job`` counts in, ``(cohort, its member, the teams whose jobs it may
    take)``: the other members that borrow - none when its team would borrow once it
    runs (Kueue's ``borrowWithinCohort: Never``: that member would reclaim at once, and
    round again; issue 20)."""
    out = []
    for cohort in book.rules.cohorts.values():
        own = member_in(cohort, job)
        if own is None:
            continue
        takes = set()
        if book.quota.usage.get((own.limit, ""), 0) + job.units <= own.nominal * GPU_UNITS:
            takes = {m.team for m in cohort.members if m is not own and member_borrows(book, m)}
        out.append((cohort, own, takes))
    return out


def stays_within_nominal(book, job: Job) -> bool:
    """Whether the cohort member of ``job`` (a job in a cohort) holds at most its nominal
    quota once the job runs, in GPU units: the job does not borrow."""
    member = job.cohort[1]
    return book.quota.usage.get((member.limit, ""), 0) + job.units <= member.nominal * GPU_UNITS


def _within_nominal_to_reclaim(book, job: Job) -> bool:
    """Preemption is on, the job's cohort reclaims, and its team stays within its
    nominal quota once the job runs (Kueue's ``reclaimWithinCohort``)."""
    if not book.rules.preemption_enabled or job.cohort is None:
        return False
    return job.cohort[0].reclaim != "never" and stays_within_nominal(book, job)


def may_reclaim(book, job: Job) -> bool:
    """Whether ``job`` may reclaim lent quota: preemption is on, its cohort reclaims, its
    team stays within its nominal quota once the job runs, and another member borrows
    (Kueue's ``reclaimWithinCohort``; note 005)."""
    if not _within_nominal_to_reclaim(book, job):
        return False
    member = job.cohort[1]
    return any(m is not member and member_borrows(book, m) for m in job.cohort[0].members)


def may_reclaim_later(book, job: Job) -> bool:
    """Whether whole-GPU ``job`` would reclaim once another member of its cohort borrows
    (``may_reclaim`` but the borrowing): a job that starts later in the same pass may make
    that member a borrower, and its jobs victims (the pass is then repeated, note 015)."""
    return job.shape.mode != "share" and _within_nominal_to_reclaim(book, job)


def borrows(book, job: Job) -> bool:
    """Whether the cohort member of ``job`` (a job in a cohort) uses more than its
    nominal quota, in GPU units: it borrows, and its jobs may be reclaimed."""
    return member_borrows(book, job.cohort[1])


def kept_by_cohort(book, job: Job) -> str:
    """Why a cohort ``job`` counts in keeps lower-class jobs on its nodes from being its
    victims (``candidates``' ``kept``), as a reason detail: its team would borrow there
    once it runs (``borrowWithinCohort: Never``), or the victim's team is within its
    nominal quota there (Kueue's guarantee); ``""`` when no such job runs. The first such
    cohort in policy order names it (note 063: a job confined to a pool counts in two)."""
    if not book.rules.cohorts:
        return ""
    nodes = book.nodes_for(job)
    prio = job.cls.priority
    lower = sorted((v for q, jobs in book.evictable.items() if q < prio for v in jobs.values()
                    if any(i in nodes for i, _m in v.alloc)), key=lambda v: v.vkey)
    for cohort, own, takes in _lenders(book, job):
        kept = [m for v in lower if (m := member_in(cohort, v)) is not None and m is not own and m.team not in takes]
        if not kept:
            continue
        if book.quota.usage.get((own.limit, ""), 0) + job.units > own.nominal * GPU_UNITS:
            return (f"{own.team} would borrow beyond its nominal {own.nominal} in cohorts.{cohort.name}: "
                    f"other members' jobs are not preempted to borrow")
        return (f"{kept[0].team} is within its nominal {kept[0].nominal} in cohorts.{cohort.name}: "
                f"a member within its nominal quota keeps its jobs")
    return ""


def comes_of_age(book, v: Job) -> float:
    """When running job ``v`` may first be a victim: ``preemption.min_runtime_s`` after
    its start, and never in the instant it started (no churn: the next second)."""
    t = v.run_start + book.rules.preemption_min_runtime_s
    if v.run_start >= book.now:
        t = max(t, book.now + 1.0)
    return t


def within_team(book, job: Job) -> frozenset:
    """The ``(limit, user)`` keys of ``job``'s charges under limits of teams that let a
    job preempt within the team (note 035), when every hard limit that refuses it now is
    one of them (a limit of another team or a class binding too: no victim inside the
    team could start it); else empty."""
    teams = book.rules.within_team
    if not teams:
        return frozenset()
    quota = book.quota
    limits, usage, current, cohorts = quota.limits, quota.usage, quota.current, quota.cohort_limits
    binding = [i for i, user, a in job.charges if i not in cohorts and usage.get((i, user), 0) + a > current[i]]
    if not binding or any(limits[i].team not in teams for i in binding):
        return frozenset()
    return frozenset((i, user) for i, user, _a in job.charges if limits[i].team in teams)


def candidates(book, job: Job, reclaim: bool, young: bool = False, within: frozenset = frozenset()) -> list[Job]:
    """The jobs that may be evicted for ``job``, in victim order; with ``young`` only
    those that may not be yet (``comes_of_age``); ``within``: also the lower-class jobs
    charged in these ``(limit, user)`` keys (``within_team``)."""
    now = book.now
    prio = job.cls.priority
    out: dict[str, Job] = {}
    lenders = _lenders(book, job) if book.rules.cohorts else []

    def eligible(v: Job) -> bool:
        return (comes_of_age(book, v) > now) == young

    def kept(v: Job) -> bool:  # another member's job, within its nominal quota or the job would borrow
        return any((m := member_in(c, v)) is not None and m is not own and m.team not in takes
                   for c, own, takes in lenders)

    if book.rules.preemption_enabled:
        for q, jobs in book.evictable.items():
            if q < prio:
                for v in jobs.values():
                    if eligible(v) and not kept(v):
                        out[v.id] = v
    if reclaim:
        cohort, member = job.cohort
        borrowing = next((takes for c, _own, takes in lenders if c is cohort), set())
        lower_only = cohort.reclaim == "lower_priority"
        for v in book.running.values():
            if v.id in out or v.state is not JobState.RUNNING or not v.evictable:
                continue
            m = member_in(cohort, v)
            if m is None or m is member or m.team not in borrowing or kept(v):  # kept by another cohort: 302283
                continue
            if lower_only and v.cls.priority >= prio:
                continue
            if eligible(v):
                out[v.id] = v
    if within:
        for q, jobs in book.evictable.items():
            if q < prio:
                for v in jobs.values():
                    if v.id not in out and eligible(v) and any((i, u) in within for i, u, _a in v.run_charges):
                        out[v.id] = v
    return sorted(out.values(), key=lambda v: v.vkey)


def plan(book, admission: Admission, profile: Profile | None, job: Job,
         within: frozenset = frozenset(), why: list | None = None) -> tuple[tuple[list[Job], Verdict] | None, float]:
    """A victim set for ``job`` and the admission verdict it then gets (``None``: no set
    works), and, on a failure, the instant a too-young job comes of age that would make
    a set work (``INF``: none would). ``within``: as ``candidates``. ``why``: a list the
    refusals of the job once victims are gone are appended to (the reason's source)."""
    reclaim = may_reclaim(book, job)
    cands = candidates(book, job, reclaim, within=within)
    found = _plan_with(book, admission, profile, job, cands, why) if cands else None
    if found is not None:
        return found, INF
    young = candidates(book, job, reclaim, young=True, within=within)
    if not young:
        return None, INF
    # would it work once the young ones come of age? then that is when to look again
    if _plan_with(book, admission, profile, job, sorted(cands + young, key=lambda v: v.vkey), why) is None:
        return None, INF
    return None, min(comes_of_age(book, v) for v in young)


def share_plan(book, admission: Admission, profile: Profile | None, job: Job, why: list | None = None
               ) -> tuple[tuple[list[Job], Verdict] | None, float]:
    """For a share (not MIG) no card or free GPU takes (rule 5): the fewest lower-priority
    shares to evict on the one card where it then fits, and the verdict it then gets
    (``None``: no card works); on a failure, the instant a too-young share comes of age
    that would make a set work (``INF``: none would). Note 042. ``why``: as ``plan``'s
    (the refusals of the cards tried, cheapest first).

    The candidates are ``candidates``' (class preemption) that hold a shared card. Per
    card of a node the job may use, a minimal set of its candidates after whom the job
    fits the card (``card_set``; all of its holders gone: an empty GPU, of any mode);
    the cards by ``_cost`` of their sets (lowest highest victim class, fewest victims,
    least work lost, victim order), then node and GPU; the first whose set the
    admission rule admits the job after wins."""
    if job.share.kind == "mig":
        return None, INF
    cands = [v for v in candidates(book, job, False) if card_of(v) is not None]
    found = _share_plan_with(book, admission, profile, job, cands, why) if cands else None
    if found is not None:
        return found, INF
    young = [v for v in candidates(book, job, False, young=True) if card_of(v) is not None]
    # the first instant a young share comes of age after which a set works (the set the
    # plan with every young share would pick may come of age later than another card's:
    # oracle seed 5099)
    for t in sorted({comes_of_age(book, v) for v in young}):
        ready = sorted(cands + [v for v in young if comes_of_age(book, v) <= t], key=lambda v: v.vkey)
        if _share_plan_with(book, admission, profile, job, ready, why) is not None:
            return None, t
    return None, INF


def _share_plan_with(book, admission: Admission, profile: Profile | None, job: Job,
                     cands: list[Job], why: list | None = None) -> tuple[list[Job], Verdict] | None:
    ledger = book.ledger
    nodes = set(members_of(ledger, book.groups_for(job)))
    on_card: dict[tuple[int, int], list[Job]] = {}
    for v in cands:
        where = card_of(v)
        if where[0] in nodes:
            on_card.setdefault(where, []).append(v)
    options = []
    for (n, g), vs in sorted(on_card.items()):
        slot = ledger.slots[n]
        card = slot.cards.get(g)
        if card is not None and slot.healthy_mask >> g & 1:
            chosen = card_set(card, slot.node, job.share, vs)
            if chosen is not None:
                options.append((_cost(chosen, book.now), n, g, chosen))
    for _key, n, g, chosen in sorted(options, key=lambda o: o[:3]):
        verdict = admission.decide(job, profile, Scratch(book, chosen))
        if verdict.admitted and not verdict.spot[3]:
            # joining the card: its other holders planned to leave before the victims
            # (signalled, or their planned end first) leave it empty - the job then opens
            # its GPU as a fresh one, which must be admitted too (other classes'
            # reserved_gpus, claims; seeds 158351, 181884)
            gone = max(book.now + v.stop_grace for v in chosen)
            first = [book.jobs[h] for h in sorted(ledger.slots[n].cards[g].holders)
                     if all(v.id != h for v in chosen) and book.jobs[h].end_est <= gone]
            if first:
                after = admission.decide(job, profile, Scratch(book, chosen + first))
                if not after.admitted:
                    _refused(why, after)
                    continue
        _refused(why, verdict)
        if verdict.admitted and not breaks_holds(book, profile, job, chosen, verdict):
            return sorted(chosen, key=lambda v: v.vkey), verdict
    return None


def _refused(why: list | None, verdict: Verdict) -> None:
    """Keep a refusal other than capacity (rule 5) in ``why``: what keeps the job out
    once its victims would be gone."""
    if why is not None and not verdict.admitted and verdict.rule != FREE:
        why.append(verdict)


def breaks_holds(book, profile: Profile | None, job: Job, victims: list[Job], verdict: Verdict) -> bool:
    """Whether evicting ``victims`` for ``job`` (which then holds what ``verdict`` places)
    breaks the class-hold condition of another preemptor's hold in ``profile``: victims
    of a class with ``reserved_gpus`` leave it covering less, which that hold's start
    must then leave free too (seed 158599: a share evicted a batch job to join its card,
    and production inference's hold, planned while the batch job covered batch's
    reservation, could no longer start when its own victims were gone)."""
    if not book.reserved or not profile or not any(v.cls.name in book.reserved for v in victims):
        return False
    holds = [c for c in profile.claims if c.hold and c.job_id != job.id]
    others = [c for c in holds if c.gslack is not None and c.gslack >= 0]
    if not others:
        return False
    gone = frozenset(vid for c in holds for vid in book.jobs[c.job_id].victims) | {v.id for v in victims}
    coming = freed_count(book.ledger, [book.jobs[vid] for vid in sorted(gone)])
    mine = sum(c for _n, c in verdict.counts) if verdict.spot is None else int(verdict.spot[3])
    spare = book.ledger.free_total + coming - sum(sum(c.gpus.values()) for c in holds) - mine
    return any(spare - -(-held_for(book, c.cls, book.now, (), gone) // GPU_UNITS) < 0 for c in others)


def card_set(card, node, share, victims: list[Job]) -> list[Job] | None:
    """A minimal set of ``victims`` (holders of ``card``) after whom ``share`` fits the
    card - joining it (same mode), or all holders gone, as an empty GPU of ``node`` - or
    ``None`` (none does, or it fits without any): the victims taken lowest class first,
    then biggest share first (time-slice replicas, else milli-GPU, then memory: the fewest
    victims where one dimension binds), then in victim order, until it fits; then those
    not needed dropped, the last taken first."""
    holders = card.holders
    need = share.need(node)

    def fits(gone: list[Job]) -> bool:
        if len(gone) == len(holders):
            return share_fits_card(node, share)
        if card.mode != share.kind:
            return False
        back = [holders[v.id] for v in gone]
        return (card.milli - sum(b[0] for b in back) + need[0] <= FULL_MILLI
                and card.mem - sum(b[1] for b in back) + need[1] <= card.cap_mem
                and (not card.cap_slots or card.slots - sum(b[2] for b in back) + need[2] <= card.cap_slots))

    if fits([]):
        return None
    out: list[Job] = []
    ts = card.mode == "time_slice"
    # the lowest class first, then the biggest share (fewest victims), then victim order
    for v in sorted(victims, key=lambda v: (v.cls.priority, -holders[v.id][2 if ts else 0], -holders[v.id][1],
                                            v.vkey)):
        out.append(v)
        if fits(out):
            break
    else:
        return None
    for v in reversed(out[:-1]):  # minimal: drop a victim whose share is not needed
        rest = [x for x in out if x is not v]
        if fits(rest):
            out = rest
    return out


def _plan_with(book, admission: Admission, profile: Profile | None, job: Job,
               cands: list[Job], why: list | None = None) -> tuple[list[Job], Verdict] | None:
    """Steps 1-4 of the module docstring with ``cands`` as the possible victims."""
    ledger = book.ledger
    nodes = [i for i in members_of(ledger, book.groups_for(job))]
    end = book.now + job.planned_run()
    # necessary: the job's GPUs fit once every candidate is gone (claims aside)
    gain: dict[int, int] = {}
    for idx, m, _end in freed_parts(ledger, cands):
        gain[idx] = gain.get(idx, 0) + m.bit_count()
    totals = {i: ledger.slots[i].healthy for i in nodes}
    upper = {i: ledger.slots[i].free + gain.get(i, 0) for i in nodes}
    if place_counts(upper, nodes, totals, job.shape) is None:
        return None
    chosen = _node_plan(book, admission, profile, job, nodes, cands, end)
    if chosen is None:
        return None
    order = {v.id: k for k, v in enumerate(cands)}
    verdict = admission.decide(job, profile, Scratch(book, chosen))
    pool = [v for v in cands if v not in chosen]
    while not verdict.admitted and pool:
        chosen.append(pool.pop(0))
        verdict = admission.decide(job, profile, Scratch(book, chosen))
    if not verdict.admitted:
        _refused(why, verdict)
        return None
    for v in sorted(chosen, key=lambda v: order[v.id], reverse=True):
        if len(chosen) == 1:
            break
        rest = [x for x in chosen if x is not v]
        trial = admission.decide(job, profile, Scratch(book, rest))
        if trial.admitted:
            chosen, verdict = rest, trial
    if breaks_holds(book, profile, job, chosen, verdict):
        return None
    return sorted(chosen, key=lambda v: v.vkey), verdict


def _cost(victims: list[Job], now: float) -> tuple:
    if not victims:
        return (-1, 0, 0.0, ())
    lost = sum(0.0 if v.checkpointable else (now - v.run_start) * v.gpus for v in victims)
    return (max(v.cls.priority for v in victims), len(victims), lost, tuple(sorted(v.vkey for v in victims)))


def _pieces(book, job: Job, nodes: list[int]) -> list[int]:
    """The pieces the job is placed in: per piece, GPUs on one node."""
    shape = job.shape
    if shape.mode == "single":
        return [shape.k]
    if shape.mode == "pods":
        return [shape.per_pod] * shape.pods
    size = max(book.ledger.slots[i].healthy for i in nodes)  # >= 1: _plan_with placed the job there (note 072)
    whole, rest = divmod(shape.k, size)
    return [size] * whole + ([rest] if rest else [])


def _node_plan(book, admission: Admission, profile: Profile | None, job: Job, nodes: list[int],
               cands: list[Job], end: float) -> list[Job] | None:
    """Step 1: per piece, the cheapest node and its minimal victim set."""
    ledger = book.ledger
    now = book.now
    on_node: dict[int, list[Job]] = {}
    for v in cands:
        for idx, _mask in v.alloc:
            on_node.setdefault(idx, []).append(v)
    cand_ids = {v.id for v in cands}
    room = {}
    for n in nodes:
        room[n] = admission._cap(job, profile, n, end, None) if profile else ledger.slots[n].free
    chosen: dict[str, Job] = {}
    used: set[int] = set()
    distinct = job.shape.mode == "multi"
    k_island = job.shape.k if job.shape.mode == "single" else 0
    for need in _pieces(book, job, nodes):
        best = None
        for n in nodes:
            if distinct and n in used:
                continue
            units = _units(n, on_node.get(n, ()), cand_ids, chosen, ledger)
            vs = _minimal_on(n, need, room, units, chosen)
            if vs is None:
                continue
            options = [(vs, 0)]
            if k_island > 1 and ledger.slots[n].node.nvlink_islands:
                if not fits_island(_freed_mask(n, vs, ledger), k_island, ledger.slots[n].node.nvlink_islands):
                    # a set that keeps it on one island: the only one when it must (note 037)
                    alt = _island_set(n, need, room, units, chosen, ledger)
                    options = [] if job.shape.island else [(vs, 1)]
                    if alt is not None:
                        options.append((alt, 0))
            for vs, island in options:
                cost = _cost(vs, now)
                key = (cost[:3], island, cost[3], n)  # at equal cost one island first, then victim order
                if best is None or key < best[0]:
                    best = (key, n, vs)
        if best is None:
            return None
        _key, n, vs = best
        before = freed_masks(ledger, list(chosen.values()))
        for v in vs:
            chosen[v.id] = v
        after = freed_masks(ledger, list(chosen.values()))
        for idx, m in after.items():  # what the piece's victims free, on every node
            if idx in room:
                room[idx] += m.bit_count() - before.get(idx, 0).bit_count()
        room[n] -= need
        used.add(n)
    return list(chosen.values())


def _units(n: int, victims, cand_ids: set[str], chosen: dict[str, Job], ledger) -> list[tuple]:
    """The ways to free GPUs on node ``n`` by evicting: ``(victims, GPUs freed there)``
    per unit - a whole-GPU victim alone, or a shared card in service with every one of
    its holders (all candidates: a card with one holder kept frees nothing; note 042).
    Units already freed by ``chosen`` are left out. In order: the lowest highest victim
    class, the fewest victims not chosen yet, then the victim order - for whole-GPU
    victims alone, the victim order itself."""
    slot = ledger.slots[n]
    out = []
    for v in victims:
        if v.share is None and v.id not in chosen:
            out.append(((v,), _on(v, n, ledger)))
    by_id = {v.id: v for v in victims}
    for g in sorted(slot.cards):
        holders = slot.cards[g].holders
        if not slot.healthy_mask >> g & 1 or not all(h in cand_ids and h in by_id for h in holders):
            continue
        if all(h in chosen for h in holders):
            continue
        out.append((tuple(sorted((by_id[h] for h in holders), key=lambda v: v.vkey)), 1))

    def key(unit):
        vs = unit[0]
        return (max(v.cls.priority for v in vs), sum(1 for v in vs if v.id not in chosen),
                tuple(v.vkey for v in vs))
    return sorted(out, key=key)


def _minimal_on(n: int, need: int, room: dict[int, int], units: list[tuple], chosen: dict[str, Job]
                ) -> list[Job] | None:
    """The fewest victims on node ``n`` that leave ``need`` GPUs there, given its room
    now and what already chosen victims free: ``units`` (``_units``) in order until
    they do, then those not needed dropped, the last added first."""
    have = room[n]
    if have >= need:
        return []
    plan: list[tuple] = []
    for u in units:
        plan.append(u)
        have += u[1]
        if have >= need:
            break
    else:
        return None
    for u in reversed(plan[:-1]):  # minimal: drop a unit whose GPUs are not needed
        if have - u[1] >= need:
            plan.remove(u)
            have -= u[1]
    return [v for u in plan for v in u[0] if v.id not in chosen]


def _freed_mask(n: int, vs, ledger) -> int:
    """The free GPUs of node ``n`` once the victims ``vs`` are gone, as a mask."""
    return ledger.slots[n].free_mask | freed_masks(ledger, vs).get(n, 0)


def _island_set(n: int, need: int, room: dict[int, int], units: list[tuple], chosen: dict[str, Job], ledger
                ) -> list[Job] | None:
    """A victim set on node ``n`` after which ``need`` GPUs fit one NVLink island: the
    ``units`` in order until they do, then, in reverse order, those not needed for
    it dropped; ``None``: no set does (note 037)."""
    islands = ledger.slots[n].node.nvlink_islands

    def victims(us):
        return [v for u in us for v in u[0] if v.id not in chosen]

    out: list[tuple] = []
    have = room[n]
    ok = False
    for u in units:
        out.append(u)
        have += u[1]
        if have >= need and fits_island(_freed_mask(n, victims(out), ledger), need, islands):
            ok = True
            break
    if not ok:
        return None
    for u in reversed(out[:-1]):
        rest = [x for x in out if x is not u]
        if have - u[1] >= need and fits_island(_freed_mask(n, victims(rest), ledger), need, islands):
            out = rest
            have -= u[1]
    return victims(out)


def _on(v: Job, n: int, ledger) -> int:
    for idx, mask in v.alloc:
        if idx == n:
            return (mask & ledger.slots[idx].healthy_mask).bit_count()
    return 0
