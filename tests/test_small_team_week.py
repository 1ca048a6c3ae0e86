"""Issue #3's acceptance: one synthetic week of the seed's workload under
examples/policies/small-team.yaml. Measured from the outcome, not from the policy:
inference never waits for GPUs held by lower classes (beyond the victims' grace
period), batch holds more than 2 GPUs only at night or at the weekend, no user holds
more than 1 sandbox GPU, forgotten notebooks stop at the 8 h limit."""

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from gpushepherd.sim.engine import Simulator
from gpushepherd.sim.week import DAY, H, week_policy, week_workload

BERLIN = ZoneInfo("Europe/Berlin")
T0 = datetime(2026, 11, 30, 0, 0, tzinfo=BERLIN)  # a Monday


def _t(day: int, hour: int) -> float:
    return (datetime(2026, 11, 30, hour, 0, tzinfo=BERLIN) + timedelta(days=day) - T0).total_seconds()


@pytest.fixture(scope="module")
def week():
    rules = week_policy().rules
    jobs = week_workload(seed=0)
    by_class = Simulator(rules, jobs, check_invariants=True, track_usage=lambda s: s.workload_class).run()
    by_user = Simulator(rules, jobs, track_usage=lambda s: s.user if s.workload_class == "sandbox" else None).run()
    return rules, jobs, by_class, by_user


def test_the_week_is_what_the_seed_describes_and_deterministic(week):
    _rules, jobs, _a, _b = week
    classes = {j.spec.workload_class for j in jobs}
    assert classes == {"production-inference", "training", "batch", "sandbox", "research-training"}
    assert [(j.spec, j.duration) for j in week_workload(0)] == [(j.spec, j.duration) for j in jobs]
    assert [(j.spec, j.duration) for j in week_workload(1)] != [(j.spec, j.duration) for j in jobs]
    assert all(j.spec.submit_time < 7 * DAY for j in jobs)
    assert 2 <= sum(j.spec.workload_class == "training" for j in jobs) <= 3
    # a user really asks for two notebooks at once (so the per-user cap is exercised)
    nb = sorted((j.spec.submit_time, j.spec.submit_time + j.duration) for j in jobs if j.spec.user == "nb1")
    assert any(b[0] < a[1] for a, b in zip(nb, nb[1:]))


def test_inference_never_waits_for_gpus_held_by_lower_classes(week):
    rules, jobs, res, _ = week
    grace = max(c.grace_period_s for c in rules.classes.values() if c.priority < 400)
    waited = 0
    for rec in res.records.values():
        if rec.spec.workload_class != "production-inference":
            continue
        assert rec.starts and not rec.preempted_at, rec.spec.id
        wait = rec.starts[0][0] - rec.spec.submit_time
        assert wait <= grace, (rec.spec.id, wait)
        if wait > 0:  # it waited only while its victims checkpointed: they were signalled at its submit
            waited += 1
            signalled = [r for r in res.records.values() if rec.spec.submit_time in r.preempted_at]
            assert signalled and all(r.spec.workload_class != "production-inference" for r in signalled)
    assert max(g for _t, g in res.usage_timeline["production-inference"]) == 3  # the peak replica ran
    assert waited <= 5


def test_batch_above_two_gpus_only_at_night_or_weekend(week):
    rules, _jobs, res, _ = week
    grace = rules.classes["batch"].grace_period_s
    line = res.usage_timeline["batch"] + [(res.t_last, 0)]
    days = [(_t(d, 8) + grace, _t(d, 20)) for d in range(5)]  # Mon-Fri, after the stop's grace
    night_max = 0
    for (t, gpus), (t_next, _g) in zip(line, line[1:]):
        if gpus > 2:
            night_max = max(night_max, gpus)
            for a, b in days:
                assert not (t < b and t_next > a), f"batch held {gpus} GPUs in [{t:g}, {t_next:g}) by day"
    assert night_max > 2  # the nightly batch did use the night window
    # the re-index batch ran into the day: the window's close stopped what was over 2
    stopped = [r for r in res.records.values() if r.spec.id.startswith("reindex") and r.preempted_at]
    assert stopped and all(any(t in (_t(1, 8), _t(3, 8)) for t in r.preempted_at) for r in stopped)
    assert all(r.state == "COMPLETED" for r in res.records.values() if r.spec.id.startswith("reindex"))


def test_no_user_above_one_sandbox_gpu_and_forgotten_notebooks_stop_at_8h(week):
    _rules, jobs, res, by_user = week
    assert by_user.usage_timeline and all(g <= 1 for line in by_user.usage_timeline.values() for _t, g in line)
    durations = {j.spec.id: j.duration for j in jobs}
    for rec in res.records.values():
        assert rec.state in ("COMPLETED", "TIMEOUT"), (rec.spec.id, rec.state)
        if rec.state == "TIMEOUT":
            assert rec.spec.workload_class == "sandbox" and durations[rec.spec.id] > 8 * H
            # stopped after 8 h of run time over all its runs (a preempted notebook
            # resumes from its checkpoint; sandbox grace is 0 s)
            assert rec.gpu_seconds / rec.spec.gpus == pytest.approx(8 * H)
    assert any(r.state == "TIMEOUT" for r in res.records.values())
