"""Runtime predictions from finished jobs (core/predict.py)."""

import pytest
from builders import job, policy_dict

from gpushepherd.core.predict import RuntimePredictor
from gpushepherd.policy import PolicyError, policy_from_dict
from gpushepherd.sim.engine import Restart, SimJob, Simulator


def test_prediction_is_the_quantile_of_the_users_ratios_then_the_teams():
    p = RuntimePredictor(quantile=0.5, history=3, min_jobs=2)
    assert p.predict("t", "u", 1000) is None  # no history
    p.observe("t", "u", 1000, 100)  # 0.1
    assert p.predict("t", "u", 1000) is None  # one job < min_jobs
    p.observe("t", "u", 1000, 500)  # 0.5
    assert p.predict("t", "u", 2000) == 200  # nearest rank of [0.1, 0.5] at 0.5 -> 0.1
    p.observe("t", "v", 100, 100)  # 1.0, another user of the team
    assert p.predict("t", "w", 1000) == 500  # w has none: the team's [0.1, 0.5, 1.0]
    for ran in (900, 900, 900):
        p.observe("t", "u", 1000, ran)
    assert p.predict("t", "u", 1000) == 900  # only the last 3 count
    assert p.predict("t", "u", None) is None
    q = RuntimePredictor(quantile=0.5, history=3, min_jobs=2)
    q.restore(p.snapshot())
    assert q.predict("t", "u", 1000) == 900 and q.predict("t", "w", 1000) == p.predict("t", "w", 1000)


RAW = policy_dict(nodes=[("n1", 2)], preemption=False, prediction={"enabled": True, "quantile": 1.0, "min_jobs": 2})


def _jobs():
    # u1's jobs use a tenth of their 10,000 s limit; then a 2-GPU job is blocked behind
    # a running one, and a 1-GPU job of u1 with a 10,000 s limit arrives: predicted
    # 1,000 s, it backfills before the reservation at 1,000 + 3,000
    jobs = [SimJob(job(f"h{i}", 1, submit=i * 1000, user="u1", time_limit_s=10_000), 1000) for i in range(2)]
    jobs += [SimJob(job("run", 1, submit=3000, user="u2", team="t2", time_limit_s=2000), 2000),
             SimJob(job("big", 2, submit=3001, user="u2", team="t2", time_limit_s=100), 100),
             SimJob(job("bf", 1, submit=3002, user="u1", time_limit_s=10_000), 900)]
    return jobs


def test_a_prediction_lets_a_job_backfill_that_its_limit_would_not():
    res = Simulator(policy_from_dict(RAW).rules, _jobs(), check_invariants=True).run()
    assert res.scheduler.jobs["bf"].estimate_s == 1000
    assert res.records["bf"].starts[0][0] == 3002
    assert res.records["big"].starts[0][0] == 5000
    off = Simulator(policy_from_dict({**RAW, "prediction": {"enabled": False}}).rules, _jobs()).run()
    assert off.records["bf"].starts[0][0] == 5100  # its 10,000 s limit would delay big


def test_a_restart_keeps_predictions_and_history():
    rules = policy_from_dict(RAW).rules
    plain = Simulator(rules, _jobs()).run()
    for cut in (1500, 3001.5):
        res = Simulator(rules, _jobs(), [Restart(cut)], check_invariants=True).run()
        assert {j: r.starts for j, r in res.records.items()} == {j: r.starts for j, r in plain.records.items()}


def test_bad_prediction_settings_name_the_field():
    with pytest.raises(PolicyError) as exc:
        policy_from_dict({**RAW, "prediction": {"quantile": 1.5}})
    assert "prediction.quantile" in str(exc.value) and "1.5" in str(exc.value)
