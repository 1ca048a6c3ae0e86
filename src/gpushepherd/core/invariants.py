"""``check_invariants``: the book's consistency (dask's ``validate_state``), called by
the property and oracle tests after every instant."""

from __future__ import annotations

from gpushepherd.core.freed import share_victim
from gpushepherd.core.ledger import MIG, SHARED, bits
from gpushepherd.model.job import JobState


def check_invariants(book) -> None:
    """Raise ``AssertionError`` when the core's state is inconsistent (dask's
    ``validate_state``). Property tests call it after every event.

    Checks: the ledger's own invariants; every GPU is held by at most one job and
    exactly the GPUs its job records; usage counters equal the sums over jobs that
    hold GPUs, never negative; the pending queue is sorted and holds exactly the
    pending jobs.
    """
    book.ledger.check()
    book.ends_by_key.check(book.ends, book.jobs)
    held: dict[tuple[int, int], str] = {}
    expect_usage: dict[tuple[int, str], int] = {}
    for job in book.jobs.values():
        if job.state.holds_gpus:
            assert job.id in book.running, f"{job.id} holds GPUs but is not in the running set"
            if job.share is not None:
                (idx, mask), = job.alloc
                slot = book.ledger.slots[idx]
                assert mask == 0 and job.share_at, f"{job.id}: a share holding whole GPUs"
                if len(job.share_at) == 1:
                    card = slot.cards.get(job.share_at[0])
                    assert not slot.alive or (card is not None and job.id in card.holders), f"{job.id}: share lost"
                else:
                    assert slot.migs[job.share_at[0]].holders[job.share_at[1]] == job.id, f"{job.id}: MIG lost"
            else:
                assert sum(m.bit_count() for _, m in job.alloc) == job.gpus, f"{job.id}: wrong GPU count"
            for idx, mask in job.alloc:
                for g in bits(mask):
                    assert (idx, g) not in held, f"GPU {idx}:{g} given to {held.get((idx, g))} and {job.id}"
                    held[(idx, g)] = job.id
                    assert book.ledger.slots[idx].holder[g] == job.id
            for i, user, amount in job.run_charges:
                expect_usage[(i, user)] = expect_usage.get((i, user), 0) + amount
            assert job.run_charges == book.charges_with(job, job.run_units, job.covered), f"{job.id}: charges drifted"
        else:
            assert not job.alloc, f"{job.id} is {job.state.value} but holds GPUs"
            assert job.id not in book.running
    for slot in book.ledger.slots:
        for g, h in enumerate(slot.holder):
            if h is not None and h not in (SHARED, MIG):
                assert held.get((slot.idx, g)) == h, f"ledger says {slot.node.name}:{g} is {h}'s"
        for g, card in slot.cards.items():
            for h in card.holders:
                assert book.jobs[h].state.holds_gpus and book.jobs[h].share_at == (g,), f"stale share {h}"
        for g, mig in slot.migs.items():
            for pos, h in enumerate(mig.holders):
                assert h is None or book.jobs[h].share_at == (g, pos), f"stale MIG holder {h}"
    assert {k: v for k, v in book.quota.usage.items() if v} == {k: v for k, v in expect_usage.items() if v}, \
        "usage counters drifted"
    assert all(v > 0 for v in book.quota.usage.values()), "negative usage"
    book.queue.check()
    pend = {j.id for j in book.jobs.values() if j.state is JobState.PENDING}
    assert pend == {j.id for j in book.queue}, "pending set drifted"
    assert set(book.preemptors) <= pend, "a preemptor that is not pending"
    for job in book.preemptors.values():
        for vid in job.victims:
            v = book.jobs[vid]
            assert v.preemptor == job.id and v.state is JobState.PREEMPTING, f"{vid}: a victim of {job.id} not exiting"
    for (idx, g) in book.mig_plans:
        assert book.ledger.slots[idx].migs[g].reconfiguring, "a MIG plan on a GPU in service"

    assert len(book.ends) == len(book.running)
    for job in book.running.values():
        assert job.state.holds_gpus
    counts: dict[int, int] = {}
    allc: dict[int, int] = {}
    gpus: dict[str, int] = {}
    covered: dict[str, int] = {}
    for job in book.running.values():
        gpus[job.cls.name] = gpus.get(job.cls.name, 0) + job.run_units
        if job.covered:
            covered[job.cls.name] = covered.get(job.cls.name, 0) + job.covered
        if job.state is JobState.RUNNING:
            allc[job.cls.priority] = allc.get(job.cls.priority, 0) + 1
            if job.evictable and share_victim(job):
                counts[job.cls.priority] = counts.get(job.cls.priority, 0) + 1
    assert counts == {p: len(js) for p, js in book.evictable.items()}, "preemptible index drifted"
    assert allc == book.running_prio, "running counters drifted"
    assert gpus == book.class_units, "class GPU counters drifted"
    assert covered == book.covered_units, "covered class reservation drifted"
    for name, units in covered.items():
        assert units <= book.reserved.get(name, 0), f"class {name} covered beyond its reserved_gpus"
    n = len(book.prios)
    lower_all = [[0] * n for _ in book.lower_all]
    lower_vic = [[0] * n for _ in book.lower_vic]
    for job in book.running.values():
        if job.state is JobState.RUNNING:
            victim = job.evictable and share_victim(job)
            for idx, mask in job.alloc:
                for j, q in enumerate(book.prios):
                    if job.cls.priority < q:
                        lower_all[idx][j] += mask.bit_count()
                        if victim:
                            lower_vic[idx][j] += mask.bit_count()
    assert lower_all == book.lower_all and lower_vic == book.lower_vic, "per-node class counters drifted"


