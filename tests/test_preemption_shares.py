"""Preemption of and for GPU shares (issue 13 point 1; design note 042): a whole-GPU
preemptor evicts the fewest lower-priority shares that leave a card empty; a card a
victim's neighbour keeps is no room; the freed card is held for the preemptor while
its victims leave; MIG instances and shares of a class that may not be evicted are
never victims."""

from __future__ import annotations

from builders import job, policy, scheduler
from gpushepherd.model.decisions import Preempt, Start
from gpushepherd.model.events import JobFinished, JobSubmitted, Tick
from gpushepherd.model.job import ExitStatus, GpuShare
from gpushepherd.model.reasons import ReasonCode as R

TS = {"time_slicing": {"replicas": 4}}


def ts() -> GpuShare:
    return GpuShare("time_slice", mem_mib=4096, slots=1)


def frac(milli: int) -> GpuShare:
    return GpuShare("fraction", milli=milli)


def preempted(out) -> list[str]:
    return sorted(d.job_id for d in out if isinstance(d, Preempt))


def started(out) -> dict[str, str]:
    return {d.job_id: str(d.placement) for d in out if isinstance(d, Start)}


def gone(t: float, *ids: str) -> list[JobFinished]:
    """The victims ``ids`` leave (a preempted job's requeue is its exit)."""
    return [JobFinished(t, i, ExitStatus.PREEMPTED) for i in ids]


def two_cards(**classes):
    """n1 (2 GPUs, 4 time-slice replicas each): a, b, c, d fill GPU 0's card at 0, e
    opens GPU 1's at 1 - all sandbox notebooks with no end."""
    rules = policy(nodes=[{"name": "n1", "gpus": 2, "gpu_mem_mib": 24576, "sharing": TS}],
                   classes={"sandbox": {"grace_period_s": 30}, **classes})
    sched, out = scheduler(rules, *[job(x, cls="sandbox", share=ts()) for x in "abcd"])
    out += sched.handle([JobSubmitted(1, job("e", cls="sandbox", submit=1, share=ts()))])
    assert set(started(out)) == set("abcde")
    cards = sched.ledger.slots[0].cards
    assert set(cards[0].holders) == set("abcd") and set(cards[1].holders) == {"e"}
    return sched


def test_a_whole_gpu_preemptor_empties_the_card_with_the_fewest_shares():
    sched = two_cards()
    out = sched.handle([JobSubmitted(100, job("p", cls="production-inference", submit=100))])
    assert preempted(out) == ["e"]  # one victim on GPU 1, not the four on GPU 0
    assert str(sched.pending_reason("p")) == "PreemptionInProgress(e)"
    out = sched.handle(gone(130, "e"))
    assert started(out) == {"p": "n1:1"}


def test_a_preemptor_of_two_gpus_empties_both_cards():
    sched = two_cards()
    out = sched.handle([JobSubmitted(100, job("p", 2, cls="production-inference", submit=100))])
    assert preempted(out) == list("abcde")
    out = sched.handle(gone(130, *"abcde"))
    assert started(out) == {"p": "n1:0,1"}


def test_a_card_with_a_share_that_may_not_be_evicted_is_no_room():
    rules = policy(nodes=[{"name": "n1", "gpus": 2, "gpu_mem_mib": 24576, "sharing": TS}])
    sched, out = scheduler(rules, job("keep", cls="sandbox", share=ts(), preemptible=False),
                           *[job(x, cls="sandbox", share=ts()) for x in "bcd"])
    out += sched.handle([JobSubmitted(1, job("e", cls="sandbox", submit=1, share=ts()))])
    assert set(sched.ledger.slots[0].cards[0].holders) == {"keep", "b", "c", "d"}
    out = sched.handle([JobSubmitted(100, job("p", 2, cls="production-inference", submit=100))])
    # evicting b, c, d and e frees GPU 1 only: "keep" holds GPU 0 - nobody is evicted
    assert preempted(out) == []
    assert sched.pending_reason("p").code is R.NO_PREEMPTIBLE_VICTIMS
    # one GPU is the card e alone holds: e goes, b, c, d stay on keep's card
    out = sched.handle([JobSubmitted(101, job("q", cls="production-inference", submit=101))])
    assert preempted(out) == ["e"]


