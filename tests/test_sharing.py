"""GPU sharing and placement constraints (issue #4): shares of one GPU, MIG, node
filters, NVLink islands, rejection at submit, stranded capacity."""

from __future__ import annotations

import json

import pytest

from builders import job, node, policy, scheduler, submit
from gpushepherd.core.scheduler import Scheduler, SpecError
from gpushepherd.model.decisions import Reject, Start
from gpushepherd.model.events import JobFinished
from gpushepherd.model.job import ExitStatus, GpuShare, JobState
from gpushepherd.model.reasons import ReasonCode as R
from gpushepherd.policy import PolicyError, policy_from_dict
from gpushepherd.sim.engine import SimJob, Simulator

MIG7 = {"g0": {"layout": ["1g.10gb"] * 7}}


def frac(milli: int, mem: int = 0) -> GpuShare:
    return GpuShare("fraction", milli=milli, mem_mib=mem)


def started(out) -> dict[str, str]:
    return {d.job_id: str(d.placement) for d in out if isinstance(d, Start)}


def done(t: float, *ids: str) -> list[JobFinished]:
    return [JobFinished(t, i, ExitStatus.COMPLETED) for i in ids]


# ------------------------------------------------------------ exact fractions
def test_ten_tenths_fill_one_card_exactly():
    # 0.1 x 10 in binary floating point is 0.9999999999999999: milli-GPUs are exact
    sched, out = scheduler(policy(nodes=[("n1", 1)]), *[job(f"j{i}", share=frac(100)) for i in range(11)])
    assert len(started(out)) == 10
    assert sched.ledger.slots[0].cards[0].milli == 1000
    # the card is full: no fraction of it is left, and that is capacity (note 063)
    assert str(sched.pending_reason("j10")) == "Resources"
    sched.check_invariants()


def test_a_share_reads_gpu_fraction_only_while_a_card_has_some_left():
    # NoFit(gpu-fraction): a card of its kind has compute left, too little for it; a
    # card with none left is capacity, Resources (note 063)
    sched, out = scheduler(policy(nodes=[("n1", 1)]), job("a", share=frac(600)), job("b", share=frac(500), submit=1))
    assert started(out) == {"a": "n1:0[fraction:0.6]"}
    assert str(sched.pending_reason("b")) == "NoFit(gpu-fraction)"
    out = sched.handle(submit(job("c", share=frac(400), submit=2)))
    assert started(out) == {"c": "n1:0[fraction:0.4]"}
    assert str(sched.pending_reason("b")) == "Resources"


def test_a_share_prefers_the_tightest_card_and_keeps_whole_gpus_whole():
    rules = policy(nodes=[("n1", 2), ("n2", 2)])
    sched, out = scheduler(rules, job("a", share=frac(600)), job("b", share=frac(300)), job("w", 2, submit=1))
    # a opens n1:0, b joins it (tightest card that fits), n2 stays whole for w
    assert started(out) == {"a": "n1:0[fraction:0.6]", "b": "n1:0[fraction:0.3]", "w": "n2:0,1"}
    # a whole-GPU job never lands on a card that hosts shares
    out = sched.handle(submit(job("w1", 1, submit=2)))
    assert started(out) == {"w1": "n1:1"}


def test_a_whole_gpu_job_waits_while_shares_hold_the_card():
    sched, out = scheduler(policy(nodes=[("n1", 1)]), job("s", share=frac(100)), job("w", 1, submit=1))
    assert started(out) == {"s": "n1:0[fraction:0.1]"}
    assert str(sched.pending_reason("w")) == "NoFit(whole-gpu)"  # capacity left only as shares
    out = sched.handle(done(5, "s"))
    assert started(out) == {"w": "n1:0"}


def test_memory_shares_never_over_commit_a_card():
    rules = policy(nodes=[node("n1", 1, gpu_mem_mib=10000)])
    sched, out = scheduler(rules, job("a", share=frac(0, 6000)), job("b", share=frac(0, 4000)),
                           job("c", share=frac(0, 1)))
    assert set(started(out)) == {"a", "b"}
    assert str(sched.pending_reason("c")) == "Resources"  # no memory left on the card (note 063)
    assert sched.ledger.slots[0].cards[0].mem == 10000


