"""A core restored after a pass that ``backfill.max_job_test`` cut short goes on as the
uninterrupted core does (design note 085; issue 20, observations 11 and 15).

Before: the snapshot kept neither the wake-up the cut pass asked for (``resume_at``) nor
how far its walk had gone. A restored core asked for no wake-up (the jobs behind the cut
waited for an unrelated event) and, given the tick, stopped at the same place again;
after a walk that went on past a cut, it gave new submissions less budget than the
uninterrupted core. And a resumed walk crashed (``KeyError`` in ``Walk.run``) when a
sub-queue it had not reached lost its last job in the pass (a preemptor started at its
own place): found by the same random workloads with small budgets.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from builders import job, policy
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.decisions import Start
from gpushepherd.model.events import JobSubmitted, Tick
from gpushepherd.policy import policy_from_dict
from test_core_v2 import _cut_short, _random_workload, random_divergences, recorded_run, restored


def test_a_core_restored_after_a_cut_pass_wakes_and_goes_on_where_it_stopped():
    # before: the restored core's next_wakeup() was None, and a tick at 11 started nothing
    sched, _out = _cut_short()
    back = restored(sched.rules, sched)
    assert back.next_wakeup() == sched.next_wakeup() == 11.0
    jobs = ("B", "L1", "L4", "S")
    assert {j: str(back.pending_reason(j)) for j in jobs} == {j: str(sched.pending_reason(j)) for j in jobs}
    assert back.handle([Tick(11.0)]) == sched.handle([Tick(11.0)])
    assert "S" not in {j.id for j in back.pending_jobs()}


def test_a_restored_core_driven_by_its_own_wakeups_reaches_the_rest_of_the_queue():
    sched, _out = _cut_short()
    back = restored(sched.rules, sched)
    started = set()
    for _ in range(5):
        wake = back.next_wakeup()
        assert wake is not None, "the jobs behind the cut wait for an unrelated event"
        started |= {d.job_id for d in back.handle([Tick(wake)]) if isinstance(d, Start)}
        if "S" in started:
            break
    assert "S" in started


def test_a_restart_under_a_new_policy_makes_a_full_pass_at_its_first_call():
    # the walk was cut under the old rules: under new ones nothing of it stands
    sched, _out = _cut_short()
    snap = json.loads(json.dumps(sched.snapshot()))
    assert snap["resume_at"] == 11.0 and snap["walk_given"] == 3
    teams = {"u": {}, **{f"Q{i}": {"max_gpus": 0} for i in range(1, 5)}}
    wider = policy(nodes=[("n1", 4), ("n2", 4)], teams=teams, preemption=False,
                   backfill={"enabled": True, "reservations": 1, "max_job_test": 10})
    back = Scheduler.restore(wider, snap, new_rules=True)
    assert back.resume_at is None and back.last_turn is None  # its first call runs a full pass
    assert {d.job_id for d in back.handle([Tick(10.0)]) if isinstance(d, Start)} == {"S"}


def test_an_old_snapshot_without_the_walk_restores_as_before():
    sched, _out = _cut_short()
    snap = {k: v for k, v in json.loads(json.dumps(sched.snapshot())).items() if k not in ("resume_at", "walk_given")}
    back = Scheduler.restore(sched.rules, snap)
    assert back.last_turn is None and back.resume_at is None


def test_a_resumed_walk_reads_the_heads_the_pass_left():
    # random workload 182 with max_job_test 1: at 25 preemptor j5 starts at its own place,
    # its sub-queue empties, the pass is cut; at 26 the resumed walk read that sub-queue
    # (KeyError: 6)
    raw, jobs = _random_workload(182)
    raw["backfill"]["max_job_test"] = 1
    _result, calls = recorded_run(policy_from_dict(raw).rules, jobs)
    assert [batch for batch, _out in calls if batch == [Tick(26.0)]]  # the resumed walk's call ran
    assert any(isinstance(d, Start) and d.job_id == "j5" and d.t == 25.0 for _batch, out in calls for d in out)


@pytest.mark.parametrize("budget", [1, 2, 3])
def test_restore_changes_no_decision_on_random_workloads_with_small_budgets(budget):
    # before: seeds 80, 86, 114 (budget 1-2) diverged, 130 too (a restored core's first
    # pass gave a submission less budget than continue_fast on a walk that had gone on),
    # and 182 crashed
    assert random_divergences(range(budget - 1, 360, 3), lambda raw: raw["backfill"].update(max_job_test=budget)) == []


def test_a_big_queue_cut_many_times_restores_at_every_call():
    # 30 jobs of 30 teams that may hold nothing (each its own sub-queue) queue ahead of 12
    # that could start, behind a reservation, budget 4: the walk is cut and goes on a
    # second later, several times; a restart before any of those wake-ups decides as the
    # uninterrupted core
    rng = random.Random(7)
    teams = {"u": {}, **{f"z{i:02d}": {"max_gpus": 0} for i in range(30)}}
    rules = policy(nodes=[("n1", 8), ("n2", 8), ("n3", 8)], teams=teams, preemption=False,
                   backfill={"enabled": True, "reservations": 1, "max_job_test": 4})
    a = Scheduler(rules)
    a.handle([JobSubmitted(0.0, job("X", 8, "batch", "u", 0.0, runtime_estimate_s=1000.0))])
    batch = [JobSubmitted(1.0, job("BIG", 24, "batch", "u", 1.0, gpus_per_pod=8, runtime_estimate_s=500.0))]
    batch += [JobSubmitted(1.0, job(f"a{i:02d}", 1, "batch", f"z{i:02d}", 1.0)) for i in range(30)]
    batch += [JobSubmitted(1.0, job(f"s{i:02d}", 1, "batch", "u", 1.0,
                                    runtime_estimate_s=float(rng.randint(5, 50)))) for i in range(12)]
    a.handle(batch)
    cuts = 0
    while (w := a.next_wakeup()) is not None and w < 1000.0:
        cuts += 1
        b = restored(rules, a)
        assert b.next_wakeup() == w
        assert b.handle([Tick(w)]) == a.handle([Tick(w)])
    assert cuts >= 3 and not [j for j in a.pending_jobs() if j.id.startswith("s")]


def merged_workload(seed: int, budget: int):
    """A larger mix for small budgets (a reviewer's generator, note 085's review): four
    ``_random_workload`` job sets merged (ids suffixed), submit times scaled and shifted
    to quarter seconds, durations shortened, under the first set's policy."""
    raw, out = None, []
    for k in range(4):
        policy_raw, jobs = _random_workload(seed + 100_000 * k)
        raw = raw or policy_raw
        rng = random.Random((seed + 100_000 * k) * 7 + 1)
        for spec, duration in jobs:
            submit = round(spec.submit_time * rng.choice([0.3, 0.5, 1.0]) + rng.choice([0, 0.25, 0.5, 0.75]), 2)
            out.append((replace(spec, id=f"{spec.id}x{k}" if k else spec.id, submit_time=submit),
                        duration * rng.choice([0.25, 0.5, 1.0])))
    raw["backfill"]["max_job_test"] = budget
    return raw, out


def test_resumed_walks_on_merged_workloads_never_crash():
    # review: prio_top (the highest class pending) was read over the resumed walk's heads,
    # the sub-queues not reached yet; with none left, max() of nothing (ValueError, 14);
    # before note 085 a resumed walk read a sub-queue its pass had emptied (KeyError: 45, 50)
    for seed in range(60):
        raw, jobs = merged_workload(seed, 1 + seed % 3)
        _result, calls = recorded_run(policy_from_dict(raw).rules, jobs)
        assert len(calls) > 10
