"""The core's copy for estimated starts (``forward.clone``, design note 062) shares only
what is immutable: the same answers as a full ``copy.deepcopy`` of the core, the
original untouched by the copy's run, and every value it shares of an immutable kind -
checked at every instant of oracle workloads (issue 20)."""

from __future__ import annotations

import copy
import enum
import json
from dataclasses import fields, is_dataclass

import pytest

from oracle_checks import drive
from oracle_workloads import workload_from_seed
from gpushepherd.core import forward
from gpushepherd.core.state import CONTAINERS, SHARED, Job

SEEDS = range(0, 40, 3)
_ATOMS = (str, bytes, int, float, bool, type(None), enum.Enum)


def _immutable(v, rules_ids: set[int]) -> bool:
    """``v`` and everything it reaches cannot be changed in place: atoms, enums, tuples
    and frozensets of such, frozen dataclasses of such, or objects of the compiled rules."""
    if isinstance(v, _ATOMS) or id(v) in rules_ids:
        return True
    if isinstance(v, (tuple, frozenset)):
        return all(_immutable(x, rules_ids) for x in v)
    if is_dataclass(v) and not isinstance(v, type) and v.__dataclass_params__.frozen:
        return all(_immutable(getattr(v, f.name), rules_ids) for f in fields(v))
    return False


class _Probe:
    """A checker for ``drive`` that runs ``probe(sched)`` after every instant."""

    def __init__(self, probe):
        self.probe = probe
        self.instants = 0

    def after(self, sched, batch, out) -> None:
        self.instants += 1
        self.probe(sched)


def _deep_clone(sched):
    return copy.deepcopy(sched, dict(forward._rules_memo(sched.rules)))


def test_the_copy_answers_as_a_full_deepcopy_and_leaves_the_original_as_it_was(monkeypatch):
    compared = [0]

    def probe(sched):
        pending = {j.id for j in sched.pending_jobs()}
        if not pending:
            return
        before = json.dumps(sched.snapshot(), sort_keys=True)
        tables = {name: dict(getattr(sched.book, name)) for name in forward._FLAT_TABLES}
        got = forward.first_starts(sched, pending)
        with monkeypatch.context() as m:
            m.setattr(forward, "clone", _deep_clone)
            want = forward.first_starts(sched, pending)
        assert got == want, f"t={sched.now:g}"
        assert json.dumps(sched.snapshot(), sort_keys=True) == before, f"t={sched.now:g}: the copy changed the core"
        assert {name: getattr(sched.book, name) for name in forward._FLAT_TABLES} == tables
        compared[0] += 1

    for seed in SEEDS:
        drive(workload_from_seed(seed), checker=_Probe(probe))
    assert compared[0] > 50  # instants with a job pending, each compared


@pytest.mark.parametrize("seed", SEEDS)
def test_what_the_copy_shares_is_immutable_at_every_instant(seed):
    wl = workload_from_seed(seed)
    rules_ids = set(forward._rules_memo(wl.rules))

    def probe(sched):
        book = sched.book
        for job in book.jobs.values():
            for name in SHARED:
                assert _immutable(getattr(job, name), rules_ids), f"{job.id}.{name} = {getattr(job, name)!r}"
            for name in CONTAINERS:
                box = getattr(job, name)
                items = [*box.keys(), *box.values()] if isinstance(box, dict) else list(box)
                assert type(box) in (list, set, dict), f"{job.id}.{name}"
                assert all(_immutable(x, rules_ids) for x in items), f"{job.id}.{name} = {box!r}"
        for table in [*(getattr(book, n) for n in forward._FLAT_TABLES), book.quota._applicable]:
            assert all(_immutable(k, rules_ids) and _immutable(v, rules_ids) for k, v in table.items())

    checker = _Probe(probe)
    drive(wl, checker=checker)
    assert checker.instants > 0


def test_a_copied_job_shares_its_values_and_owns_its_containers():
    wl = workload_from_seed(1)
    fast, _calls = drive(wl)
    job = next(iter(fast.scheduler.book.jobs.values()))
    twin = copy.deepcopy(job)
    for name in SHARED:
        assert getattr(twin, name) is getattr(job, name)
    for name in CONTAINERS:
        assert getattr(twin, name) == getattr(job, name) and getattr(twin, name) is not getattr(job, name)
    twin.history.append("x")
    twin.victims.add("x")
    assert "x" not in job.history and "x" not in job.victims
    assert set(Job.__slots__) == SHARED | CONTAINERS