def test_time_slicing_counts_replicas_and_memory():
    rules = policy(nodes=[node("n1", 1, gpu_mem_mib=24576, sharing={"time_slicing": {"replicas": 2}})])
    ts = GpuShare("time_slice", mem_mib=1000, slots=1)
    sched, out = scheduler(rules, *[job(f"t{i}", share=ts) for i in range(3)])
    assert set(started(out)) == {"t0", "t1"}
    assert sched.pending_reason("t2").detail == "time-slice-replica"
    with pytest.raises(SpecError, match="declared"):
        sched.handle(submit(job("undeclared", share=GpuShare("time_slice", slots=1), submit=1)))


def test_mps_clients_are_charged_per_process():
    rules = policy(nodes=[node("n1", 1, gpu_mem_mib=40000, sharing={"mps": {"max_clients": 8}})])
    # each client's SM percentage counts: 4 clients at 25% fill the card's 100%
    two = GpuShare("mps", milli=250, mem_mib=5000, slots=2)  # 2 clients x 25% SM x 5000 MiB
    sched, out = scheduler(rules, job("a", share=two), job("b", share=two), job("c", share=two))
    assert set(started(out)) == {"a", "b"}  # 4 clients at 25% take the whole SM budget
    card = sched.ledger.slots[0].cards[0]
    assert (card.milli, card.mem, card.slots) == (1000, 20000, 4)
    assert sched.pending_reason("c").detail == "mps-client"


def test_node_without_time_slicing_rejects_time_sliced_jobs_at_submit():
    sched, out = scheduler(policy(nodes=[("n1", 1)]), job("t", share=GpuShare("time_slice", mem_mib=10, slots=1)))
    assert [d.job_id for d in out if isinstance(d, Reject)] == ["t"]
    assert sched.jobs["t"].state is JobState.REJECTED


# ---------------------------------------------------------------------- MIG
def test_mig_instances_and_whole_gpus_never_mix():
    rules = policy(nodes=[node("n1", 2, mig=MIG7)])
    mig = GpuShare("mig", profile="1g.10gb")
    sched, out = scheduler(rules, job("w", 1), job("w2", 1), *[job(f"m{i}", share=mig, submit=1) for i in range(8)])
    got = started(out)
    assert got["w"] == "n1:1" and "w2" not in got
    assert sorted(v for k, v in got.items() if k.startswith("m")) == [f"n1:0[mig:1g.10gb@{i}]" for i in range(7)]
    # the seven instances are held: nothing is left as MIG instances either (note 063)
    assert str(sched.pending_reason("w2")) == "Resources"
    assert sched.pending_reason("m7").detail == "mig-slice 1g.10gb"
    assert sched.ledger.slots[0].healthy == 1  # whole-GPU capacity of n1 is 1, never 2
    sched.check_invariants()


def test_a_profile_no_card_offers_is_rejected_at_submit():
    rules = policy(nodes=[node("n1", 2, mig=MIG7)])
    sched, out = scheduler(rules, job("big", share=GpuShare("mig", profile="3g.40gb")))
    (rej,) = [d for d in out if isinstance(d, Reject)]
    assert "mig:3g.40gb" in rej.reason


def test_mig_layouts_are_validated_with_the_field_named():
    with pytest.raises(PolicyError, match=r"mig\.g0\.layout.*at most 7 x 1g\.10gb"):
        policy(nodes=[node("n1", 1, mig={"g0": {"layout": ["1g.10gb"] * 8}})])
    with pytest.raises(PolicyError, match="does not support MIG"):
        policy(nodes=[node("n1", 1, gpu_type="V100-32GB", mig={"g0": {"layout": ["1g.10gb"]}})])


def test_seven_mig_slices_count_as_one_gpu_of_quota():
    rules = policy(nodes=[node("n1", 2, mig=MIG7)], teams={"t": {"max_gpus": 1}})
    mig = GpuShare("mig", profile="1g.10gb")
    sched, out = scheduler(rules, *[job(f"m{i}", share=mig) for i in range(7)], job("w", 1, submit=1))
    assert len(started(out)) == 7
    assert str(sched.pending_reason("w")) == "QuotaExceeded(teams.t.max_gpus=1, in use 1)"


def test_production_inference_takes_whole_gpus_or_mig_only():
    sched = Scheduler(policy(nodes=[("n1", 1)]))
    with pytest.raises(SpecError, match="sharing: 'fraction' is not allowed for class production-inference"):
        sched.handle(submit(job("i", cls="production-inference", share=frac(500))))


