"""Trace readers, the seeded mapping, and their errors."""

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushepherd.policy import policy_from_dict
from gpushepherd.sim.mapping import PHILLY_VCS, class_for, round_limit, to_sim_jobs, unit
from gpushepherd.sim.traces import (TraceError, TraceJob, load_trace, parse_days, parse_mapping, read_csv, read_philly,
                                     read_trace, select)
from builders import write_file

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "traces"
EXCERPT = ROOT / "src/gpushepherd/data/philly-excerpt.csv.gz"


def test_bundled_excerpt_is_real_philly_days_45_to_47():
    jobs = read_philly(EXCERPT)
    assert len(jobs) == 1966
    assert all(45 * 86400 <= j.submit < 47 * 86400 for j in jobs)
    assert all(j.gpus >= 1 and j.duration >= 0 for j in jobs)


@pytest.mark.skipif(not (SHARED / "philly_rfold/philly_trace.csv.gz").exists(), reason="../shared not present")
def test_full_philly_trace_reads():
    jobs = read_philly(SHARED / "philly_rfold/philly_trace.csv.gz")
    assert len(jobs) == 111549
    assert max(j.gpus for j in jobs) == 128


@pytest.mark.skipif(not (SHARED / "elasticflow_itp/raw/cluster04.csv.gz").exists(), reason="../shared not present")
def test_itp_reader_sorts_by_submit():
    jobs = read_trace(SHARED / "elasticflow_itp/raw/cluster04.csv.gz", "itp")
    assert len(jobs) == 15802
    assert [j.submit for j in jobs] == sorted(j.submit for j in jobs)


_write = write_file


@pytest.mark.parametrize("row, fragment", [
    ("1,10.0,CLOS,1,abc,5.0", "line 3: column 'size': 'abc' is not allowed: a number from 1 to 1e+09"),
    ("1,10.0,CLOS,1,1,1e308", "column 'duration (sec)': '1e308' is not allowed"),
    ("1,10.0,CLOS,1,0,5.0", "column 'size': '0' is not allowed"),
    ("1,10.0,CLOS,1,1.5,5.0", "a whole number of GPUs"),
    ("1,-3,CLOS,1,1,5.0", "column 'arrival time (sec)': '-3' is not allowed"),
    ("1,10.0,CLOS,1,1,nan", "column 'duration (sec)': 'nan' is not allowed"),
    ("1,10.0,CLOS,1,1", "5 columns is not allowed: 6 columns"),
    ("0,11.0,CLOS,1,1,5.0", "line 3: job id '0' is not allowed: ids must be unique (first at line 2)"),
])
def test_malformed_philly_row(tmp_path, row, fragment):
    p = _write(tmp_path, "t.csv", "#job id,arrival time (sec),topology,shape,size,duration (sec)\n0,1.0,CLOS,1,1,2.0\n" + row + "\n")
    with pytest.raises(TraceError) as info:
        read_philly(p)
    assert str(p) in str(info.value) and fragment in str(info.value)


def test_byte_order_mark_is_ignored(tmp_path):
    p = tmp_path / "bom.csv"
    p.write_bytes("\ufeffjob_id,submission_time,duration,num_gpu\nx,1,2,1\n".encode())
    assert [j.id for j in read_trace(p, "itp")] == ["x"]


def test_mapping_errors_name_file_and_line(tmp_path):
    rules = policy_from_dict({"cluster": {"nodes": [{"name": "n", "gpus": 8}]}, "teams": {"a": {}}}).rules
    p = _write(tmp_path, "t.csv", "t,n,d,team\n1,1,5,a\n2,1,5,nope\n")
    with pytest.raises(TraceError) as info:
        to_sim_jobs(read_csv(p, parse_mapping("submit=t,gpus=n,duration=d,team=team")), rules)
    assert str(info.value).startswith(f"{p}: line 3: job 2: team 'nope' is not allowed")


