"""The daemon's event log (design note 008): what a commit per batch costs, and how
long a restart's replay takes.

``.venv/bin/python bench/daemon_log.py [JOBS]`` appends JOBS submissions and exits
(two batches per job) to a fresh SQLite store in a temporary directory, feeding each
batch to the core as the daemon does, then replays the whole log into a new core.
Prints milliseconds per batch (commit + core) and the replay's wall time.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from gpushepherd.core.scheduler import Scheduler
from gpushepherd.daemon.store import Store
from gpushepherd.model.events import JobFinished, JobSubmitted
from gpushepherd.model.job import JobSpec
from gpushepherd.policy.load import policy_from_dict

POLICY = {"name": "bench", "teams": {"ml": {}},
          "cluster": {"nodes": [{"name": "n", "gpus": 8, "gpu_type": "FAKE", "gpu_mem_mib": 16384}]}}


def main(jobs: int = 5000) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Store.sqlite_url(Path(tmp)))
        store.append_policy(0.0, POLICY)
        rules = policy_from_dict(POLICY).rules
        live = Scheduler(rules)
        t, start = 0.0, time.perf_counter()
        for i in range(jobs):
            job_id = str(i + 1)
            for batch in ([JobSubmitted(t + 1, JobSpec(id=job_id, team="ml", workload_class="batch",
                                                       gpus=1 + i % 4, submit_time=t + 1))],
                          [JobFinished(t + 2, job_id)]):
                store.append(batch[0].t, batch)
                live.handle(batch)
            t += 2
        live_s = time.perf_counter() - start
        start = time.perf_counter()
        replayed = None
        for _t, kind, item in store.batches():
            if kind == "policy":
                replayed = Scheduler(rules)
            else:
                replayed.handle(item)
        replay_s = time.perf_counter() - start
        assert {j: x.state for j, x in replayed.jobs.items()} == {j: x.state for j, x in live.jobs.items()}
        print(f"{2 * jobs} batches ({jobs} jobs): commit + core {live_s / (2 * jobs) * 1000:.2f} ms per batch; "
              f"replay of the whole log {replay_s:.2f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5000)
