"""The text summary of shepherd simulate says how many jobs were rejected at submit and
how many never started by the end, each with its top reasons (as `shepherd report` has
top pending reasons): a run where no job ran printed only "utilisation 0.0%" and
"ended 0" (the ElasticFlow cluster04 trace on small-team.yaml, --days 1: 9 jobs of 16
or 32 GPUs rejected on its 8 GPUs, 32 8-GPU training jobs over
classes.training.max_gpus=4)."""

import json
import subprocess
import sys
from pathlib import Path

from gpushepherd.policy.load import policy_from_dict, read_policy_dict
from gpushepherd.sim.engine import Simulator
from gpushepherd.sim.mapping import to_sim_jobs
from gpushepherd.sim.traces import TraceJob

ROOT = Path(__file__).resolve().parent.parent
SMALL_TEAM = ROOT / "examples" / "policies" / "small-team.yaml"


def test_the_summary_counts_rejected_and_never_started_jobs_with_their_reasons(tmp_path):
    p = tmp_path / "t.csv"
    # 16 and 32 GPUs on one 8-GPU node: rejected; 8 GPUs: training, over its max_gpus 4,
    # pending for ever; 1 GPU: runs
    p.write_text("id,t,n,d\nbig1,1,16,100\nbig2,2,16,100\nhuge,3,32,100\nt8a,4,8,100\nt8b,5,8,100\none,6,1,100\n")
    proc = subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", "simulate", "--no-progress", "--trace",
                           str(p), "--format", "csv", "--map", "id=id,submit=t,gpus=n,duration=d", "--policy",
                           str(SMALL_TEAM), "--json", str(tmp_path / "s.json")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    assert "3 jobs rejected, 2 jobs never started (see below)" in text
    assert ("rejected at submit: 3 jobs, never run; top reasons: 2 x gpus=16: the nodes it may use have 8 in all; "
            "1 x gpus=32: the nodes it may use have 8 in all") in text
    assert ("never started by the end: 2 jobs still pending; top pending reasons: 2 x "
            "ExceedsCapacity(classes.training.max_gpus=4)") in text
    assert json.loads((tmp_path / "s.json").read_text())["not_run"] == {
        "rejected": 3, "rejected_reasons": [["gpus=16: the nodes it may use have 8 in all", 2],
                                            ["gpus=32: the nodes it may use have 8 in all", 1]],
        "never_started": 2, "pending_reasons": [["ExceedsCapacity(classes.training.max_gpus=4)", 2]]}


def test_a_run_where_every_job_ran_prints_no_such_lines(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("id,t,n,d\na,1,1,100\n")
    proc = subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", "simulate", "--no-progress", "--trace",
                           str(p), "--format", "csv", "--map", "id=id,submit=t,gpus=n,duration=d"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "rejected" not in proc.stdout and "never started" not in proc.stdout


def test_not_run_keeps_the_top_reasons_by_count_then_text():
    from gpushepherd.sim.metrics import not_run

    rules = policy_from_dict(read_policy_dict(SMALL_TEAM), str(SMALL_TEAM)).rules
    rows = [TraceJob(f"j{g}-{i}", float(i), g, 10.0) for g, n in ((16, 2), (24, 2), (32, 1), (64, 3)) for i in range(n)]
    result = Simulator(rules, to_sim_jobs(rows, rules)).run()
    nr = not_run(result, top=2)
    assert nr["rejected"] == 8 and nr["never_started"] == 0 and nr["pending_reasons"] == []
    assert nr["rejected_reasons"] == [["gpus=64: the nodes it may use have 8 in all", 3],
                                      ["gpus=16: the nodes it may use have 8 in all", 2]]


def test_a_baseline_without_reasons_says_so(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("id,t,n,d\nbig,1,16,100\none,2,1,100\n")
    proc = subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", "simulate", "--no-progress", "--trace",
                           str(p), "--format", "csv", "--map", "id=id,submit=t,gpus=n,duration=d", "--policy",
                           str(SMALL_TEAM), "--scheduler", "tiresias"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert ("never started by the end: 1 job still pending; top pending reasons: 1 x no reason given (a baseline "
            "not on gpushepherd's core gives none)") in " ".join(proc.stdout.split())
