"""Nominal quota, borrowing and lending in cohorts, and reclaim (design note 005)."""

import pytest
from builders import job, node, policy_dict
from hypothesis import given
from hypothesis import strategies as st
from test_properties import SLOW, Scenario, run

from gpushepherd.model import Preempt
from gpushepherd.policy import PolicyError, policy_from_dict
from gpushepherd.sim.engine import SimJob, Simulator


def _rules(teams, nodes=(("n1", 8),), reclaim="any", preemption=True, **extra):
    members = [t for t in teams if teams[t].pop("_member", True)]
    raw = policy_dict(nodes=nodes, teams=teams, preemption=preemption,
                      cohorts={"c": {"members": members, "reclaim": reclaim}}, **extra)
    return policy_from_dict(raw).rules


def test_lending_limit_keeps_part_of_the_nominal_quota():
    """A lends at most 1 of its 4 GPUs: B (nominal 0) gets one, never two, even though
    the node has 8 free GPUs; the second waits with CohortQuota naming the rule."""
    rules = _rules({"A": {"nominal_gpus": 4, "lending_limit": 1}, "B": {"nominal_gpus": 0}, "C": {"_member": False}})
    jobs = [SimJob(job("b1", 1, team="B", submit=0), 100), SimJob(job("b2", 1, team="B", submit=0), 100),
            SimJob(job("c1", 4, team="C", submit=0), 100), SimJob(job("b3", 2, team="B", submit=0), 100)]
    res = Simulator(rules, jobs, check_invariants=True, record_reasons=True).run()
    assert res.records["b1"].starts[0][0] == 0 and res.records["c1"].starts[0][0] == 0
    assert res.records["b2"].starts[0][0] == 100  # after b1 gives the lent GPU back
    reasons = [str(r[2]) for r in res.records["b2"].reasons]
    assert any(r.startswith("CohortQuota(cohorts.c(keeping A lending_limit)=1") for r in reasons), reasons
    assert not res.records["b3"].starts  # 2 > the 1 GPU A lends: can never run
    assert res.scheduler.pending_reason("b3").code.value == "ExceedsCapacity"


def test_a_borrower_cannot_reclaim_and_a_team_over_nominal_does_not_evict():
    """A (nominal 2) already holds 2; its third GPU would be borrowed, so it may not
    preempt B's borrowed job of the same class."""
    rules = _rules({"A": {"nominal_gpus": 2}, "B": {"nominal_gpus": 2}}, nodes=(("n1", 4),))
    jobs = [SimJob(job("a1", 2, team="A", cls="training", submit=0), 1000),
            SimJob(job("b1", 2, team="B", cls="training", submit=0, preemptible=True, checkpointable=True), 50),
            SimJob(job("b2", 2, team="B", cls="training", submit=60, preemptible=True, checkpointable=True), 500),
            SimJob(job("a2", 1, team="A", cls="training", submit=70, preemptible=True, checkpointable=True), 10)]
    res = Simulator(rules, jobs, check_invariants=True).run()
    assert not res.records["b2"].preempted_at
    assert res.records["a2"].starts[0][0] == 560


def test_work_that_may_not_be_preempted_never_borrows():
    """A borrowed GPU must be reclaimable: a non-preemptible job runs within its team's
    nominal quota only, so the lender's guarantee holds."""
    rules = _rules({"A": {"nominal_gpus": 2}, "B": {"nominal_gpus": 2}}, nodes=(("n1", 4),))
    jobs = [SimJob(job("b-inf", 2, team="B", cls="production-inference", submit=0), 100),
            SimJob(job("b-inf2", 1, team="B", cls="production-inference", submit=1), 100),
            SimJob(job("b-batch", 1, team="B", cls="batch", submit=2), 500)]
    res = Simulator(rules, jobs, check_invariants=True, record_reasons=True).run()
    assert res.records["b-inf"].starts[0][0] == 0
    assert res.records["b-batch"].starts[0][0] == 2  # preemptible work may borrow
    assert res.records["b-inf2"].starts[0][0] == 100  # waits for B's own nominal
    assert any("teams.B.nominal_gpus(not preemptible)=2" in r[2] for r in res.records["b-inf2"].reasons)


def test_reclaim_takes_the_fewest_youngest_borrowers_and_holds_the_gpus():
    """B borrows 3 of A's 4 GPUs; A's 3-GPU job needs 2 of them back: the two youngest
    borrowers go (1 GPU was free), the oldest keeps running."""
    rules = _rules({"A": {"nominal_gpus": 4}, "B": {"nominal_gpus": 0}}, nodes=(("n1", 4),))
    jobs = [SimJob(job(f"b{i}", 1, team="B", cls="training", submit=i, preemptible=True, checkpointable=True), 1000)
            for i in (1, 2, 3)]
    jobs.append(SimJob(job("a1", 3, team="A", cls="training", submit=10), 100))
    res = Simulator(rules, jobs, check_invariants=True).run()
    assert res.records["a1"].starts[0][0] == 10
    assert [j for j in ("b1", "b2", "b3") if res.records[j].preempted_at] == ["b2", "b3"]
    assert res.records["b2"].starts[1][0] == 110 and res.records["b3"].starts[1][0] == 110


