"""Core faults the oracle (``test_oracle.py``, ``bench/oracle.py``) found, each shrunk by
hand to a few jobs. Each test states the outcome design note 015 requires and names the
seeds of ``bench/oracle.py`` where the fault showed; they fail until the core is fixed.
"""

from __future__ import annotations

import json

import pytest
from builders import job, node, placed, policy, simulate
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.decisions import Start
from gpushepherd.model.events import GpuHealthChanged, JobFinished, JobRequeueRequested, JobSubmitted, NodeLost, Tick
from gpushepherd.model.job import ExitStatus, GpuShare
from gpushepherd.sim.engine import Restart


def test_strict_order_behind_a_share_reads_priority_of_that_share():
    # bench/oracle.py seeds 54, 119, 187, 199: backfill off; the share S (queued first)
    # finds no card (n1 is X's whole, n2 takes no fractions), so the strict order stops
    # at S and T waits although n2's GPU is free. T's reason must name S (note 015:
    # "Priority(<that job>)"); the core reads "Priority(not reached by the last pass)"
    # because Turn.blocked returns for a share before it records first_blocked.
    sched = Scheduler(policy(nodes=[("n1", 1), {"name": "n2", "gpus": 1, "sharing": "exclusive"}],
                             preemption=False, backfill=False))
    sched.handle([JobSubmitted(0.0, job("X", 1, "batch", "t", 0))])
    out = sched.handle([JobSubmitted(1.0, job("S", 1, "batch", "t", 1, share=GpuShare("fraction", milli=500))),
                        JobSubmitted(1.0, job("T", 1, "batch", "t", 1))])
    assert out == []
    assert str(sched.pending_reason("S")) == "Resources"  # no card is open: capacity (note 063)
    assert str(sched.pending_reason("T")) == "Priority(S)"


def test_a_share_that_only_other_classes_reservations_keep_out_reads_exceeds_capacity():
    # seed 42: one 1-GPU node, production inference reserves it. A batch share needs a
    # fresh GPU (production inference opens no shared card), which the reservation
    # never leaves: it can never start. Note 015 section 6: ExceedsCapacity(classes.X.
    # reserved_gpus=N), not ReservedFor forever. The core checks reservations in
    # never_fits for whole-GPU jobs only.
    sched = Scheduler(policy(nodes=[("n1", 1)], classes={"production-inference": {"reserved_gpus": 1}}))
    sched.handle([JobSubmitted(0.0, job("J", 1, "batch", "t", 0, share=GpuShare("fraction", milli=500)))])
    assert str(sched.pending_reason("J")) == "ExceedsCapacity(classes.production-inference.reserved_gpus=1)"


def test_no_min_runtime_promise_when_the_young_jobs_could_not_make_room():
    # seeds 70, 76, 84: A (4 GPUs on n1) may not be preempted; B (1 GPU on n2) is too
    # young until 15. Even evicted, B frees one GPU of a 1-GPU node: P (4 GPUs) could
    # never start by preempting. The core says "victims eligible at t=15" (and asks for
    # a wake-up then, after which the reason changes with nothing else changed):
    # preemption.plan returns the young jobs' coming of age before it checks that the
    # candidates could make room at all.
    sched = Scheduler(policy(nodes=[("n1", 4), ("n2", 1)], preemption={"enabled": True, "min_runtime_s": 5.0}))
    sched.handle([JobSubmitted(0.0, job("A", 4, "research-training", "t", 0, preemptible=False))])
    sched.handle([JobSubmitted(10.0, job("B", 1, "batch", "t", 10))])
    assert sched.handle([JobSubmitted(12.0, job("P", 4, "training", "t", 12))]) == []
    assert str(sched.pending_reason("P")) == "NoPreemptibleVictims(lower-priority jobs may not be preempted)"


def test_no_window_wakeups_for_a_job_that_no_healthy_node_can_hold():
    # seeds 1, 31, 143 (the simulation never ends): n1 is lost for good, so J (2 GPUs)
    # can never start until a node event comes. J counts against team t's windowed
    # max_gpus, so window_matters asks for every window boundary, forever (and J's
    # reason alternates WindowLimit / ExceedsCapacity). next_wakeup() must be None.
    sched = Scheduler(policy(nodes=[("n1", 2)],
                             teams={"t": {"max_gpus": 1, "windows": [{"from": "01:00", "to": "02:00", "max_gpus": 2}]}}))
    sched.handle([NodeLost(5.0, node="n1")])
    sched.handle([JobSubmitted(10.0, job("J", 2, "batch", "t", 10))])
    assert sched.next_wakeup() is None


def test_a_share_card_planned_to_free_counts_for_other_classes_reservations():
    # seed 296 (a second full pass started a job the uninterrupted core held back): the
    # time profile's class-reservation check (profile._class_hold_ok) counts only whole
    # GPUs coming free at planned ends, not a shared card whose last holder leaves. n1:
    # 2 GPUs, production inference reserves 1; S (a share, estimate 100) holds GPU 0's
    # card; J (1 GPU) would leave no GPU for the reservation now, and fits at 100 when
    # S's card frees. J gets no reservation and no estimate (None) instead of 100.
    sched = Scheduler(policy(nodes=[("n1", 2)], classes={"production-inference": {"reserved_gpus": 1}},
                             preemption=False))
    sched.handle([JobSubmitted(0.0, job("S", 1, "batch", "t", 0, share=GpuShare("fraction", milli=500),
                                        runtime_estimate_s=100.0))])
    sched.handle([JobSubmitted(1.0, job("J", 1, "batch", "t", 1, runtime_estimate_s=50.0))])
    assert str(sched.pending_reason("J")) == "ReservedFor(classes.production-inference.reserved_gpus)"
    assert sched.estimated_start("J") == 100.0


def test_a_backfilled_job_does_not_delay_a_reservation_through_the_class_reservation():
    # seed 296: claims protect a reservation's GPUs per node and its quota, not the free
    # GPUs its start needs to leave other classes' reserved_gpus free. Production
    # inference reserves 1 GPU. X (n1, until 100) blocks R (2 GPUs: n1 whole); R is
    # reserved at 100 (n1's 2 GPUs + n2 free = 3, one left for inference). S (sandbox,
    # 1000 s) then backfills onto n2: at 100 only n1's 2 GPUs are free, R would take the
    # reserved one, and R waits until 1001 - the backfill delayed the reservation (note
    # 015 section 2: "no backfilled job can delay a reservation"). A restored core,
    # planning R after S started, makes no such reservation: the passes differ.
    zone_a = (("zone", "a"),)
    sched = Scheduler(policy(nodes=[{"name": "n1", "gpus": 2, "labels": {"zone": "a"}}, ("n2", 1)],
                             classes={"production-inference": {"reserved_gpus": 1}}, preemption=False))
    sched.handle([JobSubmitted(0.0, job("X", 1, "batch", "t", 0, runtime_estimate_s=100.0, node_selector=zone_a))])
    sched.handle([JobSubmitted(1.0, job("R", 2, "batch", "t", 1, runtime_estimate_s=100.0)),
                  JobSubmitted(1.0, job("S", 1, "sandbox", "t", 1, runtime_estimate_s=1000.0))])
    out = sched.handle([JobFinished(100.0, "X", ExitStatus.COMPLETED)])
    assert [d.job_id for d in out if isinstance(d, Start)] == ["R"]


def test_a_preemptors_hold_keeps_the_free_gpus_its_plan_counted_for_a_class_reservation():
    # seed 217 (a victim preempted twice, its preemptor not started when it left):
    # production inference reserves 2 GPUs; n1 (1 GPU, zone a), n2 (2, zone a), n3 (1).
    # P (training, 2 GPUs, zone a) fits n2 but would leave 1 GPU for the reservation,
    # so it preempts V (n1): then n1 + n3 stay free. The hold protects n2's GPUs only:
    # B (sandbox) takes n3 in the same pass; when V leaves at 15 P is refused again (and
    # evicts B, which restarts on the GPU it freed, as does V). P should start at 15.
    zone_a = (("zone", "a"),)
    rules = policy(nodes=[{"name": "n1", "gpus": 1, "labels": {"zone": "a"}},
                          {"name": "n2", "gpus": 2, "labels": {"zone": "a"}}, ("n3", 1)],
                   classes={"production-inference": {"reserved_gpus": 2}, "batch": {"grace_period_s": 10.0}})
    result = simulate(rules, [(job("V", 1, "batch", "t", 0, node_selector=zone_a), 100.0),
                              (job("P", 2, "training", "t", 5, node_selector=zone_a), 50.0),
                              (job("B", 1, "sandbox", "t", 5), 100.0)])
    assert result.records["V"].preempted_at == [5.0]
    assert [t for t, _ in result.records["P"].starts] == [15.0]


def test_a_restored_preemptor_starts_on_the_gpus_it_planned_for():
    # seed 227: a preemptor's planned GPUs (Job.hold_gpus) are not in the snapshot. A
    # and B (not preemptible) hold n1's GPUs 0 and 1, V (batch, grace 10) GPU 2; B ends
    # at 3; P (2 GPUs) preempts V at 5 and plans GPUs 1, 2. At 15 V leaves and A ends:
    # the uninterrupted core starts P on 1, 2 (its plan), a core restarted at 10 on 0, 1.
    rules = policy(nodes=[("n1", 3)], classes={"batch": {"grace_period_s": 10.0}})
    jobs = [(job("A", 1, "research-training", "t", 0, preemptible=False), 15.0),
            (job("B", 1, "research-training", "t", 0, preemptible=False), 3.0),
            (job("V", 1, "batch", "t", 1), 100.0), (job("P", 2, "training", "t", 5), 50.0)]
    plain = simulate(rules, jobs)
    restarted = simulate(rules, jobs, [Restart(10.0)])
    assert plain.records["P"].starts == restarted.records["P"].starts
    assert plain.records["V"].starts == restarted.records["V"].starts


