"""The figures of ``bench/slurm_compare.py`` (the bench itself needs root and Slurm and
is not run here): its workload and its measurement from the jobs' stamps."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from slurm_compare import BenchJob, measure, workload  # noqa: E402


def test_the_workload_is_philly_shaped_seeded_and_scaled():
    jobs = workload(500, 240.0, seed=7)
    assert len(jobs) == 500 and jobs == workload(500, 240.0, seed=7)
    assert jobs[0].at == 0.0 and abs(jobs[-1].at - 240.0) < 1e-6
    assert all(2 <= j.duration_s <= 20 and 1 <= j.gpus <= 8 for j in jobs)
    assert {j.cls for j in jobs} == {"production-inference", "training", "batch"}
    assert workload(500, 240.0, seed=8) != jobs  # the class draw follows the seed


def test_delays_preemptions_and_waits_behind_lower_classes_come_from_the_stamps():
    jobs = [BenchJob("h1", 0, 1, 5, "production-inference"), BenchJob("h2", 0, 1, 5, "production-inference"),
            BenchJob("t1", 0, 1, 5, "training"), BenchJob("b1", 0, 1, 5, "batch")]
    submitted = {"h1": 100.0, "h2": 100.0, "t1": 99.0, "b1": 101.0}
    stamps = [("start", "t1", 99.5), ("start", "h2", 100.5), ("start", "b1", 102.0), ("term", "t1", 103.0),
              ("start", "h1", 103.1), ("start", "t1", 110.0)] + [("end", n, 120.0) for n in submitted]
    r = measure(jobs, submitted, stamps)
    assert abs(r["per_class"]["production-inference"]["mean_s"] - (3.1 + 0.5) / 2) < 1e-9
    assert r["per_class"]["training"]["preemptions"] == 1 and r["per_class"]["batch"]["preemptions"] == 0
    assert r["per_class"]["training"]["mean_s"] == 0.5  # from its first start, not its restart
    # h1 waited 100 -> 103.1 while b1 (lower) started at 102; h2 started before any lower job
    assert r["high_waited_behind_lower"] == 1 and r["high_jobs"] == 2
    assert r["ended"] == 4 and r["makespan_s"] == 120.0 - 99.0