# ------------------------------------------------------------- node filters
def test_selector_taints_and_driver_filter_nodes():
    rules = policy(nodes=[node("old", 1, driver="470.82"), node("tainted", 1, driver="550.54", taints=["gpu=inference:NoSchedule"]),
                          node("ok", 1, driver="535.104", labels={"zone": "a"})])
    sched, out = scheduler(rules, job("a", min_driver="535.54"), job("b", min_driver="535.54"),
                           job("c", node_selector=(("zone", "b"),)), job("d", tolerations=("gpu",), min_driver="550"))
    # 535.104 >= 535.54 (numeric parts), 470.82 is too old; b waits; c's zone exists nowhere
    assert started(out) == {"a": "ok:0", "d": "tainted:0"}
    assert sched.jobs["b"].state is JobState.PENDING
    assert sched.jobs["c"].state is JobState.REJECTED


def test_cache_locality_is_preferred_or_required():
    rules = policy(nodes=[("n1", 2), node("n2", 2, cached=["llama-70b"]), ("n3", 1)])
    sched, out = scheduler(rules, job("pref", cache_key="llama-70b"), job("need", cache_key="llama-70b",
                                                                         cache_required=True, gpus=2, submit=1))
    assert started(out)["pref"] == "n2:0"
    assert "need" not in started(out)  # n2 has one GPU left
    assert sched.pending_reason("need").code is R.NO_FIT


def test_nvlink_islands_keep_pairs_whole():
    rules = policy(nodes=[node("n1", 4, nvlink_islands=[[0, 1], [2, 3]])])
    sched, out = scheduler(rules, job("s1"), job("s2", submit=1), job("pair", 2, submit=2))
    # s1 opens island 0-1, s2 fills it (the fullest island that fits), the pair gets 2-3
    assert started(out) == {"s1": "n1:0", "s2": "n1:1", "pair": "n1:2,3"}


# -------------------------------------------------------- rejection, stranded
def test_jobs_the_inventory_can_never_hold_are_rejected_with_the_reason():
    rules = policy(nodes=[node("n1", 8, gpu_mem_mib=81920)])
    sched, out = scheduler(rules, job("mem", gpu_mem_mib=92160), job("type", gpu_types=("H100-80GB",)),
                           job("share", share=frac(0, 92160)), job("fine", 1))
    rejected = {d.job_id: d.reason for d in out if isinstance(d, Reject)}
    assert set(rejected) == {"mem", "type", "share"}
    assert "gpu_mem_mib>=92160" in rejected["mem"] and "A100-80GB/81920 MiB" in rejected["mem"]
    assert "gpu_types=H100-80GB" in rejected["type"]
    assert started(out) == {"fine": "n1:0"}


def test_stranded_capacity_names_the_constraint():
    rules = policy(nodes=[("n1", 2), node("n2", 2, gpu_type="T4")])
    sched, out = scheduler(rules, job("a"), job("s", share=frac(700)), job("big", 2, same_node=True,
                                                                           gpu_types=("A100-80GB",), submit=1))
    report = sched.stranded_capacity()
    # n1: a holds GPU 0, s 0.7 of GPU 1 -> 0.3 of a card nobody pending can use;
    # n2's two T4s are free but big wants A100s
    assert report["by_constraint"] == {"gpu_type": 2.0, "sharing": 0.3}
    assert report["stranded_gpus"] == pytest.approx(2.3)


def test_the_simulator_samples_stranded_capacity():
    rules = policy(nodes=[("n1", 2), node("n2", 2, gpu_type="T4")])
    jobs = [SimJob(job("a", 2, gpu_types=("A100-80GB",)), 100.0),
            SimJob(job("b", 2, gpu_types=("A100-80GB",), submit=10), 100.0)]
    res = Simulator(rules, jobs, stranded_every_s=5.0).run()
    samples = {t: (free, stranded) for t, free, stranded, _by in res.stranded}
    assert samples == {0.0: (2.0, 0.0),  # nothing pending: the T4s are idle, not stranded
                       10.0: (2.0, 2.0),  # b waits for A100s while the T4s idle
                       100.0: (2.0, 0.0), 200.0: (4.0, 0.0)}


def test_shares_survive_a_snapshot_and_restore():
    rules = policy(nodes=[node("n1", 2, mig=MIG7, gpu_mem_mib=81920)])
    sched, _ = scheduler(rules, job("f", share=frac(250, 1000)), job("m", share=GpuShare("mig", profile="1g.10gb")))
    snap = json.loads(json.dumps(sched.snapshot()))
    back = Scheduler.restore(rules, snap)
    assert back.ledger.slots[0].cards[1].holders == {"f": (250, 1000, 0)}
    assert back.ledger.slots[0].migs[0].holders[0] == "m"
    out = back.handle(done(10, "f", "m"))
    assert back.ledger.slots[0].free == 1 and not back.ledger.slots[0].cards
    back.check_invariants()
    assert out == []


