"""The replay's speed-ups (issue 16 target 1, issue 20; design notes 052, 055) change no
decision: each shortcut is checked against the computation it skips, on the bundled
Philly excerpt under ``examples/policies/philly.yaml``."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _replay(cluster: str = "16x8", depth: int | None = None, odd: bool = False):
    """The bundled Philly excerpt (1,966 jobs) at ``cluster``: ``(digest of every job's
    starts and end, result)``. ``odd``: every job of more than 8 GPUs asks 3 fewer (a
    remainder node beside its whole ones)."""
    from gpushepherd.policy import override_cluster, policy_from_dict, read_policy_dict
    from gpushepherd.sim.engine import Simulator
    from gpushepherd.sim.mapping import to_sim_jobs
    from gpushepherd.sim.traces import read_trace

    path = ROOT / "examples" / "policies" / "philly.yaml"
    raw = override_cluster(read_policy_dict(path), cluster)
    if depth is not None:
        raw.setdefault("backfill", {})["reservations"] = depth
    rules = policy_from_dict(raw, str(path)).rules
    jobs = to_sim_jobs(read_trace(str(ROOT / "src" / "gpushepherd" / "data" / "philly-excerpt.csv.gz"), "philly"),
                       rules)
    if odd:
        from dataclasses import replace

        jobs = [replace(j, spec=replace(j.spec, gpus=j.spec.gpus - 3)) if j.spec.gpus > 8 else j for j in jobs]
    result = Simulator(rules, jobs).run()
    h = hashlib.sha256()
    for jid in sorted(result.records):
        r = result.records[jid]
        h.update(f"{jid}:{[s[0] for s in r.starts]}:{r.end}\n".encode())
    return h.hexdigest(), result


def _full_check_agrees(monkeypatch, standing, turn, restore) -> None:
    """The full standing check (``_stands_unchanged`` off) on ``turn``'s state says the
    reservations stand; ``_stands_unchanged`` is ``restore`` again afterwards."""
    monkeypatch.setattr(standing, "_stands_unchanged", lambda turn, claims: False)
    turn.slots_before_start = 1
    try:
        assert standing.reservations_stand(turn)
    finally:
        monkeypatch.setattr(standing, "_stands_unchanged", restore)


def test_a_reservation_kept_without_recomputing_it_is_the_one_recomputed(monkeypatch):
    """Whenever ``standing._stands_unchanged`` says the pass's one reservation stands (no
    hold, rule 5, every job started since planned to end by its start), the full check
    - the reserved job decided and its reservation computed again on the state the pass
    leaves - says so too; and it says so often on this trace."""
    from gpushepherd.core import standing

    shortcut = standing._stands_unchanged
    seen = {"kept": 0, "asked": 0}

    def checked(turn, claims):
        got = shortcut(turn, claims)
        seen["asked"] += 1
        if got:
            seen["kept"] += 1
            _full_check_agrees(monkeypatch, standing, turn, checked)
        return got

    monkeypatch.setattr(standing, "_stands_unchanged", checked)
    _replay()
    assert seen["kept"] > 50 and seen["kept"] < seen["asked"]


def test_a_reservation_outlived_by_worse_fits_is_the_one_recomputed(monkeypatch):
    """Whenever ``standing._outlivers_fit_worse`` keeps a single-node reservation that
    jobs started since outlive (note 055), the full check agrees; and it keeps one often
    on this trace."""
    from gpushepherd.core import standing

    outlived = standing._outlivers_fit_worse
    shortcut = standing._stands_unchanged
    seen = {"kept": 0}

    def checked(turn, job, c):
        got = outlived(turn, job, c)
        if got:
            seen["kept"] += 1
            _full_check_agrees(monkeypatch, standing, turn, shortcut)
        return got

    monkeypatch.setattr(standing, "_outlivers_fit_worse", checked)
    _replay()
    assert seen["kept"] > 20


@pytest.mark.parametrize("depth", [1, 3])
def test_the_excerpt_decides_the_same_with_and_without_the_shortcuts(monkeypatch, depth):
    """The excerpt's every start and end, with the shortcuts of note 052 and without."""
    from gpushepherd.core import planning, standing

    fast, _ = _replay(depth=depth)
    monkeypatch.setattr(standing, "_stands_unchanged", lambda turn, claims: False)
    monkeypatch.setattr(planning, "_SKIP_FROM", 10**9)
    monkeypatch.setattr(planning, "_plain_size", lambda ledger, groups: 0)  # walk every multi-node reservation
    plain, _ = _replay(depth=depth)
    assert fast == plain


