"""The shepherd command as a user runs it: outputs, exit codes, one-line errors."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from gpushepherd.cli.main import app

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "traces"
runner = CliRunner()


def run(*args):
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_simulate_default_prints_a_replay_summary(tmp_path):
    res = run("simulate", "--no-progress", "--json", str(tmp_path / "s.json"))
    assert res.exit_code == 0, res.output
    assert "bundled Philly excerpt" in res.output
    # the demo policy caps sandbox runs, so the trace mapping derives no sandbox jobs (note 024)
    assert "JCT avg" in res.output and "class batch" in res.output and "utilisation" in res.output
    assert "class sandbox" not in res.output
    summary = json.loads((tmp_path / "s.json").read_text())
    o = summary["overall"]
    assert o["jobs"] == 1966 and o["finished"] == 1966
    assert o["jct_s"]["mean"] >= o["lower_bound_jct_s"]
    assert 0 < o["utilisation"] <= 1


def test_stranded_capacity_is_sampled_and_reported(tmp_path):
    # philly.yaml preempts nothing: under the demo policy 8+ GPU jobs are training, its
    # top class, and preempt instead of waiting (note 024)
    res = run("simulate", "--no-progress", "--stranded-every", "3600", "--cluster", "40x8",
              "--policy", str(ROOT / "examples/policies/philly.yaml"), "--json", str(tmp_path / "s.json"))
    assert res.exit_code == 0, res.output
    assert "stranded capacity (" in res.output
    st = json.loads((tmp_path / "s.json").read_text())["stranded"]
    assert st["samples"] > 24
    assert 0 <= st["mean_stranded_gpus"] <= st["mean_free_gpus"] <= 320
    assert st["max_stranded_gpus"] > 0  # whole-node gangs wait while GPUs are free one by one
    assert set(st["mean_by_constraint"]) <= {"single-node"}  # one GPU type, no filters


def test_per_job_output_recomputes_the_figures_and_is_byte_identical(tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    for out in (a, b):
        res = run("simulate", "--no-progress", "--out", str(out), "--json", str(out) + ".json")
        assert res.exit_code == 0, res.output
    assert a.read_bytes() == b.read_bytes()
    df = pd.read_csv(a)
    for col in ("job_id", "team", "class", "gpus", "submit", "start", "end", "preemptions", "nodes"):
        assert col in df.columns
    summary = json.loads(Path(str(a) + ".json").read_text())["overall"]
    assert abs((df["end"] - df["submit"]).mean() - summary["jct_s"]["mean"]) < 1e-6
    assert abs((df["start"] - df["submit"]).quantile(0.99) - summary["queueing_delay_s"]["p99"]) < 1e-6
    assert (df["start"] >= df["submit"]).all() and (df["end"] >= df["start"]).all()


def test_parquet_output(tmp_path):
    res = run("simulate", "--no-progress", "--days", "45.0:45.2", "--out", str(tmp_path / "j.parquet"))
    assert res.exit_code == 0, res.output
    df = pd.read_parquet(tmp_path / "j.parquet")
    assert len(df) > 0 and set(df["state"]) == {"COMPLETED"}


def test_smaller_cluster_waits_longer(tmp_path):
    figures = {}
    for size in ("96x8", "64x8"):
        res = run("simulate", "--no-progress", "--cluster", size, "--json", str(tmp_path / f"{size}.json"))
        assert res.exit_code == 0, res.output
        figures[size] = json.loads((tmp_path / f"{size}.json").read_text())["overall"]
    assert figures["64x8"]["queueing_delay_s"]["mean"] > figures["96x8"]["queueing_delay_s"]["mean"]
    assert figures["64x8"]["jct_s"]["mean"] > figures["96x8"]["jct_s"]["mean"]
    assert figures["64x8"]["utilisation"] > figures["96x8"]["utilisation"]


def test_explain_prints_a_history_with_reasons():
    res = run("simulate", "--no-progress", "--cluster", "64x8", "--explain", "7558")
    assert res.exit_code == 0, res.output
    assert "submitted" in res.output and "RUNNING" in res.output
    assert "waiting: " in res.output  # why it waited, not just when it started


def test_makespan_and_utilisation_match_the_per_job_file(tmp_path):
    # 128 x 8 GPUs: nothing waits or is preempted, so GPU-seconds held = gpus x duration
    res = run("simulate", "--no-progress", "--cluster", "128x8", "--out", str(tmp_path / "j.csv"),
              "--json", str(tmp_path / "s.json"))
    assert res.exit_code == 0, res.output
    df = pd.read_csv(tmp_path / "j.csv")
    assert df["preemptions"].sum() == 0
    o = json.loads((tmp_path / "s.json").read_text())["overall"]
    span = df["end"].max() - df["submit"].min()
    assert abs(o["makespan_s"] - span) < 1e-6
    busy = (df["gpus"] * df["duration"]).sum()
    assert abs(o["utilisation"] - busy / (1024 * span)) < 1e-9


@pytest.mark.parametrize("policy_text, fragment", [
    ("cluster:\n  nodes:\n    - {name: n, gpus: 0}\n", "cluster.nodes[0].gpus: 0 is not allowed"),
    ("cluster:\n  nodes:\n    - {name: n, gpus: 8}\nteams:\n  ml: {max_gpus: -2}\n", "teams.ml.max_gpus: -2 is not allowed"),
    ("cluster:\n  nodes:\n    - {name: n, gpus: 8}\nteams:\n  ml: {classes: {nope: {max_gpus: 1}}}\n", "teams.ml.classes.nope"),
    ("cluster:\n  nodes:\n    - {name: n, gpus: 8}\nteams:\n  a: {nominal_gpus: 6}\n  b: {nominal_gpus: 6}\n", "teams.*.nominal_gpus: 12"),
])
def test_bad_policy_is_one_line_exit_2(tmp_path, policy_text, fragment):
    p = tmp_path / "bad.yaml"
    p.write_text(policy_text)
    proc = subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", "simulate", "--policy", str(p)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and str(p) in lines[0] and fragment in lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout


def test_bad_trace_row_is_one_line_exit_2(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("#job id,arrival time (sec),topology,shape,size,duration (sec)\n0,1.0,CLOS,1,two,2.0\n")
    proc = subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", "simulate", "--trace", str(p)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: {p}: line 2: column 'size': 'two' is not allowed: a number from 1 to 1e+09 (1 bad row in {p}, "
        "nothing of it is used; --skip-bad-rows skips and counts them)"]


def test_skip_bad_rows_skips_and_counts(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("job_id,submission_time,duration,num_gpu\na,1,50,1\nb,2,50,0\nc,3,50,2\nd,4,50,0.5\n")
    res = run("simulate", "--no-progress", "--trace", str(p), "--format", "itp", "--json", str(tmp_path / "s.json"))
    assert res.exit_code == 2 and "(2 bad rows in" in res.output and "line 3: column 'num_gpu': '0'" in res.output
    res = run("simulate", "--no-progress", "--trace", str(p), "--format", "itp", "--skip-bad-rows",
              "--json", str(tmp_path / "s.json"))
    assert res.exit_code == 0, res.output
    assert "--skip-bad-rows: skipped 2 bad rows of" in res.output and "(the first: " in res.output
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["skipped_rows"] == 2 and summary["overall"]["jobs"] == 2


@pytest.mark.parametrize("args, fragment", [
    (["--cluster", "12"], "--cluster"),
    (["--days", "9:3"], "--days"),
    (["--days", "200:300"], "no jobs to simulate"),
    (["--load", "-1"], "--load"),
    (["--out", "x.txt"], "--out"),
    (["--estimates", "oracle"], "--estimates"),
    (["--format", "csv", "--trace", "README.md"], "--map"),
    (["--trace", "nowhere.csv"], "--trace: 'nowhere.csv' does not exist: a trace file is needed"),
    (["--trace", "."], "--trace: '.' is a directory"),
    (["--cluster", ""], "--cluster"),
    (["--json", ""], "--json"),
    (["--format", "itp"], "give --trace too"),
    (["--trace", "x.csv", "--map", "submit=a,gpus=b,duration=c"], "only with --format csv"),
    (["--explain", "no-such-job"], "--explain: job 'no-such-job' is not allowed"),
    (["--out", "o.csv", "--json", "o.csv"], "--json"),
    (["--stranded-every", "0"], "'--stranded-every': '0' is not allowed: a duration > 0"),
    (["--stranded-every", "5e-324"], "'--stranded-every': '5e-324' is not allowed: SECONDS, MM:SS"),
    (["--stranded-every", "0.9"], "'--stranded-every': '0.9' is not allowed: at least 1 s"),
    (["--scheduler", "slurmish"], "--scheduler: 'slurmish' is not allowed: one of gpushepherd, slurm-default, slurm, "
                                  "slurm-timelimit, kueue, kueue-strict, tiresias, fifo"),
    (["--scheduler", "kueue", "--bf-depth", "3"], "--bf-depth: 3 is not allowed"),
    (["--scheduler", "slurm", "--bf-depth", "0"], "--bf-depth: 0 is not allowed: a depth >= 1"),
    (["--scheduler", "tiresias", "--explain", "7558"], "--explain is not allowed with --scheduler tiresias"),
])
def test_bad_options_exit_2(args, fragment):
    res = run("simulate", "--no-progress", *args)
    assert res.exit_code == 2
    assert fragment in res.output


def test_nothing_is_written_when_an_option_is_bad(tmp_path):
    out, js = tmp_path / "o.csv", tmp_path / "o.json"
    res = run("simulate", "--no-progress", "--out", str(out), "--json", str(js), "--explain", "nope")
    assert res.exit_code == 2
    assert not out.exists() and not js.exists()
    afile = tmp_path / "afile"
    afile.write_text("x")
    for opt in ("--out", "--json"):
        target = str(afile / ("x.csv" if opt == "--out" else "x.json"))
        res = run("simulate", "--no-progress", opt, target)
        assert res.exit_code == 2 and opt in res.output


def test_user_text_is_printed_as_is(tmp_path):
    """Job ids, team names and paths with rich markup or :emoji: codes are plain text."""
    p = tmp_path / "odd[b]x[b] :smile:.csv"
    p.write_text("id,t,n,d,team\n[/z],1,1,5,[b]x[/b]\n")
    proc = subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", "simulate", "--trace", str(p),
                           "--format", "csv", "--map", "id=id,submit=t,gpus=n,duration=d,team=team",
                           "--explain", "[/z]"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "team [b]x[/b]" in proc.stdout and "[/z]" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", "policy", "check", ":smile:[/x].yaml"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("error: :smile:[/x].yaml: cannot read the file")


def test_typer_usage_errors_are_one_line():
    proc = subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", "simulate", "--load", "abc"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and proc.stderr.startswith("error: ")


def test_scenario_run_pass_and_fail(tmp_path):
    good = ROOT / "examples/scenarios/S16.yaml"
    res = run("scenario", "run", str(good))
    assert res.exit_code == 0 and "PASS S16" in res.output
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("T2: {t: 1000, node: n1}", "T2: {t: 10, node: n1}"))
    res = run("scenario", "run", "-q", str(bad))
    assert res.exit_code == 1 and "FAIL S16" in res.output and "T2: start #1 at t=1000, expected t=10" in res.output
    broken = tmp_path / "broken.yaml"
    broken.write_text("scenario: X\npolicy: {cluster: {nodes: [{name: n, gpus: 1}]}}\njobs: [{id: a, class: batch, submit: 0}]\nexpect: {}\n")
    res = run("scenario", "run", str(broken))
    assert res.exit_code == 2 and "duration" in res.output


def test_policy_check():
    res = run("policy", "check", str(ROOT / "examples/policies/small-team.yaml"))
    assert res.exit_code == 0 and "OK - 1 node, 8 GPUs" in res.output


def test_policy_check_shows_a_team_s_allowed_classes(tmp_path):
    policy = tmp_path / "allowed.yaml"
    policy.write_text("name: allowed\ncluster: {nodes: [{name: n1, gpus: 8}]}\n"
                      "teams: {ml: {allowed_classes: [training, batch]}, cv: {max_gpus: 4}}\n")
    res = run("policy", "check", str(policy))
    lines = [ln.strip() for ln in res.output.splitlines()]
    assert res.exit_code == 0 and "team ml: allowed classes training, batch" in lines, lines
    assert "team cv: max_gpus=4" in lines, lines


def test_policy_check_gives_a_cohort_member_s_limits_in_the_policy_s_own_numbers(tmp_path):
    # issue 14, point 4b: not the compiled cap (nominal + borrowing) under the name borrowing_limit
    policy = tmp_path / "cohort.yaml"
    policy.write_text("""name: cohort-check
