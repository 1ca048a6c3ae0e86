"""Estimated starts model the core's own depth (issue 20 point 3, design note 043): the
estimate is the start the core gives when nothing more is submitted and every job ends
at its planned end - a job behind the reserved head backfills past a deeper one in the
estimate as it does in the core (EASY, ``backfill.reservations`` 1), where the
conservative plan (a reservation for every job) had it wait behind them all."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import job, policy
from oracle_workloads import workload_from_seed
from test_estimated_start_exact import workloads as exact_workloads
from gpushepherd.core import Scheduler
from gpushepherd.core.estimates import conservative, plan_all
from gpushepherd.model.events import JobSubmitted
from gpushepherd.sim.engine import SimJob, Simulator

#: submit order: every priority weight 0 (then job id)
FIFO = {"weights": {"class": 0.0, "fair_share": 0.0, "age": 0.0, "size": 0.0, "time_limit": 0.0, "deadline": 0.0}}

#: one node of 4 GPUs, everything submitted at 0: (id, GPUs, true duration = estimate)
#: j1, j2 start at once (2 + 2 GPUs, ending at 100 and 10); j3 (3 GPUs) is the head and
#: holds the one reservation (from 100, when j1 ends, to 200); j4 (4 GPUs) waits behind
#: it without a reservation; j5 (1 GPU for 300 s) starts at 10, when j2 ends - it leaves
#: j3's 3 GPUs free at 100 - and so j4 waits for j5's end at 310.
JOBS = (("j1", 2, 100.0), ("j2", 2, 10.0), ("j3", 3, 100.0), ("j4", 4, 10.0), ("j5", 1, 300.0))


def _rules(depth: int = 1):
    return policy(nodes=[("n1", 4)], preemption=False, backfill=depth, priority=FIFO)


def _specs():
    return [job(i, g, runtime_estimate_s=d) for i, g, d in JOBS]


def test_a_job_behind_the_reserved_head_is_estimated_to_backfill_past_a_deeper_job():
    sched = Scheduler(_rules())
    sched.handle([JobSubmitted(0.0, s) for s in _specs()])
    assert {j.id for j in sched.running_jobs()} == {"j1", "j2"}
    est = {j: e.t for j, e in sched.estimated_starts().items()}
    assert est == {"j3": 100.0, "j4": 310.0, "j5": 10.0}
    # the conservative plan (every job reserved) had j5 behind j4 and j4 right after j3
    assert {j: e.t for j, e in conservative(sched).items()} == {"j3": 100.0, "j4": 200.0, "j5": 210.0}
    # the core starts them there (true durations, nothing submitted later)
    result = Simulator(_rules(), [SimJob(s, d) for s, (_i, _g, d) in zip(_specs(), JOBS)]).run()
    assert {j: result.records[j].first_start for j in est} == est


def test_with_a_reservation_for_every_job_the_estimates_are_the_conservative_plan():
    sched = Scheduler(_rules(depth=5))
    sched.handle([JobSubmitted(0.0, s) for s in _specs()])
    est = {j: e.t for j, e in sched.estimated_starts().items()}
    assert est == {j: e.t for j, e in conservative(sched).items()} == {"j3": 100.0, "j4": 200.0, "j5": 210.0}


@st.composite
def workloads(draw):
    """``test_estimated_start_exact``'s workloads with a reservation depth of 1-3."""
    nodes, specs = draw(exact_workloads())
    return nodes, specs, draw(st.sampled_from([1, 1, 2, 3]))


def _asked_after_last_submission(rules, specs):
    """``({job: estimate}, result)``: the estimates asked right after the last submission
    (nothing is submitted later), and the replay with true durations."""
    sim = Simulator(rules, [SimJob(s, d) for s, d in specs])
    sched = sim.sched
    inner = sched.handle
    last = max(s.submit_time for s, _d in specs)
    asked: dict[str, float] = {}
    done = []

    def handle(events):
        out = inner(events)
        if sched.now >= last and not done:
            done.append(True)
            asked.update({j: e.t for j, e in sched.estimated_starts().items()})
        return out

    sched.handle = handle
    return asked, sim.run()


