"""GPU usage samples in the core (note 009): idle auto-stop, peak memory against the
declaration, unmanaged GPUs."""

from __future__ import annotations

import json

import pytest
from builders import job, policy
from hypothesis import given, settings, strategies as st

from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.decisions import Start, Stop
from gpushepherd.model.events import (
    ExitStatus,
    GpuUnmanaged,
    JobFinished,
    JobSubmitted,
    Tick,
    UsageSample,
)
from gpushepherd.model.job import GpuShare, JobState
from gpushepherd.policy import PolicyError

SANDBOX = {"sandbox": {"idle_stop": {"below_util_pct": 5, "after_s": 1800, "setup_s": 300}}}


def _sched(nodes=(("n1", 2),), classes=None, **kw) -> Scheduler:
    return Scheduler(policy(nodes=nodes, classes=classes, **kw))


def _stops(decisions, reason=None):
    return [d for d in decisions if isinstance(d, Stop) and (reason is None or d.reason == reason)]


def _samples(s: Scheduler, job_id: str, times, util: float, mem: int = 0) -> list:
    out = []
    for t in times:
        out += s.handle(UsageSample(float(t), job_id, util, mem))
    return out


# ------------------------------------------------------------------ policy
def test_sandbox_idle_stop_is_on_by_default_and_others_off():
    rules = policy()
    rule = rules.classes["sandbox"].idle_stop
    assert (rule.below_util_pct, rule.after_s, rule.setup_s) == (5.0, 1800.0, 300.0)
    assert all(rules.classes[c].idle_stop is None for c in rules.classes if c != "sandbox")
    assert policy(classes={"sandbox": {"idle_stop": None}}).classes["sandbox"].idle_stop is None


@pytest.mark.parametrize("classes, field, words", [
    ({"production-inference": {"idle_stop": {"after_s": 60}}}, "classes.production-inference.idle_stop",
     "not preemptible"),
    ({"production-inference": {"memory_overrun": "stop"}}, "classes.production-inference.memory_overrun",
     "not preemptible"),
    ({"sandbox": {"idle_stop": {"below_util_pct": 101}}}, "classes.sandbox.idle_stop.below_util_pct", "100"),
    ({"sandbox": {"idle_stop": {"below_util_pct": -1}}}, "classes.sandbox.idle_stop.below_util_pct", "0"),
    ({"sandbox": {"idle_stop": {"after_s": float("nan")}}}, "classes.sandbox.idle_stop.after_s", "finite"),
    ({"sandbox": {"idle_stop": {"after_s": 0}}}, "classes.sandbox.idle_stop.after_s", "greater than 0"),
    ({"sandbox": {"idle_stop": {"setup_s": -5}}}, "classes.sandbox.idle_stop.setup_s", "greater than or equal"),
    ({"sandbox": {"memory_overrun": "kill"}}, "classes.sandbox.memory_overrun", "'warn' or 'stop'"),
])
def test_bad_usage_policy_is_refused_naming_the_field(classes, field, words):
    with pytest.raises(PolicyError) as err:
        policy(classes=classes)
    assert field in str(err.value) and words in str(err.value)


def test_a_class_made_non_preemptible_loses_the_default_idle_stop():
    assert policy(classes={"sandbox": {"preemptible": False}}).classes["sandbox"].idle_stop is None


# ------------------------------------------------------------------ idle stop
def test_idle_stop_after_exactly_after_s_of_low_samples_and_not_before():
    s = _sched(classes=SANDBOX)
    s.handle(JobSubmitted(0.0, job("s1", cls="sandbox")))
    out = _samples(s, "s1", range(300, 2100, 60), util=1.0)  # idle from 300 (end of setup)
    assert not _stops(out)
    assert s.usage_of("s1")["idle_since"] == 300.0
    assert s.next_wakeup() == 2100.0
    assert not s.handle(Tick(2099.0))
    stop = _stops(s.handle(Tick(2100.0)))
    assert [(d.job_id, d.reason, d.grace_s) for d in stop] == [("s1", "idle", 0.0)]
    assert s.jobs["s1"].state is JobState.STOPPING
    s.handle(JobFinished(2101.0, "s1", ExitStatus.TIMEOUT))
    job_ = s.jobs["s1"]
    assert job_.state is JobState.TIMEOUT and job_.stop_reason == "idle"
    assert any("idle for 1800 s below 5 % GPU utilisation" in h.reason for h in job_.history)


