"""One benchmark run in its own process; prints one JSON line. Used by bench/run.py."""

from __future__ import annotations

import heapq
import json
import resource
import sys
import time

from gpushepherd.policy import override_cluster, policy_from_dict, read_policy_dict
from gpushepherd.sim.engine import Simulator
from gpushepherd.sim.mapping import to_sim_jobs
from gpushepherd.sim.metrics import summarize
from gpushepherd.sim.traces import parse_days, read_trace, select


def baseline(jobs, gpus: int) -> dict:
    """Count-only strict FIFO: jobs start in submit order when enough GPUs are free."""
    events = []
    queue = []
    free = gpus
    head = 0
    ends = {}
    order = sorted(jobs, key=lambda j: (j.spec.submit_time, j.spec.id))
    for n, j in enumerate(order):
        heapq.heappush(events, (j.spec.submit_time, 1, n))
    while events:
        t, kind, n = heapq.heappop(events)
        if kind == 0:
            free += order[n].spec.gpus
        else:
            queue.append(n)
        while head < len(queue) and order[queue[head]].spec.gpus <= free:
            j = order[queue[head]]
            g = min(j.spec.gpus, gpus)
            free -= g
            ends[queue[head]] = t + j.duration
            heapq.heappush(events, (t + j.duration, 0, queue[head]))
            head += 1
        if head < len(queue) and order[queue[head]].spec.gpus > gpus:
            head += 1  # can never run here: drop it
    jct = [ends[n] - order[n].spec.submit_time for n in ends]
    mean = sum(j.duration for j in order) / len(order)
    busy = sum(min(j.spec.gpus, gpus) * j.duration for j in order)
    span = max(ends.values()) - order[0].spec.submit_time
    return {"avg_jct_h": sum(jct) / len(jct) / 3600, "jct_over_bound": sum(jct) / len(jct) / mean,
            "utilisation": busy / (gpus * span)}


def main() -> None:
    mode, trace, policy, size = sys.argv[1:5]
    days = parse_days(sys.argv[5]) if len(sys.argv) > 5 else None
    pol = policy_from_dict(override_cluster(read_policy_dict(policy), size), policy)
    gpus = sum(n.gpus for n in pol.rules.nodes)
    jobs = to_sim_jobs(select(read_trace(trace, "philly"), days), pol.rules)
    t0 = time.perf_counter()
    if mode == "baseline":
        figures = baseline(jobs, gpus)
        label = "count-only FIFO loop"
    else:
        result = Simulator(pol.rules, jobs).run()
        o = summarize(result)["overall"]
        figures = {"avg_jct_h": o["jct_s"]["mean"] / 3600, "jct_over_bound": o["jct_over_lower_bound"],
                   "utilisation": o["utilisation"]}
        label = "gpushepherd"
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"mode": label, "cluster": size, "jobs": len(jobs), "wall_s": wall,
                      "jobs_per_s": len(jobs) / wall, "peak_mib": peak, **figures}))


if __name__ == "__main__":
    main()