def test_preemption_disabled_disables_reclaim():
    rules = _rules({"A": {"nominal_gpus": 2}, "B": {"nominal_gpus": 0}}, nodes=(("n1", 2),), preemption=False)
    jobs = [SimJob(job("b1", 2, team="B", submit=0), 500), SimJob(job("a1", 2, team="A", cls="training", submit=10), 10)]
    res = Simulator(rules, jobs, check_invariants=True).run()
    assert not res.records["b1"].preempted_at and res.records["a1"].starts[0][0] == 500


@pytest.mark.parametrize("cohorts, teams, field, allowed", [
    ({"c": {"members": ["X"]}}, {"A": {}}, "cohorts.c.members[0]", "a team defined under teams"),
    ({"c": {"members": ["A"]}, "d": {"members": ["A"]}}, {"A": {}}, "cohorts.d.members[0]", "one cohort per pool only"),
    ({"c": {"members": ["A", "K"]}}, {"A": {}, "K": {"parent": "A"}}, "cohorts.c.members", "not each other's parents"),
    ({"c": {"members": ["A"]}}, {"A": {"nominal_gpus": 2, "lending_limit": 3}}, "teams.A.lending_limit",
     "at most the team's nominal_gpus"),
    ({}, {"A": {"borrowing_limit": 1}}, "teams.A.borrowing_limit", "member of a cohort"),
])
def test_bad_cohorts_name_the_field(cohorts, teams, field, allowed):
    with pytest.raises(PolicyError) as exc:
        policy_from_dict(policy_dict(teams=teams, cohorts=cohorts))
    assert field in str(exc.value) and allowed in str(exc.value)


def test_unknown_reclaim_mode_is_rejected():
    with pytest.raises(PolicyError) as exc:
        policy_from_dict(policy_dict(teams={"A": {}}, cohorts={"c": {"members": ["A"], "reclaim": "sometimes"}}))
    assert "cohorts.c.reclaim" in str(exc.value) and "sometimes" in str(exc.value)


# --------------------------------------------------------------- properties
TEAMS = ("A", "B", "C")


@st.composite
def cohort_scenarios(draw):
    gpus = draw(st.integers(2, 6))
    nodes = [("n1", gpus)] + ([("n2", gpus)] if draw(st.booleans()) else [])
    total = gpus * len(nodes)
    teams = {}
    left = total
    for t in TEAMS:
        nom = draw(st.integers(0, left))
        left -= nom
        spec = {"nominal_gpus": nom}
        if draw(st.booleans()):
            spec["borrowing_limit"] = draw(st.integers(0, total))
        if nom and draw(st.booleans()):
            spec["lending_limit"] = draw(st.integers(0, nom))
        teams[t] = spec
    raw = policy_dict(nodes=nodes, teams=teams, preemption={"enabled": True, "min_runtime_s": draw(st.sampled_from([0, 30]))},
                      cohorts={"c": {"members": list(TEAMS),
                                     "reclaim": draw(st.sampled_from(["any", "lower_priority", "never"]))}})
    jobs = []
    for i in range(draw(st.integers(1, 10))):
        cls = draw(st.sampled_from(["training", "batch", "production-inference"]))
        spec = job(f"j{i}", draw(st.integers(1, gpus)), cls=cls, team=draw(st.sampled_from(TEAMS)),
                   submit=draw(st.integers(0, 200)),
                   preemptible=None if cls != "training" else draw(st.booleans()),
                   checkpointable=None if cls != "training" else draw(st.booleans()))
        jobs.append((spec, float(draw(st.integers(1, 300)))))
    return Scenario(raw, jobs, [])


@SLOW
@given(sc=cohort_scenarios())
def test_cohort_quota_holds_and_reclaim_only_takes_borrowed_gpus(sc):
    rules = sc.rules
    cohort = rules.cohorts["c"]
    teams = sc.raw["teams"]
    guard = {t: teams[t]["nominal_gpus"] - teams[t].get("lending_limit", teams[t]["nominal_gpus"]) for t in TEAMS}
    cap = sum(teams[t]["nominal_gpus"] for t in TEAMS)
    specs = sc.specs
    result, steps = run(sc)
    held = {t: 0 for t in TEAMS}
    for s in steps:
        held = {t: 0 for t in TEAMS}
        for h in set(s.holders.values()):
            held[specs[h].team] += specs[h].gpus
        assert sum(max(held[t], guard[t]) for t in TEAMS) <= cap, (s.t, held)
        for t in TEAMS:
            if "borrowing_limit" in teams[t]:
                assert held[t] <= teams[t]["nominal_gpus"] + teams[t]["borrowing_limit"]
        for d in s.decisions:
            if isinstance(d, Preempt) and d.reason == "reclaim":
                victim, pre = specs[d.job_id], specs[d.preemptor]
                assert cohort.reclaim != "never"
                assert victim.workload_class != "production-inference"
                # the reclaimer stays within its nominal quota (it has not started yet)
                assert held[pre.team] + pre.gpus <= teams[pre.team]["nominal_gpus"], (d, held)
                if victim.team != pre.team and (victim.workload_class == pre.workload_class
                                                 or cohort.reclaim == "lower_priority"):
                    # a same-class victim is taken only from a member above its nominal
                    assert held[victim.team] > teams[victim.team]["nominal_gpus"], (d, held)
    for rec in result.records.values():
        assert all(t >= 0 for t, _ in rec.starts)


