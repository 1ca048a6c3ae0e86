"""Pending jobs, kept apart from the allocation ledger (as Kueue keeps its queue
manager apart from its scheduler cache).

Jobs are held in *sub-queues* by signature - the job's shape and node filter, class,
quota charges and estimate band (a power of two of the remaining estimate). Jobs of
one sub-queue are interchangeable for a scheduling pass except for their order and
their exact estimate, so a pass looks at sub-queue *heads* in global order (class
priority, submit time, job id) and goes deeper into a sub-queue only when its next job
could do better than the one before it. A pass over 75,000 pending jobs then looks at
a few hundred.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, insort
from collections.abc import Iterator

from gpushepherd.core.state import INF, Job


def estimate_band(estimate: float | None) -> int:
    """``floor(log2(estimate))`` for an estimate in seconds; -1 for none."""
    if estimate is None or estimate == INF:
        return -1
    return int(math.floor(math.log2(max(1.0, estimate))))


def band_floor(band: int) -> float:
    """The shortest estimate of a band (``INF`` for 'no estimate')."""
    return INF if band < 0 else float(2**band)


def _first(pair: tuple) -> tuple:
    return pair[0]


def _key_of(job: Job) -> tuple:
    return job.key


class PendingQueue:
    """Pending jobs by signature.

    Attributes:
        subs: ``{signature: [job, ...]}``, each list sorted by the jobs' order keys.
        heads: ``[(order key of the head job, signature), ...]`` sorted: the global
            order of the sub-queues.
        strict: ``{strict FIFO queue: [(order key, job), ...]}`` ascending, for the
            jobs that wait in one (``Job.strict_q``; admission rule 4, note 031).
    """

    def __init__(self) -> None:
        self.subs: dict[int, list[Job]] = {}
        self._subkeys: dict[int, list[tuple]] = {}
        self._subests: dict[int, list[float]] = {}  # each job's planned run, in queue order
        self._mins: dict[int, tuple[int, list[float]]] = {}  # sig -> (version, block minima)
        self._version: dict[int, int] = {}
        self.heads: list[tuple[tuple, int]] = []
        self.count = 0
        #: strict FIFO queue -> ``[(order key, job), ...]`` ascending (note 031)
        self.strict: dict[tuple, list[tuple[tuple, Job]]] = {}

    def __len__(self) -> int:
        return self.count

    def rekeyed(self) -> None:
        """Put the queue back in order after its jobs' order keys changed (a priority
        recalculation), in place: each sub-queue sorted again (most hold one job: nothing
        to do but note its new key), the heads and strict FIFO queues sorted. Order keys
        are unique (they end with the job id, ``natural_key``), so this is the queue that
        ``add`` of every job gives, in any order (note 046)."""
        subkeys = self._subkeys
        for sig, sub in self.subs.items():
            if len(sub) == 1:
                subkeys[sig][0] = sub[0].key
            else:
                sub.sort(key=_key_of)
                subkeys[sig] = [j.key for j in sub]
                self._subests[sig] = [j.pend_est for j in sub]
        self._mins.clear()
        subs = self.subs
        heads = [(subs[sig][0].key, sig) for _k, sig in self.heads]
        heads.sort()  # in the old order: mostly sorted runs already, which Timsort merges
        self.heads = heads
        for q, fifo in self.strict.items():
            self.strict[q] = sorted([(j.key, j) for _k, j in fifo], key=_first)

    def jobs(self) -> list[Job]:
        """Every pending job, in no particular order (a new list)."""
        return [job for sub in self.subs.values() for job in sub]

    def add(self, job: Job) -> None:
        sig = job.sig
        keys = self._subkeys.get(sig)
        if keys is None:
            self.subs[sig] = [job]
            self._subkeys[sig] = [job.key]
            self._subests[sig] = [job.pend_est]
            insort(self.heads, (job.key, sig))
        else:
            i = bisect_left(keys, job.key)
            if i == 0:
                self._drop_head(keys[0], sig)
                insort(self.heads, (job.key, sig))
            keys.insert(i, job.key)
            self.subs[sig].insert(i, job)
            self._subests[sig].insert(i, job.pend_est)
        self._version[sig] = self._version.get(sig, 0) + 1
        self.count += 1
        if job.strict_q is not None:
            fifo = self.strict.setdefault(job.strict_q, [])
            fifo.insert(bisect_left(fifo, job.key, key=_first), (job.key, job))

    def remove(self, job: Job) -> None:
        sig = job.sig
        keys = self._subkeys[sig]
        sub = self.subs[sig]
        i = bisect_left(keys, job.key)
        while sub[i] is not job:
            i += 1
        del keys[i]
        del sub[i]
        del self._subests[sig][i]
        self._version[sig] = self._version.get(sig, 0) + 1
        if i == 0:
            self._drop_head(job.key, sig)
            if keys:
                insort(self.heads, (keys[0], sig))
            else:
                del self.subs[sig]
                del self._subkeys[sig]
                del self._subests[sig]
                self._mins.pop(sig, None)
        self.count -= 1
        if job.strict_q is not None:
            fifo = self.strict[job.strict_q]
            i = bisect_left(fifo, job.key, key=_first)
            while fifo[i][1] is not job:
                i += 1
            del fifo[i]
            if not fifo:
                del self.strict[job.strict_q]

    def keys_of(self, sig: int) -> list[tuple]:
        """The order keys of sub-queue ``sig``, ascending (a read-only view)."""
        return self._subkeys[sig]

    #: jobs per block of the minima that ``next_shorter`` skips by
    BLOCK = 64

    def next_shorter(self, sig: int, i: int, below: float) -> int | None:
        """The first position after ``i`` in sub-queue ``sig`` whose job's planned run is
        below ``below`` (``None``: none). Exact: blocks whose minimum is not below it
        are skipped (the minima are rebuilt when the sub-queue changed)."""
        ests = self._subests[sig]
        n = len(ests)
        j = i + 1
        block = self.BLOCK
        stop = min(n, (j // block + 1) * block)
        while j < stop:  # the rest of i's block
            if ests[j] < below:
                return j
            j += 1
        if j >= n:
            return None
        version = self._version.get(sig, 0)
        cached = self._mins.get(sig)
        if cached is None or cached[0] != version:
            mins = [min(ests[b:b + block]) for b in range(0, n, block)]
            self._mins[sig] = (version, mins)
        else:
            mins = cached[1]
        for b in range(j // block, len(mins)):
            if mins[b] < below:
                for k in range(b * block, min(n, (b + 1) * block)):
                    if ests[k] < below:
                        return k
        return None

    def _drop_head(self, key: tuple, sig: int) -> None:
        i = bisect_left(self.heads, (key, sig))
        assert self.heads[i] == (key, sig), "sub-queue head missing"
        del self.heads[i]

    def __iter__(self) -> Iterator[Job]:
        """Every pending job in global order. A sort of the sub-queues one after the
        other: each is a sorted run, which Timsort merges (as ``heapq.merge`` would, far
        faster when most sub-queues hold one job)."""
        return iter(sorted(self.jobs(), key=_key_of))

    def iter_from(self, key: tuple) -> Iterator[Job]:
        """The pending jobs whose order key is ``>= key``, in global order, lazily (a
        merge of each sub-queue's tail)."""
        def tail(sig: int):
            sub = self.subs[sig]
            for i in range(bisect_left(self._subkeys[sig], key), len(sub)):
                yield sub[i].key, sub[i]

        return (job for _key, job in heapq.merge(*(tail(sig) for _k, sig in self.heads), key=lambda kj: kj[0]))

    def check(self) -> None:
        """Raise ``AssertionError`` if the sub-queues and heads disagree."""
        assert sorted(self.heads) == self.heads, "heads out of order"
        assert {sig for _k, sig in self.heads} == set(self.subs), "heads and sub-queues differ"
        total = 0
        for sig, sub in self.subs.items():
            assert sub, "empty sub-queue kept"
            keys = [j.key for j in sub]
            assert keys == sorted(keys) == self._subkeys[sig], "sub-queue out of order"
            assert all(j.sig == sig for j in sub), "job in the wrong sub-queue"
            assert [j.pend_est for j in sub] == self._subests[sig], "planned runs drifted"
            total += len(sub)
        assert total == self.count, "pending count drifted"