def test_idle_stop_grace_is_the_class_grace_period_when_checkpointable():
    s = _sched(classes={"sandbox": {**SANDBOX["sandbox"], "grace_period_s": 30}})
    s.handle(JobSubmitted(0.0, job("s1", cls="sandbox", checkpointable=True)))
    s.handle(UsageSample(400.0, "s1", 0.0, 0))
    assert [d.grace_s for d in _stops(s.handle(Tick(2200.0)), "idle")] == [30.0]


def test_a_sample_at_or_above_the_threshold_resets_idleness():
    s = _sched(classes=SANDBOX)
    s.handle(JobSubmitted(0.0, job("s1", cls="sandbox")))
    _samples(s, "s1", range(300, 1500, 60), util=2.0)
    s.handle(UsageSample(1500.0, "s1", 5.0, 0))  # exactly the threshold counts as activity
    assert s.usage_of("s1")["idle_since"] is None
    out = _samples(s, "s1", range(1560, 3360, 60), util=0.0)
    assert not _stops(out)
    assert s.next_wakeup() == 1560.0 + 1800.0
    assert _stops(s.handle(Tick(3360.0)), "idle")


def test_setup_phase_counts_as_activity():
    s = _sched(classes=SANDBOX)
    s.handle(JobSubmitted(100.0, job("s1", cls="sandbox", submit=100)))
    s.handle(UsageSample(110.0, "s1", 0.0, 0))  # a low sample inside setup
    assert s.usage_of("s1")["idle_since"] == 400.0  # run start 100 + setup 300
    assert not s.handle(Tick(2199.0))
    assert _stops(s.handle(Tick(2200.0)), "idle")


def test_a_job_without_samples_is_never_idle_stopped():
    s = _sched(classes=SANDBOX)
    s.handle(JobSubmitted(0.0, job("s1", cls="sandbox")))
    assert s.next_wakeup() is None
    assert not _stops(s.handle(Tick(10 * 86400.0)))
    assert s.jobs["s1"].state is JobState.RUNNING


def test_classes_without_idle_stop_and_non_preemptible_jobs_are_never_idle_stopped():
    s = _sched(nodes=(("n1", 4),), classes=SANDBOX)
    s.handle([JobSubmitted(0.0, job("b1", cls="batch")), JobSubmitted(0.0, job("p1", cls="production-inference")),
              JobSubmitted(0.0, job("s1", cls="sandbox", preemptible=False))])
    for t in range(300, 5000, 100):
        s.handle([UsageSample(float(t), j, 0.0, 0) for j in ("b1", "p1", "s1")])
    assert not _stops(s.handle(Tick(10000.0)))
    assert all(s.jobs[j].state is JobState.RUNNING for j in ("b1", "p1", "s1"))
    assert s.usage_of("b1")["idle_since"] is None


def test_a_new_run_starts_without_samples():
    s = _sched(nodes=(("n1", 1),), classes=SANDBOX)
    s.handle(JobSubmitted(0.0, job("s1", cls="sandbox")))
    s.handle(UsageSample(400.0, "s1", 0.0, 7000))
    s.handle(JobFinished(500.0, "s1", ExitStatus.PREEMPTED))  # checkpointed and requeued, restarts at once
    assert s.jobs["s1"].runs == 2 and s.jobs["s1"].state is JobState.RUNNING
    view = s.usage_of("s1")
    assert view["samples"] == 0 and view["idle_since"] is None and view["run_peak_mib"] == 0
    assert view["peak_mib"] == 7000
    assert not _stops(s.handle(Tick(2300.0)))  # the first run's idle deadline is stale


def test_bad_samples_are_refused_naming_the_field():
    s = _sched(classes=SANDBOX)
    s.handle(JobSubmitted(0.0, job("s1", cls="sandbox")))
    for util, mem, field in ((101.0, 0, "gpu_util_pct"), (float("nan"), 0, "gpu_util_pct"), (1.0, -1, "mem_used_mib")):
        with pytest.raises(ValueError, match=field):
            s.handle(UsageSample(10.0, "s1", util, mem))
    assert s.usage_of("s1")["samples"] == 0
    assert not s.handle(UsageSample(10.0, "nobody", 1.0, 0))  # unknown job: a no-op


# ------------------------------------------------------------------ memory
def _mem_sched(overrun: str, nodes=None):
    nodes = nodes or [{"name": "n1", "gpus": 2, "gpu_type": "A100-80GB", "gpu_mem_mib": 81920,
                       "sharing": {"time_slicing": {"replicas": 4}}}]
    return _sched(nodes=nodes, classes={"sandbox": {"idle_stop": None, "memory_overrun": overrun}})


