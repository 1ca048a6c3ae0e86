"""A misspelt field of a scenario file is named with the fields allowed there and the
closest one, as a policy file's is; and it is the error named, not the field it left
missing. Before, `clas: batch` in a job said "jobs[0].class: a value is required here"
and `gpuss: 2` "jobs[0].gpuss: unknown field is not allowed", naming nothing allowed."""

import pytest
from test_scenario_errors import HEAD, _error as _with_file

JOB = "jobs:\n  - {id: A, class: batch, submit: 0, gpus: 1, duration: 10}\n"


def _error(tmp_path, text) -> str:
    return _with_file(tmp_path, text).removeprefix(f"{tmp_path / 's.yaml'}: ")


def test_a_misspelt_job_field_is_named_before_the_field_it_leaves_missing(tmp_path):
    msg = _error(tmp_path, HEAD + "jobs:\n  - {id: A, clas: batch, submit: 0, gpus: 1, duration: 10}\nexpect: {}\n")
    assert msg.startswith("jobs[0].clas: 'clas' is not allowed: unknown field; allowed fields here: cache_key, ")
    assert ", class, " in msg and msg.endswith(" (did you mean 'class'?)")


@pytest.mark.parametrize("text, line", [
    ("scenario: x\npolcy: {cluster: {nodes: [{name: n1, gpus: 4}]}}\n" + JOB + "expect: {}\n",
     "polcy: 'polcy' is not allowed: unknown field; allowed fields here: description, events, expect, "
     "initial_allocations, jobs, policy, scenario, source, variants (did you mean 'policy'?)"),
    (HEAD + JOB + "events:\n  - {t: 1, type: cancel, jb: A}\nexpect: {}\n",
     "events[0].jb: 'jb' is not allowed: unknown field; allowed fields here: admin, every_s, gpu, gpu_type, "
     "gpu_util_pct, gpus, job, mem_used_mib, nice, node, t, time_limit, type, until (did you mean 'job'?)"),
    (HEAD + JOB + "expect: {starts: {A: {t: 0, nod: n1}}}\n",
     "expect.starts.A.nod: 'nod' is not allowed: unknown field; allowed fields here: gpus, gpus_total, node, "
     "nodes, t (did you mean 'node'?)"),
    (HEAD + JOB + "expect: {ends: {A: 10}}\nvariants:\n  - {name: v, expect: {sarts: {}}}\n",
     "variants[0].expect.sarts: 'sarts' is not allowed: unknown field; allowed fields here: ends, final_state, "
     "gpu_never_used, max_team_usage, never_preempted, never_starts, pending, preempted, rejected, starts, "
     "team_usage, usage_at (did you mean 'starts'?)"),
])
def test_an_unknown_field_lists_the_allowed_ones(tmp_path, text, line):
    assert _error(tmp_path, text) == line

