"""Core v2 (issue 20, design note 015): the observations the scenario format cannot show.

Each test names the observation of issue 20 it reproduces and states the outcome note
015 requires, worked out by hand. They drive the public ``Scheduler`` API only
(``handle``, ``pending_reason``, ``next_wakeup``, ``snapshot`` / ``restore``,
``pending_jobs``, ``estimated_start`` and the new ``estimated_starts``) and the
simulator.

On the core of c59315f they fail (or error: ``estimated_starts`` does not exist yet);
the comment above each says how. The scenario files ``examples/scenarios/V2-*.yaml``
hold the observations a scenario can express.
"""

from __future__ import annotations

import json
import random

import pytest

from builders import STANDARD_CLASSES, job, policy, policy_dict
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.decisions import Preempt, Start
from gpushepherd.model.events import JobFinished, JobSubmitted, Tick
from gpushepherd.model.job import ExitStatus
from gpushepherd.policy import policy_from_dict
from gpushepherd.sim.engine import SimJob, Simulator


# ------------------------------------------------------------------ helpers
def recorded_run(rules, jobs, events=()):
    """Run ``jobs`` (``(spec, duration)``) through the simulator; returns the result and
    every ``Scheduler.handle`` call as ``(batch, decisions)``, in order."""
    sim = Simulator(rules, [SimJob(s, d) for s, d in jobs], list(events))
    calls: list[tuple[list, list]] = []
    inner = sim.sched.handle

    def handle(events):
        batch = list(events)
        out = inner(batch)
        calls.append((batch, list(out)))
        assert len(calls) < 2000, "runaway simulation"
        return out

    sim.sched.handle = handle
    return sim.run(), calls


def restored(rules, sched: Scheduler) -> Scheduler:
    """A new core from ``sched``'s snapshot (through JSON, as a restart reads it)."""
    return Scheduler.restore(rules, json.loads(json.dumps(sched.snapshot())))


def divergences(rules, calls) -> list[str]:
    """Where a restored core (whose first pass is a full pass) decides otherwise than the
    uninterrupted one: for every cut, restore after ``calls[:cut]`` and feed both the
    rest; and after every instant, a second full pass at the same instant (restore, then
    ``Tick(now)``) must decide nothing. Returns one line per difference (empty: none)."""
    out: list[str] = []
    for cut in range(1, len(calls)):
        a = Scheduler(rules)
        for batch, _ in calls[:cut]:
            a.handle(batch)
        again = restored(rules, a).handle([Tick(a.now)])
        if again:
            out.append(f"after t={a.now:g}: a second full pass at the same instant decided {again}")
        b = restored(rules, a)
        for batch, _ in calls[cut:]:
            got_a, got_b = a.handle(batch), b.handle(batch)
            if got_a != got_b:
                out.append(f"restored after call {cut}, at t={batch[0].t:g}: restored {got_b}, uninterrupted {got_a}")
                break
    return out


def planned(sched: Scheduler, *job_ids: str) -> dict[str, float | None]:
    """``estimated_start`` of each job."""
    return {j: sched.estimated_start(j) for j in job_ids}


def basis(sched: Scheduler, job_id: str) -> str:
    """What the estimate of ``job_id`` rests on (``estimated_starts()``), checked to
    agree with ``estimated_start``."""
    est = sched.estimated_starts()[job_id]
    assert est.t == sched.estimated_start(job_id)
    return est.basis


# ============================================================ observation 11
# Incremental pass == full pass == restore. Reproducers found by a seeded search over
# small workloads mixing class reservations, cohorts, fair-share, grace periods and
# time limits, then shrunk by hand.