def test_a_mig_share_whose_only_mig_gpu_is_unhealthy_reads_exceeds_capacity():
    # seeds 28, 3325: never_fits for a share looks at the live nodes' inventory, not at
    # the health of their GPUs. a whole-GPU job that no healthy GPU can hold reads ExceedsCapacity (rule
    # 3 counts healthy GPUs); a MIG share whose only MIG GPU is unhealthy reads
    # NoFit(mig-slice 1g.10gb) - waiting for capacity that cannot come without a
    # hardware event (and, with a window on its team, it is woken at every boundary).
    sched = Scheduler(policy(nodes=[{"name": "n1", "gpus": 1, "gpu_type": "A100-80GB",
                                     "mig": {"g0": {"layout": ["1g.10gb"] * 7}}}]))
    sched.handle([GpuHealthChanged(1.0, node="n1", gpu=0, healthy=False)])
    sched.handle([JobSubmitted(2.0, job("M", 1, "batch", "t", 2, share=GpuShare("mig", profile="1g.10gb")))])
    assert sched.pending_reason("M").code.value == "ExceedsCapacity"


def test_a_fraction_whose_only_card_is_unhealthy_reads_exceeds_capacity():
    # seed 5017 (the run ends with the share pending, NoFit(gpu-fraction)): the same for
    # a fraction; with backfill off such a share also stops the strict order for good
    # (seed 3842)
    sched = Scheduler(policy(nodes=[("n1", 1), {"name": "n2", "gpus": 1, "sharing": "exclusive"}]))
    sched.handle([GpuHealthChanged(1.0, node="n1", gpu=0, healthy=False)])
    sched.handle([JobSubmitted(2.0, job("F", 1, "batch", "t", 2, share=GpuShare("fraction", milli=500)))])
    assert sched.pending_reason("F").code.value == "ExceedsCapacity"


def test_a_preemptors_turn_does_not_take_gpus_a_reservation_ahead_of_it_claims():
    # seeds 1430, 1972 (a second full pass at the same instant started the preemptor):
    # cohort co (a: nominal 3, b: 2). n1 (3 GPUs, zone a) has A (team a, not
    # preemptible, until 100) and V (team b, sandbox, grace 200). R (production
    # inference, team a, 2 GPUs) cannot preempt V (team b is within its nominal quota)
    # and is reserved at 100 on A's GPU and the free one. P (training, team b) may not
    # take the free GPU (it would delay R) and preempts V; its plan is V's GPU. At 100,
    # step 3 of the pass (every preemptor's turn before anyone else) admits P against
    # holds only - R's reservation is not in the profile yet - and P takes a GPU R's
    # reservation claims: R waits until V leaves at 210 (note 015: the GPUs a hold
    # protects are its victims' and the free ones it counted on; a lower job never
    # delays a reservation ahead of it).
    zone_a = (("zone", "a"),)
    rules = policy(nodes=[{"name": "n1", "gpus": 3, "labels": {"zone": "a"}}, ("n2", 2)],
                   teams={"a": {"nominal_gpus": 3}, "b": {"nominal_gpus": 2}},
                   cohorts={"co": {"members": ["a", "b"]}}, classes={"sandbox": {"grace_period_s": 200.0}})
    result = simulate(rules, [
        (job("A", 1, "research-training", "a", 0, preemptible=False, runtime_estimate_s=100.0, node_selector=zone_a),
         100.0),
        (job("V", 1, "sandbox", "b", 0, runtime_estimate_s=2000.0, node_selector=zone_a), 2000.0),
        (job("R", 2, "production-inference", "a", 10, runtime_estimate_s=50.0, node_selector=zone_a), 50.0),
        (job("P", 1, "training", "b", 10, node_selector=zone_a), 500.0)])
    assert result.records["V"].preempted_at == [10.0]
    assert [t for t, _ in result.records["R"].starts] == [100.0]
    # P takes its turn after R: nothing is free at 100; R's GPUs are at 150, before V
    # has left - a preemptor starts as soon as the admission rule admits it
    assert [t for t, _ in result.records["P"].starts] == [150.0]


def test_a_second_full_pass_keeps_a_reservation_that_a_backfill_pushed_into_a_hard_limit():
    # seed 1991: team T may hold 3 GPUs. X (T, n1, until 100) runs; R (T, 2 GPUs) is
    # blocked for capacity and reserved on n1 at 100. B (T, 1 GPU, no end) backfills on
    # n2 - within T's quota at 100 too - and T is then at 2 + 2 > 3 now: R reads
    # QuotaExceeded, its reservation stands and keeps C (team U) off n1's free GPU. A
    # core restored from this state (a full pass at the same instant) gives R no
    # reservation (hard-limit-blocked jobs get none) and starts C there for ever:
    # incremental pass != full pass (and the full pass starves R).
    zone_a = (("zone", "a"),)
    rules = policy(nodes=[{"name": "n1", "gpus": 2, "labels": {"zone": "a"}}, ("n2", 1)],
                   teams={"T": {"max_gpus": 3}, "U": {}}, preemption=False)
    sched = Scheduler(rules)
    sched.handle([JobSubmitted(0.0, job("X", 1, "batch", "T", 0, runtime_estimate_s=100.0, node_selector=zone_a))])
    sched.handle([JobSubmitted(1.0, job("R", 2, "training", "T", 1, runtime_estimate_s=50.0)),
                  JobSubmitted(1.0, job("B", 1, "batch", "T", 1)), JobSubmitted(1.0, job("C", 1, "batch", "U", 1))])
    again = Scheduler.restore(rules, json.loads(json.dumps(sched.snapshot()))).handle([Tick(1.0)])
    assert again == []


def test_a_job_started_at_this_instant_becomes_a_victim_without_waiting_for_an_unrelated_event():
    # seed 2758: L (batch) starts at 5; H (training) arrives in a second call at the
    # same instant. L is no victim yet (placed at this very instant), and the core asks
    # for no wake-up: at any later instant a full pass (a restored core) preempts L for
    # H, the running core does not until some unrelated event comes (H's reason says
    # "lower-priority jobs may not be preempted" meanwhile).
    rules = policy(nodes=[("n1", 1)])
    sched = Scheduler(rules)
    sched.handle([JobSubmitted(5.0, job("L", 1, "batch", "t", 5))])
    sched.handle([JobSubmitted(5.0, job("H", 1, "training", "t", 5))])
    restored = Scheduler.restore(rules, json.loads(json.dumps(sched.snapshot())))
    assert restored.handle([Tick(6.0)]) == sched.handle([Tick(6.0)])


def test_a_restored_memory_share_is_charged_by_the_card_it_holds():
    # seed 1985: a memory-only share is charged its memory over its card's (note 015,
    # section 5); a restored core charges a running one by the largest card it may use
    # (the pending charge). J1 (40 GB) holds n1's 40 GB card: 1 GPU of T's 1. Restored,
    # J1 counts 0.5 and J2 starts on n2's 80 GB card: T holds two cards (observation 8
    # after a restart).
    rules = policy(nodes=[{"name": "n1", "gpus": 1, "gpu_type": "A100-40GB", "gpu_mem_mib": 40960},
                          {"name": "n2", "gpus": 1, "gpu_type": "A100-80GB", "gpu_mem_mib": 81920}],
                   teams={"T": {"max_gpus": 1}})
    sched = Scheduler(rules)
    sched.handle([JobSubmitted(0.0, job("J1", 1, "batch", "T", 0, share=GpuShare("fraction", mem_mib=40960))),
                  JobSubmitted(0.0, job("J2", 1, "batch", "T", 0, share=GpuShare("fraction", mem_mib=40960)))])
    restored = Scheduler.restore(rules, json.loads(json.dumps(sched.snapshot())))
    assert restored.handle([Tick(50.0)]) == []
    assert restored.jobs["J1"].run_charges == sched.jobs["J1"].run_charges


def test_strict_order_is_kept_when_the_fast_pass_skips_a_job_by_its_failed_fit_memo():
    # seed 3852, the one fast != reference found: backfill off. P (2 GPUs) preempts V;
    # B (3 GPUs, same node filter) is refused for capacity, so nobody behind B may start
    # (the reference pass stops there: S reads Priority(B)). The fast walk skips B by its
    # failed-fit memo (a 2-GPU placement failed, B asks 3) with `continue`, not as a
    # refusal of the strict order, and starts S on the free GPU.
    rules = policy(nodes=[("n1", 4)], backfill=False, classes={"sandbox": {"grace_period_s": 10.0}})
    outs = {}
    for reference in (False, True):
        sched = Scheduler(rules, reference=reference)
        sched.handle([JobSubmitted(0.0, job("V", 2, "sandbox", "t", 0)),
                      JobSubmitted(0.0, job("X", 1, "production-inference", "t", 0))])
        outs[reference] = sched.handle([JobSubmitted(5.0, job("P", 2, "training", "t", 5)),
                                        JobSubmitted(5.0, job("B", 3, "batch", "t", 5)),
                                        JobSubmitted(5.0, job("S", 1, "sandbox", "t", 5))])
        if reference:
            assert str(sched.pending_reason("S")) == "Priority(B)"
    assert outs[False] == outs[True]


