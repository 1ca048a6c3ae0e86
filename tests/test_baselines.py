"""The baselines (gpushepherd.baselines) behave as the systems they name, run from
`shepherd simulate --scheduler` and `bench/compare.py`, and the time-limit priority
factor orders shortest limit first."""

import json
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
from builders import job, policy_dict
from typer.testing import CliRunner

from gpushepherd.baselines import BASELINES, BF_DEPTH, build
from gpushepherd.cli.main import app
from gpushepherd.model import Preempt, Start
from gpushepherd.model.job import natural_key
from gpushepherd.policy import policy_from_dict
from gpushepherd.sim.engine import SimJob, Simulator
from gpushepherd.sim.mapping import to_sim_jobs
from gpushepherd.sim.traces import read_trace


def _run(name, raw, jobs, **kw):
    rules, factory = BASELINES[name](policy_from_dict(raw).rules)
    return Simulator(rules, jobs, scheduler=factory, **kw).run()


def test_fifo_blocks_behind_the_head_and_ignores_classes():
    raw = policy_dict(nodes=[("n1", 4)])
    jobs = [SimJob(job("a", 3, submit=0), 100), SimJob(job("big", 4, submit=1), 10),
            SimJob(job("small", 1, cls="production-inference", submit=2), 10)]
    res = _run("fifo", raw, jobs)
    assert res.records["big"].starts[0][0] == 100
    assert res.records["small"].starts[0][0] == 110  # waited behind big, though 1 GPU was free


def test_kueue_best_effort_fifo_skips_a_blocked_head_without_reserving():
    raw = policy_dict(nodes=[("n1", 4)])
    jobs = [SimJob(job("a", 3, submit=0, time_limit_s=100), 100), SimJob(job("big", 4, submit=1, time_limit_s=10), 10),
            SimJob(job("s1", 1, submit=2, time_limit_s=200), 200)]
    res = _run("kueue", raw, jobs)
    assert res.records["s1"].starts[0][0] == 2  # passes the blocked head
    assert res.records["big"].starts[0][0] == 202  # nothing was reserved for it
    shepherd = Simulator(policy_from_dict(raw).rules, jobs).run()
    assert shepherd.records["s1"].starts[0][0] == 110  # backfill would delay big's reservation


def test_slurm_like_uses_multifactor_priority_and_backfill():
    rules, factory = BASELINES["slurm"](policy_from_dict(policy_dict(nodes=[("n1", 2)])).rules)
    assert rules.priority.fair_share_weight > 0 and rules.priority.age_weight > 0
    assert rules.priority.class_weight > 0 and rules.priority.time_limit_weight == 0
    assert rules.backfill_enabled and not rules.preemption_enabled
    jobs = [SimJob(job("a", 1, submit=0, time_limit_s=1000), 1000),
            SimJob(job("big", 2, submit=1, time_limit_s=100), 100),
            SimJob(job("short", 1, submit=2, time_limit_s=500), 400),
            SimJob(job("long", 1, submit=3, time_limit_s=5000), 400)]
    res = Simulator(rules, jobs, scheduler=factory).run()
    assert res.records["short"].starts[0][0] == 2  # ends by big's reservation at 1000
    assert res.records["big"].starts[0][0] == 1000
    assert res.records["long"].starts[0][0] == 1100


def test_tiresias_preempts_the_job_with_most_attained_service():
    """2D-LAS: 'old' passes 3,600 GPU-s after 1,800 s on 2 GPUs and drops to queue 2;
    'new' (no service yet) then takes its GPUs; 'old' resumes with its work banked."""
    raw = policy_dict(nodes=[("n1", 2)])
    jobs = [SimJob(job("old", 2, submit=0), 5000), SimJob(job("new", 2, submit=100), 1000)]
    res = _run("tiresias", raw, jobs)
    old, new = res.records["old"], res.records["new"]
    assert new.starts[0][0] == 1800 and old.preempted_at == [1800.0]
    assert new.end == 2800  # 1,000 s of work, never demoted (2,000 GPU-s < 3,600)
    assert old.starts[1][0] == 2800 and old.end == 2800 + (5000 - 1800)


