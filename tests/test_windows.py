"""Time windows: properties over random workloads and window layouts.

* admissions never push a team above the limit of the window in force at the start;
* with ``drain`` nothing is ever preempted because a window closed;
* with ``checkpoint-and-stop`` the usage is back under the new limit once the stopped
  jobs have exited (grace 0: in the same instant).
"""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import job, policy_dict
from gpushepherd.policy import policy_from_dict
from gpushepherd.sim.engine import SimJob, Simulator

HOUR = 3600.0


@st.composite
def workloads(draw):
    day_max = draw(st.integers(0, 4))
    night_max = draw(st.integers(day_max, 8))
    start_h = draw(st.integers(0, 23))
    end_h = draw(st.integers(0, 23).filter(lambda h: h != start_h))
    mode = draw(st.sampled_from(["drain", "checkpoint-and-stop"]))
    jobs = []
    for i in range(draw(st.integers(1, 14))):
        jobs.append(SimJob(job(f"j{i}", gpus=draw(st.integers(1, 3)), cls="batch", team="T",
                               submit=draw(st.integers(0, 40)) * HOUR / 2,
                               runtime_estimate_s=None), draw(st.integers(1, 12)) * HOUR / 2))
    raw = policy_dict(nodes=[("n1", 8), ("n2", 4)], preemption=False,
                      teams={"T": {"max_gpus": day_max, "windows": [
                          {"name": "night", "from": f"{start_h:02d}:00", "to": f"{end_h:02d}:00",
                           "max_gpus": night_max}]}},
                      classes={"batch": {"on_window_close": mode}})
    raw["clock"] = {"timezone": "UTC", "start": "2026-11-30T00:00:00"}
    return policy_from_dict(raw).rules, jobs, mode


@settings(max_examples=150, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_window_limits_hold(case):
    rules, jobs, mode = case
    lim = rules.limits[0]
    sim = Simulator(rules, jobs, check_invariants=True, track_usage=lambda s: s.team)
    result = sim.run()
    starts = sorted((t, r.spec.id) for r in result.records.values() for t, _ in r.starts)
    line = result.usage_timeline.get("T", [])
    for t, _job_id in starts:
        usage_after = max(u for tt, u in line if tt == t)
        limit, _ = lim.at(rules.clock, t)
        assert usage_after <= limit, f"at t={t} team T holds {usage_after} > window limit {limit}"
    preempted = [(t, r.spec.id) for r in result.records.values() for t in r.preempted_at]
    if mode == "drain":
        assert preempted == []
    else:
        for t, _ in preempted:
            limit, _ = lim.at(rules.clock, t)
            final = [u for tt, u in line if tt == t][-1]
            assert final <= limit, f"after stopping at t={t} team T still holds {final} > {limit}"
