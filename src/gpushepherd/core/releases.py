"""When each whole GPU is planned to be free, per node, and an index over the nodes by
that time for single-node reservations (design note 015, section 2: the time profile).

``node_releases`` is a node's sorted release times, cached until the node changes
(``Ledger.version``). ``ReleaseIndex`` keeps, for every GPU count ``k``, the nodes sorted
by the time their ``k``-th GPU is planned to be free, kept up to date from the nodes the
ledger touched since it last looked (``Ledger.changes``), so that the earliest start of a
job of ``k`` GPUs on one node reads the first nodes of one list instead of every node
(Slurm's backfill keeps the same per-node end times; its map is per node, ours is sorted).
``release_time``, ``free_mask_at``, ``gpus_free_at`` and ``free_total_at`` read one GPU, one
node or the cluster at a time ``p`` by planned ends, with no claims (``profile.py`` adds them).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort

from gpushepherd.core.placement import Counts
from gpushepherd.core.state import INF


def node_releases(book, n: int) -> list[float]:
    """When each whole GPU of node ``n`` is planned to be free, ascending (``-INF``: free
    now; ``INF``: out of service or held without an end), cached until the node changes
    (``Ledger.version``); a job past its planned end keeps its time (callers clamp)."""
    ledger = book.ledger
    version = ledger.version[n] if n < len(ledger.version) else 0
    found = book.release_cache.get(n)
    if found is not None and found[0] == version:
        return found[1]
    slot = ledger.slots[n]
    rel = []
    if slot.alive:
        for g in range(slot.total):
            if not slot.healthy_mask >> g & 1:
                rel.append(INF)
                continue
            h = slot.holder[g]
            if h is None:
                rel.append(-INF)
                continue
            card = slot.cards.get(g)
            if card is not None:
                rel.append(max((book.jobs[j].end_est for j in card.holders), default=-INF))
            else:
                holder = book.jobs.get(h)
                rel.append(INF if holder is None else holder.end_est)
    rel.sort()
    book.release_cache[n] = (version, rel)
    return rel


class ReleaseIndex:
    """Per GPU count ``k``: ``[(time the k-th GPU is planned to be free, node index)]``,
    ascending, over the nodes where that time is finite. Built on first use, then kept up
    to date from ``Ledger.changes`` (drained: the index is its only reader)."""

    def __init__(self) -> None:
        self.by_k: list[list[tuple[float, int]]] = [[]]  # by_k[k], k >= 1
        self.keys: dict[int, list[float]] = {}  # node -> the times it is indexed under
        self.built = False

    def _refresh(self, book) -> None:
        ledger = book.ledger
        if not self.built or ledger.changes_lost:
            changed = range(len(ledger.slots))
            self.built = True
            ledger.changes_lost = False
        elif ledger.changes:
            changed = sorted(set(ledger.changes))
        else:
            return
        ledger.changes.clear()
        by_k = self.by_k
        for n in changed:
            old = self.keys.get(n, ())
            rel = node_releases(book, n)
            new = [t for t in rel if t != INF]
            if old == new:
                continue
            while len(by_k) <= len(new):
                by_k.append([])
            n_old = len(old)
            for k in range(1, max(n_old, len(new)) + 1):  # only the counts whose time moved
                t_old = old[k - 1] if k <= n_old else None
                t_new = new[k - 1] if k <= len(new) else None
                if t_old == t_new:
                    continue
                lst = by_k[k]
                if t_old is not None:
                    del lst[bisect_left(lst, (t_old, n))]
                if t_new is not None:
                    insort(lst, (t_new, n))
            self.keys[n] = new

    def single_start(self, book, node_set: frozenset[int] | set[int], k: int,
                     free_out: dict[int, int] | None) -> tuple[float, Counts] | None:
        """The earliest instant some node of ``node_set`` has ``k`` GPUs free by planned
        ends, and the best fit then (fewest free, then lowest index); ``None``: never.
        Reads the nodes in the order of their ``k``-th release and stops at the first
        that is later than the best found (a release in the past counts as now)."""
        self._refresh(book)
        if k >= len(self.by_k):
            return None
        now = book.now
        best = None
        for t, n in self.by_k[k]:
            if t < now:
                t = now
            if best is not None and t > best[0]:
                break
            if n not in node_set:
                continue
            free = bisect_right(node_releases(book, n), t)
            if best is None or (t, free, n) < best:
                best = (t, free, n)
        if best is None:
            return None
        if free_out is not None:
            free_out[best[2]] = best[1]
        return best[0], [(best[2], k)]

    def whole_bound(self, book, node_set, whole: int, top: int, rest: int) -> float:
        """The earliest instant at which ``whole`` nodes of ``node_set`` have all ``top``
        of their GPUs free and one has ``rest`` free (``rest`` 0: no such node needed), by
        planned ends (``-INF``: now; ``INF``: never). Before it a multi-node job of
        ``whole * top + rest`` GPUs on nodes of ``top`` GPUs fits nowhere (its whole
        nodes, then its remainder on one more node, note 052)."""
        self._refresh(book)
        bound = self._nth(top, node_set, whole) if whole else -INF
        if rest:
            bound = max(bound, self._nth(rest, node_set, 1))
        return bound

    def multi_start(self, book, node_set, whole: int, top: int, rest: int,
                    free_out: dict[int, int] | None) -> tuple[float, Counts] | None:
        """``planning._walk_free``'s answer for a multi-node job of ``whole * top + rest``
        GPUs on fully healthy nodes of ``top`` whole GPUs without shared cards, read from
        the index instead of walked over planned ends (note 059): ``(start, counts)`` or
        ``None`` (never). The multi rule (``place_counts``: whole free nodes largest first,
        then the tightest remainder node) holds at ``T`` exactly when ``whole`` nodes have
        all ``top`` GPUs free by ``T`` and ``whole + 1`` nodes (those whole ones and one
        more) have ``rest`` free - a count of nodes that only grows with ``T`` - so the
        walk's first success is the later of the ``whole``-th ``top``-th release and the
        ``(whole + 1)``-th ``rest``-th one, and its placement is the rule's on the GPUs
        free at that release (a release in the past starts now, as in the walk)."""
        self._refresh(book)
        by_k = self.by_k
        t_whole = t_rest = -INF
        if whole:
            t_whole = self._nth(top, node_set, whole)
        if rest:
            t_rest = self._nth(rest, node_set, whole + 1)
        t = max(t_whole, t_rest)
        if t == INF:
            return None
        taken = sorted(n for s, n in by_k[top] if s <= t and n in node_set)[:whole] if whole else []
        counts: Counts = [(n, top) for n in taken]
        if free_out is not None:
            free_out.update((n, top) for n in taken)
        if rest:
            keys = self.keys
            best = None
            for s, n in by_k[rest]:
                if s > t:
                    break
                if n in node_set and n not in taken:
                    cand = (bisect_right(keys[n], t), n)
                    if best is None or cand < best:
                        best = cand
            counts.append((best[1], rest))
            if free_out is not None:
                free_out[best[1]] = best[0]
        return max(t, book.now), counts

    def _nth(self, k: int, node_set, m: int) -> float:
        """The ``m``-th earliest time a node of ``node_set`` has ``k`` GPUs free (``INF``:
        fewer than ``m`` nodes ever have)."""
        if k >= len(self.by_k):
            return INF
        seen = 0
        for s, n in self.by_k[k]:
            if n in node_set:
                seen += 1
                if seen == m:
                    return s
        return INF


def release_time(book, n: int, g: int) -> float:
    """When whole GPU ``g`` of node ``n`` is planned to be free (``INF``: not in service,
    a MIG GPU, or held by a job without an end)."""
    slot = book.ledger.slots[n]
    if not slot.alive or not slot.healthy_mask >> g & 1:
        return INF
    h = slot.holder[g]
    if h is None:
        return book.now
    card = slot.cards.get(g)
    if card is not None:
        t = max((book.jobs[j].end_est for j in card.holders), default=book.now)
    elif h in book.jobs:
        t = book.jobs[h].end_est
    else:
        return INF
    return max(t, book.now)


def gpus_free_at(book, n: int, p: float) -> int:
    """Whole GPUs of node ``n`` free at ``p`` by planned ends (no claims)."""
    return free_mask_at(book, n, p).bit_count()


def free_mask_at(book, n: int, p: float) -> int:
    """The whole GPUs of node ``n`` free at ``p`` by planned ends, as a mask (no claims;
    an NVLink island is read from it, note 037)."""
    slot = book.ledger.slots[n]
    if not slot.alive:
        return 0
    if p <= book.now:
        return slot.free_mask
    mask = 0
    for g in range(slot.total):
        if release_time(book, n, g) <= p:
            mask |= 1 << g
    return mask


def free_total_at(book, p: float) -> int:
    """Whole GPUs free at ``p`` on every live node, by planned ends (cards included)."""
    if p <= book.now:
        return book.ledger.free_total
    total = 0
    for slot in book.ledger.slots:
        if slot.alive:
            rel = node_releases(book, slot.idx)
            total += sum(1 for t in rel if t <= p)
    return total
