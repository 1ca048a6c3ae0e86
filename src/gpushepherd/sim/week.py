"""A synthetic week of one small AI team's GPU work, from the seed's examples.

The seed (``../shared/seeds``, requirement R4) describes one 8-GPU server shared by a
24/7 production inference API, training runs two or three times a week, a nightly
embeddings batch and notebooks that people forget to stop. ``week_workload`` draws one
such week, Monday 00:00 to the next Monday 00:00 local time, for
``examples/policies/small-team.yaml``:

* inference (``production-inference``, team ``ml-platform``): two 1-GPU API replicas
  all week, and on each weekday a third replica for the midday peak (10:00 plus up to
  30 min, 4-6 h);
* training (``training``, team ``research``): 3 runs of 4 GPUs, checkpointing, 6-20 h,
  on Monday, Wednesday and Friday, starting 09:00-18:00;
* the nightly embeddings batch (``batch``, team ``data``): each night from 22:00, 4
  chunks of 1 or 2 GPUs (at most 6 GPUs in all), 2-5 h each;
* a re-index batch (``batch``, team ``data``) on Tuesday and Thursday from 05:30: 3
  chunks of 2 GPUs, 3-5 h each - it runs into the day window (08:00), where the
  policy checkpoints and stops batch above 2 GPUs;
* notebooks (``sandbox``, team ``research``, users ``nb1``..``nb4``): on weekdays
  between 09:00 and 17:00, 1 GPU, 1-4 h; one in six is forgotten and runs into the
  class's 8 h limit; user ``nb1`` opens a second notebook while the first runs;
* experiments (``research-training``, team ``research``): one or two 1-GPU jobs a
  weekday, 2-8 h.

Times are seconds from ``t = 0`` = Monday 00:00 local time (the policy's
``clock.start`` must say so: ``week_policy`` does). Every job has a time limit, 1.5x to
4x its true duration (sandbox: the class's max runtime); the policy never sees the
duration. The same ``seed`` gives the same jobs.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from gpushepherd.model import JobSpec
from gpushepherd.policy import Policy, policy_from_dict, read_policy_dict
from gpushepherd.sim.engine import SimJob

H = 3600.0
DAY = 86400.0
#: Monday 2026-11-30 00:00, the local start of the week
WEEK_START = "2026-11-30T00:00:00"
SMALL_TEAM = Path(__file__).resolve().parents[3] / "examples" / "policies" / "small-team.yaml"


def week_policy(path: str | Path = SMALL_TEAM) -> Policy:
    """The policy at ``path`` with its clock starting on Monday 00:00 local time."""
    raw: Any = read_policy_dict(path)
    raw.setdefault("clock", {})["start"] = WEEK_START
    return policy_from_dict(raw, str(path))


def week_workload(seed: int = 0) -> list[SimJob]:
    """One week of jobs (see the module docstring), in submit order."""
    rng = random.Random(seed)
    jobs: list[SimJob] = []

    def add(id_: str, cls: str, team: str, user: str, gpus: int, submit: float, duration: float,
            limit: float | None = None, **kw: Any) -> None:
        if limit is None:
            limit = round(duration * rng.uniform(1.5, 4.0))
        spec = JobSpec(id=id_, team=team, workload_class=cls, gpus=gpus, user=user, submit_time=round(submit),
                       time_limit_s=limit, **kw)
        jobs.append(SimJob(spec, round(duration)))

    for r in range(2):
        add(f"api-{r}", "production-inference", "ml-platform", "svc", 1, 0, 7 * DAY, limit=7 * DAY + H)
    for d in range(5):
        add(f"api-peak-d{d}", "production-inference", "ml-platform", "svc", 1,
            d * DAY + 10 * H + rng.uniform(0, 0.5 * H), rng.uniform(4 * H, 6 * H))
    for n, d in enumerate((0, 2, 4)):
        add(f"train-{n}", "training", "research", "ana", 4, d * DAY + rng.uniform(9 * H, 18 * H),
            rng.uniform(6 * H, 20 * H), preemptible=True, checkpointable=True)
    for d in range(7):
        left = 6
        for c in range(4):
            g = min(left - (3 - c), rng.choice((1, 2)))
            left -= g
            add(f"embed-d{d}-c{c}", "batch", "data", "etl", g, d * DAY + 22 * H + c * 60, rng.uniform(2 * H, 5 * H))
    for d in (1, 3):
        for c in range(3):
            add(f"reindex-d{d}-c{c}", "batch", "data", "etl", 2, d * DAY + 5.5 * H + c * 60,
                rng.uniform(3 * H, 5 * H))
    for d in range(5):
        for u in range(1, 5):
            for k in range(rng.randint(1, 2)):
                submit = d * DAY + rng.uniform(9 * H, 17 * H)
                forgotten = rng.random() < 1 / 6
                add(f"nb{u}-d{d}-{k}", "sandbox", "research", f"nb{u}", 1, submit,
                    12 * H if forgotten else rng.uniform(1 * H, 4 * H), limit=8 * H)
        # nb1 opens a second notebook while the first one runs
        add(f"nb1-d{d}-second", "sandbox", "research", "nb1", 1, d * DAY + 9 * H, 2 * H, limit=8 * H)
        add(f"nb1-d{d}-first", "sandbox", "research", "nb1", 1, d * DAY + 9 * H - 600, 3 * H, limit=8 * H)
        for k in range(rng.randint(1, 2)):
            add(f"exp-d{d}-{k}", "research-training", "research", rng.choice(("ana", "ben")), 1,
                d * DAY + rng.uniform(8 * H, 20 * H), rng.uniform(2 * H, 8 * H))
    jobs.sort(key=lambda j: (j.spec.submit_time, j.spec.id))
    return jobs