#: a preemption waiting for its victim's minimum runtime: an exit in between (S at 13)
#: moved the uninterrupted core's wake-up to 13 + 5 = 18; a restored core preempts at
#: 15, when V comes of age (the scenario V2-11 shows the same run).
MIN_RUNTIME = (
    policy_dict([("n1", 4), ("n2", 2), ("n3", 1)], preemption={"enabled": True, "min_runtime_s": 5.0}),
    [(job("S", 2, "batch", "u", 3), 10.0),
     (job("V", 4, "batch", "u", 10), 50.0),
     (job("P", 4, "research-training", "u", 11), 49.0)],
)

#: production inference reserves 1 of 6 GPUs. J6 (training, 4) preempts B (batch, 2)
#: at 11 and runs on n2; B waits (it would take the reserved GPU, n1's 2 free GPUs being
#: all there is); S (sandbox, 1) starts at 25 on n1. At 57 (a stale time-limit wake-up)
#: a full pass let B preempt S and take both of n1's GPUs - the reserved one included
#: (observation 4's fault on the full pass only); the uninterrupted core did nothing.
CLASS_HOLD = (
    policy_dict([("n1", 2), ("n2", 4)], classes={"production-inference": {"reserved_gpus": 1}}, backfill=2),
    [(job("S", 1, "sandbox", "a", 25), 59.0),
     (job("B", 2, "batch", "b", 5), 38.0),
     (job("R", 1, "research-training", "a", 4, time_limit_s=53.0), 7.0),
     (job("J6", 4, "training", "a", 11), 57.0)],
)

#: backfill off (strict order); J (2 GPUs) can never fit beside the reserved GPU. A
#: pass over the new job K only treated J as blocked by capacity and held K back; a
#: full pass skips J (ExceedsCapacity) and starts K (scenario V2-12-never-fits).
NEVER_FITS_STRICT = (
    policy_dict([("n1", 2)], classes={"production-inference": {"reserved_gpus": 1}}, backfill=False),
    [(job("J", 2, "batch", "c", 2), 3.0),
     (job("K", 1, "batch", "c", 4), 8.0)],
)

#: J7 (training, estimate 40) preempts the sandbox job at 22 to run in the hole before
#: the reservation of J2 (inference, 4 GPUs); the uninterrupted core then let J4
#: (training, queued ahead, no estimate) take the freed GPUs, a restored core did not
#: preempt at all.
HOLD_AHEAD = (
    policy_dict([("n1", 2), ("n2", 2)], backfill=1),
    [(job("J1", 2, "sandbox", "a", 6, runtime_estimate_s=36.0), 35.0),
     (job("J2", 4, "production-inference", "a", 17), 16.0),
     (job("J3", 1, "production-inference", "c", 14, time_limit_s=75.0), 47.0),
     (job("J4", 2, "training", "c", 19), 2.0),
     (job("J7", 2, "training", "a", 22, runtime_estimate_s=40.0), 26.0)],
)


@pytest.mark.parametrize("case", [MIN_RUNTIME, CLASS_HOLD, NEVER_FITS_STRICT, HOLD_AHEAD],
                         ids=["min_runtime", "class_hold", "never_fits_strict", "hold_ahead"])
def test_restore_and_a_second_full_pass_change_no_decision(case):
    # c59315f: each case diverges (restored core preempts / starts where the
    # uninterrupted one did not, or the reverse)
    raw, jobs = case
    rules = policy_from_dict(raw).rules
    _result, calls = recorded_run(rules, jobs)
    assert divergences(rules, calls) == []


def test_min_runtime_preemption_happens_when_the_victim_comes_of_age():
    # c59315f: V is preempted at 18, not 15 (and P waits until 18)
    raw, jobs = MIN_RUNTIME
    result, _ = recorded_run(policy_from_dict(raw).rules, jobs)
    assert result.records["V"].preempted_at == [15.0]
    assert [t for t, _ in result.records["P"].starts] == [15.0]