def test_a_run_keeps_the_class_reservation_coverage_it_started_with():
    # seed 3802: note 015 section 6 - coverage of reserved_gpus is fixed at start, a new
    # run never takes coverage from another, so no charge ever grows. c2 (team c, not
    # preemptible) starts first in the pass (fair-share order) covered by batch's 2
    # reserved GPUs (its charge on teams.c.nominal_gpus(not preemptible) = 1 is 0); a1
    # starts next in the same pass; Book.recover re-deals coverage by (start time,
    # submission order) and gives it to a1 (submitted first): c2 is then charged 2 GPUs
    # against that limit of 1.
    rules = policy(nodes=[("n1", 6)], teams={"a": {"nominal_gpus": 3}, "c": {"nominal_gpus": 1}},
                   cohorts={"co": {"members": ["a", "c"]}}, classes={"batch": {"reserved_gpus": 2}},
                   priority={"weights": {"fair_share": 1000.0}, "recalc_s": 1.0})
    sched = Scheduler(rules)
    sched.handle([JobSubmitted(0.0, job("w", 2, "sandbox", "a", 0))])
    sched.handle([JobFinished(10.0, "w", ExitStatus.COMPLETED)])
    out = sched.handle([JobSubmitted(20.0, job("a1", 2, "batch", "a", 20)),
                        JobSubmitted(20.0, job("c2", 2, "batch", "c", 20, preemptible=False))])
    assert [d.job_id for d in out if isinstance(d, Start)] == ["c2", "a1"]
    quota = sched.quota
    for (i, user), used in quota.usage.items():
        assert used <= quota.current[i], f"{quota.limits[i].path}: {used / 7000:g} of {quota.current[i] / 7000:g}"


def test_a_job_waiting_for_a_window_gets_a_wakeup_when_its_class_reservation_covers_it():
    # seed 5358: J (batch, team b) fits team b's borrowing_limit 0 only through batch's
    # reserved GPU (covered); it waits WindowLimit until 01:00. window_matters tests
    # the uncovered charges, finds J can never fit (borrowing_limit 0) and asks for no
    # wake-up: next_wakeup() is None, though a tick at 3600 starts J.
    rules = policy(nodes=[("n1", 2)],
                   teams={"a": {"nominal_gpus": 1},
                          "b": {"nominal_gpus": 0, "borrowing_limit": 0,
                                "windows": [{"from": "00:00", "to": "01:00", "max_running_jobs_per_user": 0}]}},
                   cohorts={"co": {"members": ["a", "b"]}}, classes={"batch": {"reserved_gpus": 1}})
    sched = Scheduler(rules)
    sched.handle([JobSubmitted(10.0, job("J", 1, "batch", "b", 10))])
    assert str(sched.pending_reason("J")).startswith("WindowLimit(")
    assert sched.next_wakeup() == 3600.0


def test_a_preemptors_hold_keeps_the_class_reservation_coverage_its_plan_counted_on():
    # seed 6468: production inference reserves 2 GPUs; cohort co (a: 2, b: 2). P
    # (production inference, team b, 4 GPUs, not preemptible) fits b's
    # nominal_gpus(not preemptible)=2 only with 2 GPUs covered by the reservation; it
    # preempts V (sandbox, grace 10). Q (production inference, team a) starts on n2 at
    # 6 and takes the coverage. At 15 V is gone and P is refused, reading
    # ExceedsCapacity (which it is not: it starts at 66); V restarts and is preempted
    # again at 56.
    zone_a = (("zone", "a"),)
    rules = policy(nodes=[{"name": "n1", "gpus": 4, "labels": {"zone": "a"}}, ("n2", 2)],
                   teams={"a": {"nominal_gpus": 2}, "b": {"nominal_gpus": 2}}, cohorts={"co": {"members": ["a", "b"]}},
                   classes={"production-inference": {"reserved_gpus": 2}, "sandbox": {"grace_period_s": 10.0}})
    result = simulate(rules, [(job("V", 1, "sandbox", "b", 0, node_selector=zone_a), 100.0),
                              (job("P", 4, "production-inference", "b", 5, node_selector=zone_a), 50.0),
                              (job("Q", 2, "production-inference", "a", 6), 50.0)])
    assert result.records["V"].preempted_at == [5.0]
    assert [t for t, _ in result.records["P"].starts] == [15.0]


def test_a_job_with_no_time_left_is_not_started_for_a_run_of_zero_seconds():
    # seed 6408 (a second full pass at the same instant stopped a job the uninterrupted
    # core had just started): J (batch, checkpointable, time limit 10) is requeued by
    # the operator at 10 - the event comes before the time-limit check, so it banks 10
    # s, all of its limit. The pass starts it again for 0 s; its time-limit timer is at
    # the current instant, next_wakeup() returns the current instant (a driver ticks
    # only later times) and J runs past its limit until some other event; a restored
    # core stops it at once. A run with no time left should not start (J has used its
    # time limit: it ends TIMEOUT).
    sched = Scheduler(policy(nodes=[("n1", 1)]))
    sched.handle([JobSubmitted(0.0, job("J", 1, "batch", "t", 0, time_limit_s=10.0))])
    out = sched.handle([JobRequeueRequested(10.0, job_id="J")])
    assert [d.job_id for d in out if isinstance(d, Start)] == []


def test_a_share_joining_a_card_does_not_delay_a_reservation():
    # seed 622 (a share the admission rule admits waits "Priority(not reached by the
    # last pass)"): rule 9 (claims) is checked for a share only when it opens a fresh GPU
    # (admission._decide_share); a share joining a card keeps that card from freeing
    # for as long as it runs. X holds n1 until 100; R (2 GPUs: n1 and n2 whole) is
    # reserved at 100. S2 (estimate 10) opens a card on n2 - it ends before 100. S1
    # (estimate 1000) joins that card at 5: the card frees at 1005 and R waits until
    # then. S1 should wait (ReservedFor(R)) and R start at 100.
    rules = policy(nodes=[("n1", 1), ("n2", 1)], preemption=False)
    half = GpuShare("fraction", milli=500)
    result = simulate(rules, [(job("X", 1, "batch", "t", 0, runtime_estimate_s=100.0), 100.0),
                              (job("R", 2, "batch", "t", 1, runtime_estimate_s=50.0), 50.0),
                              (job("S2", 1, "batch", "t", 2, share=half, runtime_estimate_s=10.0), 10.0),
                              (job("S1", 1, "batch", "t", 5, share=half, runtime_estimate_s=1000.0), 1000.0)])
    assert [t for t, _ in result.records["R"].starts] == [100.0]


def test_asking_why_a_job_waits_changes_no_decision():
    # seed 2914 (the run that asked every pending reason started j3 at 4, the plain run
    # did not): the pass defers the reservation of R (2 GPUs at 40, when B ends) until a
    # job needs the claims. Admission read which reservations exempt a job (a reclaimer
    # of the quota it would borrow) before computing the deferred ones; a pending_reason
    # query computes them, so the next submission saw R's exemption only if someone had
    # asked. J (team a, borrowing its second GPU) must start at 4 either way: R would
    # reclaim J's borrowed GPU, so J's run does not delay R.
    rules = policy(nodes=[("n1", 4)], backfill=2,
                   teams={"a": {"nominal_gpus": 1}, "b": {"nominal_gpus": 2, "borrowing_limit": 3},
                          "c": {"max_gpus": 1}},
                   cohorts={"co": {"members": ["a", "b"], "reclaim": "lower_priority"}})

    def run(ask: bool):
        sched = Scheduler(rules)
        starts = []
        for t, specs in [(0.0, [job("A", 1, "research-training", "a", 0, runtime_estimate_s=100.0),
                                job("B", 1, "research-training", "b", 0, runtime_estimate_s=40.0),
                                job("C", 1, "batch", "c", 0, runtime_estimate_s=100.0)]),
                         (1.0, [job("R", 2, "research-training", "b", 1, runtime_estimate_s=50.0)]),
                         (4.0, [job("J", 1, "batch", "a", 4, runtime_estimate_s=50.0)])]:
            out = sched.handle([JobSubmitted(t, s) for s in specs])
            starts += [(d.t, d.job_id) for d in out if isinstance(d, Start)]
            if ask:
                for j in sched.pending_jobs():
                    sched.pending_reason(j.id)
        return starts

    assert run(True) == run(False)
    assert (4.0, "J") in run(False)


def test_windowed_limits_that_never_allow_a_job_together_read_exceeds_capacity():
    # seeds 820, 334 (wake-ups at every window edge for a week that decided nothing):
    # research-training's max_gpus is 0 from 03:30 to 03:00, its max_gpus_per_user 0
    # from 00:00 to 03:30 - each alone leaves a gap, together none. The job can never
    # start: ExceedsCapacity naming both, and nothing to wake for.
    rules = policy(nodes=[("n1", 2)], classes={"research-training": {"windows": [
        {"from": "03:30", "to": "03:00", "max_gpus": 0}, {"from": "00:00", "to": "03:30", "max_gpus_per_user": 0}]}})
    sched = Scheduler(rules)
    sched.handle([JobSubmitted(0.0, job("J", 1, "research-training", "t", 0))])
    assert str(sched.pending_reason("J")) == (
        "ExceedsCapacity(classes.research-training.max_gpus with classes.research-training.max_gpus_per_user: "
        "their windows never allow it at the same time)")
    assert sched.next_wakeup() is None