def test_generic_csv_with_mapping(tmp_path):
    p = _write(tmp_path, "t.csv.gz", "name,t,n,secs,grp\nb,5,2,100,ml\na,1,1,50,\n")
    jobs = read_csv(p, parse_mapping("id=name,submit=t,gpus=n,duration=secs,team=grp"))
    assert [(j.id, j.submit, j.gpus, j.duration, j.team) for j in jobs] == [("a", 1.0, 1, 50.0, None), ("b", 5.0, 2, 100.0, "ml")]
    with pytest.raises(TraceError, match="column 'nope' \\(for gpus\\) is not allowed"):
        read_csv(p, parse_mapping("submit=t,gpus=nope,duration=secs"))
    for bad in ("submit=t,gpus=n", "submit=t,gpus=n,duration=secs,colour=c", "submit", "submit=t,submit=n,gpus=n,duration=d"):
        with pytest.raises(TraceError):
            parse_mapping(bad)


def test_select_window_and_load():
    from gpushepherd.sim.traces import TraceJob
    jobs = [TraceJob(str(i), i * 43200.0, 1, 10.0) for i in range(10)]
    win = select(jobs, (1, 3))
    assert [j.submit for j in win] == [86400.0, 129600.0, 172800.0, 216000.0]
    fast = select(jobs, (1, 3), load=2.0)
    assert [j.submit for j in fast] == [86400.0, 108000.0, 129600.0, 151200.0]
    assert parse_days("30") == (0.0, 30.0) and parse_days("40:70") == (40.0, 70.0)
    for bad in ("x", "5:2", "-1:3"):
        with pytest.raises(TraceError):
            parse_days(bad)
    with pytest.raises(TraceError):
        select(jobs, None, load=0)


def test_mapping_is_seeded_stable_and_documented():
    rules = policy_from_dict({"cluster": {"nodes": [{"name": "n", "count": 4, "gpus": 8}]}}).rules
    rows = read_philly(EXCERPT)
    a = to_sim_jobs(rows, rules, seed=1)
    b = to_sim_jobs(rows, rules, seed=1)
    c = to_sim_jobs(rows, rules, seed=2)
    assert [j.spec for j in a] == [j.spec for j in b]
    assert [j.spec.team for j in a] != [j.spec.team for j in c]
    # one job's mapping does not depend on the others
    assert to_sim_jobs(rows[5:6], rules, seed=1)[0].spec == a[5].spec
    vcs = {name for name, _ in PHILLY_VCS}
    assert {j.spec.team for j in a} == vcs
    for sj in a:
        spec = sj.spec
        assert spec.workload_class == class_for(spec.gpus, spec.user, seed=1)
        assert spec.time_limit_s >= sj.duration and spec.runtime_estimate_s is None
        assert spec.user.startswith(spec.team + "-u")
    assert 0 <= unit(0, "x", "1") < 1
    assert round_limit(1) == 300 and round_limit(3601) == 7200 and round_limit(100 * 86400 + 1) == 101 * 86400


def test_mapping_uses_policy_teams_and_rejects_unknown_ones():
    rules = policy_from_dict({"cluster": {"nodes": [{"name": "n", "gpus": 8}]},
                              "teams": {"a": {"nominal_gpus": 6}, "b": {"nominal_gpus": 2}}}).rules
    rows = read_philly(EXCERPT)
    teams = [j.spec.team for j in to_sim_jobs(rows, rules)]
    share_a = teams.count("a") / len(teams)
    assert 0.7 < share_a < 0.8  # weighted 6:2
    from gpushepherd.sim.traces import TraceJob
    with pytest.raises(TraceError, match="team 'zz' is not allowed"):
        to_sim_jobs([TraceJob("1", 0.0, 1, 1.0, team="zz")], rules)


