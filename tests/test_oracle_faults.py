"""Core faults the oracle (``test_oracle.py``, ``bench/oracle.py``) found, each shrunk by
hand to a few jobs. Each test states the outcome design note 015 requires and names the
seeds of ``bench/oracle.py`` where the fault showed; they fail until the core is fixed.
"""

from __future__ import annotations

from builders import job, policy, simulate
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.decisions import Start
from gpushepherd.model.events import GpuHealthChanged, JobFinished, JobSubmitted, NodeLost
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
    assert str(sched.pending_reason("S")) == "NoFit(gpu-fraction)"
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
    # seed 28: a whole-GPU job that no healthy GPU can hold reads ExceedsCapacity (rule
    # 3 counts healthy GPUs); a MIG share whose only MIG GPU is unhealthy reads
    # NoFit(mig-slice 1g.10gb) - waiting for capacity that cannot come without a
    # hardware event (and, with a window on its team, it is woken at every boundary).
    sched = Scheduler(policy(nodes=[{"name": "n1", "gpus": 1, "gpu_type": "A100-80GB",
                                     "mig": {"g0": {"layout": ["1g.10gb"] * 7}}}]))
    sched.handle([GpuHealthChanged(1.0, node="n1", gpu=0, healthy=False)])
    sched.handle([JobSubmitted(2.0, job("M", 1, "batch", "t", 2, share=GpuShare("mig", profile="1g.10gb")))])
    assert sched.pending_reason("M").code.value == "ExceedsCapacity"
