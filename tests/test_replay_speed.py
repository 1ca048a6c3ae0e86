"""The replay's speed-ups (issue 16 target 1, issue 20; design notes 052, 055) change no
decision: each shortcut is checked against the computation it skips, on the bundled
Philly excerpt under ``examples/policies/philly.yaml``."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _replay(cluster: str = "16x8", depth: int | None = None):
    """The bundled Philly excerpt (1,966 jobs) at ``cluster``: ``(digest of every job's
    starts and end, result)``."""
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
    _replay(cluster)
    assert seen["multi"] > 100 and seen["skipped"] > 20


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