def test_generic_csv_maps_a_project_column(tmp_path):
    rules = policy_from_dict({"cluster": {"nodes": [{"name": "n", "gpus": 8}]}}).rules
    p = _write(tmp_path, "t.csv", "t,n,d,proj\n1,1,5,llm\n2,1,5,\n")
    rows = read_csv(p, parse_mapping("submit=t,gpus=n,duration=d,project=proj"))
    assert [j.project for j in rows] == ["llm", ""]
    assert [j.spec.project for j in to_sim_jobs(select(rows, None, load=2.0), rules)] == ["llm", ""]
    bad = _write(tmp_path, "bad.csv", "t,n,d,proj\n1,1,5,\"a\x1bb\"\n")
    with pytest.raises(TraceError, match=f"{bad}: line 2: column 'proj': .* is not allowed: a project"):
        read_csv(bad, parse_mapping("submit=t,gpus=n,duration=d,project=proj"))


_RULES = policy_from_dict({"cluster": {"nodes": [{"name": "n", "count": 4, "gpus": 8}]}}).rules
_TEAM_RULES = policy_from_dict({"cluster": {"nodes": [{"name": "n", "gpus": 8}]},
                                "teams": {"a": {"shares": 3}, "b": {"shares": 1}}}).rules


@settings(max_examples=300, deadline=None)
@given(gpus=st.integers(1, 128), d1=st.floats(0, 1e8), d2=st.floats(0, 1e8), jid=st.text(min_size=1, max_size=8),
       seed=st.integers(0, 2**32), teams=st.booleans())
def test_the_mapping_never_reads_the_true_duration(gpus, d1, d2, jid, seed, teams):
    """Issue 17: a job's class (and team, user, checkpointing) is the same whatever its
    duration; only the time limit - the user's over-estimate of it - follows it."""
    rules = _TEAM_RULES if teams else _RULES
    a, b = (to_sim_jobs([TraceJob(jid, 0.0, gpus, d)], rules, seed=seed)[0].spec for d in (d1, d2))
    assert replace(a, time_limit_s=0) == replace(b, time_limit_s=0)
    assert a.workload_class == class_for(gpus, a.user, seed)


def test_a_class_with_a_max_runtime_is_never_derived():
    """Which jobs would fit a capped class cannot be known without their durations."""
    rules = policy_from_dict({"cluster": {"nodes": [{"name": "n", "gpus": 8}]},
                              "classes": {"sandbox": {"max_runtime_s": 28800}}}).rules
    jobs = to_sim_jobs(read_philly(EXCERPT), rules)
    assert {sj.spec.workload_class for sj in jobs} == {"batch", "research-training", "training"}
    assert all(sj.spec.time_limit_s >= sj.duration for sj in jobs)  # nobody is stopped by a class cap
    assert class_for(1, "u", capped=frozenset({"sandbox", "batch"})) == "research-training"


def test_classes_come_from_size_and_user():
    rows = read_philly(EXCERPT)
    jobs = to_sim_jobs(rows, _RULES)
    by_class = {}
    for sj in jobs:
        by_class.setdefault(sj.spec.workload_class, set()).add(sj.spec.gpus)
    assert min(by_class["training"]) == 8 and by_class["research-training"] <= set(range(2, 8))
    assert by_class["sandbox"] == by_class["batch"] == {1}
    users = {}
    for sj in jobs:
        if sj.spec.gpus == 1:
            users.setdefault(sj.spec.user, set()).add(sj.spec.workload_class)
    assert all(len(v) == 1 for v in users.values())  # a user's 1-GPU jobs are all of one class


def _bad_philly(tmp_path):
    return _write(tmp_path, "t.csv", "#job id,arrival time (sec),topology,shape,size,duration (sec)\n"
                  "0,1.0,CLOS,1,1,2.0\n1,2.0,CLOS,1,0,5.0\n2,3.0,CLOS,1,2,5.0\n0,4.0,CLOS,1,1,1.0\n3,5,CLOS,1,1\n")


def test_bad_rows_refuse_the_file_with_their_count_and_the_first(tmp_path):
    p = _bad_philly(tmp_path)
    with pytest.raises(TraceError) as info:
        read_trace(p, "philly")
    assert str(info.value) == (f"{p}: line 3: column 'size': '0' is not allowed: a number from 1 to 1e+09 "
                               f"(3 bad rows in {p}, nothing of it is used; --skip-bad-rows skips and counts them)")