def test_a_full_pass_never_preempts_into_a_class_reservation():
    # c59315f: a restored core at t=57 preempts S for B, and B then holds n1's 2 GPUs
    # with 4 more taken by J6: 6 of 6 GPUs to other classes than inference
    raw, jobs = CLASS_HOLD
    rules = policy_from_dict(raw).rules
    result, calls = recorded_run(rules, jobs)
    assert result.records["S"].preempted_at == []
    cut = next(i for i, (batch, _) in enumerate(calls) if batch[0].t >= 57.0)
    a = Scheduler(rules)
    for batch, _ in calls[:cut]:
        a.handle(batch)
    b = restored(rules, a)
    assert not [d for d in b.handle(calls[cut][0]) if isinstance(d, Preempt)]


def test_strict_order_does_not_wait_behind_a_job_that_can_never_fit():
    # c59315f: K waits "Priority(not reached by the last pass)" for ever
    raw, jobs = NEVER_FITS_STRICT
    result, _ = recorded_run(policy_from_dict(raw).rules, jobs)
    assert [t for t, _ in result.records["K"].starts] == [4.0]
    assert result.records["J"].starts == []


def _random_workload(seed: int):
    """A small random cluster and workload mixing class reservations, cohorts,
    fair-share, grace periods, time limits, estimates and gangs (seeded)."""
    rng = random.Random(seed)
    sizes = [rng.choice([1, 2, 2, 4, 4, 8]) for _ in range(rng.randint(1, 3))]
    total = sum(sizes)
    teams: dict = {"a": {}, "b": {}, "c": {}}
    classes: dict = {}
    extra: dict = {}
    reserved = 0
    if rng.random() < 0.5:
        reserved = rng.randint(1, max(1, total // 4))
        classes["production-inference"] = {"reserved_gpus": reserved}
    if rng.random() < 0.6:
        na = rng.randint(0, total - reserved)
        nb = rng.randint(0, total - reserved - na)
        teams["a"]["nominal_gpus"], teams["b"]["nominal_gpus"] = na, nb
        extra["cohorts"] = {"co": {"members": ["a", "b"], "reclaim": rng.choice(["any", "lower_priority", "any"])}}
    if rng.random() < 0.3:
        teams["c"]["max_gpus"] = rng.randint(1, total)
    for cls in ("training", "batch", "sandbox"):
        if rng.random() < 0.3:
            classes.setdefault(cls, {})["grace_period_s"] = float(rng.randint(1, 20))
    if rng.random() < 0.5:
        extra["priority"] = {"weights": {"fair_share": 1000.0}, "recalc_s": 10.0}
    raw = policy_dict([(f"n{i + 1}", g) for i, g in enumerate(sizes)], teams=teams, classes=classes,
                      preemption={"enabled": rng.random() < 0.8, "min_runtime_s": float(rng.choice([0, 0, 5]))},
                      backfill={"enabled": rng.random() < 0.8, "reservations": rng.randint(1, 2)}, **extra)
    jobs = []
    for i in range(rng.randint(2, 10)):
        gpus = rng.choice([1, 1, 1, 2, 2, 4, 4, 8])
        kw: dict = {}
        if rng.random() < 0.25:
            kw["gpus_per_pod"] = rng.choice([d for d in range(1, gpus + 1) if gpus % d == 0])
        kw["checkpointable"] = rng.choice([None, None, True, False])
        if rng.random() < 0.3:
            kw["time_limit_s"] = float(rng.randint(1, 80))
        if rng.random() < 0.5:
            kw["runtime_estimate_s"] = float(rng.randint(1, 80))
        cls = rng.choice(STANDARD_CLASSES)
        spec = job(f"j{i + 1}", gpus, cls, rng.choice(["a", "b", "c"]), submit=float(rng.randint(0, 30)),
                   user=rng.choice(["u1", "u2"]), **kw)
        jobs.append((spec, float(rng.randint(1, 60))))
    return raw, jobs


def random_divergences(seeds, change=None) -> list[str]:
    """``divergences`` of ``_random_workload(seed)`` for each seed (its policy mapping
    first given to ``change``), one line per workload that diverges."""
    bad = []
    for seed in seeds:
        raw, jobs = _random_workload(seed)
        if change is not None:
            change(raw)
        rules = policy_from_dict(raw).rules
        _result, calls = recorded_run(rules, jobs)
        found = divergences(rules, calls)
        if found:
            bad.append(f"seed {seed}: {found[0]}")
    return bad


def test_restore_changes_no_decision_on_random_mixed_workloads():
    # c59315f: seeds 39, 117, 150 and 223 diverge (about 1 workload in 60)
    assert random_divergences(range(240)) == []


def test_a_reasons_time_point_names_a_daemons_epoch_time_exactly():
    # found on a live run (bench/reasons.py --db): the daemon's times are epoch seconds
    # and `:g` printed "victims eligible at t=1.79654e+09", a day before the wake-up
    raw, _jobs = MIN_RUNTIME
    t0 = 1_796_541_000.25
    sched = Scheduler(policy_from_dict(raw).rules)
    sched.handle([JobSubmitted(t0 + 3.0, job("S", 2, "batch", "u", t0 + 3))])
    sched.handle([JobSubmitted(t0 + 10.0, job("V", 4, "batch", "u", t0 + 10))])
    sched.handle([JobSubmitted(t0 + 11.0, job("P", 4, "research-training", "u", t0 + 11))])
    assert sched.next_wakeup() == t0 + 15.0
    assert str(sched.pending_reason("P")) == "NoPreemptibleVictims(min_runtime: victims eligible at t=1796541015.25)"


# ============================================================ observation 12
# (the part a scenario cannot show: the wake-up at the instant a victim comes of age)
def test_the_core_wakes_when_a_too_young_victim_becomes_one():
    # c59315f: after S's exit at 13 next_wakeup() is 18 (13 + min_runtime_s), not 15
    raw, _jobs = MIN_RUNTIME
    sched = Scheduler(policy_from_dict(raw).rules)
    sched.handle([JobSubmitted(3.0, job("S", 2, "batch", "u", 3))])
    sched.handle([JobSubmitted(10.0, job("V", 4, "batch", "u", 10))])
    sched.handle([JobSubmitted(11.0, job("P", 4, "research-training", "u", 11))])
    assert sched.next_wakeup() == 15.0
    assert str(sched.pending_reason("P")) == "NoPreemptibleVictims(min_runtime: victims eligible at t=15)"
    sched.handle([JobFinished(13.0, "S", ExitStatus.COMPLETED)])
    assert sched.next_wakeup() == 15.0
    out = sched.handle([Tick(15.0)])
    assert [(d.job_id, d.preemptor) for d in out if isinstance(d, Preempt)] == [("V", "P")]


# ============================================================ observation 14
# An estimated start for every pending job (Slurm's squeue --start): conservative
# planning in queue order on the time profile.
def _busy_one_gpu(**x_kw):
    """One 1-GPU node that X (started at 0) holds; returns the scheduler."""
    sched = Scheduler(policy(nodes=[("n1", 1)], preemption=False))
    out = sched.handle([JobSubmitted(0.0, job("X", 1, "batch", "u", 0, **x_kw))])
    assert [d.job_id for d in out if isinstance(d, Start)] == ["X"]
    return sched


def test_every_waiting_job_gets_an_estimate_from_runtime_estimates():
    # c59315f: estimated_starts() does not exist; estimated_start gives A's 100 only
    # (the reservation holder) and None for B and C
    sched = _busy_one_gpu(runtime_estimate_s=100.0)
    sched.handle([JobSubmitted(10.0, job("A", 1, "batch", "u", 10, runtime_estimate_s=100.0)),
                  JobSubmitted(10.0, job("B", 1, "batch", "u", 10, runtime_estimate_s=50.0)),
                  JobSubmitted(10.0, job("C", 1, "batch", "u", 10, runtime_estimate_s=200.0))])
    # X ends at 100; A runs 100-200, B 200-250, then C
    assert planned(sched, "A", "B", "C") == {"A": 100.0, "B": 200.0, "C": 250.0}
    assert {basis(sched, j) for j in ("A", "B", "C")} == {"estimates"}


def test_estimates_from_time_limits_say_so():
    # c59315f: estimated_start(B) is None; estimated_starts() does not exist
    sched = _busy_one_gpu(time_limit_s=100.0)
    sched.handle([JobSubmitted(10.0, job("A", 1, "batch", "u", 10, time_limit_s=100.0)),
                  JobSubmitted(10.0, job("B", 1, "batch", "u", 10, time_limit_s=50.0))])
    assert planned(sched, "A", "B") == {"A": 100.0, "B": 200.0}
    assert (basis(sched, "A"), basis(sched, "B")) == ("time limits", "time limits")


def test_deep_estimates_hold_each_claim_from_its_start():
    # c59315f: Y is planned at 300 (claims are held from now, so W's claim on n1 never
    # ends) and Z gets no plan.
    # n1 (2 GPUs) is X1's until 100, n2 (2) has X2 on one GPU until 300. W (2 GPUs, one
    # node) can start on n1 at 100 and runs to 150; Y (2, one node) then on n1 at 150
    # (n2 is busy until 300) to 200; Z (two pods of 2) needs both nodes whole: 300.
    sched = Scheduler(policy(nodes=[("n1", 2), ("n2", 2)], preemption=False, backfill=3))
    sched.handle([JobSubmitted(0.0, job("X1", 2, "batch", "u", 0, runtime_estimate_s=100.0)),
                  JobSubmitted(0.0, job("X2", 1, "batch", "u", 0, runtime_estimate_s=300.0))])
    sched.handle([JobSubmitted(10.0, job("W", 2, "batch", "u", 10, runtime_estimate_s=50.0)),
                  JobSubmitted(10.0, job("Y", 2, "batch", "u", 10, runtime_estimate_s=50.0)),
                  JobSubmitted(10.0, job("Z", 4, "batch", "u", 10, gpus_per_pod=2, runtime_estimate_s=50.0))])
    assert planned(sched, "W", "Y", "Z") == {"W": 100.0, "Y": 150.0, "Z": 300.0}


def test_a_job_blocked_by_its_quota_is_estimated_when_the_quota_frees():
    # c59315f: estimated_start(J2) is None
    sched = Scheduler(policy(nodes=[("n1", 4)], teams={"T": {"max_gpus": 1}}, preemption=False))
    sched.handle([JobSubmitted(0.0, job("J1", 1, "batch", "T", 0, runtime_estimate_s=100.0))])
    sched.handle([JobSubmitted(10.0, job("J2", 1, "batch", "T", 10, runtime_estimate_s=100.0))])
    assert str(sched.pending_reason("J2")).startswith("QuotaExceeded")
    assert planned(sched, "J2") == {"J2": 100.0}


def test_a_preemptor_is_estimated_at_its_victims_exit_not_now():
    # c59315f: estimated_start(P) is 10 ("now") though P waits for V's 60 s grace
    # period
    sched = Scheduler(policy(nodes=[("n1", 1)], classes={"batch": {"grace_period_s": 60.0}}))
    sched.handle([JobSubmitted(0.0, job("V", 1, "batch", "u", 0))])
    out = sched.handle([JobSubmitted(10.0, job("P", 1, "training", "u", 10))])
    assert [(d.job_id, d.grace_s) for d in out if isinstance(d, Preempt)] == [("V", 60.0)]
    assert planned(sched, "P") == {"P": 70.0}


def test_no_estimate_when_the_job_waited_for_has_no_end():
    # c59315f: estimated_starts() does not exist (estimated_start(A) is None already)
    sched = _busy_one_gpu()  # X: no estimate, no time limit
    sched.handle([JobSubmitted(10.0, job("A", 1, "batch", "u", 10, runtime_estimate_s=10.0))])
    assert planned(sched, "A") == {"A": None}
    assert sched.estimated_starts().get("A") is None


def test_estimates_are_exact_with_true_durations_and_never_in_the_past():
    # c59315f: estimated_starts() does not exist. One node, one class, FIFO, preemption off, every
    # job reserved (depth above the queue), estimates = true durations: a job's estimate
    # at submit is its actual start, and no pending job is ever estimated at or before
    # the current time.
    rules = policy(nodes=[("n1", 4)], preemption=False, backfill=50)
    rng = random.Random(20)
    jobs = []
    for i in range(14):
        d = float(rng.randint(5, 60))
        jobs.append((job(f"j{i + 1:02d}", rng.choice([1, 1, 2, 2, 3, 4]), "batch", "u", float(rng.randint(0, 40)),
                         runtime_estimate_s=d), d))
    sim = Simulator(rules, [SimJob(s, d) for s, d in jobs], [])
    sched = sim.sched
    inner = sched.handle
    at_submit: dict[str, float | None] = {}
    stale: list[str] = []

    def handle(events):
        batch = list(events)
        out = inner(batch)
        est = sched.estimated_starts()
        for job_ in sched.pending_jobs():
            e = est.get(job_.id)
            if e is not None and e.t <= sched.now:
                stale.append(f"t={sched.now:g}: {job_.id} estimated at {e.t:g}")
        for e in batch:
            if isinstance(e, JobSubmitted):
                started = any(isinstance(d, Start) and d.job_id == e.spec.id for d in out)
                at_submit[e.spec.id] = e.t if started else (est[e.spec.id].t if e.spec.id in est else None)
        return out

    sched.handle = handle
    result = sim.run()
    assert stale == []
    actual = {j: r.starts[0][0] for j, r in result.records.items()}
    assert at_submit == actual


# ============================================================ observation 15
# backfill.max_job_test counts only jobs that do not start; a pass cut short asks for a
# wake-up one second later.
def test_jobs_that_start_do_not_count_against_max_job_test():
    # c59315f: 10 of the 25 start, 15 wait "Priority(not reached by the last pass)" with
    # 30 GPUs free and next_wakeup() None
    sched = Scheduler(policy(nodes=[("n1", 8), ("n2", 8), ("n3", 8), ("n4", 8), ("n5", 8)],
                             backfill={"enabled": True, "max_job_test": 10}))
    out = sched.handle([JobSubmitted(0.0, job(f"j{i:02d}", 1, "batch", "u", 0)) for i in range(25)])
    assert len([d for d in out if isinstance(d, Start)]) == 25
    assert sched.pending_jobs() == []


def _cut_short():
    """n1 (4 GPUs) is X's until 1000 by its estimate, n2 (4) is free. B (two pods of 4:
    both nodes whole) is reserved at 1000, which reaches the reservation depth (1).
    L1-L4 are of teams Q1-Q4, which may hold nothing (max_gpus 0): they never start. S (1
    GPU, estimate 100, last in the queue) delays nothing and could start at once.
    max_job_test 3: the pass stops after testing L1-L3."""
    teams = {"u": {}, **{f"Q{i}": {"max_gpus": 0} for i in range(1, 5)}}
    sched = Scheduler(policy(nodes=[("n1", 4), ("n2", 4)], teams=teams, preemption=False,
                             backfill={"enabled": True, "reservations": 1, "max_job_test": 3}))
    sched.handle([JobSubmitted(0.0, job("X", 4, "batch", "u", 0, runtime_estimate_s=1000.0))])
    batch = [JobSubmitted(10.0, job("B", 8, "batch", "u", 10, gpus_per_pod=4, runtime_estimate_s=100.0))]
    batch += [JobSubmitted(10.0, job(f"L{i}", 1, "batch", f"Q{i}", 10, runtime_estimate_s=100.0)) for i in range(1, 5)]
    batch.append(JobSubmitted(10.0, job("S", 1, "batch", "u", 10, runtime_estimate_s=100.0)))
    return sched, sched.handle(batch)


def test_a_pass_cut_short_by_max_job_test_asks_for_a_wakeup():
    # c59315f: next_wakeup() is None (X has no time limit; nothing else is timed)
    sched, out = _cut_short()
    assert not [d for d in out if isinstance(d, Start) and d.job_id.startswith("L")]
    assert sched.next_wakeup() == 11.0


def test_the_core_reaches_the_rest_of_the_queue_on_its_own_wakeups():
    # c59315f: no wake-up, so S (which delays nothing) waits for an unrelated event.
    # Driven by the core's own wake-ups only, S starts within a few seconds (a pass
    # that starts again from the head of the queue and stops at L3 again never gets
    # there: the pass after a cut-short one must get further).
    sched, out = _cut_short()
    started = {d.job_id for d in out if isinstance(d, Start)}
    for _ in range(10):
        if "S" in started:
            break
        wake = sched.next_wakeup()
        assert wake is not None and wake <= sched.now + 1.0, f"t={sched.now:g}: next wake-up {wake}"
        started |= {d.job_id for d in sched.handle([Tick(wake)]) if isinstance(d, Start)}
    assert "S" in started
    assert not started & {"L1", "L2", "L3", "L4"}


def test_estimates_of_two_waiting_jobs_beside_a_class_reservation():
    """Found by a newcomer on a live server (``shepherd queue`` answered 500, the loop
    stalled): with a class's ``reserved_gpus``, the second waiting job is planned against
    the first one's claim, which had no class (``AttributeError: '_QuotaClaim' object has
    no attribute 'cls'``). The oracle now asks ``estimated_starts()`` after every instant
    (property ``h_estimates``): 89 of seeds 0-599 crashed so before the fix."""
    rules = policy([("n1", 4)], classes={"production-inference": {"reserved_gpus": 1}})
    sched = Scheduler(rules)
    out = sched.handle([JobSubmitted(0.0, job("A", 3, "batch", time_limit_s=100.0)),
                        JobSubmitted(0.0, job("B", 1, "batch", submit=1, time_limit_s=100.0)),
                        JobSubmitted(0.0, job("C", 1, "batch", submit=2, time_limit_s=100.0))])
    assert [d.job_id for d in out if isinstance(d, Start)] == ["A"]  # B, C: the 4th GPU is inference's
    est = sched.estimated_starts()
    # at 100 A's 3 GPUs come free: 4 free, 1 kept for inference, so both fit then
    assert {j: (e.t, e.basis) for j, e in est.items()} == {"B": (100.0, "time limits"), "C": (100.0, "time limits")}


def test_a_planned_job_of_a_reserved_class_fills_its_reservation_in_the_estimates():
    """The estimates' plan counts a planned job of a class with ``reserved_gpus`` as
    filling that reservation, as a pass's reservation does: at 100, P (inference, 2 GPUs)
    covers inference's 1 reserved GPU, so B (batch, 2) fits beside it then, not after P."""
    rules = policy([("n1", 4)], classes={"production-inference": {"reserved_gpus": 1}}, preemption=False)
    sched = Scheduler(rules)
    sched.handle([JobSubmitted(0.0, job("A", 3, "batch", time_limit_s=100.0))])  # A runs; GPU 4 is reserved
    sched.handle([JobSubmitted(1.0, job("P", 2, "production-inference", submit=1, time_limit_s=50.0)),
                  JobSubmitted(1.0, job("B", 2, "batch", submit=1, time_limit_s=100.0))])
    assert [j.id for j in sched.pending_jobs()] == ["P", "B"]
    assert {j: e.t for j, e in sched.estimated_starts().items()} == {"P": 100.0, "B": 100.0}
