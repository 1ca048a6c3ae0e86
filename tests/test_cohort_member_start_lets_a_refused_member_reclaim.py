"""A start of one cohort member can make that member's reservation borrow at its start;
a job of another member within its nominal quota, refused by that claim at its turn, may
then reclaim the claim's GPUs (``Profile.reclaimers_of``) and fits: the start asks for
another pass (``again._member_refused``). Found by the review of note 078's narrowing:
with it, a reserved class's card join over its reservation asked for no repeat and J
waited (``Priority(not reached by the last pass)``) while a restored core started it; the
batch-share case (a class without a reservation) failed before note 078 too, as the
cohort clause read only the starting job's own member. Both cores.
"""

from __future__ import annotations

import json

import pytest
from builders import job, policy
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.decisions import Start
from gpushepherd.model.events import JobSubmitted, Tick
from gpushepherd.model.job import GpuShare


def _sub(t: float, jid: str, gpus: int, cls: str, team: str, est: float = 1000, **kw) -> JobSubmitted:
    return JobSubmitted(t, job(jid, gpus, cls, team, t, runtime_estimate_s=est, **kw))


@pytest.mark.parametrize("s_class", ["sandbox", "batch"])
@pytest.mark.parametrize("reference", [False, True])
def test_a_start_that_makes_a_reservation_borrow_lets_another_members_refused_job_reclaim_it(reference, s_class):
    # n1 has 10 GPUs; cohort co = a (nominal 2) + m (nominal 6); sandbox reserves 1,
    # filled at 0 by W and two half-GPU sandbox shares of m (m charged 1 GPU). At 1 R
    # (batch, m, 5 GPUs) reserves n1 from 100 without borrowing (m holds 1 + 5 = 6 then);
    # J (batch, a, 1 GPU, within a's nominal) is refused by R's claim. At 1.2 S (m, a
    # quarter GPU) joins TC2's card: m holds 6.25 at R's start, R now borrows, J may
    # reclaim R's GPUs and fits at once, as a full pass on the final state says.
    rules = policy(nodes=[("n1", 10)], teams={"a": {"nominal_gpus": 2}, "m": {"nominal_gpus": 6}, "o": {}},
                   cohorts={"co": {"members": ["a", "m"]}}, classes={"sandbox": {"reserved_gpus": 1}}, backfill=1)
    s = Scheduler(rules, reference=reference)
    half = GpuShare("fraction", milli=500)
    s.handle([_sub(0, "W", 1, "sandbox", "m", preemptible=False),
              _sub(0, "TC1", 1, "sandbox", "m", share=half, preemptible=False),
              _sub(0, "Y", 1, "batch", "o", share=half),
              _sub(0, "TC2", 1, "sandbox", "m", share=half, preemptible=False),
              _sub(0, "O1", 4, "batch", "o", est=100), _sub(0, "O2", 2, "batch", "o", est=5000)])
    out = s.handle([_sub(1, "R", 5, "batch", "m"), _sub(1.1, "J", 1, "batch", "a"),
                    _sub(1.2, "S", 1, s_class, "m", share=GpuShare("fraction", milli=250), preemptible=False)])
    assert {d.job_id for d in out if isinstance(d, Start)} == {"S", "J"}
    restored = Scheduler.restore(rules, json.loads(json.dumps(s.snapshot())), reference=reference)
    assert restored.handle([Tick(1.2)]) == []
