"""The release index (``core/releases.py``): the earliest single-node start it reads from
its sorted lists equals a scan of every node's release times, on states a live core
reaches (jobs starting and ending, GPUs lost and back, nodes lost), design note 015 (2)."""

from __future__ import annotations

from bisect import bisect_right

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import job, policy
from gpushepherd.core.releases import node_releases
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.core.state import INF
from gpushepherd.model.events import GpuHealthChanged, JobFinished, JobSubmitted, NodeLost, Tick
from gpushepherd.model.job import ExitStatus


def scan(book, nodes, k: int):
    """Every node's k-th release, the earliest (fewest free then, lowest index)."""
    best = None
    for n in nodes:
        rel = node_releases(book, n)
        if len(rel) < k or rel[k - 1] == INF:
            continue
        t = max(rel[k - 1], book.now)
        cand = (t, bisect_right(rel, t), n)
        if best is None or cand < best:
            best = cand
    return None if best is None else (best[0], [(best[2], k)], best[1])


def check_all(sched: Scheduler, subsets) -> None:
    book = sched.book
    everyone = range(len(book.ledger.slots))
    for nodes in [set(everyone), *({n for n in s if n < len(everyone)} for s in subsets)]:
        for k in range(1, 10):
            out: dict[int, int] = {}
            got = book.release_index.single_start(book, frozenset(nodes), k, out)
            want = scan(book, sorted(nodes), k)
            if want is None:
                assert got is None, (k, nodes)
            else:
                assert got == (want[0], want[1]) and out == {want[1][0][0]: want[2]}, (k, sorted(nodes), got, want)


step = st.tuples(st.sampled_from(["submit", "finish", "sick", "lose"]), st.integers(0, 7), st.integers(1, 8),
                 st.integers(1, 200))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.integers(1, 8), min_size=1, max_size=6), steps=st.lists(step, max_size=30),
       subsets=st.lists(st.sets(st.integers(0, 5), max_size=4), max_size=3))
def test_single_node_start_from_the_index_equals_a_scan_of_every_node(sizes, steps, subsets):
    rules = policy(nodes=[(f"n{i}", g) for i, g in enumerate(sizes)], preemption=False)
    sched = Scheduler(rules)
    t, seq, running = 0.0, 0, []
    for kind, a, b, c in steps:
        t += 1.0
        if kind == "submit":
            seq += 1
            spec = job(f"j{seq}", min(b, max(sizes)), submit=t, runtime_estimate_s=float(c))
            sched.handle(JobSubmitted(t, spec))
            running = [j.id for j in sched.running_jobs()]
        elif kind == "finish" and running:
            sched.handle(JobFinished(t, running[a % len(running)], ExitStatus.COMPLETED))
            running = [j.id for j in sched.running_jobs()]
        elif kind == "sick":
            n = a % len(sizes)
            sched.handle(GpuHealthChanged(t, f"n{n}", b % sizes[n], healthy=c % 2 == 0))
            running = [j.id for j in sched.running_jobs()]
        elif kind == "lose" and len(sizes) > 1 and a % 4 == 0:
            n = a % len(sizes)
            if sched.book.ledger.slots[n].alive:
                sched.handle(NodeLost(t, f"n{n}"))
                running = [j.id for j in sched.running_jobs()]
        check_all(sched, [s for s in subsets if s])


def test_the_index_looks_at_every_node_again_when_the_ledgers_changes_overflowed(monkeypatch):
    from gpushepherd.core import ledger as ledger_mod
    monkeypatch.setattr(ledger_mod, "MAX_CHANGES", 3)
    rules = policy(nodes=[("n0", 2), ("n1", 4)], preemption=False)
    sched = Scheduler(rules)
    book = sched.book
    sched.handle(Tick(0.0))
    assert book.release_index.single_start(book, {0, 1}, 2, None) == (0.0, [(0, 2)])  # read: all free
    sched.handle(JobSubmitted(1.0, job("long", 2, runtime_estimate_s=500.0)))  # on n0 (best fit)
    for i in range(4):  # then more changes on n1 than the ledger keeps unread: n0's is lost
        sched.handle(JobSubmitted(2.0 + i, job(f"b{i}", 4, runtime_estimate_s=10.0)))
        sched.handle(JobFinished(2.5 + i, f"b{i}", ExitStatus.COMPLETED))
    assert book.ledger.changes_lost
    assert book.release_index.single_start(book, {0}, 2, None) == (501.0, [(0, 2)])
    check_all(sched, [{0}, {1}])
