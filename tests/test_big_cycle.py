"""The big-cluster shortcuts of the core (issue 16, point 2; design note 046) change no
decision: the queue built at once equals the queue built job by job, the fair-share
memo equals the factor worked out afresh, the quota walk of a reservation equals the
walk over every instant, and a seeded big-cycle workload decides the same as the
reference pass."""

from __future__ import annotations

import random
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gpushepherd.core.queue import PendingQueue

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))


class _Job:
    """What the queue reads of a job."""

    __slots__ = ("sig", "key", "pend_est", "strict_q", "tag")


def _jobs(draw_keys: list[tuple[int, int, int, int, int]]) -> list:
    """Bare jobs: (sub-queue, priority, submit time, id, strict queue) - keys may tie."""
    out = []
    for n, (sig, prio, sub_t, ident, strict) in enumerate(draw_keys):
        j = _Job()
        j.sig = sig
        j.key = (-prio, float(sub_t), ((0, ident, ""),))  # equal ids tie, as ``j1`` and ``j01`` do
        j.pend_est = float(n % 7)
        j.strict_q = ("q", strict) if strict >= 0 else None
        j.tag = n
        out.append(j)
    return out


def _view(q: PendingQueue):
    return (list(q.heads), {s: [j.tag for j in sub] for s, sub in q.subs.items()},
            {s: list(k) for s, k in q._subkeys.items()}, {s: list(e) for s, e in q._subests.items()},
            {k: [j.tag for _k, j in v] for k, v in q.strict.items()}, q.count, [j.tag for j in q])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 2), st.integers(0, 2), st.integers(0, 3),
                          st.integers(-1, 1)), max_size=40), st.randoms(use_true_random=False))
def test_a_queue_built_at_once_is_the_queue_built_job_by_job(keys, rnd):
    jobs = _jobs(keys)
    rnd.shuffle(jobs)
    old = PendingQueue()
    for j in jobs:
        old.add(j)
    # the recalculation used to add the jobs in the old queue's order, one by one
    by_add = PendingQueue()
    for j in list(old):
        by_add.add(j)
    at_once = PendingQueue.of(old.jobs())
    assert _view(at_once) == _view(by_add)
    at_once.check()


def _old_quota_start(book, job, claims, t0, run):
    """``planning.quota_start`` before note 046: every instant sorted, each probe's
    released quota summed over the planned ends from the first."""
    from gpushepherd.core import planning

    def released_by(k, q):
        out = 0
        for e, _seq, jid in book.ends:
            if e > q:
                break
            for li, u, a in book.jobs[jid].run_charges:
                if (li, u) == k:
                    out += a
        return out

    quota = book.quota
    keys = {(i, user): a for i, user, a in job.charges}
    hold = planning._holds_for_others(book, job)
    times = {t0}
    times.update(e for e, _s, _j in book.ends if e > t0 and e != float("inf"))
    times.update(c.end for c in claims if c.end > t0 and c.end != float("inf"))
    for t in sorted(times):
        end = t + run
        probes = [t] + [c.start for c in claims if t < c.start < end]
        ok = True
        for q in probes:
            for k, a in keys.items():
                used = quota.usage.get(k, 0) - released_by(k, q)
                extra = sum(c.quota_at(k, q) for c in claims if c.start <= q < c.end)
                if used + extra + a > quota.current[k[0]]:
                    ok = False
                    break
            if ok and hold and not planning._class_hold_ok(book, job, q, claims):
                ok = False
            if not ok:
                break
        if ok:
            return t
    return None


def _small_run(seed: int, **policy) -> dict:
    import bigcycle

    return bigcycle.one(40, 600, 40, seed, **policy)


def test_the_shortcuts_decide_as_the_plain_computations(monkeypatch):
    """A seeded big-cycle workload (bench/bigcycle.py, small: 40 nodes, 600 pending, 40
    job ends, two fair-share recalculations) decides the same with the shortcuts of note
    046 and with the plain computations: the fair-share factor worked out afresh for
    every job, the quota walk over every instant, the island best fit over every node."""
    from gpushepherd.core import admission, planning, priority

    fast = [_small_run(seed) for seed in (1, 2)]
    fast_user = _small_run(3, fair_share_level="user")
    fast_quota = _small_run(4, tight=True)
    assert fast[0]["subqueues"] > 300 and fast[0]["started"] > 0 and fast_quota["started"] > 0
    monkeypatch.setattr(priority, "_fs_memo", lambda book: {})
    monkeypatch.setattr(planning, "quota_start", _old_quota_start)
    plain_place = admission.Admission._place

    def place(self, job, scratch, avoided=frozenset(), caps=None, within=None):
        shape = job.shape
        if (scratch is None and not avoided and shape.k > 1 and shape.mode == "single"
                and self.book.on_islands(job)):  # the island path over every node: a dummy avoided set
            return plain_place(self, job, scratch, frozenset({-1}), caps, within)
        return plain_place(self, job, scratch, avoided, caps, within)

    monkeypatch.setattr(admission.Admission, "_place", place)
    assert [_small_run(seed)["digest"] for seed in (1, 2)] == [r["digest"] for r in fast]
    assert _small_run(3, fair_share_level="user")["digest"] == fast_user["digest"]
    assert _small_run(4, tight=True)["digest"] == fast_quota["digest"]


def test_the_lazy_quota_walk_finds_the_instant_of_the_walk_over_every_instant(monkeypatch):
    """Every ``quota_start`` of a seeded workload with tight team caps (quotas bind, so
    reservations wait for their team's jobs to end) equals the walk before note 046."""
    from gpushepherd.core import planning

    lazy = planning.quota_start
    seen = {"calls": 0, "later": 0, "never": 0}

    def both(book, job, claims, t0, run):
        got = lazy(book, job, claims, t0, run)
        assert got == _old_quota_start(book, job, claims, t0, run)
        seen["calls"] += 1
        seen["later"] += got is not None and got > t0
        seen["never"] += got is None
        return got

    monkeypatch.setattr(planning, "quota_start", both)
    for seed in (5, 6, 7):
        _small_run(seed, tight=True)
    assert seen["calls"] > 50 and seen["later"] > 5