def test_tiresias_round_robins_jobs_of_the_low_queue_by_entry_time():
    """Both jobs pass the threshold; in the low queue the one that entered first runs."""
    raw = policy_dict(nodes=[("n1", 1)])
    jobs = [SimJob(job("x", 1, submit=0), 5000), SimJob(job("y", 1, submit=10), 5000)]
    res = _run("tiresias", raw, jobs)
    x, y = res.records["x"], res.records["y"]
    assert x.preempted_at == [3600.0] and y.starts[0][0] == 3600
    assert y.preempted_at == [7200.0]  # y demoted at 7,200, after x entered the low queue
    assert x.end == 7200 + 1400 and y.end == 8600 + 1400


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_every_baseline_replays_the_bundled_excerpt(name):
    """All jobs of the bundled Philly excerpt finish; no GPU is ever given twice."""
    src = resources.files("gpushepherd") / "data"
    raw = policy_from_dict(__import__("gpushepherd.policy", fromlist=["read_policy_dict"]).read_policy_dict(
        str(src / "demo-policy.yaml"))).rules
    jobs = to_sim_jobs(read_trace(str(src / "philly-excerpt.csv.gz"), "philly"), raw)[:400]
    rules, factory = BASELINES[name](raw)
    sim = Simulator(rules, jobs, scheduler=factory)
    held: dict = {}
    inner = sim.sched.handle

    def handle(events):
        for e in events:
            if getattr(e, "job_id", None) and type(e).__name__ == "JobFinished":
                for key in [k for k, v in held.items() if v == e.job_id]:
                    del held[key]
        out = inner(events)
        for d in out:
            if isinstance(d, Start):
                for node, gpus in d.placement.parts:
                    for g in gpus:
                        assert (node, g) not in held, f"{name}: {node}:{g} given twice"
                        held[(node, g)] = d.job_id
            assert not isinstance(d, Preempt) or name == "tiresias" or rules.preemption_enabled
        return out

    sim.sched.handle = handle
    res = sim.run()
    assert all(r.end is not None for r in res.records.values()), name


def test_time_limit_factor_orders_shortest_limit_first():
    raw = policy_dict(nodes=[("n1", 1)], priority={"weights": {"class": 0, "time_limit": 1000}})
    rules = policy_from_dict(raw).rules
    jobs = [SimJob(job("a", 1, submit=0, time_limit_s=100), 100),
            SimJob(job("long", 1, submit=1, time_limit_s=9000), 10),
            SimJob(job("short", 1, submit=2, time_limit_s=600), 10),
            SimJob(job("predicted", 1, submit=3, time_limit_s=9000, runtime_estimate_s=300), 10)]
    res = Simulator(rules, jobs).run()
    order = sorted(("long", "short", "predicted"), key=lambda j: res.records[j].starts[0][0])
    assert order == ["predicted", "short", "long"]
    f = res.scheduler.priority_factors("short")
    assert f["time_limit"] == pytest.approx(1000 * (1 - 600 / (7 * 86400)))


ROOT = Path(__file__).resolve().parent.parent
EXCERPT = resources.files("gpushepherd") / "data" / "philly-excerpt.csv.gz"
PHILLY_POLICY = ROOT / "examples" / "policies" / "philly.yaml"


def _depth_jobs():
    """On 4 GPUs: X (4 GPUs) can start at 1000 only, Y (3 GPUs) at 100, when a ends;
    d (1 GPU, 500 s) fits now and ends before X's start but would hold a GPU Y needs."""
    return [SimJob(job("a", 2, submit=0, time_limit_s=100), 100), SimJob(job("a2", 1, submit=0, time_limit_s=1000), 1000),
            SimJob(job("X", 4, submit=1, time_limit_s=100), 100), SimJob(job("Y", 3, submit=2, time_limit_s=100), 100),
            SimJob(job("d", 1, submit=3, time_limit_s=500), 500)]