def test_windows_never_together_name_only_the_limits_that_clash():
    # seeds 162346, 166603, 171823, 190815: sandbox's max_gpus is 0 from 02:00 to 02:30,
    # its max_gpus_per_user 2 from 03:30 to 03:00 (all day but 03:00-03:30), team a's
    # max_gpus_per_user 0 from 00:00 to 03:30. A 3-GPU job fits the class's per-user cap
    # only from 03:00 to 03:30, when its team's is 0: those two clash. max_gpus is 0 for
    # half an hour elsewhere and clashes with nothing - raised, the job still never
    # starts. The reason named the first windowed limit and every other one.
    team = {"windows": [{"from": "00:00", "to": "03:30", "max_gpus_per_user": 0}]}
    sandbox = {"windows": [{"from": "02:00", "to": "02:30", "max_gpus": 0},
                           {"from": "03:30", "to": "03:00", "max_gpus_per_user": 2}]}
    rules = policy(nodes=[("n1", 4)], teams={"a": team}, classes={"sandbox": sandbox})
    sched = Scheduler(rules)
    sched.handle([JobSubmitted(0.0, job("J", 3, "sandbox", "a", 0))])
    assert str(sched.pending_reason("J")) == (
        "ExceedsCapacity(classes.sandbox.max_gpus_per_user with teams.a.max_gpus_per_user: "
        "their windows never allow it at the same time)")
    assert sched.next_wakeup() is None


def test_a_window_open_all_week_leaves_the_limit_outside_it_unused():
    # seeds 535, 1733: a window from 00:00 to 24:00 every day is always open, so the
    # limit outside it never applies: a job over the window's value can never start
    # (the core woke at every midnight to find it still WindowLimit).
    rules = policy(nodes=[("n1", 2)], classes={"batch": {"windows": [
        {"from": "00:00", "to": "24:00", "max_running_jobs_per_user": 0}]}})
    sched = Scheduler(rules)
    sched.handle([JobSubmitted(0.0, job("J", 1, "batch", "t", 0))])
    assert str(sched.pending_reason("J")) == "ExceedsCapacity(classes.batch.max_running_jobs_per_user=0)"
    assert sched.next_wakeup() is None


def test_a_mig_share_whose_only_card_with_its_profile_is_unhealthy_never_fits():
    # seeds 446, 496, 1353, 2028: the card with 1g.10gb is out of service; the healthy
    # card has only 3g.40gb (no reconfiguration): ExceedsCapacity, not NoFit forever.
    rules = policy(nodes=[{"name": "n1", "gpus": 2, "gpu_type": "A100-80GB", "gpu_mem_mib": 81920,
                           "mig": {"g0": {"layout": ["3g.40gb", "3g.40gb"]},
                                   "g1": {"layout": ["4g.40gb", "2g.20gb", "1g.10gb"]}}}])
    sched = Scheduler(rules)
    sched.handle([GpuHealthChanged(0.0, node="n1", gpu=1, healthy=False)])
    sched.handle([JobSubmitted(1.0, job("M", 1, "batch", "t", 1, share=GpuShare("mig", profile="1g.10gb")))])
    assert str(sched.pending_reason("M")) == "ExceedsCapacity(share=mig:1g.10gb)"


def test_a_share_joining_a_card_does_not_leave_a_reservation_only_reserved_gpus():
    # seed 2919: GPU 1 is production inference's (reserved_gpus 1); R (batch) is
    # reserved at 100 on GPU 0, X's card, when X ends. S (estimate 1000) joining the card
    # at 5 keeps it until 1005: the node still has a GPU at 100 (rule 9's node check
    # passes) but it is the reserved one. S must wait and R start at 100.
    rules = policy(nodes=[("n1", 2)], classes={"production-inference": {"reserved_gpus": 1}}, preemption=False)
    half = GpuShare("fraction", milli=500)
    result = simulate(rules, [(job("X", 1, "batch", "t", 0, share=half, runtime_estimate_s=100.0), 100.0),
                              (job("R", 1, "batch", "t", 1, runtime_estimate_s=50.0), 50.0),
                              (job("S", 1, "batch", "t", 5, share=half, runtime_estimate_s=1000.0), 1000.0)])
    assert [t for t, _ in result.records["R"].starts] == [100.0]
    assert [t for t, _ in result.records["S"].starts] == [150.0]


def test_a_preemptors_hold_counts_its_victims_class_reservation_coverage_as_gone():
    # seed 2024: V (batch) is covered by batch's reserved_gpus 1; P (4 GPUs, n1) preempts
    # it at 10 (grace 20). Q (2 GPUs) at 15 would take n2's two GPUs: when V leaves,
    # batch's reservation wants a free GPU again and P could not start. The hold's
    # class-hold slack counted V's coverage as staying; P must start at 30, Q after.
    rules = policy(nodes=[("n1", 4), ("n2", 2, "L40S", 46068)],
                   classes={"batch": {"reserved_gpus": 1, "grace_period_s": 20.0}})
    result = simulate(rules, [
        (job("V", 1, "batch", "t", 0, runtime_estimate_s=1000.0, checkpointable=True, gpu_types=("A100-80GB",)), 1000.0),
        (job("P", 4, "training", "t", 10, runtime_estimate_s=100.0), 100.0),
        (job("Q", 2, "training", "t", 15, runtime_estimate_s=100.0), 100.0)])
    assert [t for t, _ in result.records["P"].starts] == [30.0]
    assert [t for t, _ in result.records["Q"].starts] == [130.0]


def test_a_job_whose_only_node_it_avoids_now_is_reserved_there_once_the_avoided_job_leaves():
    # seed 923: training avoids batch. T (training, 2 GPUs, zone a) can only use n1, where
    # B (batch) runs until 50: n1 was left out of T's reservation walk as long as B ran, so
    # T held none and S (sandbox, no end) took n1's free GPU - T waited until S ended
    zone_a = (("zone", "a"),)
    rules = policy(nodes=[{"name": "n1", "gpus": 2, "labels": {"zone": "a"}}, ("n2", 1)],
                   classes={"training": {"avoid_nodes_with": ["batch"]}}, preemption=False)
    result = simulate(rules, [
        (job("B", 1, "batch", "t", 0, runtime_estimate_s=50.0, node_selector=zone_a), 50.0),
        (job("T", 2, "training", "t", 1, runtime_estimate_s=100.0, node_selector=zone_a), 100.0),
        (job("S", 1, "sandbox", "t", 2, node_selector=zone_a), 5000.0)])
    assert [t for t, _ in result.records["T"].starts] == [50.0]
    assert [t for t, _ in result.records["S"].starts] == [150.0]


def test_a_backfilled_job_of_a_class_a_reservation_avoids_stays_off_its_node():
    # X (batch) fits n1's spare GPU at T's reserved start, but its class would keep T
    # (training avoids batch) off n1 until X ends: a backfill that delays a reservation
    zone_a = (("zone", "a"),)
    rules = policy(nodes=[{"name": "n1", "gpus": 3, "labels": {"zone": "a"}}, ("n2", 1)],
                   classes={"training": {"avoid_nodes_with": ["batch"]}}, preemption=False)
    result = simulate(rules, [
        (job("B", 1, "batch", "t", 0, runtime_estimate_s=50.0, node_selector=zone_a), 50.0),
        (job("T", 2, "training", "t", 1, runtime_estimate_s=100.0, node_selector=zone_a), 100.0),
        (job("X", 1, "batch", "t", 2, runtime_estimate_s=500.0, node_selector=zone_a), 500.0)])
    assert [t for t, _ in result.records["T"].starts] == [50.0]
    assert [t for t, _ in result.records["X"].starts] == [150.0]


def test_a_share_that_needs_a_whole_card_under_reservations_that_keep_every_fresh_gpu_never_fits():
    # seed 4745: training reserves the only whole GPU; a share may then only join a card a
    # training job opens - not one that needs all of the card's MPS clients: it waited for
    # ever as ReservedFor(...) instead of ExceedsCapacity
    rules = policy(nodes=[{"name": "n1", "gpus": 1, "gpu_type": "L40S", "gpu_mem_mib": 46068,
                           "sharing": {"mps": {"max_clients": 2}}}],
                   classes={"training": {"reserved_gpus": 1}})
    whole_card = GpuShare("mps", milli=500, mem_mib=4096, slots=2)
    sched = Scheduler(rules)
    sched.handle([JobSubmitted(0.0, job("W", 1, "batch", "t", 0, share=whole_card)),
                  JobSubmitted(0.0, job("J", 1, "batch", "t", 0, share=GpuShare("mps", milli=500, mem_mib=4096)))])
    assert sched.pending_reason("W").code.value == "ExceedsCapacity"
    # J may not join such a card either while training holds less than its GPU (rule 8,
    # note 042 "Class reservations"), and no MIG instance can hold training's reservation
    assert sched.pending_reason("J").code.value == "ExceedsCapacity"


