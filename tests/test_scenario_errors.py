"""A scenario file the runner cannot use gives one ScenarioError line naming the file
and the field; it never crashes the runner, and never passes silently."""

import pytest

from gpushepherd.sim.scenario import ScenarioError, load_scenario, run_scenario

HEAD = "scenario: x\npolicy: {cluster: {nodes: [{name: n1, gpus: 4}]}}\n"
JOB = "  - {id: A, team: T, class: batch, submit: 0, gpus: 1, duration: 10}\n"


def _error(tmp_path, text) -> str:
    p = tmp_path / "s.yaml"
    p.write_text(text)
    with pytest.raises(ScenarioError) as info:
        run_scenario(load_scenario(p), str(p))
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(str(p) + ": "), msg
    return msg


@pytest.mark.parametrize("body, fragment", [
    ("jobs:\n  - {id: A, class: batch, submit: 0, duration: 1, gpu_fraction: 0.5, mig_profile: 1g.10gb}\nexpect: {}\n",
     "jobs[0].mig_profile: '1g.10gb' is not allowed: one of gpu_fraction"),
    ("jobs:\n  - {id: A, class: batch, submit: 0, duration: 1, gpus: 2, gpu_fraction: 0.5}\nexpect: {}\n",
     "jobs[0].gpus: 2 is not allowed: no gpus or gang with gpu_fraction"),
    ("jobs:\n  - {id: A, class: batch, submit: 0, duration: 1, gpu_fraction: 0.0001}\nexpect: {}\n",
     "jobs[0].gpu_fraction: 0.0001 is not allowed: a multiple of 0.001 GPU"),
    ("jobs:\n  - {id: A, class: batch, submit: 0, duration: 1, gpus: 1, mps_sm_percent: 50}\nexpect: {}\n",
     "jobs[0].mps_sm_percent: 50.0 is not allowed: only with mps_replicas"),
    ("jobs:\n  - {id: A, class: batch, submit: 0, duration: 1, mps_replicas: 2, mps_sm_percent: 33.33}\nexpect: {}\n",
     "jobs[0].mps_sm_percent: 33.33 is not allowed: a multiple of 0.1 percent"),
    ("initial_allocations:\n  - {job: E, node: n1, gpus: 2, gpu: 0, fraction: 0.5, ends: 9}\nexpect: {}\n",
     "initial_allocations[0].gpus: 2 is not allowed: 1 and no gpu_indices for a share"),
    ("jobs:\n" + JOB + JOB + "expect: {}\n", "jobs[1].id: 'A' is not allowed: an id used once only"),
    ("jobs:\n  - {id: A1..A3, class: batch, submit: 0, duration: 1}\n  - {id: A2, class: batch, submit: 0, duration: 1}\n"
     "expect: {}\n", "jobs[1].id: 'A2'"),
    ("jobs:\n  - {id: A1..A0, class: batch, submit: 0, duration: 1}\nexpect: {}\n", "id range 'A1..A0'"),
    ("jobs:\n  - {id: A1..A99999999, class: batch, submit: 0, duration: 1}\nexpect: {}\n", "at most 100,000"),
    ("jobs:\n  - {id: X..Y, class: batch, submit: 0, duration: 1}\nexpect: {}\n", "a plain id or a range"),
    ("jobs:\n" + JOB + "events: [{t: 1, type: cancel, job: ZZ}]\nexpect: {}\n", "events[0].job: 'ZZ'"),
    ("jobs:\n" + JOB + "events: [{t: 1, type: gpu_unhealthy, node: n1, gpu: 99}]\nexpect: {}\n", "events[0].gpu: 99"),
    ("jobs:\n" + JOB + "events: [{t: 1, type: gpu_unhealthy, node: zz, gpu: 0}]\nexpect: {}\n", "events[0].node: 'zz'"),
    ("jobs:\n" + JOB + "events: [{t: 1, type: usage, job: ZZ, gpu_util_pct: 1}]\nexpect: {}\n", "events[0].job: 'ZZ'"),
    ("jobs:\n" + JOB + "events: [{t: 1, type: usage, job: A}]\nexpect: {}\n", "events[0].gpu_util_pct"),
    ("jobs:\n" + JOB + "events: [{t: 1, type: update, job: A}]\nexpect: {}\n", "events[0].time_limit"),
    ("jobs:\n" + JOB + "events: [{t: 1, type: update, job: A, nice: x}]\nexpect: {}\n", "nice"),
    ("jobs:\n" + JOB + "events: [{t: 1, type: usage, job: A, gpu_util_pct: 101}]\nexpect: {}\n",
     "gpu_util_pct: 101"),
    ("jobs:\n" + JOB + "events: [{t: 1, type: usage, job: A, gpu_util_pct: 1, every_s: 60}]\nexpect: {}\n",
     "events[0].until"),
    ("jobs:\n" + JOB + "events: [{t: 1, type: gpu_unmanaged, node: n1, gpu: 99}]\nexpect: {}\n", "events[0].gpu: 99"),
    ("jobs:\n" + JOB + "events: [{t: 1, type: node_lost, node: zz}]\nexpect: {}\n", "events[0].node: 'zz'"),
    ("jobs:\n" + JOB + "events: [{t: 1, type: node_added, node: n1, gpus: 4}]\nexpect: {}\n", "events[0].node: 'n1'"),
    ("jobs:\n" + JOB + "events: [{t: 1, type: node_added, node: n9, gpus: 1000000000000}]\nexpect: {}\n",
     "less than or equal to 256"),
    ("jobs:\n" + JOB + "events: [{t: 1, type: cancel}]\nexpect: {}\n", "events[0].job: None is not allowed"),
    ("initial_allocations: [{job: E1, node: n1, gpus: 1, gpu_indices: [-1], ends: 50}]\nexpect: {}\n",
     "initial_allocations[0].gpu_indices[0]"),
    ("initial_allocations: [{job: E1, node: n1, gpus: 2, gpu_indices: [0, 0], ends: 50}]\nexpect: {}\n",
     "2 distinct indices from 0 to 3"),
    ("initial_allocations: [{job: E1, node: n1, gpus: 3, ends: 50}, {job: E2, node: n1, gpus: 3, ends: 50}]\n"
     "expect: {}\n", "at most the 1 GPU(s) of n1 still free"),
    ("jobs:\n" + JOB + "initial_allocations: [{job: A, node: n1, gpus: 1, ends: 5}]\nexpect: {}\n",
     "initial_allocations[0].job: 'A'"),
    ("jobs:\n" + JOB + "expect: {ends: {ZZ: 100}}\n", "expect.ends.ZZ"),
    ("jobs:\n" + JOB + "expect: {never_starts: [ZZ]}\n", "expect.never_starts"),
    ("jobs:\n" + JOB + "expect: {max_team_usage: {ZZ: 1}}\n", "expect.max_team_usage.ZZ"),
    ("jobs:\n" + JOB + "expect: {gpu_never_used: [{nod: n1}]}\n", "expect.gpu_never_used[0]"),
    ("jobs:\n" + JOB + "expect: {gpu_never_used: [{node: n1, gpu: x}]}\n", "expect.gpu_never_used[0].gpu"),
    ("jobs:\n" + JOB + "expect: {}\nvariants: [{name: v, jobs: {A: {colour: red}}, expect: {}}]\n",
     "variants[0].jobs.A.colour"),
    ("jobs:\n" + JOB + "expect: {}\nvariants: [{name: v, jobs: {ZZ: {gpus: 2}}, expect: {}}]\n", "variants[0].jobs.ZZ"),
    ("jobs:\n" + JOB + "expect: {}\nvariants: [{name: v, jobs: {A: {gpus: abc}}, expect: {}}]\n", "x/v: jobs.A.gpus"),
    ("jobs:\n  - {id: A, class: batch, submit: 0, gpus: 1, duration: abc}\nexpect: {}\n", "jobs[0].duration: 'abc'"),
    ("jobs:\n  - {id: A, class: nope, submit: 0, gpus: 1, duration: 1}\nexpect: {}\n", "class: 'nope' is not allowed"),
    ("jobs:\n" + JOB, "expect: a value is required here"),
    # note 026: a refusal of the core's submit validation is REJECTED, but a fault of the file is not
    ("jobs:\n  - {id: A, class: batch, submit: 0, gpus: 1, duration: 1, ignore_signal: true}\nexpect: {}\n",
     "jobs[0].ignore_signal: 'ignore_signal' is not allowed: unknown field; allowed fields here: cache_key"),
    ("jobs:\n  - {id: A, class: batch, submit: 0, gpus: 1, duration: 1, ignores_signal: true, exit_after_signal: 5}\n"
     "expect: {}\n", "jobs[0].exit_after_signal: 5.0 is not allowed: no exit_after_signal with ignores_signal"),
    ("jobs:\n  - {id: A, class: batch, submit: 0, gpus: 1, duration: 1, checkpoint_every: 0}\nexpect: {}\n",
     "jobs[0].checkpoint_every: 0 is not allowed"),
    ("jobs:\n" + JOB + "expect: {rejected: {ZZ: x}}\n", "expect.rejected.ZZ"),
    ("jobs:\n" + JOB + "expect: {final_state: {A: REFUSED}}\n",
     "expect.final_state.A: 'REFUSED' is not allowed: one of PENDING, RUNNING"),
    ("jobs:\n" + JOB + "expect: {}\nvariants: [{name: v, jobs: {A: {class: nope}}, expect: {}}]\n",
     "x/v: jobs.A.class: 'nope' is not allowed: a class of the policy"),
    ("scenario: [\n", "line 2 column 1: not valid YAML"),
])
def test_bad_scenarios(tmp_path, body, fragment):
    text = body if body.startswith("scenario") else HEAD + body
    assert fragment in _error(tmp_path, text)