def test_policy_rejects_bad_inventory_fields():
    with pytest.raises(PolicyError, match="gpu_uuids"):
        policy_from_dict({"cluster": {"nodes": [{"name": "n", "gpus": 2, "gpu_uuids": ["GPU-1"]}]}})
    with pytest.raises(PolicyError, match="driver"):
        policy_from_dict({"cluster": {"nodes": [{"name": "n", "gpus": 2, "driver": "latest"}]}})


# -------------------------------------------------------- MIG reconfiguration
def _reconf_run(events=()):
    rules = policy(nodes=[node("n1", 1, mig=MIG7)], mig={"reconfigure": True, "delay_s": 60})
    small = GpuShare("mig", profile="1g.10gb")
    jobs = [SimJob(job("s1", share=small), 100.0), SimJob(job("big", share=GpuShare("mig", profile="3g.40gb"),
                                                              submit=10), 100.0)]
    return Simulator(rules, jobs, list(events), check_invariants=True).run()


def test_an_idle_mig_gpu_is_repartitioned_for_the_pending_mix():
    res = _reconf_run()
    assert res.records["big"].reconfigurations == [100.0]
    assert [(t, str(p)) for t, p in res.records["big"].starts] == [(160.0, "n1:0[mig:3g.40gb@4]")]
    layout = res.scheduler.ledger.slots[0].migs[0].layout
    assert [(i.start, i.profile) for i in layout] == [(0, "1g.10gb"), (1, "1g.10gb"), (2, "1g.10gb"),
                                                     (3, "1g.10gb"), (4, "3g.40gb")]


def test_a_restart_while_reconfiguring_keeps_the_plan():
    from gpushepherd.sim.engine import Restart
    res = _reconf_run([Restart(130.0)])
    assert [t for t, _p in res.records["big"].starts] == [160.0]
    assert res.records["big"].reconfigurations == [100.0]


# ------------------------------------------------------------ anti-affinity
def test_sandbox_and_production_inference_never_share_a_node():
    rules = policy(nodes=[("n1", 4), ("n2", 4)], classes={"sandbox": {"avoid_nodes_with": ["production-inference"]}})
    sched, out = scheduler(rules, job("inf", 1, cls="production-inference"), job("nb", 1, cls="sandbox", submit=1),
                           job("nb2", cls="sandbox", share=frac(500), submit=2),
                           job("inf2", 1, cls="production-inference", submit=3))
    # best fit alone would put nb on n1 next to inf; the rule is symmetric for inf2
    assert started(out) == {"inf": "n1:0", "nb": "n2:0", "nb2": "n2:1[fraction:0.5]", "inf2": "n1:1"}
    # batch is not named: it may go anywhere
    out = sched.handle(submit(job("b", 2, cls="batch", submit=5)))
    assert started(out) == {"b": "n1:2,3"}


def test_a_job_kept_off_the_only_node_with_room_says_anti_affinity():
    rules = policy(nodes=[("n1", 4), ("n2", 4)], classes={"sandbox": {"avoid_nodes_with": ["production-inference"]}})
    sched, out = scheduler(rules, job("inf", 1, cls="production-inference"), job("x", 3, cls="sandbox", submit=1),
                           job("y", 3, cls="sandbox", same_node=True, submit=2))
    assert started(out) == {"inf": "n1:0", "x": "n2:0,1,2"}
    assert str(sched.pending_reason("y")) == "NoFit(anti-affinity)"  # n1 has 3 free, but inf runs there
    out = sched.handle(done(10, "inf"))
    assert started(out) == {"y": "n1:0,1,2"}


def test_an_unknown_class_in_avoid_nodes_with_is_named():
    with pytest.raises(PolicyError, match=r"classes\.sandbox\.avoid_nodes_with: 'inference' is not allowed"):
        policy(nodes=[("n1", 1)], classes={"sandbox": {"avoid_nodes_with": ["inference"]}})


# ------------------------------------------------- bad input (hostile review)
def test_mig_profiles_must_be_named_as_nvidia_does():
    sched = Scheduler(policy(nodes=[node("n1", 1, mig=MIG7)], mig={"reconfigure": True}))
    with pytest.raises(SpecError, match=r"share.profile: '1G\.10GB' is not allowed: .*1g\.10gb"):
        sched.handle(submit(job("a", share=GpuShare("mig", profile="1G.10GB"))))
    with pytest.raises(SpecError, match="share: 'fraction' is not allowed: a GpuShare"):
        sched.handle(submit(job("b", share="fraction")))