@pytest.mark.parametrize("overrun, stopped", [("warn", False), ("stop", True)])
def test_memory_over_declaration_on_a_shared_gpu_warns_or_stops(overrun, stopped):
    s = _mem_sched(overrun)
    share = GpuShare("time_slice", mem_mib=20000, slots=1)
    s.handle(JobSubmitted(0.0, job("s1", cls="sandbox", share=share)))
    assert not s.handle(UsageSample(10.0, "s1", 50.0, 20000))  # at the declaration: fine
    assert not s.usage_of("s1")["over"]
    out = s.handle(UsageSample(20.0, "s1", 50.0, 30000))
    view = s.usage_of("s1")
    assert view["over"] and view["over_at"] == 20.0 and view["declared_mib"] == 20000 and view["run_peak_mib"] == 30000
    assert [(d.reason, d.grace_s) for d in _stops(out)] == ([("memory-overrun", 0.0)] if stopped else [])
    s.handle(UsageSample(30.0, "s1", 50.0, 31000))
    flags = [h for h in s.jobs["s1"].history if "over the 20000 MiB declared" in h.reason]
    assert len(flags) == (2 if stopped else 1)  # the flag once per run (plus the stop's own line)
    if stopped:
        s.handle(JobFinished(31.0, "s1", ExitStatus.TIMEOUT))
        assert s.jobs["s1"].state is JobState.FAILED


def test_memory_over_declaration_on_a_whole_gpu_is_only_flagged():
    s = _mem_sched("stop")
    s.handle(JobSubmitted(0.0, job("w1", cls="sandbox", gpu_mem_mib=40000)))
    out = s.handle(UsageSample(10.0, "w1", 50.0, 60000))
    assert not _stops(out) and s.usage_of("w1")["over"]
    assert s.jobs["w1"].state is JobState.RUNNING


def test_a_job_that_declares_no_memory_is_never_flagged():
    s = _mem_sched("stop")
    s.handle(JobSubmitted(0.0, job("w1", cls="sandbox")))
    s.handle(UsageSample(10.0, "w1", 50.0, 80000))
    assert s.usage_of("w1")["declared_mib"] is None and not s.usage_of("w1")["over"]


# ------------------------------------------------------------------ unmanaged GPUs
def test_unmanaged_gpu_is_not_allocated_until_released_and_its_holder_keeps_it():
    s = _sched(nodes=(("n1", 2),))
    out = s.handle(JobSubmitted(0.0, job("a", gpus=1)))
    assert out[0].placement.parts == (("n1", (0,)),)
    assert not s.handle(GpuUnmanaged(1.0, "n1", 0, True))  # a's GPU: a keeps running
    assert s.jobs["a"].state is JobState.RUNNING
    s.handle(GpuUnmanaged(2.0, "n1", 1, True))
    assert s.unmanaged_gpus() == [("n1", 0), ("n1", 1)]
    assert not s.handle(JobSubmitted(3.0, job("b", gpus=1, submit=3)))
    assert str(s.pending_reason("b")) == "Resources(unmanaged:n1:0,n1:1)"
    assert not s.handle(JobFinished(4.0, "a", ExitStatus.COMPLETED))  # its GPU stays out
    assert s.stranded_capacity()["free_gpus"] == 0
    out = s.handle(GpuUnmanaged(5.0, "n1", 1, False))
    assert [(d.job_id, d.placement.parts) for d in out if isinstance(d, Start)] == [("b", (("n1", (1,)),))]
    s.check_invariants()


def test_unmanaged_gpu_takes_no_new_shares_and_unknown_gpus_are_refused():
    s = _mem_sched("warn")
    share = GpuShare("time_slice", mem_mib=1000, slots=1)
    s.handle([JobSubmitted(0.0, job("s1", cls="sandbox", share=share)), GpuUnmanaged(0.0, "n1", 1, True)])
    s.handle(GpuUnmanaged(1.0, "n1", 0, True))
    assert not s.handle(JobSubmitted(2.0, job("s2", cls="sandbox", share=share, submit=2)))
    assert s.pending_reason("s2").detail.startswith("unmanaged:")
    out = s.handle(GpuUnmanaged(3.0, "n1", 0, False))
    assert [d.job_id for d in out if isinstance(d, Start)] == ["s2"]
    with pytest.raises(ValueError, match="node: 'nx'"):
        s.handle(GpuUnmanaged(4.0, "nx", 0, True))
    with pytest.raises(ValueError, match="gpu: 7"):
        s.handle(GpuUnmanaged(4.0, "n1", 7, True))


