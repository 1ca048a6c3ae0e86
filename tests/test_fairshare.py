"""Fair-share and multifactor priority: exact decayed usage, restarts that forget
nothing, and properties over random workloads."""

import math

from builders import job, policy_dict
from hypothesis import given
from hypothesis import strategies as st
from test_properties import SLOW, Scenario, check_restore, scenarios

from gpushepherd.core import Scheduler
from gpushepherd.core.fairshare import UsageBook
from gpushepherd.policy import policy_from_dict
from gpushepherd.sim.engine import SimJob, Simulator

H = 3600.0


def decayed(runs, t, h=H):
    """Exact decayed GPU-seconds at t of runs [(start, end, gpus)], by the formula."""
    k = h / math.log(2)
    return sum(g * k * (2 ** (-(t - min(b, t)) / h) - 2 ** (-(t - a) / h)) for a, b, g in runs if a < t)


def test_usage_book_matches_the_integral():
    """Queried as time moves forward, between the holds, the book equals the formula."""
    book = UsageBook(H)
    keys = (("all",), ("team", "x"))
    runs = [(0, 400, 2), (100, 400, 1), (1000, 10**9, 1)]
    steps = [(0, 2), (50, None), (100, 1), (250, None), (400, -3), (999, None), (1000, 1), (5000, None)]
    for t, gpus in steps:
        if gpus is not None:
            book.hold(keys, t, gpus)
        assert abs(book.value(("team", "x"), t) - decayed(runs, t)) < 1e-6
        assert book.value(("all",), t) == book.value(("team", "x"), t)
    assert book.value(("team", "nobody"), 10) == 0.0
    assert decayed(runs, 5000) > 0


def test_a_team_that_used_more_ranks_lower():
    """R5: the team that held GPUs all day waits behind the one that rarely runs."""
    rules = policy_from_dict(policy_dict(nodes=[("n1", 2)], preemption=False,
                                         teams={"busy": {}, "rare": {}},
                                         priority={"weights": {"fair_share": 10000}, "recalc_s": 60},
                                         fair_share={"half_life_s": 86400})).rules
    jobs = [SimJob(job("b0", 2, team="busy", submit=0), 20 * H),
            SimJob(job("b1", 2, team="busy", submit=10 * H), 1 * H),
            SimJob(job("r1", 2, team="rare", submit=15 * H), 1 * H)]
    res = Simulator(rules, jobs, check_invariants=True).run()
    assert res.records["r1"].starts[0][0] == 20 * H  # before b1, submitted 5 h earlier
    assert res.records["b1"].starts[0][0] == 21 * H
    sched = res.scheduler
    f = sched.priority_factors("b1")
    assert set(f) == {"class", "fair_share", "age", "size", "time_limit", "deadline", "nice", "priority"}
    assert sched.fair_share_factor("busy") < sched.fair_share_factor("rare")


def test_without_fair_share_weight_the_order_is_fifo():
    rules = policy_from_dict(policy_dict(nodes=[("n1", 2)], preemption=False, teams={"busy": {}, "rare": {}})).rules
    jobs = [SimJob(job("b0", 2, team="busy", submit=0), 20 * H),
            SimJob(job("b1", 2, team="busy", submit=10 * H), 1 * H),
            SimJob(job("r1", 2, team="rare", submit=15 * H), 1 * H)]
    res = Simulator(rules, jobs).run()
    assert res.records["b1"].starts[0][0] == 20 * H and res.records["r1"].starts[0][0] == 21 * H


def test_age_lifts_an_old_job_over_a_newer_one_of_a_favoured_team():
    rules = policy_from_dict(policy_dict(nodes=[("n1", 1)], preemption=False, teams={"a": {}, "b": {}},
                                         priority={"weights": {"fair_share": 100, "age": 1000}, "max_age_s": 3600,
                                                   "recalc_s": 60})).rules
    sched = Scheduler(rules)
    sched.handle([__import__("gpushepherd").model.JobSubmitted(0, job("hog", 1, team="a", submit=0))])
    sched.handle([__import__("gpushepherd").model.JobSubmitted(10, job("old", 1, team="a", submit=10))])
    sched.handle([__import__("gpushepherd").model.JobSubmitted(3000, job("new", 1, team="b", submit=3000))])
    sched.handle([__import__("gpushepherd").model.Tick(3060)])
    assert sched.priority_factors("old")["age"] > sched.priority_factors("new")["age"]
    assert sched.priority_factors("old")["priority"] > sched.priority_factors("new")["priority"]


def _with_fair_share(sc: Scenario, level: str) -> Scenario:
    raw = dict(sc.raw)
    raw["priority"] = {"weights": {"fair_share": 50000, "age": 20000, "size": 1000}, "recalc_s": 7,
                       "max_age_s": 120}
    raw["fair_share"] = {"half_life_s": 40, "level": level}
    return Scenario(raw, sc.jobs, sc.events)


@SLOW
@given(sc=scenarios(), level=st.sampled_from(["team", "user"]), data=st.data())
def test_restore_keeps_usage_and_order_with_fair_share(sc, level, data):
    sc = _with_fair_share(sc, level)
    check_restore(sc, lambda n: data.draw(st.integers(0, n), label="cut"))


@SLOW
@given(sc=scenarios(operator=False, hardware=False))
def test_usage_equals_the_integral_of_what_teams_held(sc):
    sc = _with_fair_share(sc, "team")
    res = Simulator(sc.rules, [SimJob(s, d) for s, d in sc.jobs], sc.events, check_invariants=True).run()
    sched = res.scheduler
    t = max(res.t_last, 1.0)
    for team in {s.team for s, _ in sc.jobs}:
        runs = []
        for rec in res.records.values():
            if rec.spec.team != team:
                continue
            job_ = sched.jobs[rec.spec.id]
            ends = [h.t for h in job_.history if h.from_state in ("RUNNING", "PREEMPTING", "STOPPING")
                    and h.to_state not in ("RUNNING", "PREEMPTING", "STOPPING")]
            for (start, _p), end in zip(rec.starts, ends + [t] * len(rec.starts)):
                runs.append((start, end, rec.spec.gpus))
        got = sched.usage.value(("team", team), t)
        assert got >= 0
        assert abs(got - decayed(runs, t, 40)) < 1e-6 * max(1.0, got)