def test_a_preemptor_whose_victims_left_starts_beside_another_preemptors_hold():
    # seed 7641: training reserves 2 GPUs. P (batch, 3 GPUs) preempts V on n2, the only
    # 3-GPU node; Q (research-training, zone a) preempts W on n1. When V leaves at 7, Q's
    # hold still waits for W. P's own hold was dropped as it started, but Q's class-hold
    # slack still counted P's 3 GPUs as taken, so P was charged them twice and refused
    # (8 free, 1 coming, 2 reserved: 5 left, not 2). P should start at 7, on n2.
    zone_a = (("zone", "a"),)
    rules = policy(nodes=[{"name": "n1", "gpus": 2, "labels": {"zone": "a"}}, ("n2", 3), ("n3", 2), ("n4", 2)],
                   classes={"training": {"reserved_gpus": 2}, "sandbox": {"grace_period_s": 6.0}})
    result = simulate(rules, [(job("V", 3, "sandbox", "t", 0), 100.0),
                              (job("W", 1, "sandbox", "t", 0, node_selector=zone_a), 100.0),
                              (job("P", 3, "batch", "t", 1), 50.0),
                              (job("Q", 2, "research-training", "t", 3, node_selector=zone_a), 50.0)])
    assert result.records["V"].preempted_at == [1.0]
    assert result.records["W"].preempted_at == [3.0]
    assert [t for t, _ in result.records["P"].starts] == [7.0]
    assert [t for t, _ in result.records["Q"].starts] == [9.0]


def test_a_share_refused_a_fresh_gpu_joins_a_card_a_later_share_opened_in_the_same_pass():
    # seeds 19272, 5991, 9908, 17184: batch and production inference reserved a GPU each
    # (shrunk again with training for production inference, which takes no fractions) of
    # n1's 4. M (training, half a card) and Z (sandbox) fill GPU 0, X holds GPU 1:
    # training still needs half a GPU, batch a whole one, so S
    # (research-training, a quarter of a card) may not open one of the 2 free GPUs. At 5,
    # B (batch, half a card's memory) opens GPU 2 - after S's turn in the pass. The free
    # GPU left still covers both reservations' unused halves (rule 8 lets S join B's card,
    # note 042 "Class reservations"): S should start at 5, on B's card.
    # (Before that rule, the fault was shown with X on 2 GPUs and no M or Z; S joining
    # B's card there left batch's reservation short, see the test below.)
    rules = policy(nodes=[("n1", 4)], preemption=False,
                   classes={"training": {"reserved_gpus": 1}, "batch": {"reserved_gpus": 1}})
    half = GpuShare(kind="fraction", milli=500, mem_mib=40960)
    quarter = GpuShare(kind="fraction", milli=250, mem_mib=20480)
    memory = GpuShare(kind="fraction", milli=0, mem_mib=40960)
    result = simulate(rules, [(job("M", 1, "training", "t", 0, share=half), 100.0),
                              (job("Z", 1, "sandbox", "t", 0, share=half), 100.0),
                              (job("X", 1, "sandbox", "t", 0), 100.0),
                              (job("S", 1, "research-training", "t", 1, share=quarter), 50.0),
                              (job("B", 1, "batch", "t", 5, share=memory), 50.0)])
    assert [p.parts for _t, p in result.records["Z"].starts] == [p.parts for _t, p in result.records["M"].starts]
    assert [t for t, _ in result.records["B"].starts] == [5.0]
    assert [t for t, _ in result.records["S"].starts] == [5.0]
    assert [p.parts for _t, p in result.records["S"].starts] == [p.parts for _t, p in result.records["B"].starts]


def test_a_job_of_a_reserved_class_whose_reservation_is_held_does_not_take_a_preemptors_class_slack():
    # seeds 13765, 3462: production inference reserves 2 GPUs, batch 1 (held by B1). P
    # (training, 4 H100s) preempts V on n2 and holds n2's 2 free GPUs; once V is gone, n3's
    # 2 free GPUs are production inference's. B2 (batch, 1) comes at 2: batch's own
    # reservation is held already, so it takes from what P's hold counted on like any job
    # and must wait. It started on n3 and was preempted at 11 by P, which would otherwise
    # have been refused by production inference's reservation.
    h100 = ("H100-80GB",)
    rules = policy(nodes=[("n1", 4), node("n2", 4, gpu_type="H100-80GB"), ("n3", 2)],
                   classes={"production-inference": {"reserved_gpus": 2}, "batch": {"reserved_gpus": 1},
                            "sandbox": {"grace_period_s": 10.0}})
    result = simulate(rules, [(job("X", 3, "research-training", "t", 0), 1000.0),
                              (job("B1", 1, "batch", "t", 0), 1000.0),
                              (job("V", 2, "sandbox", "t", 0, gpu_types=h100), 1000.0),
                              (job("P", 4, "training", "t", 1, gpu_types=h100), 100.0),
                              (job("B2", 1, "batch", "t", 2), 100.0)])
    assert result.records["V"].preempted_at == [1.0]
    assert [t for t, _ in result.records["P"].starts] == [11.0]
    assert result.records["B2"].preempted_at == []
    assert [t for t, _ in result.records["B2"].starts] == [111.0]


def test_behind_the_strict_orders_stop_no_job_reads_victims_that_come_of_age():
    # seeds 4467, 14222: backfill off. A (research-training, 2 GPUs) is stopped by X
    # (same class, never a victim): it blocks the strict order. B (batch) behind it could
    # evict sandbox S once S has run min_runtime_s - but nothing passes A, preemption
    # included. B read "victims eligible at t=5" and no wake-up came at 5; it must read
    # the capacity it lacks, and S must never be preempted.
    rules = policy(nodes=[("n1", 2)], preemption={"enabled": True, "min_runtime_s": 5.0}, backfill=False)
    sched = Scheduler(rules)
    sched.handle([JobSubmitted(0.0, job("S", 1, "sandbox", "t", 0, preemptible=True)),
                  JobSubmitted(0.0, job("X", 1, "research-training", "t", 0))])
    sched.handle([JobSubmitted(1.0, job("A", 2, "research-training", "t", 1))])
    out = sched.handle([JobSubmitted(2.0, job("B", 1, "batch", "t", 2))])
    assert out == []
    assert str(sched.pending_reason("B")) == "Resources"
    wake = sched.next_wakeup()
    assert wake is None or wake > 5.0
    assert sched.handle([Tick(6.0)]) == []  # S is of age: B still may not pass A


def test_a_window_boundary_does_not_wake_a_job_only_other_classes_reservations_keep_off():
    # seeds 9361, 18785: production inference and training reserve a GPU each, of one;
    # J (team b, whose limit has a night window, an MPS client) is past every limit and
    # kept off by those reservations (n2 is lost). A window boundary cannot start it
    # (reservations are never windowed): no wake-up for it, else the run never ends and
    # a daemon wakes at every boundary for nothing.
    rules = policy(nodes=[node("n1", 1, sharing={"mps": {"max_clients": 3}}), ("n2", 1)],
                   classes={"production-inference": {"reserved_gpus": 1}, "training": {"reserved_gpus": 1}},
                   teams={"b": {"max_gpus": 1, "windows": [{"from": "02:00", "to": "04:00", "max_gpus": 1}]}})
    sched = Scheduler(rules)
    sched.handle([NodeLost(0.0, "n2")])
    # an MPS client: it may neither open a card nor join one a training job opens while
    # training holds less than its GPU (rule 8, note 042 "Class reservations")
    mps = GpuShare(kind="mps", milli=100, mem_mib=4096)
    sched.handle([JobSubmitted(1.0, job("J", 1, "research-training", "b", 1, share=mps))])
    assert str(sched.pending_reason("J")).startswith("ExceedsCapacity(classes.")
    assert sched.next_wakeup() is None


def test_a_start_that_makes_its_team_borrow_gives_its_team_mate_refused_by_a_lending_claim_its_turn_again():
    # seed 15683: cohort of a and b (nominal 2 each) on 4 GPUs. A1 keeps a at its
    # max_running_jobs, so R (a, 3 GPUs) waits with a reservation that lends its GPUs to
    # the cohort's borrowers. J (b, 2 GPUs, within b's nominal quota) is refused by that
    # claim; K (b, 1 GPU, short) starts after it in the same pass - b now borrows, and a
    # borrower may take what R's reservation lends: J fits at that instant.
    rules = policy(nodes=[("n1", 4)],
                   teams={"a": {"nominal_gpus": 2, "max_running_jobs": 1},
                          "b": {"nominal_gpus": 2, "borrowing_limit": 2}},
                   cohorts={"co": {"members": ["a", "b"]}})
    result = simulate(rules, [(job("A1", 1, "batch", "a", 0, runtime_estimate_s=100.0), 100.0),
                              (job("R", 3, "batch", "a", 1, runtime_estimate_s=50.0), 50.0),
                              (job("J", 2, "batch", "b", 2, runtime_estimate_s=500.0), 500.0),
                              (job("K", 1, "batch", "b", 2, runtime_estimate_s=10.0), 10.0)])
    assert [t for t, _ in result.records["K"].starts] == [2.0]
    assert [t for t, _ in result.records["J"].starts] == [2.0]


def test_a_share_kept_off_fresh_gpus_by_class_reservations_does_not_stop_the_strict_order():
    # seeds 22562, 22732: backfill off; production inference and batch reserve one GPU
    # each of 2. S (research-training, a quarter of a card) may not open a card on either:
    # it waits for a job of a reserved class to open one. B (batch, a quarter) behind it
    # is such a job - if S stopped the strict order, B waited behind S and S for B, for
    # ever. B opens a card at 1. S may not join it (batch would hold a quarter of its GPU
    # with no free GPU for the rest: rule 8, note 042 "Class reservations"), nor any other
    # card while batch holds less than its GPU: it never fits.
    rules = policy(nodes=[("n1", 2)], backfill=False,
                   classes={"production-inference": {"reserved_gpus": 1}, "batch": {"reserved_gpus": 1}})
    quarter = GpuShare(kind="fraction", milli=250)
    result = simulate(rules, [(job("S", 1, "research-training", "t", 0, share=quarter), 50.0),
                              (job("B", 1, "batch", "t", 1, share=quarter), 50.0)])
    assert [t for t, _ in result.records["B"].starts] == [1.0]
    assert result.records["S"].starts == []
    sched = Scheduler(rules)
    sched.handle([JobSubmitted(0.0, job("S", 1, "research-training", "t", 0, share=quarter))])
    assert str(sched.pending_reason("S")) == ("ExceedsCapacity(classes.production-inference.reserved_gpus=1,"
                                              "classes.batch.reserved_gpus=1)")