def test_shares_of_a_class_evicted_only_with_checkpoints_stay():
    rules = policy(nodes=[("n1", 1)])
    sched, out = scheduler(rules, job("t", cls="training", share=frac(500)))
    out = sched.handle([JobSubmitted(10, job("p", cls="production-inference", submit=10))])
    assert preempted(out) == []  # training preempted only when it checkpoints
    assert str(sched.pending_reason("p")) == "NoPreemptibleVictims(lower-priority jobs may not be preempted)"


def test_lower_shares_that_may_not_be_evicted_yet_wake_the_preemptor():
    rules = policy(nodes=[("n1", 1)], preemption={"enabled": True, "min_runtime_s": 50})
    sched, out = scheduler(rules, job("s", cls="sandbox", share=frac(500)))
    out = sched.handle([JobSubmitted(10, job("p", cls="production-inference", submit=10))])
    assert preempted(out) == []
    assert str(sched.pending_reason("p")) == "NoPreemptibleVictims(min_runtime: victims eligible at t=50)"
    assert sched.next_wakeup() == 50
    out = sched.handle([Tick(50)])
    assert preempted(out) == ["s"]


def test_no_share_joins_a_card_its_victims_are_leaving():
    rules = policy(nodes=[("n1", 1)], classes={"sandbox": {"grace_period_s": 30}})
    sched, out = scheduler(rules, job("s", cls="sandbox", share=frac(500)))
    out = sched.handle([JobSubmitted(10, job("p", cls="production-inference", submit=10))])
    assert preempted(out) == ["s"]
    out = sched.handle([JobSubmitted(11, job("late", cls="batch", submit=11, share=frac(250)))])
    assert started(out) == {}  # the card has room, but it is p's once s is gone
    assert str(sched.pending_reason("late")) == "HeldForPreemptor(p)"
    out = sched.handle(gone(40, "s"))
    assert started(out) == {"p": "n1:0"}


def test_mig_instances_are_never_victims():
    mig = {"g0": {"layout": ["3g.40gb", "3g.40gb"]}}
    rules = policy(nodes=[{"name": "n1", "gpus": 2, "gpu_type": "A100-80GB", "mig": mig}])
    sched, out = scheduler(rules, job("m", cls="sandbox", share=GpuShare("mig", profile="3g.40gb")),
                           job("w", cls="sandbox"))
    assert set(started(out)) == {"m", "w"}
    out = sched.handle([JobSubmitted(10, job("p", cls="production-inference", submit=10))])
    assert preempted(out) == ["w"]  # the whole-GPU sandbox job, never the MIG instance


# ------------------------------------------------------------ a share preempts
def one_full_card(**pre):
    """n1 (1 GPU): sandbox fractions s1 (0.5), s2 and s3 (0.25 each) fill its card."""
    rules = policy(nodes=[("n1", 1)], classes={"sandbox": {"grace_period_s": 30}},
                   preemption={"enabled": True, **pre})
    sched, out = scheduler(rules, job("s1", cls="sandbox", share=frac(500)),
                           job("s2", cls="sandbox", share=frac(250)), job("s3", cls="sandbox", share=frac(250)))
    assert set(started(out)) == {"s1", "s2", "s3"}
    return sched


def test_a_share_evicts_the_fewest_lower_shares_on_one_card():
    sched = one_full_card()
    out = sched.handle([JobSubmitted(10, job("b", cls="batch", submit=10, share=frac(500)))])
    assert preempted(out) == ["s1"]  # one share of 0.5, not s2 and s3, not the whole card
    assert str(sched.pending_reason("b")) == "PreemptionInProgress(s1)"
    out = sched.handle(gone(40, "s1"))
    assert started(out) == {"b": "n1:0[fraction:0.5]"}


