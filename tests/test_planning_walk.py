"""The planner's walk over claims (``core.planning._walk_claims``) against the plain scan it
stands for (design note 015, "The release index and the walk's cost"): at every instant of
seeded oracle workloads, for every pending whole-GPU job and the claims that bind it, the
same earliest instant and counts. The fast walk probes only the nodes claims touch and, on
them, only the probes that can lower what they offer; the scan probes every node at the
candidate instant and at every claim's start inside the run."""

from __future__ import annotations

import pytest
from oracle_checks import drive
from oracle_workloads import workload_from_seed

from gpushepherd.core import planning
from gpushepherd.core.placement import members_of, place_counts
from gpushepherd.core.releases import release_time
from gpushepherd.core.state import INF


def scan(book, job, nodes, totals, claims, run, t_min=None):
    """Every candidate instant, every node, every probe: what the walk must equal."""
    now = book.now
    releases = {n: sorted(release_time(book, n, g) for g in range(book.ledger.slots[n].total)) for n in nodes}
    times = {now} | {t for rel in releases.values() for t in rel if t != INF} | {c.end for c in claims if c.end != INF}
    lo = now if t_min is None else max(now, t_min)
    times.add(lo)
    for t in sorted(times):
        if t < lo:
            continue
        probes = [t] + [c.start for c in claims if t < c.start < t + run]
        avail = {n: max(0, min(sum(1 for r in releases[n] if r <= q)
                               - sum(c.gpus_at(n, q) for c in claims if c.start <= q < c.end) for q in probes))
                 for n in nodes}
        if job.shape.island and any(book.ledger.slots[n].node.nvlink_islands for n in nodes):
            # only a node where k GPUs free at t by planned ends fit one island (note 037)
            ok = [n for n in nodes if avail[n] >= job.shape.k and _one_island(book, n, t, job.shape.k)]
            best = min(((avail[n], n) for n in ok), default=None)
            if best is not None:
                return t, [(best[1], job.shape.k)]
            continue
        counts = place_counts(avail, nodes, totals, job.shape)
        if counts is not None:
            return t, counts
    return None


def _one_island(book, n, t, k) -> bool:
    slot = book.ledger.slots[n]
    if not slot.node.nvlink_islands:  # no islands declared: one island of all its GPUs, so counts decide
        return True  # (at now a GPU of a job past its planned end counts as free, though not in the free mask)
    free = {g for g in range(slot.total)
            if (slot.free_mask >> g & 1 if t <= book.now else release_time(book, n, g) <= t)}
    return any(len(free & set(island)) >= k for island in slot.node.nvlink_islands)


class Compare:
    def __init__(self):
        self.checked = 0

    def after(self, sched, batch, out):
        book = sched.book
        for job in sched.pending_jobs():
            if job.shape.mode == "share":
                continue
            profile = sched.profile_for(job)
            nodes = members_of(book.ledger, book.groups_for(job))
            node_set = set(nodes)
            claims = [c for c in profile.claims if not node_set.isdisjoint(c.gpus)]
            if not claims or not nodes:
                continue
            totals = {n: book.ledger.slots[n].healthy for n in nodes}
            run = job.planned_run()
            for t_min in (None, book.now + run / 2) if run < INF else (None,):
                want = scan(book, job, nodes, totals, claims, run, t_min)
                got = planning._walk_claims(book, job, nodes, totals, claims, run, t_min)
                assert got == want, f"t={book.now:g} {job.id} t_min={t_min}: walk {got}, scan {want}"
                self.checked += 1


@pytest.mark.parametrize("first", range(0, 1000, 100))
def test_the_walk_over_claims_plans_what_the_plain_scan_plans(first):
    compare = Compare()
    for seed in range(first, first + 100):
        try:
            drive(workload_from_seed(seed), checker=compare)
        except RuntimeError:
            continue  # a runaway workload: the oracle's business, not the planner's
    assert compare.checked > 100  # the comparison ran on claims, not on nothing