@pytest.mark.parametrize("name", sorted(BF_DEPTH))
def test_slurm_baselines_reserve_for_as_many_blocked_jobs_as_the_depth(name):
    base = policy_from_dict(policy_dict(nodes=[("n1", 4)])).rules
    starts = {}
    for depth in (1, 2):
        rules, factory = build(name, base, depth)
        assert rules.backfill_reservations == depth and not rules.preemption_enabled
        res = Simulator(rules, _depth_jobs(), scheduler=factory).run()
        starts[depth] = {j: res.records[j].starts[0][0] for j in ("X", "Y", "d")}
    assert starts[1] == {"X": 1000, "Y": 503, "d": 3}  # EASY: only X is protected
    assert starts[2] == {"X": 1000, "Y": 100, "d": 200}  # Y's reservation keeps d back
    assert build(name, base)[0].backfill_reservations == 1  # the default depth (module docstring)


def test_slurm_default_is_submit_order_and_slurm_timelimit_adds_the_time_limit_factor():
    base = policy_from_dict(policy_dict(nodes=[("n1", 1)])).rules
    jobs = [SimJob(job("a", 1, submit=0, time_limit_s=100), 100),
            SimJob(job("long", 1, cls="training", submit=1, time_limit_s=90000), 10),
            SimJob(job("short", 1, cls="sandbox", submit=2, time_limit_s=600), 10)]
    first = {}
    for name in ("slurm-default", "slurm", "slurm-timelimit"):
        rules, factory = build(name, base)
        res = Simulator(rules, jobs, scheduler=factory).run()
        first[name] = min(("long", "short"), key=lambda j: res.records[j].starts[0][0])
    assert first == {"slurm-default": "long", "slurm": "long", "slurm-timelimit": "short"}


def _cli(*args):
    return CliRunner().invoke(app, ["simulate", "--no-progress", *args], catch_exceptions=False)


@pytest.mark.parametrize("name", list(BASELINES))
def test_every_baseline_runs_from_simulate(name, tmp_path):
    res = _cli("--scheduler", name, "--days", "45:45.2", "--cluster", "8x8", "--policy", str(PHILLY_POLICY),
               "--json", str(tmp_path / "s.json"))
    assert res.exit_code == 0, res.output
    assert ("scheduled by the" in res.output) == (name != "gpushepherd")
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["scheduler"] == name
    o = summary["overall"]
    assert o["jobs"] > 100 and o["finished"] == o["jobs"] and o["jct_over_lower_bound"] >= 1


def _behind_a_waiting_head(res, rules) -> int:
    """Starts of a job while a job ahead of it in its team's queue (class priority,
    submit time, id) had been submitted and had not started."""
    def key(spec):
        return (-rules.classes[spec.workload_class].priority, spec.submit_time, natural_key(spec.id))
    by_team = {}
    for rec in res.records.values():
        by_team.setdefault(rec.spec.team, []).append((key(rec.spec), rec.spec.submit_time, rec.first_start))
    bad = 0
    for recs in by_team.values():
        recs.sort()
        for i, (_k, _sub, start) in enumerate(recs):
            bad += any(sub <= start and s0 > start for _k0, sub, s0 in recs[:i])
    return bad


def test_kueue_strict_never_starts_a_job_behind_a_waiting_head_of_its_queue():
    rules0 = policy_from_dict(__import__("gpushepherd.policy", fromlist=["read_policy_dict"]).read_policy_dict(
        str(PHILLY_POLICY)) | {"cluster": {"nodes": [{"name": "n", "count": 16, "gpus": 8}]}}).rules
    jobs = to_sim_jobs(read_trace(str(EXCERPT), "philly"), rules0)[:800]
    results = {}
    for name in ("kueue-strict", "kueue"):
        rules, factory = build(name, rules0)
        res = Simulator(rules, jobs, scheduler=factory).run()
        assert all(r.end is not None for r in res.records.values())
        results[name] = _behind_a_waiting_head(res, rules0)
    assert results["kueue-strict"] == 0
    assert results["kueue"] > 0  # best effort passes blocked heads: the check can fail