@pytest.mark.parametrize("skip_from, cluster", [(0, "8x8"), (16, "16x8")])
def test_a_multi_node_walk_that_skips_to_its_bound_finds_the_start_of_the_full_walk(monkeypatch, skip_from, cluster):
    """Every reservation walk of a multi-node job (``planning._walk_free``) that starts at
    the first planned end where its nodes can first hold it (``_skip_to_bound``) finds
    the start and placement of the walk over every planned end, and it skips often."""
    from gpushepherd.core import planning

    walk = planning._walk_free
    seen = {"multi": 0, "skipped": 0}
    skip = planning._skip_to_bound

    def counted(*args):
        got = skip(*args)
        seen["skipped"] += bool(got[0])
        return got

    def both(book, job, nodes, totals, free_out=None):
        monkeypatch.setattr(planning, "_SKIP_FROM", skip_from)
        got = walk(book, job, nodes, totals, free_out)
        if job.shape.mode == "multi":
            seen["multi"] += 1
            monkeypatch.setattr(planning, "_SKIP_FROM", 10**9)
            plain_out = {} if free_out is not None else None
            assert walk(book, job, nodes, totals, plain_out) == got
            assert plain_out == free_out
        return got

    monkeypatch.setattr(planning, "_walk_free", both)
    monkeypatch.setattr(planning, "_skip_to_bound", counted)
    monkeypatch.setattr(planning, "_plain_size", lambda ledger, groups: 0)  # the walk, not the index (note 059)
    _replay(cluster)
    assert seen["multi"] > 100 and seen["skipped"] > 20


@pytest.mark.parametrize("cluster, odd", [("8x8", False), ("16x8", False), ("8x8", True), ("16x8", True)])
def test_a_multi_node_start_read_from_the_release_index_is_the_walks(monkeypatch, cluster, odd):
    """Every multi-node reservation read from the release index (``ReleaseIndex.
    multi_start``, note 059) has the start, placement and free counts of the walk over
    every planned end, and the index is read for most of them."""
    from gpushepherd.core import planning
    from gpushepherd.core.releases import ReleaseIndex

    walk = planning._walk_free
    plain_size = planning._plain_size
    read = ReleaseIndex.multi_start
    skip_from = planning._SKIP_FROM
    seen = {"multi": 0, "read": 0}

    def counted(self, *args):
        seen["read"] += 1
        return read(self, *args)

    def both(book, job, nodes, totals, free_out=None):
        got = walk(book, job, nodes, totals, free_out)
        if job.shape.mode == "multi":
            seen["multi"] += 1
            monkeypatch.setattr(planning, "_plain_size", lambda ledger, groups: 0)
            monkeypatch.setattr(planning, "_SKIP_FROM", 10**9)
            plain_out = {} if free_out is not None else None
            try:
                assert walk(book, job, nodes, totals, plain_out) == got
            finally:
                monkeypatch.setattr(planning, "_plain_size", plain_size)
                monkeypatch.setattr(planning, "_SKIP_FROM", skip_from)
            assert plain_out == free_out
        return got

    monkeypatch.setattr(planning, "_walk_free", both)
    monkeypatch.setattr(ReleaseIndex, "multi_start", counted)
    _replay(cluster, odd=odd)
    assert seen["multi"] > 100 and seen["read"] > seen["multi"] // 2


def test_a_replay_leaves_the_collector_as_it_found_it_and_passes_no_cycles():
    """``Simulator.run`` freezes what it builds (note 059) and unfreezes it at the end;
    a pass's ``Turn`` is freed by reference counting once the next replaces it (its
    ``Walk`` keeps no reference back), so freezing keeps no garbage alive."""
    import gc
    import weakref

    from gpushepherd.core import cycle

    made = []
    run_fast = cycle.run_fast

    def kept(sched, out):
        turn = run_fast(sched, out)
        made.append(weakref.ref(turn))
        return turn

    cycle.run_fast = kept
    was = gc.isenabled()
    gc.disable()  # only reference counting frees them
    try:
        _replay()
    finally:
        cycle.run_fast = run_fast
        if was:
            gc.enable()
    assert len(made) > 100 and sum(r() is not None for r in made) <= 1  # the last pass's, held by the scheduler
    gc.collect()
    _replay()
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_pod_job_on_nodes_without_a_gpu_gets_its_reservation_walk():
    """Oracle seed 923: a pod job whose nodes have no whole GPU reached the multi-node
    walk, which divided by their size (0) for the inline gate it does not use; the
    workload passes every oracle check now."""
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from oracle_checks import check
    from oracle_workloads import workload_from_seed

    rep = check(workload_from_seed(923))
    assert not rep.failures, rep.failures


def test_events_of_one_instant_sort_as_by_their_full_text():
    """``event_order``'s last key is the event's text worked out only on a tie (note
    059): events of one instant sort exactly as with ``repr`` as that key."""
    import random

    from gpushepherd.core.intake import event_order
    from gpushepherd.model.events import GpuHealthChanged, JobCancelled, JobFinished, JobSubmitted, Tick
    from gpushepherd.model.job import ExitStatus, JobSpec

    events = [JobSubmitted(5.0, JobSpec(id=i, team="a", workload_class="batch", gpus=g, user=u))
              for i in ("7", "07", "x1", "x01") for g in (1, 2) for u in ("u", "v")]
    events += [JobCancelled(5.0, "7"), JobCancelled(5.0, "07"), JobFinished(5.0, "x1", ExitStatus.COMPLETED),
               JobFinished(5.0, "x1", ExitStatus.FAILED), Tick(5.0)]
    events += [GpuHealthChanged(5.0, "n1", 0, h) for h in (True, False)]

    def by_text(e):
        key = event_order(e)
        return key[:-1] + (repr(e),)

    want = sorted(events, key=by_text)
    for seed in range(20):
        shuffled = events[:]
        random.Random(seed).shuffle(shuffled)
        assert sorted(shuffled, key=event_order) == want
