"""Policy rules Kueue, Slurm and Kubernetes users reach for (issue 13; design note 027),
each through the core's one admission rule, with a hand-computed scenario."""

from __future__ import annotations

import pytest
from builders import job, policy, simulate

from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.events import JobSubmitted
from gpushepherd.core.intake import SpecError


# ------------------------------------------------------------ 6. per-job grace period
def test_a_job_s_own_grace_period_shortens_its_preemption_and_the_class_s_is_the_default():
    # 2 GPUs; training's grace is 60 s. V1 asks for 5 s, V2 takes the class's 60 s. At
    # 10, P (production inference, 1 GPU) preempts the youngest victim: V2 (submitted
    # later) - it keeps its GPU 60 s, P starts at 70. Q at 100 preempts V1: 5 s, so 105.
    rules = policy(nodes=[("n1", 2)], classes={"training": {"grace_period_s": 60.0}})
    result = simulate(rules, [
        (job("V1", 1, "training", "t", 0, checkpointable=True, grace_period_s=5.0), 1000.0),
        (job("V2", 1, "training", "t", 1, checkpointable=True), 1000.0),
        (job("P", 1, "production-inference", "t", 10), 500.0),
        (job("Q", 1, "production-inference", "t", 100), 500.0)])
    assert result.records["V2"].preempted_at == [10.0]
    assert [t for t, _ in result.records["P"].starts] == [70.0]
    assert result.records["V1"].preempted_at == [100.0]
    assert [t for t, _ in result.records["Q"].starts] == [105.0]


@pytest.mark.parametrize("grace", [61.0, -1.0, float("nan"), True])
def test_a_grace_period_above_the_class_s_or_not_a_number_of_seconds_is_refused_naming_it(grace):
    rules = policy(nodes=[("n1", 2)], classes={"training": {"grace_period_s": 60.0}})
    sched = Scheduler(rules)
    with pytest.raises(SpecError, match=r"grace_period_s: .* is not allowed: seconds from 0 to the grace period "
                                        r"of class training \(60 s\)"):
        sched.handle([JobSubmitted(0.0, job("J", 1, "training", "t", 0, grace_period_s=grace))])