@settings(max_examples=150, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_in_submit_order_with_true_durations_each_job_starts_at_its_estimate(wl):
    nodes, specs, depth = wl
    rules = policy(nodes=nodes, preemption=False, backfill=depth, priority=FIFO)
    asked, result = _asked_after_last_submission(rules, specs)
    wrong = {j: (t, result.records[j].first_start) for j, t in asked.items() if result.records[j].first_start != t}
    assert not wrong
    # every job that waited past the last submission had one, later than then
    last = max(s.submit_time for s, _d in specs)
    started_later = {j for j, r in result.records.items() if r.first_start is not None and r.first_start > last}
    assert started_later <= set(asked)
    assert all(t > last for t in asked.values())


def _oracle_mix_counts(seed: int) -> tuple[int, int, int]:
    """On the oracle's workload ``seed`` (every rule mixed: preemption, quotas, cohorts,
    shares, MIG, windows, priority recalculation) with true durations as runtime
    estimates (capped at the time limit) and no event after the last submission:
    ``(pending jobs then that start later, of them at their estimate, with one)``."""
    wl = workload_from_seed(seed)
    last = max(s.submit_time for s, _d in wl.jobs)
    specs = [(replace(s, runtime_estimate_s=d if s.time_limit_s is None else min(d, s.time_limit_s)), d)
             for s, d in wl.jobs]
    sim = Simulator(wl.rules, [SimJob(s, d) for s, d in specs], [e for e in wl.events if e.t < last])
    sched = sim.sched
    inner = sched.handle
    asked: dict[str, float] = {}
    pending: list[str] = []

    def handle(events):
        out = inner(events)
        if sched.now >= last and not pending:
            asked.update({j: e.t for j, e in sched.estimated_starts().items()})
            pending.extend(j.id for j in sched.pending_jobs())
            pending.append("")
        return out

    sched.handle = handle
    result = sim.run()
    n = exact = with_est = 0
    for j in pending[:-1]:
        start = next((t for t, _p in result.records[j].starts if t >= last), None)
        if start is None:
            continue
        n += 1
        exact += asked.get(j) == start
        with_est += j in asked
    return n, exact, with_est


def test_under_the_oracle_rule_mix_nearly_every_job_starts_at_its_estimate():
    # measured on seeds 0-299: 397 of 411 (96.6 %). 7 of the rest start in a second batch
    # of the instant asked about (a victim's grace period of 0), where an estimate must be
    # later than now; 7 plan with what is not the true duration (the predictor's runs, an
    # admin's later time limit over the one the estimate was capped at, work banked by
    # a checkpoint that the core does not count)
    counts = [_oracle_mix_counts(seed) for seed in range(150)]
    n, exact, with_est = (sum(c[i] for c in counts) for i in range(3))
    assert n >= 150 and with_est == n
    assert exact >= 0.95 * n, (exact, n)


def test_jobs_the_copy_has_not_started_within_its_bound_get_the_conservative_plan_no_earlier_than_it_reached():
    sched = Scheduler(_rules())
    sched.handle([JobSubmitted(0.0, s) for s in _specs()])
    # one instant: the copy reaches t=10 (j2 ends, j5 starts); j3 and j4 from the plan
    est = {j: e.t for j, e in plan_all(sched, max_instants=1).items()}
    assert est == {"j5": 10.0, "j3": 100.0, "j4": 200.0}


def test_with_no_job_pending_there_is_nothing_to_estimate_and_no_copy_is_run(monkeypatch):
    # note 056: the oracle asks after every instant, many with an empty queue; the copy
    # (forward.clone) cost as much there as anywhere and planned nothing
    from gpushepherd.core import forward

    sched = Scheduler(_rules())
    sched.handle([JobSubmitted(0.0, job("j1", 2, runtime_estimate_s=100.0))])
    assert sched.pending_jobs() == []

    def no_copy(_sched):
        raise AssertionError("a copy was run forward with no job pending")

    monkeypatch.setattr(forward, "clone", no_copy)
    assert sched.estimated_starts() == {}
    assert plan_all(sched) == {}
    sched.handle([JobSubmitted(1.0, job("j2", 4, runtime_estimate_s=10.0))])  # waits for j1
    with pytest.raises(AssertionError, match="a copy was run"):
        sched.estimated_starts()