def test_a_preemptor_whose_victims_left_is_not_charged_its_own_hold_against_another_holds_class_slack():
    # seed 12010 (not shrunk: the fault needs two holds, a class reservation and MPS):
    # production inference reserves 2 GPUs; j11 (batch, 6 GPUs) preempts j6 at 5 and
    # holds n2's 4 GPUs and 2 of n1's; j5 (production inference) preempts j2 at 12. When
    # j6 is gone at 17, j11 must start on its plan. j5's hold's class-hold slack had
    # counted j11's plan as taken, and j11 was charged those GPUs again: refused, its
    # hold dropped, and j1 took n2 - j6 lost its work for nothing.
    from oracle_checks import drive
    from oracle_workloads import workload_from_seed

    # (the seed's workload before the share draws took classes' reserved_gpus)
    result, _calls = drive(workload_from_seed(12010, share_preemption=False), restarts=False, record_reasons=False)
    assert result.records["j6"].preempted_at == [5.0]
    assert [t for t, _ in result.records["j11"].starts][:1] == [17.0]


def test_a_job_backfilled_beside_a_reservation_that_moves_its_best_fit_gets_a_second_pass():
    # seed 12903: R (2 GPUs on one node) is reserved at 48, when X1 leaves n1's GPUs 0-1
    # and X2 n2's GPU 0: n1 would have 3 free then, n2 2, so the best fit is n2. K (1
    # GPU, long) is backfilled on n1's free GPU 3 - that delays nobody, but now n1 has
    # 2 free at 48 too and a full pass reserves R there (the lower index), which leaves
    # n2's free GPU to L. The pass the core ran left L waiting for R until 48; a restart
    # or a policy apply at 1 would have started it. The decisions of an instant are those
    # of a full pass on its final state: L starts at 1, and R still at 48.
    a, b = (("zone", "a"),), (("zone", "b"),)
    rules = policy(nodes=[{"name": "n1", "gpus": 4, "labels": {"zone": "a"}},
                          {"name": "n2", "gpus": 2, "labels": {"zone": "b"}}], preemption=False)
    result = simulate(rules, [(job("X1", 2, "batch", "t", 0, node_selector=a, runtime_estimate_s=48.0), 48.0),
                              (job("Y", 1, "batch", "t", 0, node_selector=a, runtime_estimate_s=100.0), 100.0),
                              (job("X2", 1, "batch", "t", 0, node_selector=b, runtime_estimate_s=48.0), 48.0),
                              (job("R", 2, "training", "t", 1, runtime_estimate_s=50.0), 50.0),
                              (job("K", 1, "batch", "t", 1, runtime_estimate_s=200.0), 200.0),
                              (job("L", 1, "batch", "t", 1, runtime_estimate_s=200.0), 200.0)])
    assert [(t, str(p)) for t, p in result.records["K"].starts] == [(1.0, "n1:3")]
    assert [(t, str(p)) for t, p in result.records["L"].starts] == [(1.0, "n2:1")]
    assert [t for t, _ in result.records["R"].starts] == [48.0]


def test_a_reserved_classs_mig_start_lets_a_share_it_kept_off_start_in_the_strict_order():
    # seed 12899: backfill off; production inference and training reserve a GPU each of
    # n1's 2 plain GPUs (GPU 0 is a MIG card). S (research-training, a quarter of a card)
    # may not open a card. At 1, P (production inference) takes the MIG slice: its
    # class's reservation is filled without a plain GPU, and S may take one of the two.
    # The pass at 1 gave only the new job its turn (nothing but a submission changed, and
    # a start only takes GPUs - except this one, which loosens a class hold): S waited.
    rules = policy(nodes=[{"name": "n1", "gpus": 3, "gpu_type": "H100-80GB", "gpu_mem_mib": 81920,
                           "mig": {"g0": {"layout": ["7g.80gb"]}}}], backfill=False,
                   classes={"production-inference": {"reserved_gpus": 1}, "training": {"reserved_gpus": 1}})
    result = simulate(rules, [(job("S", 1, "research-training", "t", 0, share=GpuShare("fraction", milli=250)), 50.0),
                              (job("P", 1, "production-inference", "t", 1, share=GpuShare("mig", profile="7g.80gb")),
                               100.0)])
    assert [t for t, _ in result.records["P"].starts] == [1.0]
    assert [t for t, _ in result.records["S"].starts] == [1.0]


def test_a_job_started_beside_a_reservation_that_puts_its_team_at_a_type_limit_redecides_the_type():
    # seed 1912 (a second full pass at the same instant started a job the uninterrupted
    # core held back): per-type quotas (note 038), team t may hold 2 L40S and 4 A100s.
    # L holds an L40S for good (no estimate); X (team t) and Z hold A100s until 100. R
    # (3 GPUs) is refused on L40S by the limit and on the A100s by free GPUs: decided on
    # the A100s (closer to starting), reserved there at 100. B (team t, 1 A100) backfills
    # beside the reservation (at 100 B + R = 4 A100s: within the limit) and puts t at
    # its A100 limit now: R is refused by a hard limit on both types, and a full pass
    # decides it on L40S (type order), where no start can be planned - no reservation.
    # The core kept the stale A100 reservation: C, which would delay it, waited
    # ReservedFor(R), and a restored core at the same instant started C.
    a100, l40s = ("A100-80GB",), ("L40S",)
    rules = policy(nodes=[node("nA", 4, "L40S", 46068), node("nB", 4)],
                   teams={"t": {"max_gpus": {"L40S": 3, "A100-80GB": 4}}, "u": {}}, preemption=False, backfill=1)
    sched = Scheduler(rules)
    sched.handle([JobSubmitted(0.0, job("L", 1, "batch", "t", 0, gpu_types=l40s)),
                  JobSubmitted(0.0, job("X", 1, "batch", "t", 0, gpu_types=a100, runtime_estimate_s=100.0)),
                  JobSubmitted(0.0, job("Z", 1, "batch", "u", 0, gpu_types=a100, runtime_estimate_s=100.0))])
    assert sched.handle([JobSubmitted(1.0, job("R", 3, "batch", "t", 1, runtime_estimate_s=100.0))]) == []
    assert sched.estimated_start("R") == 100.0
    out = sched.handle([JobSubmitted(2.0, job("B", 1, "batch", "t", 2, gpu_types=a100, runtime_estimate_s=1000.0)),
                        JobSubmitted(2.0, job("C", 1, "batch", "u", 2, gpu_types=a100,
                                              runtime_estimate_s=1000.0))])
    assert [d.job_id for d in out if isinstance(d, Start)] == ["B", "C"]
    again = Scheduler.restore(rules, json.loads(json.dumps(sched.snapshot())))
    assert again.handle([Tick(2.0)]) == []


def test_a_share_of_another_class_does_not_join_a_reserved_classs_card_the_reservation_needs():
    # found with note 042's share draws (three jobs at t=0, the old code too): n1 has 2
    # GPUs, training reserves 1. W (batch) takes GPU 0 - the free GPU left covers the
    # reservation. P (training, half a GPU) opens GPU 1 inside its reservation; the card
    # is training's while training alone holds it. B (batch, half a GPU) joining it would
    # leave training holding half a GPU with no free GPU for the other half: rule 8 (as
    # for a fresh GPU) keeps B out, ReservedFor(classes.training.reserved_gpus), and B
    # joins once W's GPU is free again (it covers the unused half).
    half = GpuShare("fraction", milli=500)
    sched = Scheduler(policy(nodes=[("n1", 2)], classes={"training": {"reserved_gpus": 1}}, preemption=False))
    assert [d.job_id for d in sched.handle([JobSubmitted(0.0, job("W", 1, "batch", "t", 0))])] == ["W"]
    out = sched.handle([JobSubmitted(0.0, job("P", 1, "training", "t", 0, share=half)),
                        JobSubmitted(0.0, job("B", 1, "batch", "t", 0, share=half))])
    assert [d.job_id for d in out if isinstance(d, Start)] == ["P"]
    assert str(sched.pending_reason("B")) == "ReservedFor(classes.training.reserved_gpus)"
    out = sched.handle([JobFinished(10.0, job_id="W", status=ExitStatus.COMPLETED)])
    assert [(d.job_id, d.placement.parts) for d in out if isinstance(d, Start)] == [("B", (("n1", (1,)),))]


def test_a_share_of_another_class_joins_a_reserved_classs_card_while_free_gpus_cover_the_reservation():
    # the same jobs, P and B first: B joins P's card (GPU 0) while GPU 1 is free for the
    # unused half of training's reservation, which then keeps W out.
    half = GpuShare("fraction", milli=500)
    sched = Scheduler(policy(nodes=[("n1", 2)], classes={"training": {"reserved_gpus": 1}}, preemption=False))
    out = sched.handle([JobSubmitted(0.0, job("P", 1, "training", "t", 0, share=half)),
                        JobSubmitted(0.0, job("B", 1, "batch", "t", 0, share=half)),
                        JobSubmitted(0.0, job("W", 1, "batch", "t", 0))])
    assert [(d.job_id, d.placement.parts) for d in out if isinstance(d, Start)] == [
        ("P", (("n1", (0,)),)), ("B", (("n1", (0,)),))]
    assert str(sched.pending_reason("W")) == "ReservedFor(classes.training.reserved_gpus)"