def test_no_preemption_for_a_gpu_that_its_victim_would_not_free():
    s = _sched(nodes=(("n1", 1),))
    s.handle(JobSubmitted(0.0, job("low", cls="sandbox")))
    s.handle(GpuUnmanaged(1.0, "n1", 0, True))
    out = s.handle(JobSubmitted(2.0, job("high", cls="training", submit=2)))
    assert not out and s.jobs["low"].state is JobState.RUNNING
    assert s.pending_reason("high").detail == "unmanaged:n1:0"


# ------------------------------------------------------------------ restore
def test_restore_carries_tracks_and_unmanaged_gpus_and_decides_the_same():
    def build():
        s = _sched(nodes=(("n1", 3),), classes=SANDBOX)
        s.handle([JobSubmitted(0.0, job("s1", cls="sandbox")), JobSubmitted(0.0, job("s2", cls="sandbox",
                                                                                     gpu_mem_mib=100))])
        s.handle([UsageSample(400.0, "s1", 1.0, 10), UsageSample(400.0, "s2", 50.0, 500)])
        s.handle(GpuUnmanaged(500.0, "n1", 0, True))
        return s

    later = [UsageSample(600.0, "s2", 1.0, 20), JobSubmitted(700.0, job("s3", cls="sandbox", submit=700)),
             Tick(2200.0), JobFinished(2201.0, "s1", ExitStatus.TIMEOUT), JobSubmitted(2300.0, job("s4", submit=2300)),
             Tick(2400.0)]
    a = build()
    b = Scheduler.restore(a.rules, json.loads(json.dumps(a.snapshot())))
    assert b.unmanaged_gpus() == a.unmanaged_gpus() == [("n1", 0)]
    assert b.usage_of("s2") == a.usage_of("s2") and b.next_wakeup() == a.next_wakeup()
    for e in later:
        assert a.handle(e) == b.handle(e)
    assert {j: s.state for j, s in a.jobs.items()} == {j: s.state for j, s in b.jobs.items()}
    assert a.usage_of("s1") == b.usage_of("s1")


# ------------------------------------------------------------------ property
@settings(max_examples=60, deadline=None)
@given(st.data())
def test_property_idle_stops_only_after_a_full_low_window(data):
    after, setup, thr = 600.0, 100.0, 5.0
    s = _sched(nodes=(("n1", 2), ("n2", 2)),
               classes={"sandbox": {"idle_stop": {"below_util_pct": thr, "after_s": after, "setup_s": setup}}})
    classes = ["sandbox", "batch", "production-inference"]
    samples: dict[str, list[tuple[float, float, int]]] = {}  # job -> (t, util, run)
    t = 0.0
    n = 0
    for _ in range(data.draw(st.integers(5, 40))):
        t += data.draw(st.sampled_from([0.0, 30.0, 100.0, 250.0, 600.0]))
        events = []
        kind = data.draw(st.sampled_from(["submit", "sample", "sample", "unmanaged", "finish", "tick"]))
        running = sorted(j for j, x in s.jobs.items() if x.state is JobState.RUNNING)
        if kind == "submit":
            n += 1
            events.append(JobSubmitted(t, job(f"j{n}", cls=data.draw(st.sampled_from(classes)), submit=t)))
        elif kind == "sample" and running:
            jid = data.draw(st.sampled_from(running))
            util = data.draw(st.sampled_from([0.0, 4.9, 5.0, 50.0]))
            events.append(UsageSample(t, jid, util, 0))
            samples.setdefault(jid, []).append((t, util, s.jobs[jid].runs))
        elif kind == "unmanaged":
            events.append(GpuUnmanaged(t, data.draw(st.sampled_from(["n1", "n2"])), data.draw(st.integers(0, 1)),
                                       data.draw(st.booleans())))
        elif kind == "finish" and running:
            events.append(JobFinished(t, data.draw(st.sampled_from(running)), ExitStatus.COMPLETED))
        else:
            events.append(Tick(t))
        out = s.handle(events)
        s.check_invariants()
        for d in out:
            if isinstance(d, Start):
                for node_name, gpus in d.placement.parts:
                    for g in gpus:  # an unmanaged GPU is never newly allocated
                        assert (node_name, g) not in set(s.unmanaged_gpus())
            if isinstance(d, Stop) and d.reason == "idle":
                job_ = s.jobs[d.job_id]
                assert job_.cls.idle_stop is not None and job_.preemptible
                run_start = job_.run_start
                assert t >= run_start + setup + after
                mine = [(st_, u) for st_, u, r in samples.get(d.job_id, []) if r == job_.runs]
                assert mine, "stopped without a sample"
                last_high = max((st_ for st_, u in mine if u >= thr), default=None)
                window = [u for st_, u in mine if st_ > t - after]
                assert all(u < thr for u in window)
                assert last_high is None or last_high <= t - after
