"""No job starts in a pass after that pass asked for another (``book.repass``): the start
that asked may let a job ahead preempt, and the next pass turns every job in queue
order - a job behind must not first take what that job's preemption needs (oracle seed
341629, issue 20 points 4 and 11; note 070, scenario I20-43). Both cores, uninterrupted
and restored before the instant (a restored core runs a full pass; the fast core's
pass over new jobs, ``continue_fast``, gave the new job's start a repeat pass at once).

The case, by hand: n1 has 8 GPUs; cohort co of a and b (nominal 2 each, reclaim of
lower priority); production inference avoids nodes with sandbox jobs. W (a, sandbox)
starts at 0. At 1 P (b, production inference) finds no node without a sandbox job
(``NoFit(anti-affinity)``); a is within its nominal quota, so W is no victim. P reserves
n1 from W's planned end; Y (a, sandbox, long) would break that reservation:
``ReservedFor(P)``. At 10 X (a, training, 2 GPUs) starts: a borrows (3 of nominal 2),
W becomes P's reclaim victim, and the start asks for another pass. Y, behind it, is no
longer bound by the claim of P, who may reclaim from a borrower: a full pass used to
start Y there, and P then had to evict W and Y - Y too young at 10, so at 11. With the
rule, Y waits for the next pass: P evicts W at 10 and Y is held for P.
"""

from __future__ import annotations

import json

import pytest
from builders import job, policy
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.events import JobSubmitted, Tick


def _brief(out) -> list:
    return [(type(d).__name__, d.job_id, getattr(d, "preemptor", None)) for d in out]


@pytest.mark.parametrize("restored", [False, True])
@pytest.mark.parametrize("reference", [False, True])
def test_a_job_behind_waits_for_the_repeat_pass_a_borrowing_start_asked(reference, restored):
    rules = policy(nodes=[("n1", 8)], teams={"a": {"nominal_gpus": 2}, "b": {"nominal_gpus": 2}},
                   cohorts={"co": {"members": ["a", "b"], "reclaim": "lower_priority"}},
                   classes={"sandbox": {"grace_period_s": 10},
                            "production-inference": {"avoid_nodes_with": ["sandbox"]}},
                   preemption={"enabled": True, "min_runtime_s": 0})
    sched = Scheduler(rules, reference=reference)
    assert _brief(sched.handle([JobSubmitted(0.0, job("W", 1, "sandbox", "a", 0, runtime_estimate_s=100))])) == [
        ("Start", "W", None)]
    assert sched.handle([JobSubmitted(1.0, job("P", 1, "production-inference", "b", 1, runtime_estimate_s=50)),
                         JobSubmitted(1.0, job("Y", 1, "sandbox", "a", 1, runtime_estimate_s=1000))]) == []
    assert str(sched.pending_reason("P")) == "NoFit(anti-affinity)"
    assert str(sched.pending_reason("Y")) == "ReservedFor(P)"
    if restored:
        sched = Scheduler.restore(rules, json.loads(json.dumps(sched.snapshot())), reference=reference)
    out = sched.handle([JobSubmitted(10.0, job("X", 2, "training", "a", 10, runtime_estimate_s=100))])
    assert _brief(out) == [("Start", "X", None), ("Preempt", "W", "P")]
    assert str(sched.pending_reason("P")) == "PreemptionInProgress(W)"
    assert str(sched.pending_reason("Y")) == "HeldForPreemptor(P)"
    assert sched.handle([Tick(11.0)]) == []
    restored_after = Scheduler.restore(rules, json.loads(json.dumps(sched.snapshot())), reference=reference)
    assert restored_after.handle([Tick(11.0)]) == []