def test_skip_bad_rows_keeps_the_others_and_counts_the_skipped(tmp_path):
    loaded = load_trace(_bad_philly(tmp_path), "philly", skip_bad_rows=True)
    assert [j.id for j in loaded.rows] == ["0", "2"]
    assert [str(e).split(": ", 2)[1] for e in loaded.skipped] == ["line 3", "line 5", "line 6"]
    assert "ids must be unique (first at line 2)" in str(loaded.skipped[1])
    itp = _write(tmp_path, "c.csv", "job_id,submission_time,duration,num_gpu\na,1,5,0\nb,2,5,4\nc,x,5,1\n")
    loaded = load_trace(itp, "itp", skip_bad_rows=True)
    assert [j.id for j in loaded.rows] == ["b"] and len(loaded.skipped) == 2
    assert "column 'num_gpu': '0' is not allowed" in str(loaded.skipped[0])
    with pytest.raises(TraceError, match="column 'num_gpu': '0' is not allowed.*\\(2 bad rows in"):
        load_trace(itp, "itp")
    assert not load_trace(EXCERPT, "philly", skip_bad_rows=True).skipped


def test_deadline_column_absolute_on_the_submit_clock(tmp_path):
    p = _write(tmp_path, "d.csv", "id,t,n,d,due\na,100,1,50,400\nb,200,2,50,\nc,300,1,50,300.5\n")
    rows = read_csv(p, parse_mapping("id=id,submit=t,gpus=n,duration=d,deadline=due"))
    assert [(j.id, j.deadline_after_s) for j in rows] == [("a", 300.0), ("b", None), ("c", 0.5)]
    specs = [j.spec for j in to_sim_jobs(rows, _RULES)]
    assert [s.deadline for s in specs] == [400.0, None, 300.5]
    # --load moves submit times and keeps each job's slack
    fast = [j.spec for j in to_sim_jobs(select(rows, None, load=2.0), _RULES)]
    assert [(s.submit_time, s.deadline) for s in fast] == [(100.0, 400.0), (150.0, None), (200.0, 200.5)]


def test_deadline_after_is_seconds_after_submit(tmp_path):
    p = _write(tmp_path, "d.csv", "t,n,d,slack\n100,1,50,3600\n")
    [row] = read_csv(p, parse_mapping("submit=t,gpus=n,duration=d,deadline_after=slack"))
    assert to_sim_jobs([row], _RULES)[0].spec.deadline == 3700.0


@pytest.mark.parametrize("field, cell, allowed", [
    ("deadline", "100", "a time after the job's submit \\(100\\) on the submit column's clock"),
    ("deadline", "50", "a time after the job's submit \\(100\\)"),
    ("deadline", "soon", "a number from 0 to 1e\\+09"),
    ("deadline_after", "0", "seconds > 0 after the job's submit"),
    ("deadline_after", "-5", "a number from 0 to 1e\\+09"),
])
def test_a_bad_deadline_names_row_column_and_value_and_can_be_skipped(tmp_path, field, cell, allowed):
    p = _write(tmp_path, "d.csv", f"id,t,n,d,due\nok,100,1,50,1000\nbad,100,1,50,{cell}\n")
    mapping = f"id=id,submit=t,gpus=n,duration=d,{field}=due"
    with pytest.raises(TraceError, match=f"^{p}: line 3: column 'due': '{cell}' is not allowed: {allowed}"):
        load_trace(p, "csv", mapping)
    loaded = load_trace(p, "csv", mapping, skip_bad_rows=True)
    assert [j.id for j in loaded.rows] == ["ok"] and len(loaded.skipped) == 1


def test_deadline_and_deadline_after_are_not_mapped_together():
    with pytest.raises(TraceError, match="deadline and deadline_after are not allowed together"):
        parse_mapping("submit=t,gpus=n,duration=d,deadline=a,deadline_after=b")
