"""A job that a strict FIFO queue's order refused (rule 4) takes no reservation slot. A
start later in the same pass may make a hard limit refuse it first (rule 2 comes before
rule 4), and a full pass then gives it a slot - another job's. Before, nothing asked for
that pass: the reservation went to a later job of another team, which kept a third job
from starting, and a restart started it (found by note 088's review; older than that
note). The start now asks for another pass (``again._binds_now``). Both cores."""

from __future__ import annotations

import json

import pytest
from builders import job, node, policy_dict
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.decisions import Start
from gpushepherd.model.events import JobSubmitted, Tick
from gpushepherd.policy import policy_from_dict


def _sub(t, jid, gpus, cls, team, est):
    return JobSubmitted(t, job(jid, gpus, cls, team, t, runtime_estimate_s=est))


@pytest.mark.parametrize("reference", [False, True])
def test_a_start_that_makes_a_limit_refuse_a_strict_queue_job_asks_for_another_pass(reference):
    raw = policy_dict(nodes=[node("n1", 9)],
                      teams={"a": {"max_gpus": 4, "classes": {"training": {"queueing": "strict_fifo"}}}, "b": {}},
                      preemption={"enabled": False, "min_runtime_s": 0.0}, backfill=2)
    rules = policy_from_dict(raw).rules
    s = Scheduler(rules, reference=reference)
    s.handle([_sub(0, "A1", 2, "batch", "a", 1000), _sub(0, "B1", 4, "batch", "b", 100)])
    # H (a, training) waits for a's limit (2 + 4 > 4) and takes a slot; P behind it in a's
    # strict training queue is refused by rule 4; Q (b, 7 GPUs) takes the second slot; L
    # (a) starts: a uses 3, so a's limit now refuses P first, and P takes the slot - Q
    # none, so Z (b, 200 s, would end after Q's planned start) may start
    out = s.handle([_sub(10, "H", 4, "training", "a", 100), _sub(10, "P", 2, "training", "a", 100),
                    _sub(10, "Q", 7, "batch", "b", 100), _sub(10, "L", 1, "sandbox", "a", 50),
                    _sub(10, "Z", 1, "sandbox", "b", 200)])
    assert sorted(d.job_id for d in out if isinstance(d, Start)) == ["L", "Z"]
    assert s.handle([Tick(10)]) == []
    restored = Scheduler.restore(rules, json.loads(json.dumps(s.snapshot())), reference=reference)
    assert restored.handle([Tick(10)]) == []
