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
from gpushepherd.model.job import natural_key

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))


class _Job:
    """What the queue reads of a job."""

    __slots__ = ("sig", "key", "pend_est", "strict_q", "tag")


def _jobs(draw: list[tuple[int, int, int, int]]) -> list:
    """Bare jobs: (sub-queue, priority, submit time, strict queue); the id is unique."""
    out = []
    for n, (sig, prio, sub_t, strict) in enumerate(draw):
        j = _Job()
        j.sig = sig
        j.key = (-prio, float(sub_t), natural_key(f"j{n}"))
        j.pend_est = float(n % 7)
        j.strict_q = ("q", strict) if strict >= 0 else None
        j.tag = n
        out.append(j)
    return out


def _view(q: PendingQueue):
    return (list(q.heads), {s: [j.tag for j in sub] for s, sub in sorted(q.subs.items())},
            {s: list(k) for s, k in sorted(q._subkeys.items())}, {s: list(e) for s, e in sorted(q._subests.items())},
            {k: [j.tag for _k, j in v] for k, v in sorted(q.strict.items())}, q.count, [j.tag for j in q])


_draws = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 2), st.integers(0, 2), st.integers(-1, 1)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(_draws, st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3)), max_size=40), st.randoms(use_true_random=False))
def test_a_queue_rekeyed_in_place_is_the_queue_built_job_by_job(draw, new_keys, rnd):
    """What a priority recalculation does to the queue (``PendingQueue.rekeyed``) gives
    the queue that adding every job with its new key gives (what it did before note 046)."""
    jobs = _jobs(draw)
    rnd.shuffle(jobs)
    q = PendingQueue()
    for j in jobs:
        q.add(j)
    for j, (prio, sub_t) in zip(jobs, new_keys):
        j.key = (-prio, float(sub_t), j.key[2])
    q.next_shorter(0, 0, 0.0) if 0 in q.subs else None  # block minima cached before the change
    fresh = PendingQueue()
    for j in rnd.sample(jobs, len(jobs)):
        fresh.add(j)
    q.rekeyed()
    assert _view(q) == _view(fresh)
    q.check()
    for sig in q.subs:
        for i in range(len(q.subs[sig])):
            assert q.next_shorter(sig, i, 3.0) == fresh.next_shorter(sig, i, 3.0)


def test_ids_that_read_alike_never_tie():
    """``j01`` and ``j1`` have one natural order (the text decides), so order keys are
    unique - and ids without a leading zero keep the key they had."""
    assert natural_key("j01") != natural_key("j1")
    assert sorted(["j2", "j01", "j1", "j10"], key=natural_key) == ["j1", "j01", "j2", "j10"]
    assert natural_key("job-12-a") == ((1, 0, "job-"), (0, 12, ""), (1, 0, "-a"))


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


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 16), min_size=1, max_size=12), st.integers(1, 120))
def test_a_multi_node_job_fits_empty_nodes_exactly_when_their_gpus_add_up(totals, k):
    """What ``Admission.never_fits`` now reads for a multi-node job (note 046): the
    multi rule of ``place_counts`` on every node empty fails only when the GPUs fall short."""
    from gpushepherd.core.placement import Shape, place_counts

    nodes = list(range(len(totals)))
    tot = dict(zip(nodes, totals))
    shape = Shape(k=k, mode="multi", per_pod=0, pods=1, ckey=())
    assert (place_counts(dict(tot), nodes, tot, shape) is None) == (sum(totals) < k)


def test_never_fits_reads_the_node_totals_as_a_placement_on_empty_nodes():
    """``Admission.never_fits`` without a placement for multi-node and plain single-node
    jobs (note 046) says what the placement on every node empty says, for every job of
    a seeded big-cycle queue - on a cluster with a sick GPU too (then the single-node
    case places as before)."""
    import random

    import bigcycle

    from gpushepherd.core import Scheduler
    from gpushepherd.core.placement import best_fit_island, members_of, place_counts
    from gpushepherd.model.events import GpuHealthChanged, JobSubmitted
    from gpushepherd.policy import policy_from_dict

    rng = random.Random(8)
    rules = policy_from_dict(bigcycle.policy_dict(40, 8)).rules
    for sick in (False, True):
        sched = Scheduler(rules)
        if sick:
            sched.handle(GpuHealthChanged(t=0.0, node=rules.nodes[0].name, gpu=3, healthy=False))
        sched.handle([JobSubmitted(t=1.0, spec=s) for s in bigcycle.pending_specs(800, rng)])
        book, ledger = sched.book, sched.book.ledger
        modes = set()
        for job in book.queue.jobs():
            book.cap_cache.clear()
            cand = members_of(ledger, book.groups_for(job))
            totals = {i: ledger.slots[i].healthy for i in cand}
            plain = place_counts(dict(totals), cand, totals, job.shape) is None or (
                job.shape.island and best_fit_island(totals, cand, job.shape.k, ledger.slots, True) is None)
            assert sched.admission.never_fits(job) == plain, job.id
            modes.add((job.shape.mode, plain))
        assert {("multi", False), ("single", False)} <= modes
