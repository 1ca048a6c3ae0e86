"""A preemption that another preemption undoes at once (issue 20: a newcomer's Kueue
translation preempted 17,205 times for 146 jobs). A job that would borrow in its cohort
once it runs preempts no job of another member (Kueue's ``borrowWithinCohort: Never``,
design note 005, "Borrowing by preemption"): that member, back within its nominal quota,
would reclaim the GPUs by preempting it, and round again. Scenario V2-16 shows the same
on one node; the oracle checks it as part of ``e_preemptor``."""

import yaml
from builders import KUEUE_TRANSLATION, job

from gpushepherd.model import Preempt
from gpushepherd.policy import policy_from_dict
from gpushepherd.sim.engine import SimJob, Simulator

KUEUE_POLICY = KUEUE_TRANSLATION  # the newcomer's policy, as they wrote it


def _kueue(jobs):
    rules = policy_from_dict(yaml.safe_load(KUEUE_POLICY)).rules
    return Simulator(rules, jobs, check_invariants=True, record_reasons=True).run()


def test_the_newcomers_three_jobs_no_longer_preempt_each_other():
    """Jobs 49, 110 and 71 of their trace (ids, submit times, sizes and durations as
    there): team-b's 49 (1 GPU) and 110 (4 GPUs) hold 5 H100s, its nominal 4 + 1
    borrowed; team-a's 71 (8 GPUs, a higher class) would hold 8 of its nominal 4. Before
    the fix 71 preempted both, 49 reclaimed by preempting 71, 110 started again, and so
    on every 2 s until one of them ended (thousands of preemptions). Now 71 waits for
    the H100 node to empty: 110 ends last, at 14197 + 11914 = 26111 (no job has a time
    limit, so 71's reservation cannot be planned and 110 starts beside it). 71 reads
    why it may not preempt from its arrival on (team-b is then within its nominal
    quota too)."""
    res = _kueue([SimJob(job("49", 1, cls="low-h100", team="team-b", submit=6759), 14400),
                  SimJob(job("71", 8, cls="high-h100", team="team-a", submit=9550), 14400),
                  SimJob(job("110", 4, cls="low-h100", team="team-b", submit=14197), 11914)])
    recs = res.records
    assert {j: r.preempted_at for j, r in recs.items()} == {"49": [], "71": [], "110": []}
    assert [s[0] for s in recs["71"].starts] == [26111]
    assert [r[2] for r in recs["71"].reasons] == ["NoPreemptibleVictims(team-a would borrow beyond its nominal 4 in cohorts.research-h100: "
                     "other members' jobs are not preempted to borrow)"]


def test_a_job_within_its_nominal_quota_still_reclaims():
    """The same cohort, team-a's job asking 4 H100s (its nominal): it reclaims what
    team-b borrows. One victim makes room either way (3 GPUs free); at equal cost the
    victim order decides (same class, most recently started first): 110. Team-b does
    not take the GPUs back (team-a does not borrow); 110 would make team-b hold 5 while
    team-a holds 4 of the cohort's 8, so it restarts when 71 ends, at 9650."""
    res = _kueue([SimJob(job("49", 1, cls="low-h100", team="team-b", submit=6759), 14400),
                  SimJob(job("110", 4, cls="low-h100", team="team-b", submit=9000), 11914),
                  SimJob(job("71", 4, cls="high-h100", team="team-a", submit=9550), 100)])
    recs = res.records
    assert recs["71"].preempted_at == [] and [s[0] for s in recs["71"].starts] == [9550]
    assert recs["49"].preempted_at == [] and recs["110"].preempted_at == [9550]
    assert [s[0] for s in recs["110"].starts] == [9000, 9650]


def test_a_lenders_job_within_its_nominal_is_not_kept_waiting_for_a_borrower():
    """Team-b's b0 (1 GPU) runs 0-500; team-a's ``a`` (8 GPUs, a higher class, 300 s)
    arrives at 5 and, evicting no one (it would borrow), is reserved the node at 500.
    Team-b's b1 (3 GPUs, 600 s) arrives at 10: team-b would then hold 4, its nominal
    quota. Before, a's reservation kept b1 waiting (ReservedFor(a)); ``a`` started at
    500 and b1 reclaimed its GPUs a second later. Now a borrower's reservation does not
    bind a lender's job within its nominal quota (it would reclaim those GPUs at the
    borrower's start anyway): b1 runs 10-610, ``a`` is reserved at 610 and runs 610-910;
    nobody is preempted. Every job's time limit is its duration (the reservation can
    be planned)."""
    jobs = [SimJob(job("b0", 1, cls="low-h100", team="team-b", submit=0, time_limit_s=500), 500),
            SimJob(job("a", 8, cls="high-h100", team="team-a", submit=5, time_limit_s=300), 300),
            SimJob(job("b1", 3, cls="low-h100", team="team-b", submit=10, time_limit_s=600), 600)]
    recs = _kueue(jobs).records
    assert {j: r.preempted_at for j, r in recs.items()} == {"b0": [], "a": [], "b1": []}
    assert [s[0] for s in recs["b1"].starts] == [10]
    assert [s[0] for s in recs["a"].starts] == [610]
