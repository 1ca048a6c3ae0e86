"""Planned ends per quota key (design note 046): what the jobs holding GPUs give back of
a limit by a time.

The reservation of a job that counts in a limit asks, at each instant it probes, how
much of the limit the running jobs planned to end by then give back
(``planning.quota_start``, ``Profile._qspare_fresh``). Summed over every planned end
(``Book.ends``) that costs a walk over every running job - tens of thousands at 4,000
nodes - per probe; summed over the ends of the jobs charged to that key, only over
those (a team's running jobs).
"""

from __future__ import annotations

from bisect import bisect_left, insort


class EndsByKey:
    """``(planned end, seq, job id)`` of the jobs holding GPUs, per quota key ``(limit
    index, user)`` they are charged to (their ``run_charges`` when their end was
    entered), each list ascending as ``Book.ends``."""

    def __init__(self) -> None:
        self.by_key: dict[tuple, list[tuple[float, int, str]]] = {}
        self.keys_of: dict[str, tuple[tuple, ...]] = {}

    def add(self, entry: tuple[float, int, str], run_charges) -> None:
        """Enter a job's planned end (seconds) under each quota key of ``run_charges``
        (``(limit index, user, amount)`` triples); O(log n) per key."""
        keys = tuple(sorted({(i, user) for i, user, _a in run_charges}))
        self.keys_of[entry[2]] = keys
        for k in keys:
            insort(self.by_key.setdefault(k, []), entry)

    def remove(self, entry: tuple[float, int, str]) -> None:
        """Take a job's planned end out of every key ``add`` entered it under (none: a
        no-op). Raises ``IndexError`` if the entry is not where ``add`` put it."""
        for k in self.keys_of.pop(entry[2], ()):
            lst = self.by_key[k]
            del lst[bisect_left(lst, entry)]
            if not lst:
                del self.by_key[k]

    def recharged(self, entry: tuple[float, int, str], run_charges) -> None:
        """A job's ``run_charges`` changed while it holds GPUs (``Book._set_covered``)."""
        if entry[2] in self.keys_of:
            self.remove(entry)
            self.add(entry, run_charges)

    def released(self, jobs: dict, k: tuple, q: float) -> int:
        """What the jobs planned to end by ``q`` (``end <= q``) give back of key ``k``:
        the sum of their ``run_charges`` on it, as read now."""
        i, user = k
        out = 0
        for e, _seq, jid in self.by_key.get(k, ()):
            if e > q:
                break
            for li, u, a in jobs[jid].run_charges:
                if li == i and u == user:
                    out += a
        return out

    def check(self, ends: list[tuple[float, int, str]], jobs: dict) -> None:
        """Raise ``AssertionError`` unless this is the index of ``ends`` by the jobs'
        charges now."""
        expect: dict[tuple, list] = {}
        for entry in ends:
            for k in sorted({(i, user) for i, user, _a in jobs[entry[2]].run_charges}):
                expect.setdefault(k, []).append(entry)
        assert expect == self.by_key, "planned ends per quota key drifted"
