"""When can a job start: walks over the time profile (Slurm's backfill map; design note
015, section 2).

``earliest_start`` is the earliest instant (>= now) at which a job fits its nodes for its
whole planned run, given running jobs' planned ends and a profile's claims, with its
quota and other classes' reserved GPUs; the pass reserves it, the estimates plan with it.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from heapq import merge
from itertools import islice

from gpushepherd.core.placement import Counts, best_fit_island, members_of, place_counts
from gpushepherd.core.profile import Claim, Key, Profile, class_slack
from gpushepherd.core.releases import free_mask_at, gpus_free_at, node_releases, release_time
from gpushepherd.core.state import INF, Job
from gpushepherd.model.job import GPU_UNITS


def earliest_start(book, profile: Profile, job: Job, nodes: list[int], totals: dict[int, int],
                   check_quota: bool = True, free_out: dict[int, int] | None = None) -> tuple[float, Counts] | None:
    """The earliest instant (>= now) at which ``job`` fits ``nodes`` for its whole planned
    run, given running jobs' planned ends and the profile's claims, with its quota
    (``check_quota``); ``(start, counts)`` or ``None`` when no instant can be planned.

    Candidate instants are now, each planned end on the nodes and each claim's end (free
    GPUs only grow between them). At an instant ``t`` a node offers the least it has free
    over ``[t, t + planned run)``: that is at ``t`` or at a claim's start inside. Without
    claims on the nodes the walk is incremental: only nodes whose GPUs come free are
    looked at, and the exact placement runs when a cheap necessary condition holds."""
    run = job.planned_run()
    node_set = totals.keys()  # ``totals`` is keyed by ``nodes``: no set built per reservation
    gclaims = [c for c in profile.claims if not node_set.isdisjoint(c.gpus)]
    qkeys = {(i, user) for i, user, _a in job.charges} if check_quota else set()
    qclaims = list(profile.claims)
    island = _on_islands(book, job)
    if gclaims or island:  # an island's GPUs, not only their number: every instant checked
        found = _walk_claims(book, job, nodes, totals, gclaims, run)
    else:
        found = _walk_free(book, job, nodes, totals, free_out)
    if found is None or not (qkeys or _holds_for_others(book, job)):
        return found
    if free_out is not None:
        free_out.clear()  # the start may move: the walk's counts no longer apply
    t, counts = found
    t_q = quota_start(book, job, qclaims, t, run)
    if t_q is None:
        return None
    if t_q == t:
        return found
    if gclaims or island:  # availability is not monotone under claims: place again from there
        later = _walk_claims(book, job, nodes, totals, gclaims, run, t_min=t_q)
        if later is None:
            return None
        if later[0] == t_q:
            return later
        return earliest_start_from(book, profile, job, nodes, totals, later[0])
    return t_q, _place_at(book, job, nodes, totals, t_q)


def reservation_for(book, profile: Profile, job: Job) -> tuple[float, Counts, dict[int, int]] | None:
    """The reservation a pass gives ``job`` against ``profile``'s claims: ``(start s,
    [(node index, GPUs)], {node index: GPUs free at start})``, the last possibly empty,
    or ``None`` (a share, or no start can be planned). Nodes the job's class avoids now are its too once the
    jobs it avoids there are planned to be gone (a start there may come sooner)."""
    if job.shape.mode == "share":
        return None  # shares wait for a card; they hold no reservation
    nodes, totals = book.nodes_and_totals(job)
    free_at: dict[int, int] = {}
    found = earliest_start(book, profile, job, nodes, totals, free_out=free_at)
    avoided = book.avoided_nodes(job) if book.anti and job.cls.avoid else frozenset()
    if avoided:
        clear = book.avoidance_end(job, avoided)
        if clear < INF and (found is None or clear < found[0]):
            every = members_of(book.ledger, book.groups_for(job))
            later = earliest_start_from(book, profile, job, every,
                                        {i: book.ledger.slots[i].healthy for i in every}, clear)
            if later is not None and (found is None or later[0] < found[0]):
                found, free_at = later, {}
    if found is None:
        return None
    return found[0], found[1], free_at


def earliest_start_from(book, profile, job, nodes, totals, t_min: float):
    """``earliest_start`` no earlier than ``t_min`` (GPUs and quota alternately, until
    both hold at one instant)."""
    run = job.planned_run()
    node_set = totals.keys()
    gclaims = [c for c in profile.claims if not node_set.isdisjoint(c.gpus)]
    qclaims = list(profile.claims)
    for _ in range(64):
        found = _walk_claims(book, job, nodes, totals, gclaims, run, t_min=t_min)
        if found is None:
            return None
        t_q = quota_start(book, job, qclaims, found[0], run)
        if t_q is None:
            return None
        if t_q == found[0]:
            return found
        t_min = t_q
    return None  # pragma: no cover - claims alternate more than 64 times


def _place_at(book, job: Job, nodes: list[int], totals: dict[int, int], t: float) -> Counts | None:
    avail = {n: gpus_free_at(book, n, t) for n in nodes}
    return _place_counts(book, job, avail, nodes, totals, t)


def _on_islands(book, job: Job) -> bool:
    """Whether the job must fit one NVLink island and some node it may use declares
    islands (elsewhere every node is one island: counts decide)."""
    return job.shape.island and book.on_islands(job)


def _place_counts(book, job: Job, avail: dict[int, int], nodes: list[int], totals: dict[int, int],
                  t: float) -> Counts | None:
    """``place_counts`` at instant ``t``; a job that requires one NVLink island only on a
    node where ``k`` of the GPUs free at ``t`` by planned ends fit one (note 037: the
    claims are counts, so an island is read from the planned ends alone)."""
    if not _on_islands(book, job):
        return place_counts(avail, nodes, totals, job.shape)
    masks = {n: free_mask_at(book, n, t) for n in nodes if avail.get(n, 0) >= job.shape.k}
    return best_fit_island(avail, list(masks), job.shape.k, book.ledger.slots, masks)


def _walk_free(book, job: Job, nodes: list[int], totals: dict[int, int],
               free_out: dict[int, int] | None = None) -> tuple[float, Counts] | None:
    """The earliest instant by planned ends alone (no claims on these nodes): the walk
    over planned ends touches only the nodes whose GPUs come free, and runs the exact
    placement when a cheap necessary condition (``_Gate``) holds."""
    ledger = book.ledger
    slots = ledger.slots
    node_set = totals.keys()  # (keyed by ``nodes``)
    changed: dict[int, int] = {}

    def full() -> dict[int, int]:
        avail = {n: slots[n].free for n in nodes}
        avail.update(changed)
        return avail

    shape = job.shape
    if shape.mode == "single":
        return book.release_index.single_start(book, node_set, shape.k, free_out)
    groups = book.groups_for(job)
    if shape.mode == "multi" and not book.reference:  # (the reference pass walks: the oracle holds the two equal)
        top = _plain_size(ledger, groups)
        if top:  # read from the release index, no walk (note 059)
            whole, rest = divmod(shape.k, top)
            return book.release_index.multi_start(book, node_set, whole, top, rest, free_out)
    if not any(totals.values()):  # no GPU in service on any node: none comes free either (note 072)
        return None
    single = False
    gate = _Gate.of(shape, ledger, groups, nodes, totals)
    if gate.maybe():
        if single:
            idx = ledger.best_fit(book.groups_for(job), shape.k)
            if idx is not None:
                if free_out is not None:
                    free_out[idx] = slots[idx].free
                return book.now, [(idx, shape.k)]
        else:
            counts = place_counts(full(), nodes, totals, shape)
            if counts is not None:
                return book.now, counts
    k = shape.k
    ends = book.ends
    jobs = book.jobs
    # a multi-node job on nodes of one size: the gate's test and update written out here
    # (whole nodes free and the most free on one node; the walk's inner loop, note 052)
    inline = gate.homog and shape.mode == "multi"
    need_whole, rest = divmod(k, gate.top) if inline else (0, 0)  # (inline: gate.top > 0, note 072)
    whole, biggest = gate.whole, gate.biggest
    i, n_ends = 0, len(ends)
    if inline and n_ends > _SKIP_FROM and not any(slots[n].cards for n in nodes):
        i, whole, biggest = _skip_to_bound(book, nodes, totals, changed, need_whole, gate.top, rest, whole, biggest)
        if i is None:
            return None
    while i < n_ends:
        end_t = ends[i][0]
        if end_t == INF:
            return None
        touched = False
        while i < n_ends and ends[i][0] == end_t:  # every job that ends at this instant
            holder = jobs[ends[i][2]]
            i += 1
            for idx, mask in holder.alloc:
                if idx in node_set:
                    got = (mask & slots[idx].healthy_mask).bit_count() if mask else _freed_whole(
                        book, holder, idx, mask, end_t)
                    if got:
                        before = changed.get(idx, slots[idx].free)
                        after = before + got
                        if inline:  # _Gate.update
                            b = before if before > 0 else 0
                            a = after if after > 0 else 0
                            if b < totals[idx] <= a:
                                whole += 1
                            if a > biggest:
                                biggest = a
                        else:
                            gate.update(before, after, totals[idx])
                        changed[idx] = after
                        touched = True
        if touched and (whole >= need_whole and (rest == 0 or biggest >= rest) if inline else gate.maybe()):
            if single:
                # no node had k free before (else found above): the best fit is among
                # the nodes whose GPUs came free
                best = min(((f, n) for n, f in changed.items() if f >= k), default=None)
                if best is not None:
                    if free_out is not None:
                        free_out[best[1]] = best[0]
                    return max(end_t, book.now), [(best[1], k)]
                continue
            avail = full()
            counts = place_counts(avail, nodes, totals, shape)
            if counts is not None:
                if free_out is not None:
                    free_out.update((n, avail[n]) for n, _c in counts)
                return max(end_t, book.now), counts
    return None


def _plain_size(ledger, groups: list[int]) -> int:
    """The GPUs of every node of ``groups`` when they are all of one size, fully healthy,
    without MIG and without shared cards (a node's release times then count its whole
    GPUs free, as the walk does); else 0."""
    top = 0
    for g in groups:
        grp = ledger.groups[g]
        if (top and grp.gpus != top) or grp.node.mig or grp.healthy_sum != len(grp.members) * grp.gpus or any(
                grp.open.values()):
            return 0
        top = grp.gpus
    return top


#: planned ends past which a multi-node walk first looks for where its gate can hold
_SKIP_FROM = 64


def _skip_to_bound(book, nodes: list[int], totals: dict[int, int], changed: dict[int, int], need_whole: int,
                   top: int, rest: int, whole: int, biggest: int) -> tuple[int | None, int, int]:
    """Where ``_walk_free``'s walk of a multi-node job on nodes of ``top`` GPUs (no shared
    cards on them) may start: the first planned end at or after the instant its nodes
    can first hold it (``ReleaseIndex.whole_bound``; before it the placement fails,
    whatever the gate says), with ``changed`` and the gate's counts as the walk would
    have them there - each node's GPUs released before it, from its release times.
    ``(None, ..)``: no instant can ever hold it."""
    bound = book.release_index.whole_bound(book, totals.keys(), need_whole, top, rest)
    if bound == INF:
        return None, whole, biggest
    ends = book.ends
    i = bisect_left(ends, (bound,))
    if i < _SKIP_FROM:
        return 0, whole, biggest
    slots = book.ledger.slots
    keys = book.release_index.keys  # each node's finite release times, current after ``whole_bound``
    for n in nodes:
        got = bisect_left(keys.get(n, ()), bound)  # free now (-INF) and released before it
        if got != slots[n].free:
            changed[n] = got
    # the gate's counts as its updates along the walk leave them: a node whole once, the most on one node
    whole += sum(1 for n, got in changed.items() if max(slots[n].free, 0) < totals[n] <= max(got, 0))
    return i, whole, max(biggest, *changed.values()) if changed else biggest


def _freed_whole(book, holder: Job, idx: int, mask: int, t: float) -> int:
    """Whole GPUs of node ``idx`` that ``holder`` leaving at ``t`` frees: its own GPUs in
    service, or for a share the card once its last holder is planned to leave."""
    slot = book.ledger.slots[idx]
    if mask:
        return (mask & slot.healthy_mask).bit_count()
    if len(holder.share_at) == 1:
        g = holder.share_at[0]
        if slot.healthy_mask >> g & 1 and release_time(book, idx, g) <= max(t, book.now):
            card = slot.cards.get(g)
            last = max(card.holders, key=lambda j: (book.jobs[j].end_est, book.jobs[j].seq)) if card else None
            return 1 if last == holder.id else 0
    return 0


def _walk_claims(book, job: Job, nodes: list[int], totals: dict[int, int], claims: list[Claim], run: float,
                 t_min: float | None = None) -> tuple[float, Counts] | None:
    """The earliest instant with claims on the nodes: every candidate instant checked.

    At a candidate ``t`` a node offers the least it has free at ``t`` and at each claim's
    start inside ``[t, t + run)``. A node no claim touches only gains GPUs over time, so
    that least is what it has free at ``t``: kept up to date as ``t`` passes its release
    times (a merged sweep); only the nodes of claims are probed, each probe worked out
    once (note 015, "The release index and the walk's cost")."""
    now = book.now
    # planned release times (cached per node; a time before now counts as now: only
    # counts at instants >= now are read)
    releases = {n: node_releases(book, n) for n in nodes}
    on: dict[int, list[Claim]] = {}
    for c in claims:
        for n in c.gpus.keys() | c.need_now.keys():
            on.setdefault(n, []).append(c)
    claimed = [n for n in nodes if n in on]
    times = {now}
    for rel in releases.values():
        times.update(t for t in rel if now < t < INF)
    times.update(c.end for c in claims if c.end != INF)
    lo = now if t_min is None else max(now, t_min)
    times.add(lo)
    starts = sorted({c.start for c in claims})
    # the probes that can lower a claimed node's least: between its own claims' starts
    # and its holds' exits it only gains GPUs (releases, claim ends), so of the probes
    # (t and every claim's start in the window) only its own starts and the first probe
    # after each of its exits can be lower than what comes before them
    dips: dict[int, list[float]] = {}
    for n, cs in on.items():
        pts = {c.start for c in cs}
        for c in cs:
            e = c.exits.get(n) if c.hold else None
            if e is not None:
                j = bisect_left(starts, e)
                if j < len(starts):
                    pts.add(starts[j])
        dips[n] = sorted(pts)
    # the nodes no claim touches: free GPUs at t, advanced through their release times
    sweep = sorted((t, n) for n in nodes if n not in on for t in releases[n] if t < INF)
    avail = {n: 0 for n in nodes}
    total = 0
    i = 0
    memo: dict[tuple[int, float], int] = {}
    need = job.shape.k

    def free(n: int, q: float) -> int:
        v = memo.get((n, q))
        if v is None:
            v = memo[n, q] = bisect_right(releases[n], q) - sum(c.gpus_at(n, q) for c in on[n] if c.start <= q < c.end)
        return v

    for t in sorted(times):
        while i < len(sweep) and sweep[i][0] <= t:
            avail[sweep[i][1]] += 1
            total += 1
            i += 1
        if t < lo:
            continue
        end = t + run
        here = total
        for n in claimed:
            least = free(n, t)
            for q in dips[n]:
                if q >= end:
                    break
                if q > t:
                    v = free(n, q)
                    if v < least:
                        least = v
            least = max(0, least)
            avail[n] = least
            here += least
        if here < need:
            continue  # fewer GPUs than it needs, wherever they are
        counts = _place_counts(book, job, avail, nodes, totals, t)
        if counts is not None:
            return t, counts
    return None


def _holds_for_others(book, job: Job) -> bool:
    return bool(book.reserved) and any(c != job.cls.name for c in book.reserved) and job.shape.mode != "share"


def quota_start(book, job: Job, claims: list[Claim], t0: float, run: float) -> float | None:
    """The earliest instant >= ``t0`` from which the job's counted constraints hold for
    its planned run: its quota (usage by planned ends, plus claims active, plus its own
    charges, within each limit's value now) and other classes' ``reserved_gpus`` (the
    GPUs free then, less the claims, leave them free). ``None`` when never.

    The candidate instants (``t0``, each planned end and each claim's end after it) are
    walked in order, lazily: the first that holds is the answer, so a job its quota
    allows at ``t0`` costs no walk over every running job's end; what running jobs give
    back by an instant is summed over the jobs charged to the key only
    (``Book.ends_by_key``, note 046)."""
    quota = book.quota
    keys = {(i, user): a for i, user, a in job.charges}
    hold = _holds_for_others(book, job)
    released = book.ends_by_key.released
    for t in _instants(book, claims, t0):
        end = t + run
        probes = [t] + [c.start for c in claims if t < c.start < end]
        ok = True
        for q in probes:
            for k, a in keys.items():
                used = quota.usage.get(k, 0) - released(book.jobs, k, q)
                extra = sum(c.quota_at(k, q) for c in claims if c.start <= q < c.end)
                if used + extra + a > quota.current[k[0]]:
                    ok = False
                    break
            if ok and hold and not _class_hold_ok(book, job, q, claims):
                ok = False
            if not ok:
                break
        if ok:
            return t
    return None


def _instants(book, claims: list[Claim], t0: float):
    """``t0``, then the distinct finite planned ends and claim ends after it, ascending
    (``sorted({t0} | ends | claim ends)``, generated as asked)."""
    yield t0
    ends = book.ends
    i = bisect_right(ends, (t0, INF, ""))
    later = merge((e for e, _s, _j in islice(ends, i, None)),
                  sorted(c.end for c in claims if c.end > t0 and c.end != INF))
    last = t0
    for t in later:
        if t == INF:
            return
        if t != last:
            last = t
            yield t


def _class_hold_ok(book, job: Job, q: float, claims: list[Claim]) -> bool:
    """Whether at ``q`` (by planned ends) the free GPUs, less the claims active then and
    the job's own, still cover what other classes' ``reserved_gpus`` keep free."""
    return class_slack(book, job.cls.name, q, claims) * GPU_UNITS >= job.units



class _Gate:
    """A cheap necessary condition for ``place_counts`` to succeed, kept up to date as
    GPUs come free during a walk, so the exact placement runs only when it may."""

    __slots__ = ("shape", "whole", "biggest", "top", "homog", "sum", "slots")

    @classmethod
    def of(cls, shape, ledger, groups: list[int], nodes: list[int], totals: dict[int, int]) -> "_Gate":
        """The gate from the ledger's free-count buckets when the job's groups are of one
        size (not 0) and fully healthy (no walk over the nodes; the buckets may count nodes the job
        avoids, which only weakens a necessary condition), else from the nodes."""
        sizes = {ledger.groups[g].gpus for g in groups}
        if len(sizes) == 1 and 0 not in sizes and all(
                ledger.groups[g].healthy_sum == len(ledger.groups[g].members) * ledger.groups[g].gpus for g in groups):
            gate = cls.__new__(cls)
            gate.shape = shape
            gate.top = sizes.pop()
            gate.homog = True
            gate.sum = ledger.free_in(groups)
            gate.biggest = ledger.max_free_node(groups)
            gate.whole = sum(len(ledger.groups[g].buckets[ledger.groups[g].gpus]) for g in groups)
            per = shape.per_pod
            gate.slots = sum(len(b) * (f // per) for g in groups for f, b in enumerate(ledger.groups[g].buckets))
            return gate
        return cls(shape, {n: ledger.slots[n].free for n in nodes}, totals)

    def __init__(self, shape, avail: dict[int, int], totals: dict[int, int]):
        self.shape = shape
        sizes = set(totals.values())
        self.top = max(sizes, default=0)
        # whole nodes plus a remainder only on nodes of one size that have GPUs in service;
        # mixed sizes, or none in service (unhealthy, MIG-only; note 072): only the total
        self.homog = len(sizes) == 1 and self.top > 0
        self.sum = sum(max(0, v) for v in avail.values())
        self.biggest = max(avail.values(), default=0)
        self.whole = sum(1 for n, v in avail.items() if v > 0 and v >= totals[n])
        per = shape.per_pod
        self.slots = sum(max(0, v) // per for v in avail.values())

    def update(self, before: int, after: int, healthy: int) -> None:
        if before < 0:
            before = 0
        if after < 0:
            after = 0
        per = self.shape.per_pod
        self.slots += after // per - before // per
        if before < healthy <= after:
            self.whole += 1
        self.sum += after - before
        if after > self.biggest:
            self.biggest = after

    def maybe(self) -> bool:
        shape = self.shape
        if shape.mode == "single":
            return self.biggest >= shape.k
        if shape.mode == "pods":
            return self.slots >= shape.pods
        if not self.homog:  # mixed node sizes or none in service: only the total is a safe test
            return self.sum >= shape.k
        need_whole, rest = divmod(shape.k, self.top)
        return self.whole >= need_whole and (rest == 0 or self.biggest >= rest)