def test_a_share_joining_a_card_takes_nothing_from_a_preemptors_class_hold_slack():
    # seed 59 (drawn once the share draws took classes' reserved_gpus): production
    # inference reserves 1 of n1's 7 GPUs. X (batch, a time-slice replica) holds GPU 0's
    # card, V (sandbox, 2 GPUs) GPUs 1-2; P (batch, 4 GPUs) preempts V at 10 and holds 4
    # GPUs while V's grace runs: 4 free + V's 2 - 4 = 2, one of them production
    # inference's - one GPU of slack. At 20 S (research-training, a replica) joins X's
    # card: it takes no free GPU. J (sandbox, 1 GPU) takes the slack's GPU and should
    # start at 20; the pass took S's card GPU from the hold's slack too, and J waited
    # while a second pass at the same instant started it.
    rules = policy(nodes=[node("n1", 7, sharing={"time_slicing": {"replicas": 2}})],
                   classes={"production-inference": {"reserved_gpus": 1}, "sandbox": {"grace_period_s": 100.0}})
    replica = GpuShare("time_slice", mem_mib=8192, slots=1)
    sched = Scheduler(rules)
    out = sched.handle([JobSubmitted(0.0, job("X", 1, "batch", "t", 0, share=replica)),
                        JobSubmitted(0.0, job("V", 2, "sandbox", "t", 0))])
    assert [d.job_id for d in out if isinstance(d, Start)] == ["X", "V"]
    out = sched.handle([JobSubmitted(10.0, job("P", 4, "batch", "t", 10))])
    assert [d.job_id for d in out] == ["V"]  # preempted
    out = sched.handle([JobSubmitted(20.0, job("S", 1, "research-training", "t", 20, share=replica)),
                        JobSubmitted(20.0, job("J", 1, "sandbox", "t", 20))])
    assert [d.job_id for d in out if isinstance(d, Start)] == ["S", "J"]


def test_a_share_preemptor_wakes_when_the_first_card_it_could_empty_comes_of_age():
    # seed 5099: min_runtime 5 s. A and B (sandbox) each fill a time-sliced card of n1,
    # started at 1 and 3. R (research-training, a whole card's replicas) at 4 may evict
    # neither yet. A's card works from 6, B's from 8: R's reason and wake-up must say 6.
    # The plan with every young share picked B's card (less work lost) and said 8; a
    # pass at 6 (a restored core) preempted A.
    rules = policy(nodes=[node("n1", 2, sharing={"time_slicing": {"replicas": 2}})],
                   preemption={"enabled": True, "min_runtime_s": 5.0})
    card = GpuShare("time_slice", mem_mib=8192, slots=2)
    sched = Scheduler(rules)
    sched.handle([JobSubmitted(1.0, job("A", 1, "sandbox", "t", 1, share=card))])
    sched.handle([JobSubmitted(3.0, job("B", 1, "sandbox", "t", 3, share=card))])
    assert sched.handle([JobSubmitted(4.0, job("R", 1, "research-training", "t", 4, share=card))]) == []
    assert str(sched.pending_reason("R")) == "NoPreemptibleVictims(min_runtime: victims eligible at t=6)"
    assert sched.next_wakeup() == 6.0
    out = sched.handle([Tick(6.0)])
    assert [(type(d).__name__, d.job_id) for d in out] == [("Preempt", "A")]



@pytest.mark.parametrize("instants", [(1.0, 2.0, 3.0), (1.0, 1.0, 1.0)], ids=["continued", "one-pass"])
def test_a_share_refused_by_the_claims_preempts_once_a_later_start_takes_its_free_gpu(instants):
    # seed 1323: R (training, 2 GPUs on n1) reserves n1 from 50, when B (batch, not
    # preemptible) ends; V (sandbox, half a card) holds n2's card. S (research-training,
    # 3/4 of a card, limit 100) could open n1's free GPU but runs into R's reservation:
    # ReservedFor(R) - a share preempts only when no room takes it (note 042). W (batch,
    # estimate 10) then backfills on that GPU: S has no room left and must preempt V at
    # that instant, as a second full pass there did. The pass (continued with W, or one
    # pass with all three) left S's refusal as the claims had made it.
    t_r, t_s, t_w = instants
    rules = policy(nodes=[node("n1", 2, labels={"zone": "a"}), node("n2", 1, labels={"zone": "b"})])
    sched = Scheduler(rules)
    out = sched.handle([JobSubmitted(0.0, job("B", 1, "batch", "t", 0, preemptible=False, runtime_estimate_s=50.0,
                                              node_selector=(("zone", "a"),))),
                        JobSubmitted(0.0, job("V", 1, "sandbox", "t", 0, share=GpuShare("fraction", milli=500),
                                              node_selector=(("zone", "b"),)))])
    assert [d.placement.parts[0][0] for d in out] == ["n1", "n2"]
    s = job("S", 1, "research-training", "t", t_s, time_limit_s=100.0, share=GpuShare("fraction", milli=750))
    w = job("W", 1, "batch", "t", t_w, runtime_estimate_s=10.0)
    events = [JobSubmitted(t_r, job("R", 2, "training", "t", t_r, same_node=True, node_selector=(("zone", "a"),))),
              JobSubmitted(t_s, s), JobSubmitted(t_w, w)]
    out = []
    for t in sorted(set(instants)):
        out = sched.handle([e for e in events if e.t == t])
        if t_s <= t < t_w:
            assert out == [] and str(sched.pending_reason("S")) == "ReservedFor(R)"
    assert [(type(d).__name__, d.job_id) for d in out] == [("Start", "W"), ("Preempt", "V")]


def test_a_share_opening_a_fresh_gpu_leaves_the_island_a_preemptor_holds():
    # seed 10002: n1's NVLink islands are GPUs 0-2 and 3-5. V1 and V2 (sandbox shares)
    # hold GPUs 0 and 1, Y (batch, not preemptible) GPU 3; GPU 2 was unhealthy while
    # they started, so 2, 4 and 5 are free. P (production inference, 3 GPUs on one island) preempts V1 and V2
    # and holds island 0-2. S (batch, a share) then opens a fresh GPU: the hold counts
    # 3 GPUs of n1, not which, and S took GPU 2 (the fullest island first), so P found
    # no island when V1 and V2 left: NoFit(nvlink-island). S must take GPU 4 or 5.
    rules = policy(nodes=[node("n1", 6, nvlink_islands=[[0, 1, 2], [3, 4, 5]])],
                   classes={"sandbox": {"grace_period_s": 10.0}}, preemption={"enabled": True, "min_runtime_s": 0.0})
    half = GpuShare("fraction", milli=600)
    sched = Scheduler(rules)
    sched.handle([GpuHealthChanged(0.0, node="n1", gpu=2, healthy=False)])
    out = sched.handle([JobSubmitted(0.0, job("V1", 1, "sandbox", "t", 0, share=half)),
                        JobSubmitted(0.0, job("V2", 1, "sandbox", "t", 0, share=half))])
    out += sched.handle([JobSubmitted(0.5, job("Y", 1, "batch", "t", 0.5, preemptible=False))])
    assert [(d.job_id, d.placement.parts[0][1]) for d in out] == [("V1", (0,)), ("V2", (1,)), ("Y", (3,))]
    sched.handle([GpuHealthChanged(1.0, node="n1", gpu=2, healthy=True)])
    out = sched.handle([JobSubmitted(2.0, job("P", 3, "production-inference", "t", 2, require_island=True))])
    assert sorted(d.job_id for d in out) == ["V1", "V2"]  # preempted
    out = sched.handle([JobSubmitted(3.0, job("S", 1, "batch", "t", 3, share=half))])
    assert [d.job_id for d in out] == ["S"] and out[0].placement.parts[0][1][0] in (4, 5)
    out = sched.handle([JobFinished(12.0, "V1", ExitStatus.PREEMPTED), JobFinished(12.0, "V2", ExitStatus.PREEMPTED)])
    assert [(d.job_id, d.placement.parts[0][1]) for d in out][0] == ("P", (0, 1, 2))  # V1 requeued after it