def test_empty_and_list_files(tmp_path):
    assert "a YAML mapping" in _error(tmp_path, "")
    assert "a YAML mapping" in _error(tmp_path, "- a\n- b\n")


def test_a_job_larger_than_the_cluster_is_rejected(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(HEAD + "jobs:\n  - {id: A, class: batch, submit: 0, gpus: 9, duration: 1}\n"
                 "expect: {never_starts: [A], final_state: {A: REJECTED}}\n")
    assert run_scenario(load_scenario(p), str(p))[0].passed


def test_initial_allocations_skip_shared_and_mig_gpus(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("scenario: x\npolicy: {cluster: {nodes: [{name: n1, gpus: 3, gpu_type: A100-80GB, "
                 "mig: {g0: {layout: [7g.80gb]}}}]}}\n"
                 "initial_allocations:\n  - {job: S, node: n1, gpu: 2, fraction: 0.5, ends: 50}\n"
                 "  - {job: W, node: n1, gpus: 1, ends: 50}\n"
                 "  - {job: G, node: n1, gpu: 2, fraction: 0.25, ends: 50}\n"
                 "expect: {starts: {W: {t: 0, gpus: [1]}, S: {t: 0, gpus: [2]}, G: {t: 0, gpus: [2]}}}\n")
    (outcome,) = run_scenario(load_scenario(p), str(p))
    assert outcome.passed, outcome.failures


def test_a_team_the_policy_lacks_is_a_fault_of_the_file(tmp_path):
    text = ("scenario: x\npolicy: {cluster: {nodes: [{name: n1, gpus: 4}]}, teams: {T: {}}}\n"
            "jobs:\n  - {id: A, team: X, class: batch, submit: 0, gpus: 1, duration: 1}\nexpect: {}\n")
    assert "jobs[0].team: 'X' is not allowed: a team of the policy: T" in _error(tmp_path, text)


def test_a_refused_submission_is_rejected_and_the_run_goes_on(tmp_path):
    """Note 026: a sharing kind the class forbids is a REJECTED job with the core's reason,
    not a refused file; the checker fails a wrong rejection expectation both ways."""
    p = tmp_path / "s.yaml"
    p.write_text(HEAD + "jobs:\n  - {id: A, class: production-inference, submit: 0, gpu_fraction: 0.5, duration: 9}\n"
                 "  - {id: B, class: batch, submit: 5, gpus: 4, duration: 10}\n"
                 "expect: {rejected: {A: \"sharing: 'fraction' is not allowed\", B: nope}, starts: {B: {t: 5}}}\n")
    (outcome,) = run_scenario(load_scenario(p), str(p))
    assert outcome.failures == ["B: final state COMPLETED, expected rejected with a reason containing 'nope'"]
    p.write_text(p.read_text().replace("sharing: 'fraction' is not allowed", "gpus=9"))
    (outcome,) = run_scenario(load_scenario(p), str(p))
    assert outcome.failures[0].startswith("A: rejected: job 'A': sharing: 'fraction' is not allowed for class "
                                          "production-inference"), outcome.failures