def test_bad_hardware_events_apply_nothing_of_their_instant():
    from gpushepherd.model.cluster import Node
    from gpushepherd.model.events import GpuHealthChanged, NodeAdded, NodeLost
    from gpushepherd.model.mig import MigInstance
    sched, _ = scheduler(policy(nodes=[("n1", 2), ("n2", 2)]), job("w", 2))
    bad = Node("n3", 1, "A100-80GB", mig=((0, (MigInstance(0, "7g.80gb"), MigInstance(0, "7g.80gb"))),))
    with pytest.raises(ValueError, match="n3: mig: GPU 0"):
        sched.handle([NodeLost(5, "n1"), NodeAdded(5, bad)])
    with pytest.raises(ValueError, match="unknown GPU n2:7"):
        sched.handle([NodeLost(5, "n1"), GpuHealthChanged(5, "n2", 7, False)])
    assert sched.ledger.slots[0].alive and sched.jobs["w"].state is JobState.RUNNING and sched.now == 0


def test_a_lost_node_drops_its_mig_plan_and_a_report_without_a_plan_is_ignored():
    from gpushepherd.model.events import MigReconfigured, NodeAdded, NodeLost
    rules = policy(nodes=[node("n1", 1, mig=MIG7)], mig={"reconfigure": True})
    sched, out = scheduler(rules, job("big", share=GpuShare("mig", profile="3g.40gb")))
    assert [type(d).__name__ for d in out] == ["ReconfigureMig"]
    sched.handle([NodeLost(1, "n1")])
    assert sched.book.mig_plans == {}
    assert sched.handle([MigReconfigured(2, "n1", 0, ((0, "7g.80gb"),))]) == []  # no plan: stale, ignored
    out = sched.handle([NodeAdded(3, rules.nodes[0])])  # back as the policy has it: planned again
    assert [d.layout[-1] for d in out] == [(4, "3g.40gb")]
    # the driver's report is the truth about the GPU, even when it is not what was asked
    out = sched.handle([MigReconfigured(4, "n1", 0, ((0, "7g.80gb"),))])
    assert [i.profile for i in sched.ledger.slots[0].migs[0].layout] == ["7g.80gb"]
    assert [d.layout[-1] for d in out] == [(4, "3g.40gb")]  # and big's plan is asked for again
    sched.check_invariants()


def test_stranded_room_is_the_tightest_dimension_and_reconfiguring_gpus_are_not_free():
    rules = policy(nodes=[node("n1", 1, gpu_mem_mib=24576, sharing={"time_slicing": {"replicas": 2}})])
    ts = GpuShare("time_slice", mem_mib=1000, slots=1)
    sched, _ = scheduler(rules, job("a", share=ts), job("b", share=ts), job("c", share=ts))
    assert sched.stranded_capacity()["free_gpus"] == 0.0  # both replicas taken: nothing free
    rules = policy(nodes=[node("n1", 1, mig=MIG7)], mig={"reconfigure": True})
    sched, _ = scheduler(rules, job("big", share=GpuShare("mig", profile="3g.40gb")))
    assert sched.stranded_capacity()["free_gpus"] == 0.0  # being re-partitioned: out of service


def test_policy_mig_and_sharing_mistakes_are_named():
    with pytest.raises(PolicyError, match="GPU 0 is already given as 'g0'"):
        policy(nodes=[node("n1", 2, mig={"g0": {"layout": ["7g.80gb"]}, "0": {"layout": ["7g.80gb"]}})])
    with pytest.raises(PolicyError, match="layout is not allowed with enabled: false"):
        policy(nodes=[node("n1", 2, mig={"g0": {"enabled": False, "layout": ["7g.80gb"]}})])
    with pytest.raises(PolicyError, match="'memory_slice' is not allowed: one of memory_slices, fractions, exclusive"):
        policy(nodes=[node("n1", 2, sharing="memory_slice")])


def test_a_share_cannot_be_adopted_where_the_node_offers_none():
    from gpushepherd.model.events import JobAdopted
    from gpushepherd.model.placement import Placement
    sched = Scheduler(policy(nodes=[node("n1", 1, sharing="exclusive")]))
    with pytest.raises(SpecError, match="does not offer a fraction:0.5 share"):
        sched.handle([JobAdopted(0, job("e", share=frac(500)), Placement((("n1", (0,)),)), 0.0)])