def test_a_reason_asked_after_a_pass_over_new_jobs_only_reads_the_claims_on_the_state_now():
    # seed 17125 (backfill off): P's preemption of V is in progress, its hold takes V's 2
    # GPUs of n1 and 1 free one; production inference reserves a GPU. H's reason at 1
    # builds the claims that bind a job (holds only, backfill off) on the state of 1: 2
    # GPUs spare beside the hold and the class's reservation. At 2 only submissions came:
    # the pass gives J and K alone their turns (``continue_fast``); J takes n2's 2 free
    # GPUs, leaving none spare, so K (1 GPU) would take the class's GPU the hold counts
    # on: refused, it stops the strict order. Its reason read the claims built at 1 (a
    # cache kept across the pass over the new jobs only), found it admitted there, and
    # said "Priority(not reached by the last pass)" - the fast core's pass had refused it.
    a, b = (("zone", "a"),), (("zone", "b"),)
    rules = policy(nodes=[node("n1", 4, labels={"zone": "a"}), node("n2", 3, labels={"zone": "b"})],
                   teams={"t": {}, "h": {"max_running_jobs": 1}},
                   classes={"production-inference": {"reserved_gpus": 1}}, backfill=False)
    sched = Scheduler(rules)
    sched.handle([JobSubmitted(0.0, job("V", 2, "batch", "t", 0, node_selector=a, runtime_estimate_s=100.0)),
                  JobSubmitted(0.0, job("R", 1, "batch", "h", 0, node_selector=b, runtime_estimate_s=100.0))])
    out = sched.handle([JobSubmitted(1.0, job("P", 3, "training", "t", 1, gpus_per_pod=3)),
                        JobSubmitted(1.0, job("H", 1, "batch", "h", 1))])
    assert [d.job_id for d in out] == ["V"]  # preempted for P
    assert str(sched.pending_reason("H")) == "QuotaExceeded(teams.h.max_running_jobs=1, in use 1)"
    out = sched.handle([JobSubmitted(2.0, job("J", 2, "batch", "t", 2)),
                        JobSubmitted(2.0, job("K", 1, "batch", "t", 2))])
    assert [(d.job_id, placed(d)) for d in out] == [("J", {"n2": (1, 2)})]
    assert str(sched.pending_reason("K")) == "HeldForPreemptor(P)"


@pytest.mark.parametrize("reference", [False, True])
def test_a_new_start_that_puts_a_team_at_its_limit_lets_an_older_job_preempt_within_the_team(reference):
    # the class of seed 116225 (scenario I20-13: per-GPU-type quotas) with
    # preemption.within_team and preemption off: O (team T) waits NoFit behind B, the
    # first blocked job. N (team T, half a GPU) joins F's card at 2: T holds 1.5 of 2, so
    # in a full pass O's turn after N's start is refused by T's limit, which it may
    # preempt W (sandbox, team T) for (note 035). The pass over the new job only started
    # N and left O as it was.
    rules = policy(nodes=[("n1", 3)], preemption=False,
                   teams={"T": {"max_gpus": 2, "preemption": {"within_team": "lower_priority"}}, "U": {}})
    sched = Scheduler(rules, reference=reference)
    sched.handle([JobSubmitted(0.0, job("A", 1, "production-inference", "U", 0)),
                  JobSubmitted(0.0, job("F", 1, "training", "U", 0, share=GpuShare("fraction", milli=500))),
                  JobSubmitted(0.0, job("W", 1, "sandbox", "T", 0))])
    assert sched.handle([JobSubmitted(1.0, job("B", 1, "training", "U", 1)),
                         JobSubmitted(1.0, job("O", 1, "research-training", "T", 1))]) == []
    assert str(sched.pending_reason("O")) == "NoFit(whole-gpu)"
    out = sched.handle([JobSubmitted(2.0, job("N", 1, "training", "T", 2, share=GpuShare("fraction", milli=500)))])
    assert [(type(d).__name__, d.job_id) for d in out] == [("Start", "N"), ("Preempt", "W")]
    assert out[1].preemptor == "O"


@pytest.mark.parametrize("reference", [False, True])
def test_no_preemption_in_a_pass_after_a_start_asked_for_another_pass(reference):
    # seed 305500 (scenario I20-36, variant q-waiting-before): n1 2 GPUs, batch reserves
    # 1 (grace 50). B1 and B2 (batch, 1/2 each) share GPU 1; P (training, 3/4) at 5 and Q
    # (research-training, 3/4) at 7 may not evict them: the emptied card would be a fresh
    # GPU batch's reservation needs. J (training, memory only) comes at 10 and joins their
    # card: evicting B1 and B2 now leaves J's card to join, and J's start asks for another
    # pass. The reference pass went on to Q, behind J, which preempted them; the fast core
    # turned J alone and gave them to P in the repeat pass (at f8d0ba2 only the reference
    # case fails; scenario I20-36 itself, J and Q new together, fails on both). P preempts.
    rules = policy(nodes=[("n1", 2)], classes={"batch": {"reserved_gpus": 1, "grace_period_s": 50}},
                   preemption={"enabled": True, "min_runtime_s": 0})
    sched = Scheduler(rules, reference=reference)
    half = GpuShare("fraction", milli=500)
    out = sched.handle([JobSubmitted(0.0, job("W", 1, "production-inference", "T", 0)),
                        JobSubmitted(0.0, job("B1", 1, "batch", "T", 0, share=half)),
                        JobSubmitted(0.0, job("B2", 1, "batch", "T", 0, share=half))])
    assert [(d.job_id, placed(d)) for d in out] == [("W", {"n1": (0,)}), ("B1", {"n1": (1,)}), ("B2", {"n1": (1,)})]
    three_quarters = GpuShare("fraction", milli=750)
    assert sched.handle([JobSubmitted(5.0, job("P", 1, "training", "T", 5, share=three_quarters))]) == []
    assert sched.handle([JobSubmitted(7.0, job("Q", 1, "research-training", "T", 7, share=three_quarters))]) == []
    assert str(sched.pending_reason("Q")) == "ReservedFor(classes.batch.reserved_gpus)"
    memory_only = GpuShare("fraction", mem_mib=40960)
    out = sched.handle([JobSubmitted(10.0, job("J", 1, "training", "T", 10, share=memory_only))])
    assert (type(out[0]).__name__, out[0].job_id) == ("Start", "J")
    assert sorted((type(d).__name__, d.job_id, d.preemptor) for d in out[1:]) == [
        ("Preempt", "B1", "P"), ("Preempt", "B2", "P")]
    assert str(sched.pending_reason("P")) == "PreemptionInProgress(B1,B2)"
    assert str(sched.pending_reason("Q")) == "Resources"  # the card has no compute left (note 063)


def _brief(out) -> list:
    return [(type(d).__name__, d.job_id, getattr(d, "preemptor", None)) for d in out]


@pytest.mark.parametrize("reference", [False, True])
def test_a_second_preemptor_in_a_pass_is_not_overtaken_by_a_job_behind_it(reference):
    # a review's case against 7e1c2d1 (which let no job preempt once another pass was
    # asked, but let later jobs start): A's preemption asks for another pass; B (behind
    # A) then could not preempt LB, and C (behind B) started on the A100s B's plan needed
    # - B waited until C came of age and evicted it. The pass halts at B instead; the
    # next pass gives B its preemption and holds C back.
    rules = policy(nodes=[("n2", 8), ("n3", 8, "H100")], preemption={"enabled": True, "min_runtime_s": 60})
    sched = Scheduler(rules, reference=reference)
    sched.handle([JobSubmitted(0.0, job("LA", 8, "batch", "t", 0, gpu_types=("H100",), runtime_estimate_s=10000,
                                        time_limit_s=10000)),
                  JobSubmitted(0.0, job("LB", 4, "batch", "t", 0, runtime_estimate_s=10000, time_limit_s=10000))])
    out = sched.handle([
        JobSubmitted(100.0, job("A", 8, "production-inference", "t", 100, gpu_types=("H100",), runtime_estimate_s=1000)),
        JobSubmitted(100.0, job("B", 8, "production-inference", "t", 100, gpu_types=("A100-80GB",),
                                runtime_estimate_s=1000)),
        JobSubmitted(100.0, job("C", 4, "sandbox", "t", 100, runtime_estimate_s=500, time_limit_s=500))])
    assert _brief(out) == [("Preempt", "LA", "A"), ("Preempt", "LB", "B")]
    assert str(sched.pending_reason("C")) == "HeldForPreemptor(B)"


@pytest.mark.parametrize("reference", [False, True])
def test_a_pass_over_new_jobs_halts_where_a_full_pass_would_preempt(reference):
    # a review's case against 7e1c2d1: the pass over new jobs only (continue_fast) reuses
    # the last pass's turn, whose flags (a share refused by the claims at 2) made N1's
    # start ask for another pass; N2 then could not preempt S and N3 started on the H100
    # N2's plan needed, where a full pass (the reference, a restored core) preempts S for
    # N2 and holds N3 back. Now every core decides what the full pass does.
    a100, h100 = ("A100-80GB",), ("H100",)
    rules = policy(nodes=[("n1", 2), ("n2", 2, "H100")], preemption={"enabled": True, "min_runtime_s": 0})
    sched = Scheduler(rules, reference=reference)
    sched.handle([JobSubmitted(0.0, job("R", 1, "training", "t", 0, gpu_types=a100, runtime_estimate_s=1000)),
                  JobSubmitted(0.0, job("S", 1, "sandbox", "t", 0, gpu_types=h100, runtime_estimate_s=5000))])
    sched.handle([JobSubmitted(1.0, job("F", 2, "training", "t", 1, gpu_types=a100, runtime_estimate_s=1000))])
    sched.handle([JobSubmitted(2.0, job("O", 1, "research-training", "t", 2, gpu_types=a100, runtime_estimate_s=5000,
                                        share=GpuShare("fraction", milli=500)))])
    out = sched.handle([JobSubmitted(10.0, job("N1", 1, "training", "t", 10, gpu_types=a100, runtime_estimate_s=100)),
                        JobSubmitted(10.0, job("N2", 2, "training", "t", 10, gpu_types=h100, runtime_estimate_s=1000)),
                        JobSubmitted(10.0, job("N3", 1, "training", "t", 10, gpu_types=h100, runtime_estimate_s=100))])
    assert _brief(out) == [("Start", "N1", None), ("Preempt", "S", "N2")]
    assert str(sched.pending_reason("N3")) == "HeldForPreemptor(N2)"
