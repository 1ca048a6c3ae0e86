"""A scenario's times and expected values are finite numbers: `.inf` or `.nan` (or a
literal like 1e309, which YAML reads as inf) is refused at load, naming the field. An
expectation of NaN compared false with everything, so `expect: {ends: {A: .nan}}` was a
check that never failed, and `submit: .inf` was run as a job refused at submit."""

import pytest

from gpushepherd.sim.scenario import ScenarioError, load_scenario, run_scenario

HEAD = "scenario: x\npolicy: {cluster: {nodes: [{name: n1, gpus: 4}]}}\n"


def _job(extra: str = "", submit: str = "0") -> str:
    return f"jobs:\n  - {{id: A, team: T, class: batch, submit: {submit}, gpus: 1, duration: 10{extra}}}\n"


def _load_error(tmp_path, text) -> str:
    p = tmp_path / "s.yaml"
    p.write_text(HEAD + text)
    with pytest.raises(ScenarioError) as info:
        run_scenario(load_scenario(p), str(p))
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(str(p) + ": "), msg
    return msg.removeprefix(str(p) + ": ")


@pytest.mark.parametrize("body, line", [
    (_job(submit=".inf") + "expect: {}\n", "jobs[0].submit: inf is not allowed: input should be a finite number"),
    (_job(submit="1e309") + "expect: {}\n", "jobs[0].submit: inf is not allowed: input should be a finite number"),
    (_job(", deadline: .inf") + "expect: {}\n", "jobs[0].deadline: inf is not allowed: input should be a finite number"),
    (_job(", time_limit: .inf") + "expect: {}\n",
     "jobs[0].time_limit: inf is not allowed: input should be a finite number"),
    (_job() + "events:\n  - {t: .inf, type: cancel, job: A}\nexpect: {}\n",
     "events[0].t: inf is not allowed: input should be a finite number"),
    (_job() + "expect: {ends: {A: .nan}}\n", "expect.ends.A: nan is not allowed: input should be a finite number"),
    (_job() + "expect: {preempted: {A: [.nan]}}\n",
     "expect.preempted.A[0]: nan is not allowed: input should be a finite number"),
    (_job() + "expect: {starts: {A: {t: .nan}}}\n",
     "expect.starts.A.t: nan is not allowed: input should be a finite number"),
    (_job() + "expect: {team_usage: {T: [[.nan, 1]]}}\n",
     "expect.team_usage.T[0][0]: nan is not allowed: input should be a finite number"),
])
def test_an_infinite_or_nan_number_is_refused_at_load(tmp_path, body, line):
    assert _load_error(tmp_path, body) == line


def test_an_expectation_that_does_not_hold_still_fails(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(HEAD + _job() + "expect: {ends: {A: 11}}\n")
    [outcome] = run_scenario(load_scenario(p), str(p))
    assert not outcome.passed


def test_duration_unbounded_is_still_allowed(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(HEAD + "jobs:\n  - {id: A, team: T, class: batch, submit: 0, gpus: 1, duration: unbounded}\n"
                 "expect: {never_starts: []}\n")
    [outcome] = run_scenario(load_scenario(p), str(p))
    assert outcome.passed