def test_kueue_strict_head_blocks_its_own_queue_only():
    raw = policy_dict(nodes=[("n1", 5)])
    jobs = [SimJob(job("a", 3, team="A", submit=0), 100), SimJob(job("A-big", 5, team="A", submit=1), 10),
            SimJob(job("A-small", 1, team="A", submit=2), 10), SimJob(job("B-small", 1, team="B", submit=3), 10),
            SimJob(job("A-urgent", 1, cls="training", team="A", submit=4), 10)]
    res = _run("kueue-strict", raw, jobs)
    start = {j: res.records[j].starts[0][0] for j in ("A-big", "A-small", "B-small", "A-urgent")}
    # B's queue is not blocked by A's head; A-urgent (a higher class) is A's head on arrival
    assert start == {"B-small": 3, "A-urgent": 4, "A-big": 100, "A-small": 110}
    assert _run("kueue", raw, jobs).records["A-small"].starts[0][0] == 2  # best effort passes A-big


def test_compare_writes_one_jsonl_row_per_scheduler(tmp_path):
    rows = tmp_path / "rows.jsonl"
    names = ["gpushepherd", "slurm-default", "kueue-strict", "tiresias"]
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "compare.py"), "--trace", str(EXCERPT),
                           "--days", "45:45.1", "--cluster", "8x8", "--schedulers", ",".join(names),
                           "--bf-depth", "2", "--jsonl", str(rows), "--out", str(tmp_path / "out"), "--jobs", "1"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = [json.loads(line) for line in rows.read_text().splitlines()]
    assert sorted(r["scheduler"] for r in got) == sorted(names)
    assert {r["bf_depth"] for r in got if r["scheduler"] == "slurm-default"} == {2}
    assert all(r["jobs"] == got[0]["jobs"] > 0 and r["unfinished"] == 0 for r in got)
    assert proc.stdout.count("JCT/bound") == len(names)  # each row printed as it finished
    assert (tmp_path / "out" / "compare.md").exists()
    bad = subprocess.run([sys.executable, str(ROOT / "bench" / "compare.py"), "--schedulers", "gpushepherd,slurmish"],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "--schedulers: 'slurmish' is not allowed" in bad.stderr


def test_the_names_known_without_the_core_are_the_registry_in_order():
    from gpushepherd.baselines import NAMES

    assert tuple(BASELINES) == NAMES


def test_compare_labels_a_preset_by_the_days_and_cluster_it_ran():
    """``--only philly --days 40:50 --cluster 32x8`` ran days 40-50 on 32x8: its rows must
    say so (they said "Philly days 40-70, 192x8", the preset's defaults)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_compare", ROOT / "bench" / "compare.py")
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    ran = compare._preset("philly", "32x8", "40:50")
    assert (ran["label"], ran["days"], ran["cluster"]) == ("Philly days 40-50, 32x8", "40:50", "32x8")
    assert compare._preset("philly", None, None)["label"] == "Philly days 40-70, 192x8"
    assert compare._preset("itp", "16x8", None)["label"] == "ITP cluster04, 16x8"


def test_compare_table_prints_p90_wait_per_size_class():
    """Issue 17 point 4: the size-class table of ``compare.md`` has a p90 wait column;
    ten 8-GPU jobs, nine starting at once and one after 100 h: p90 10.0 h (test_tails)."""
    import importlib.util

    from gpushepherd.tails import tail_figures

    spec = importlib.util.spec_from_file_location("bench_compare", ROOT / "bench" / "compare.py")
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    fig = tail_figures([8] * 10, [0.0] * 9 + [360000.0], [1.0] * 10, ["u"] * 10)
    row = {"trace": "t", "scheduler": "fifo", "estimates": "limit", "avg_jct_h": 1.0, "jct_over_bound": 1.0,
           "max_wait_8plus_h": 100.0, "p99_wait_h": 91.0, "utilisation": 0.5, "preemptions": 0,
           "nonpreemptible_preempted": 0, "wall_s": 1.0, "size_classes": fig["size_classes"]}
    md = compare.table([row])
    assert "| wait mean | wait p90 | wait p99 | wait max |" in md
    assert "| t | fifo | limit | 5-8 | 10 | 0 | 10.00 | 10.0 | 91.0 | 100.0 |" in md
