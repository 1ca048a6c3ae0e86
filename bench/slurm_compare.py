"""gpushepherd on Slurm against Slurm's own scheduler alone, on the same fake cluster and
the same workload, measured in one run (issue 7; design note 013, "Bench and demo on
Slurm").

``/work/venv/bin/python bench/slurm_compare.py [--jobs 500] [--nodes 4] [--span-s 240]
[--seed 7] [--modes gpushepherd,slurm]`` (root, Debian's ``slurm-wlm``):

* the workload: the first ``--jobs`` jobs of the bundled Philly excerpt
  (``gpushepherd/data/philly-excerpt.csv.gz``): their GPU counts (capped at one node,
  8), their arrival gaps scaled so the last arrives at ``--span-s``, their durations
  mapped on a log scale onto 2-20 s (whole seconds), and a class per job from a seeded
  generator: 15 % ``production-inference`` (the high class), 45 % ``training``, 40 %
  ``batch``. Each job has a time limit of twice its duration plus 10 s (what a user
  would ask for; backfill needs it);
* every job is ``job.sh`` (below), the same in both modes: it stamps ``start``/``end``
  with its own clock, works in 1 s steps saving its step, and on SIGTERM stamps
  ``term``, saves and exits 85; on its next start it resumes from its step;
* mode ``gpushepherd``: a fresh fake cluster (partition ``shepherd``), a real
  ``shepherd server --backend slurm`` under a policy of the three standard classes
  (priorities 400 / 300 / 200; training and batch preemptible and checkpointing, grace
  period 5 s), jobs submitted over HTTP;
* mode ``slurm``: a fresh fake cluster whose ``slurm.conf`` adds
  ``PreemptType=preempt/partition_prio`` and ``PreemptMode=REQUEUE``, with partitions
  ``inference`` (PriorityTier 3, never preempted), ``training`` (tier 2) and ``batch``
  (tier 1; both ``PreemptMode=REQUEUE GraceTime=5``) over all nodes;
  ``PriorityType=priority/multifactor`` and ``SchedulerType=sched/backfill``
  (``bf_interval=1,sched_interval=1``) as every fake cluster; jobs submitted with
  ``sbatch --priority`` = the class's priority (a manual priority: Slurm keeps it).

Figures, from the jobs' stamps and the bench's submit times (one clock, one machine):
per class the mean and p95 queueing delay (submit -> first start), preemptions (``term``
stamps), and "waited behind lower ones": high-class jobs during whose wait a
lower-class job started. Plus the makespan (first submit -> last end) and the mode's
wall time. Not a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import httpx

from gpushepherd.backends.fakeslurm import FakeSlurmCluster, free_ports, unavailable
from gpushepherd.sim.traces import read_philly

CLASSES = ("production-inference", "training", "batch")
HIGH = "production-inference"
SHARES = (0.15, 0.45, 0.40)
PRIORITY = {"production-inference": 400, "training": 300, "batch": 200}  # R1's standard classes
RANK = {c: i for i, c in enumerate(CLASSES)}  # 0 is the highest
MIN_S, MAX_S, GPUS_PER_NODE, GRACE_S = 2, 20, 8, 5

JOB_SH = """#!/bin/sh
# NAME DURATION_S STAMPS CHECKPOINT: one bench job; the same script in both modes
name=$1; dur=$2; stamps=$3; ck=$4
echo "start $name $(date +%s.%N)" >> "$stamps"
step=0; [ -s "$ck" ] && step=$(cat "$ck")
trap 'echo "term $name $(date +%s.%N)" >> "$stamps"; echo $step > "$ck"; exit 85' TERM
while [ "$step" -lt "$dur" ]; do sleep 1 & wait $!; step=$((step + 1)); echo $step > "$ck"; done
echo "end $name $(date +%s.%N)" >> "$stamps"
"""

SLURM_ALONE_CONF = "PreemptType=preempt/partition_prio\nPreemptMode=REQUEUE"
SLURM_ALONE_PARTITIONS = "\n".join([
    "PartitionName=batch Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE "
    f"GraceTime={GRACE_S}",
    "PartitionName=training Nodes=ALL Default=NO MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=REQUEUE "
    f"GraceTime={GRACE_S}",
    "PartitionName=inference Nodes=ALL Default=NO MaxTime=INFINITE State=UP PriorityTier=3 PreemptMode=OFF",
])
PARTITION = {"production-inference": "inference", "training": "training", "batch": "batch"}


@dataclass(frozen=True)
class BenchJob:
    """One job of the bench: ``at`` seconds after the start, its GPUs, duration (s), class."""

    name: str
    at: float
    gpus: int
    duration_s: int
    cls: str

    @property
    def time_limit_s(self) -> int:
        return 2 * self.duration_s + 10


def workload(n: int, span_s: float, seed: int) -> list[BenchJob]:
    """The first ``n`` Philly jobs of the bundled excerpt, scaled (see the module docstring)."""
    trace = Path(str(resources.files("gpushepherd") / "data" / "philly-excerpt.csv.gz"))
    jobs = sorted(read_philly(trace), key=lambda j: (j.submit, j.id))[:n]
    t0, t1 = jobs[0].submit, jobs[-1].submit
    lo, hi = (math.log(max(1.0, f(j.duration for j in jobs))) for f in (min, max))
    rng = random.Random(seed)
    out = []
    for i, j in enumerate(jobs):
        frac = (math.log(max(1.0, j.duration)) - lo) / (hi - lo) if hi > lo else 0.0
        out.append(BenchJob(f"j{i:04d}", (j.submit - t0) * span_s / (t1 - t0 or 1), min(j.gpus, GPUS_PER_NODE),
                            round(MIN_S + frac * (MAX_S - MIN_S)), rng.choices(CLASSES, SHARES)[0]))
    return out


# ------------------------------------------------------------------ the two modes
class GpushepherdMode:
    """``shepherd server --backend slurm`` on the fake cluster; jobs over HTTP."""

    name = "gpushepherd"

    def __init__(self, work: Path, nodes: int):
        self.work, self.nodes = work, nodes
        self.cluster = FakeSlurmCluster(work / "cluster", nodes)
        self.server: subprocess.Popen | None = None
        self.http: httpx.Client | None = None

    def policy(self) -> str:
        nodes = "".join(f"    - {{name: fake{i}, gpus: 8, gpu_type: A100, gpu_mem_mib: 81920}}\n"
                        for i in range(1, self.nodes + 1))
        return ("name: slurm-compare\ncluster:\n  nodes:\n" + nodes + "classes:\n"
                "  production-inference: {}\n"
                f"  training: {{checkpointable: true, grace_period_s: {GRACE_S}}}\n"
                f"  batch: {{checkpointable: true, grace_period_s: {GRACE_S}}}\n"
                "teams:\n  ml: {}\npreemption: {enabled: true}\nbackfill: {enabled: true}\n")

    def start(self) -> None:
        self.cluster.start()
        (self.work / "policy.yaml").write_text(self.policy())
        port = free_ports(1)
        args = [sys.executable, "-m", "gpushepherd.cli.main", "server", "--data-dir", str(self.work / "data"),
                "--policy", str(self.work / "policy.yaml"), "--port", str(port), "--backend", "slurm"]
        self.server = subprocess.Popen(args, env=self.cluster.env(), stdout=open(self.work / "server.log", "ab"),
                                       stderr=subprocess.STDOUT)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
        deadline = time.monotonic() + 120
        while True:
            if self.server.poll() is not None:
                raise RuntimeError(f"the server exited: {(self.work / 'server.log').read_text()[-2000:]}")
            try:
                if self.http.get("/nodes").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not answer in 120 s")
            time.sleep(0.2)

    def submit(self, job: BenchJob, argv: list[str]) -> None:
        r = self.http.post("/jobs", json={"class": job.cls, "team": "ml", "user": "bench", "gpus": job.gpus,
                                          "time_limit_s": job.time_limit_s, "command": ["/bin/sh", *argv],
                                          "cwd": str(self.work)})
        if r.status_code != 201:
            raise RuntimeError(f"POST /jobs refused {job}: {r.status_code} {r.text}")

    def stop(self) -> None:
        if self.http is not None:
            self.http.close()
        if self.server is not None and self.server.poll() is None:
            self.server.terminate()
            try:
                self.server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()
        _cancel_all(self.cluster)
        self.cluster.stop()


class SlurmAloneMode:
    """``sbatch`` straight to three partitions with partition-priority preemption."""

    name = "slurm"

    def __init__(self, work: Path, nodes: int):
        self.work = work
        self.cluster = FakeSlurmCluster(work / "cluster", nodes, extra_conf=SLURM_ALONE_CONF,
                                        partitions=SLURM_ALONE_PARTITIONS)

    def start(self) -> None:
        self.cluster.start()

    def submit(self, job: BenchJob, argv: list[str]) -> None:
        """``argv``: the batch script (``#!/bin/sh``) and its arguments."""
        limit = f"{job.time_limit_s // 60}:{job.time_limit_s % 60:02d}"  # minutes:seconds
        p = subprocess.run(["sbatch", "--parsable", f"--partition={PARTITION[job.cls]}",
                        f"--priority={PRIORITY[job.cls]}", "--nodes=1", "--ntasks=1",
                        f"--gres=gpu:a100:{job.gpus}", f"--time={limit}", f"--job-name={job.name}", "--requeue",
                        "--output=/dev/null", f"--error={self.work / 'stderr'}", f"--chdir={self.work}", *argv],
                       env=self.cluster.env(), capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise RuntimeError(f"sbatch refused {job}: {p.stderr.strip()}")

    def stop(self) -> None:
        _cancel_all(self.cluster)
        self.cluster.stop()


def _cancel_all(cluster: FakeSlurmCluster) -> None:
    """Cancel every job still in the (bench's own) cluster, so no job outlives it."""
    out = subprocess.run(["squeue", "-h", "-o", "%i"], env=cluster.env(), capture_output=True, text=True, timeout=60)
    ids = out.stdout.split()
    if ids:
        subprocess.run(["scancel", *ids], env=cluster.env(), capture_output=True, timeout=60)


# ------------------------------------------------------------------ one run, its figures
def run_mode(mode, jobs: list[BenchJob], work: Path, drain_s: float) -> dict:
    """Submit ``jobs`` at their times, wait until every one stamped ``end`` (or
    ``drain_s`` after the last submission), then measure."""
    stamps, ckpts = work / "stamps", work / "ckpt"
    ckpts.mkdir(parents=True, exist_ok=True)
    script = work / "job.sh"
    script.write_text(JOB_SH)
    t_wall = time.time()
    mode.start()
    submitted: dict[str, float] = {}
    try:
        t0 = time.time()
        for job in jobs:
            delay = t0 + job.at - time.time()
            if delay > 0:
                time.sleep(delay)
            submitted[job.name] = time.time()
            mode.submit(job, [str(script), job.name, str(job.duration_s), str(stamps),
                              str(ckpts / job.name)])
        deadline = time.time() + drain_s
        while time.time() < deadline:
            ended = {w[1] for w in _stamps(stamps) if w[0] == "end"}
            if len(ended) == len(jobs):
                break
            time.sleep(1.0)
    finally:
        mode.stop()
    return measure(jobs, submitted, _stamps(stamps)) | {"wall_s": time.time() - t_wall}


def _stamps(path: Path) -> list[tuple[str, str, float]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        w = line.split()
        if len(w) == 3:
            out.append((w[0], w[1], float(w[2])))
    return out


def p95(values: list[float]) -> float:
    """The 95th percentile (``statistics.quantiles``, inclusive method)."""
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=20, method="inclusive")[18]


def measure(jobs: list[BenchJob], submitted: dict[str, float], stamps: list[tuple[str, str, float]]) -> dict:
    """The figures of one mode (see the module docstring)."""
    cls = {j.name: j.cls for j in jobs}
    starts: dict[str, list[float]] = {}
    for kind, name, t in stamps:
        if kind == "start":
            starts.setdefault(name, []).append(t)
    first = {n: min(ts) for n, ts in starts.items()}
    delays = {c: [first[j.name] - submitted[j.name] for j in jobs if j.cls == c and j.name in first]
              for c in CLASSES}
    terms = {c: sum(1 for k, n, _t in stamps if k == "term" and cls.get(n) == c) for c in CLASSES}
    all_starts = sorted((t, n) for n, ts in starts.items() for t in ts)
    behind = 0
    high = [j for j in jobs if j.cls == HIGH and j.name in first]
    for j in high:
        lo_t, hi_t = submitted[j.name], first[j.name]
        if any(lo_t < t < hi_t and RANK[cls[n]] > RANK[HIGH] for t, n in all_starts):
            behind += 1
    ends = [t for k, _n, t in stamps if k == "end"]
    return {
        "per_class": {c: {"jobs": sum(1 for j in jobs if j.cls == c), "started": len(delays[c]),
                          "mean_s": statistics.fmean(delays[c]) if delays[c] else float("nan"),
                          "p95_s": p95(delays[c]), "preemptions": terms[c]} for c in CLASSES},
        "high_waited_behind_lower": behind, "high_jobs": len(high),
        "ended": len({n for k, n, _t in stamps if k == "end"}),
        "makespan_s": (max(ends) - min(submitted.values())) if ends else float("nan"),
    }


def table(results: dict[str, dict], jobs: list[BenchJob]) -> str:
    """The figures side by side, as a Markdown table."""
    modes = list(results)
    rows = [("| figure | " + " | ".join(modes) + " |"), "|---|" + "---:|" * len(modes)]

    def row(label: str, f) -> None:
        rows.append(f"| {label} | " + " | ".join(f(results[m]) for m in modes) + " |")
    for c in CLASSES:
        n = sum(1 for j in jobs if j.cls == c)
        row(f"{c} ({n} jobs): mean / p95 queueing delay s",
            lambda r, c=c: f"{r['per_class'][c]['mean_s']:.1f} / {r['per_class'][c]['p95_s']:.1f}")
    for c in CLASSES:
        row(f"preemptions of {c}", lambda r, c=c: str(r["per_class"][c]["preemptions"]))
    row(f"{HIGH} jobs that waited while a lower-class job started",
        lambda r: f"{r['high_waited_behind_lower']} of {r['high_jobs']}")
    row("jobs ended", lambda r: f"{r['ended']} of {len(jobs)}")
    row("makespan s (first submit -> last end)", lambda r: f"{r['makespan_s']:.0f}")
    row("wall time of the mode s (cluster start to stop)", lambda r: f"{r['wall_s']:.0f}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=500, help="jobs from the trace (default 500)")
    ap.add_argument("--nodes", type=int, default=4, help="fake 8-GPU nodes (default 4)")
    ap.add_argument("--span-s", type=float, default=240.0, help="seconds over which the jobs arrive (default 240)")
    ap.add_argument("--seed", type=int, default=7, help="seed of the class draw (default 7)")
    ap.add_argument("--drain-s", type=float, default=600.0, help="most seconds to wait after the last submission")
    ap.add_argument("--modes", default="gpushepherd,slurm", help="which modes, in order (default both)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    a = ap.parse_args(argv)
    why = unavailable()
    if why:
        print(f"slurm_compare: {why}", file=sys.stderr)
        return 2
    modes = [m for m in a.modes.split(",") if m]
    wrong = [m for m in modes if m not in ("gpushepherd", "slurm")]
    if wrong or not modes:
        print(f"--modes: {','.join(wrong) or a.modes!r} is not allowed: gpushepherd, slurm", file=sys.stderr)
        return 2
    jobs = workload(a.jobs, a.span_s, a.seed)
    gpu_s = sum(j.gpus * j.duration_s for j in jobs)
    print(f"{len(jobs)} jobs over {a.span_s:.0f} s on {a.nodes} x 8 GPUs: {gpu_s} GPU-seconds of work "
          f"(offered load {gpu_s / (a.span_s * a.nodes * GPUS_PER_NODE):.2f}); classes "
          + ", ".join(f"{c} {sum(1 for j in jobs if j.cls == c)}" for c in CLASSES), flush=True)
    results = {}
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="slurm-compare-") as tmp:
        for m in modes:
            work = Path(tmp) / m
            work.mkdir()
            mode = GpushepherdMode(work, a.nodes) if m == "gpushepherd" else SlurmAloneMode(work, a.nodes)
            print(f"mode {m} ...", flush=True)
            results[m] = run_mode(mode, jobs, work, a.drain_s)
            print(f"mode {m}: {results[m]['wall_s']:.0f} s", flush=True)
    print(table(results, jobs))
    print(f"bench wall time: {time.time() - t0:.0f} s")
    if a.json:
        a.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