def test_a_restart_keeps_the_reclaimers_hold():
    """Restored mid-reclaim (victim inside its grace period), the same-class borrower
    queued ahead must not take the GPUs back: the outcome equals the run without restart."""
    raw = policy_dict(nodes=[("n1", 2)], teams={"A": {"nominal_gpus": 2}, "B": {"nominal_gpus": 0}},
                      classes={"training": {"grace_period_s": 30}}, cohorts={"c": {"members": ["A", "B"]}})
    rules = policy_from_dict(raw).rules
    jobs = [SimJob(job("b1", 2, team="B", cls="training", submit=0, preemptible=True, checkpointable=True), 1000),
            SimJob(job("a1", 2, team="A", cls="training", submit=10), 100)]
    from gpushepherd.sim.engine import Restart
    plain = Simulator(rules, jobs, check_invariants=True).run()
    restarted = Simulator(rules, jobs, [Restart(20)], check_invariants=True).run()
    for res in (plain, restarted):
        assert res.records["a1"].starts[0][0] == 40  # after b1's 30 s grace
        assert res.records["b1"].starts[1][0] == 140


def test_nominal_quota_per_pool():
    """Team A is guaranteed 2 GPUs of the inference pool and 4 of the training pool:
    each cohort counts only the jobs confined to its pool, so A borrowing in one pool
    is reclaimed there while its quota in the other pool is untouched."""
    raw = policy_dict(
        nodes=[node("i1", 2, pool="inference"), node("t1", 4, pool="training")],
        classes={"serve": {"priority": 350, "pools": ["inference"]}, "train": {"priority": 250, "pools": ["training"],
                                                                                "preemptible": True,
                                                                                "checkpointable": True}},
        teams={"A": {}, "B": {}},
        cohorts={"inf": {"pool": "inference", "members": [{"team": "A", "nominal_gpus": 2}, "B"]},
                 "trn": {"pool": "training", "members": [{"team": "A", "nominal_gpus": 0},
                                                          {"team": "B", "nominal_gpus": 4}]}})
    rules = policy_from_dict(raw).rules
    paths = [lim.path for lim in rules.limits]
    assert "cohorts.inf" in paths and "cohorts.trn" in paths
    jobs = [SimJob(job("a-train", 4, cls="train", team="A", submit=0), 1000),  # A borrows B's training GPUs
            SimJob(job("a-serve", 2, cls="serve", team="A", submit=0), 1000),  # within A's inference nominal
            SimJob(job("b-train", 2, cls="train", team="B", submit=10), 100)]  # B reclaims in training only
    res = Simulator(rules, jobs, check_invariants=True).run()
    assert res.records["a-train"].preempted_at == [10.0]
    assert res.records["a-serve"].preempted_at == [] and res.records["a-serve"].starts[0][0] == 0
    assert res.records["b-train"].starts[0][0] == 10


def test_a_cohort_pool_must_exist_and_its_nominal_fit_the_pool():
    base = dict(nodes=[node("i1", 2, pool="inference")], teams={"A": {}})
    with pytest.raises(PolicyError) as exc:
        policy_from_dict(policy_dict(**base, cohorts={"c": {"pool": "gpuz", "members": ["A"]}}))
    assert "cohorts.c.pool" in str(exc.value) and "gpuz" in str(exc.value)
    with pytest.raises(PolicyError) as exc:
        policy_from_dict(policy_dict(**base, cohorts={"c": {"pool": "inference",
                                                            "members": [{"team": "A", "nominal_gpus": 3}]}}))
    assert "cohorts.c.members" in str(exc.value) and "at most pool inference's 2 GPUs" in str(exc.value)


def test_a_member_entry_with_an_unknown_field_is_named():
    with pytest.raises(PolicyError) as exc:
        policy_from_dict(policy_dict(teams={"A": {}}, cohorts={"c": {"members": [{"team": "A", "nominal": 2}]}}))
    assert "cohorts.c.members[0].nominal" in str(exc.value) and "nominal_gpus" in str(exc.value)