def test_a_share_takes_a_card_its_victims_leave_empty():
    sched = one_full_card()
    out = sched.handle([JobSubmitted(10, job("b", cls="batch", submit=10, share=frac(1000)))])
    assert preempted(out) == ["s1", "s2", "s3"]
    out = sched.handle(gone(40, "s1", "s2", "s3"))
    assert started(out) == {"b": "n1:0[fraction:1]"}


def test_a_share_evicts_no_share_of_its_own_class_or_above():
    sched = one_full_card()
    out = sched.handle([JobSubmitted(10, job("x", cls="sandbox", submit=10, share=frac(500)))])
    assert preempted(out) == []
    assert str(sched.pending_reason("x")) == "Resources"  # the one card is full (note 063)


def test_a_share_waits_for_young_victims_to_come_of_age():
    sched = one_full_card(min_runtime_s=50)
    out = sched.handle([JobSubmitted(10, job("b", cls="batch", submit=10, share=frac(500)))])
    assert preempted(out) == []
    assert str(sched.pending_reason("b")) == "NoPreemptibleVictims(min_runtime: victims eligible at t=50)"
    assert sched.next_wakeup() == 50
    out = sched.handle([Tick(50)])
    assert preempted(out) == ["s1"]


def test_lower_shares_that_may_not_be_evicted_read_no_preemptible_victims():
    rules = policy(nodes=[("n1", 1)])
    sched, out = scheduler(rules, job("k", cls="sandbox", share=frac(1000), preemptible=False))
    out = sched.handle([JobSubmitted(10, job("b", cls="batch", submit=10, share=frac(500)))])
    assert preempted(out) == []
    assert str(sched.pending_reason("b")) == "NoPreemptibleVictims(lower-priority jobs may not be preempted)"


def test_time_sliced_notebooks_give_way_to_a_time_sliced_batch_job():
    sched = two_cards()
    out = sched.handle([JobSubmitted(100, job("t", cls="batch", submit=100, share=ts()))])
    # GPU 0's card is full, GPU 1's has room: no one goes
    assert preempted(out) == [] and started(out) == {"t": "n1:1[time_slice:1 replica:4096MiB]"}
    out = sched.handle([JobSubmitted(101, job(x, cls="batch", submit=101, share=ts())) for x in ("u", "v", "w")])
    # u and v fill GPU 1's card; w finds both cards full: one notebook goes - e, the
    # youngest of the lower class on the cheaper card (least work lost) - and w takes its replica
    assert sorted(started(out)) == ["u", "v"] and preempted(out) == ["e"]
    out = sched.handle(gone(131, "e"))
    assert started(out) == {"w": "n1:1[time_slice:1 replica:4096MiB]"}


def test_a_mig_instance_never_preempts():
    mig = {"g0": {"layout": ["7g.80gb"]}}
    rules = policy(nodes=[{"name": "n1", "gpus": 1, "gpu_type": "A100-80GB", "mig": mig}])
    sched, out = scheduler(rules, job("m", cls="sandbox", share=GpuShare("mig", profile="7g.80gb")))
    out = sched.handle([JobSubmitted(10, job("p", cls="batch", submit=10,
                                             share=GpuShare("mig", profile="7g.80gb")))])
    assert preempted(out) == []


def test_no_share_takes_the_room_a_share_preemptor_is_owed():
    rules = policy(nodes=[("n1", 1)], classes={"sandbox": {"grace_period_s": 30}})
    sched, out = scheduler(rules, job("s1", cls="sandbox", share=frac(500)), job("s2", cls="sandbox", share=frac(250)))
    out = sched.handle([JobSubmitted(10, job("b", cls="batch", submit=10, share=frac(750)))])
    assert preempted(out) == ["s1"]  # 0.25 free, s1's 0.5 back: 0.75
    # the card's free 0.25 is b's too: n would leave b 0.5 once s1 is gone
    out = sched.handle([JobSubmitted(11, job("n", cls="sandbox", submit=11, share=frac(250)))])
    assert started(out) == {}
    assert str(sched.pending_reason("n")) == "HeldForPreemptor(b)"
    out = sched.handle(gone(40, "s1"))
    assert started(out) == {"b": "n1:0[fraction:0.75]"}
