"""Row-level refusals of a trace, all counted and skippable alike: a CSV header that
names a mapped column twice is refused (which one is meant cannot be known; the last
one was used silently), and a row the policy cannot take (a team or class it does not
have, a job its submit validation refuses) is a bad row: counted when the file is
refused, skipped and counted with --skip-bad-rows. A job the policy takes but the
scheduler rejects (more GPUs than the cluster) is replayed and counted as rejected."""

import json
import subprocess
import sys

import pytest

from gpushepherd.policy.load import policy_from_dict
from gpushepherd.sim.mapping import to_sim_jobs
from gpushepherd.sim.traces import TraceError, TraceJob, load_trace, parse_mapping, read_csv

POLICY = """\
cluster:
  nodes:
    - {name: n1, gpus: 8}
classes:
  batch: {}
  sandbox:
    sharing: [fraction]
teams:
  a: {nominal_gpus: 4}
  b: {nominal_gpus: 4}
"""
MAP = "id=id,submit=t,gpus=n,duration=d,team=team,class=cls"


def shepherd(tmp_path, body: str, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "p.yaml").write_text(POLICY)
    (tmp_path / "t.csv").write_text("id,t,n,d,team,cls\n" + body)
    return subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", "simulate", "--no-progress", "--trace",
                           str(tmp_path / "t.csv"), "--format", "csv", "--map", MAP, "--policy",
                           str(tmp_path / "p.yaml"), *args], capture_output=True, text=True)


@pytest.mark.parametrize("header", ["ts,ts,secs", "ts, ts ,secs"])
def test_a_header_that_repeats_a_mapped_column_is_refused(tmp_path, header):
    p = tmp_path / "t.csv"
    p.write_text(f"{header}\n1,2,3\n")
    with pytest.raises(TraceError) as exc:
        read_csv(p, parse_mapping("submit=ts,gpus=ts,duration=secs"))
    assert str(exc.value) == (f"{p}: line 1: column 'ts' (for submit) is not allowed: the header names it 2 times "
                              "(columns 1, 2); a column the header names once")
    with pytest.raises(TraceError, match="names it 2 times"):  # not a bad row: never skipped
        load_trace(p, "csv", "submit=ts,gpus=ts,duration=secs", skip_bad_rows=True)


def test_a_repeated_column_no_field_reads_is_fine(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("ts,note,note,secs,n\n1,x,y,3,2\n")
    [row] = read_csv(p, parse_mapping("submit=ts,gpus=n,duration=secs"))
    assert (row.submit, row.gpus, row.duration) == (1.0, 2, 3.0)


def test_rows_the_policy_cannot_take_are_counted_when_the_file_is_refused(tmp_path):
    proc = shepherd(tmp_path, "1,1,1,50,a,batch\n2,2,1,50,zz,batch\n3,3,1,50,b,nope\n4,4,1,50,b,sandbox\n")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    p = tmp_path / "t.csv"
    assert proc.stderr.strip().splitlines() == [
        f"error: {p}: line 3: job 2: team 'zz' is not allowed: a team of the policy (a, b) (3 rows the policy "
        "cannot take, nothing of the trace is used; --skip-bad-rows skips and counts them)"]


def test_skip_bad_rows_skips_rows_the_policy_cannot_take_and_counts_them(tmp_path):
    body = ("1,1,1,50,a,batch\n2,2,1,50,zz,batch\n3,3,0,50,a,batch\n4,4,1,50,b,nope\n5,5,1,50,b,sandbox\n"
            "6,6,16,50,a,batch\n")
    proc = shepherd(tmp_path, body, "--skip-bad-rows", "--json", str(tmp_path / "s.json"))
    assert proc.returncode == 0, proc.stderr
    p = tmp_path / "t.csv"
    assert (f"--skip-bad-rows: skipped 4 bad rows of {p}, 3 of them rows the policy cannot take (the first: {p}: "
            "line 3: job 2: team 'zz' is not allowed") in " ".join(proc.stderr.split())
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["skipped_rows"] == 4 and s["overall"]["jobs"] == 2
    # 16 GPUs on an 8-GPU cluster: the policy takes the job, the scheduler rejects it
    assert s["overall"]["rejected"] == 1 and s["overall"]["finished"] == 1


def test_to_sim_jobs_refuses_what_submit_validation_would(tmp_path):
    rules = policy_from_dict({"cluster": {"nodes": [{"name": "n1", "gpus": 8}]},
                              "classes": {"batch": {}, "sandbox": {"sharing": ["fraction"]}}}).rules
    rows = [TraceJob("1", 0.0, 1, 5.0, workload_class="sandbox", where="t.csv: line 2", line=2),
            TraceJob("2", 1.0, 1, 5.0, workload_class="batch", where="t.csv: line 3", line=3)]
    with pytest.raises(TraceError, match=r"^t\.csv: line 2: job '1': sharing: 'whole' is not allowed for class "
                                         r"sandbox: one of fraction \(1 row the policy cannot take"):
        to_sim_jobs(rows, rules)
    skipped: list = []
    assert [j.spec.id for j in to_sim_jobs(rows, rules, skipped=skipped)] == ["2"]
    assert [e.line for e in skipped] == [2]