cluster: {nodes: [{name: n1, gpus: 8, gpu_type: A100}]}
classes: {batch: {}}
teams:
  ml: {nominal_gpus: 4, borrowing_limit: 2, lending_limit: 1}
  cv: {nominal_gpus: 4, max_gpus: 6}
cohorts:
  research: {members: [ml, {team: cv, borrowing_limit: 3}]}
""")
    res = run("policy", "check", str(policy))
    assert res.exit_code == 0, res.output
    lines = [ln.strip() for ln in res.output.splitlines()]
    assert "team ml: nominal_gpus=4; cohort research: nominal_gpus=4, borrowing_limit=2 (holds at most 6 GPUs), " \
        "lending_limit=1" in lines, lines
    assert "team cv: nominal_gpus=4, max_gpus=6; cohort research: nominal_gpus=4, borrowing_limit=3 (holds at " \
        "most 7 GPUs), lending_limit unset (lends all its idle quota)" in lines, lines
    assert "cohort research: ml, cv; 8 GPUs of nominal quota shared" in lines
    assert not [ln for ln in lines if "borrowing_limit=6" in ln or "borrowing_limit=7" in ln or "(not preemptible)" in ln
                or ln.startswith("limit cohorts")], lines


@pytest.mark.skipif(not (SHARED / "philly_rfold/philly_trace.csv.gz").exists(), reason="../shared not present")
def test_full_philly_trace_on_2816_gpus(tmp_path):
    """The acceptance run: the whole Philly trace under the example policy."""
    res = run("simulate", "--no-progress", "--trace", str(SHARED / "philly_rfold/philly_trace.csv.gz"),
              "--format", "philly", "--policy", str(ROOT / "examples/policies/philly.yaml"),
              "--json", str(tmp_path / "s.json"))
    assert res.exit_code == 0, res.output
    o = json.loads((tmp_path / "s.json").read_text())["overall"]
    assert o["jobs"] == 111549 and o["finished"] == 111549
    assert o["jct_s"]["mean"] >= o["lower_bound_jct_s"] > 0
    assert 0 < o["utilisation"] <= 1


def test_scenario_run_explains_a_job_per_variant_and_rejects_unknown_jobs():
    path = str(ROOT / "examples/scenarios/S07.yaml")
    ok = run("scenario", "run", "-q", "--explain", "G2", path)
    assert ok.exit_code == 0, ok.output
    assert ok.output.count("reclaiming quota from E1") == 2  # the scenario and its same-class variant
    assert "QuotaExceeded(teams.G.max_gpus=4, in use 2)" in ok.output
    bad = subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", "scenario", "run", "--explain", "nope", path],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--explain: 'nope' is not allowed" in bad.stderr, bad.stderr


def test_size_class_tails_recompute_from_the_per_job_file(tmp_path):
    out = tmp_path / "jobs.csv"
    res = run("simulate", "--no-progress", "--cluster", "24x8", "--out", str(out), "--json", str(tmp_path / "s.json"))
    assert res.exit_code == 0, res.output
    assert "Per size class (GPUs)" in res.output and "fairness across users (Jain's index" in res.output
    assert "wait p90" in res.output
    summary = json.loads((tmp_path / "s.json").read_text())
    df = pd.read_csv(out)
    bins = pd.cut(df["gpus"], [0, 1, 4, 8, 15, float("inf")], labels=["1", "2-4", "5-8", "9-15", "16+"])
    sizes = summary["size_classes"]
    assert set(sizes) == {"1", "2-4", "5-8", "9-15", "16+"}  # --json sorts its keys
    assert sum(f["jobs"] for f in sizes.values()) == len(df)
    for label, g in df.groupby(bins, observed=True):
        f = sizes[label]
        wait = (g["start"] - g["submit"]).dropna()
        assert f["jobs"] == len(g) and f["started"] == len(wait)
        assert f["wait_s"]["max"] == pytest.approx(wait.max()) and f["wait_s"]["mean"] == pytest.approx(wait.mean())
        assert f["wait_s"]["p90"] == pytest.approx(wait.quantile(0.9))  # pandas' default: the same interpolation
        slow = ((g["end"] - g["submit"]) / g["duration"].clip(lower=10)).clip(lower=1).dropna()
        assert f["slowdown"]["max"] == pytest.approx(slow.max())
    assert sizes["5-8"]["wait_s"]["max"] > 0  # 24 x 8 GPUs: gangs wait
    fair = summary["fairness"]
    assert fair["index"] == "jain_user_mean_slowdown" and 0 < fair["value"] <= 1 and fair["users"] > 10


def test_deadlines_from_a_trace_are_counted_met_or_missed(tmp_path):
    # one 8-GPU node: two 8-GPU jobs of 100 s due at 150 s, so exactly one makes it
    p = tmp_path / "t.csv"
    p.write_text("id,t,n,d,due\na,0,8,100,150\nb,0,8,100,150\nc,0,1,10,\n")
    res = run("simulate", "--no-progress", "--trace", str(p), "--format", "csv", "--cluster", "1x8",
              "--map", "id=id,submit=t,gpus=n,duration=d,deadline=due", "--json", str(tmp_path / "s.json"),
              "--out", str(tmp_path / "jobs.csv"))
    assert res.exit_code == 0, res.output
    dl = json.loads((tmp_path / "s.json").read_text())["deadlines"]
    assert (dl["jobs"], dl["met"], dl["missed"], dl["not_ended"], dl["met_share"]) == (2, 1, 1, 0, 0.5)
    assert "deadlines: 1 of 2 jobs with a deadline met it (50.0%), 1 ended after it" in res.output
    df = pd.read_csv(tmp_path / "jobs.csv").set_index("job_id")
    assert df.loc["a", "deadline"] == 150 and pd.isna(df.loc["c", "deadline"])
    late = tmp_path / "late.csv"
    late.write_text("id,t,n,d,due\na,0,8,100,150\nb,20,8,100,20\n")
    bad = run("simulate", "--no-progress", "--trace", str(late), "--format", "csv",
              "--map", "id=id,submit=t,gpus=n,duration=d,deadline=due")
    assert bad.exit_code == 2
    assert (f"{late}: line 3: column 'due': '20' is not allowed: a time after the job's submit (20) on the submit "
            "column's clock (1 bad row in") in " ".join(bad.output.split())


def test_piped_output_is_160_columns_wide_with_or_without_markup():
    """rich cuts a table at 80 columns when the output is not a terminal; every command
    (the demo's live queue too, which prints its own markup) gets 160 there."""
    import io

    from gpushepherd.cli.main import _console
    for markup in (False, True):
        con = _console(markup=markup)
        assert not con.is_terminal and con.width == 160
        con.file = io.StringIO()
        con.print("[b]x[/b]")
        assert con.file.getvalue() == ("x\n" if markup else "[b]x[/b]\n")
