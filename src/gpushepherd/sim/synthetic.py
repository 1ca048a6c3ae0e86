"""A seeded synthetic week of the seed's small-team workload (requirement R4).

The seed (``shared/seeds``) describes one GPU server shared by a 24/7 inference API,
training two or three times a week, a nightly embeddings batch and notebooks that
people forget to stop. ``week_workload(seed, start)`` draws one such week, from
Monday 00:00 local time (Europe/Berlin) to the next Monday 00:00, meant to be replayed
under ``examples/policies/small-team.yaml``:

* ``production-inference`` (team ``ml-platform``, user ``svc``): two 1-GPU API replicas
  ``api-0`` and ``api-1`` all week; on one weekday afternoon ``api-1`` crashes and its
  replacement ``api-1-restart`` is submitted 30-120 s later; each weekday a third
  replica ``api-peak-dN`` for the midday peak (from 11:00-12:00, 3-6 h);
* ``training`` (team ``research``): 2 or 3 runs a week on distinct weekdays, submitted
  09:00-18:00, 4 GPUs, preemptible and checkpointing, 6-20 h;
* ``batch`` (team ``data``, user ``etl``): every night from about 22:00 (7 nights,
  Sunday's runs into the next week) the embeddings batch as 3-6 chunks of 1 or 2 GPUs,
  4-6 GPUs in all, 1.5-4.5 h each (chunks checkpoint: class default);
* ``sandbox`` (team ``research``, users ``alice`` .. ``eva``): notebooks on weekdays
  from 09:00-15:30, 1 GPU, 0.5-4 h; about one in eight is forgotten and would run for
  days (the 8 h max runtime stops it); about one in four sessions opens a second
  notebook while the first is open;
* ``research-training`` (team ``research``): 0-2 jobs a weekday, submitted 08:00-20:00,
  1 or 2 GPUs, 2-10 h, not checkpointing.

Units: every time (``submit_time``, ``time_limit_s``, ``SimJob.duration``) is in whole
seconds; ``t = 0`` is ``start``, Monday 00:00 local time, so the policy's clock must
start there too (``clock: {timezone: Europe/Berlin, start: <start>}``). Local times of
day are converted with ``zoneinfo``, so a week across a DST change still has its batch
at 22:00 local time. Each job carries a time limit a user would set, 1.5-4x its true
duration rounded up to a whole hour (sandbox: the class's 8 h; the services: 14 days);
no job reveals its true duration otherwise (no ``runtime_estimate_s``).

Determinism: everything is drawn from one ``random.Random(seed)``; the same seed gives
the same jobs, in the same (submit time, id) order.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from datetime import date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from gpushepherd.model import JobSpec
from gpushepherd.sim.engine import SimJob

H = 3600.0
TIMEZONE = "Europe/Berlin"
#: Monday 2026-11-30 00:00 local time
WEEK_START = "2026-11-30T00:00:00"
NOTEBOOK_USERS = ("alice", "boris", "chen", "dasha", "eva")
RESEARCHERS = ("ana", "ben", "chen")
SANDBOX_MAX_S = 8 * H


def week_start(start: str = WEEK_START) -> datetime:
    """``start`` as an aware local datetime in Europe/Berlin (a naive ``start`` is local
    wall time, as the policy clock reads it).

    Raises:
        ValueError: ``start`` is unreadable or not a Monday 00:00 local time.
    """
    tz = ZoneInfo(TIMEZONE)
    t0 = datetime.fromisoformat(start)
    t0 = t0.replace(tzinfo=tz) if t0.tzinfo is None else t0.astimezone(tz)
    if t0.weekday() != 0 or t0.time() != time(0):
        raise ValueError(f"the week must start on a Monday 00:00 {TIMEZONE} time, not {start!r}")
    return t0


def local_seconds(t0: datetime, day: date | int, hours: float) -> float:
    """Seconds from ``t0`` to local wall time ``hours`` after midnight on ``day`` (a
    date, or days after ``t0``'s date). Real elapsed seconds: across a DST change a day
    is 23 or 25 h long."""
    if isinstance(day, int):
        day = t0.date() + timedelta(days=day)
    local = datetime.combine(day, time(), tzinfo=t0.tzinfo) + timedelta(hours=hours)
    return local.timestamp() - t0.timestamp()


def week_workload(seed: int = 0, start: str = WEEK_START) -> list[SimJob]:
    """One week of the small team's jobs (see the module docstring), in submit order.

    Args:
        seed: seeds the one ``random.Random`` all choices come from.
        start: local wall time of ``t = 0`` (ISO 8601), a Monday 00:00.
    """
    rng = random.Random(seed)
    t0 = week_start(start)
    jobs: list[SimJob] = []

    def at(day: int, hours: float) -> float:
        return local_seconds(t0, day, hours)

    def limit_for(duration: float) -> float:
        return math.ceil(duration * rng.uniform(1.5, 4.0) / H) * H

    def add(id_: str, cls: str, team: str, user: str, gpus: int, submit: float, duration: float,
            limit: float | None = None, **kw) -> None:
        duration = round(duration)
        spec = JobSpec(id=id_, team=team, workload_class=cls, gpus=gpus, user=user, submit_time=round(submit),
                       time_limit_s=limit_for(duration) if limit is None else limit, **kw)
        jobs.append(SimJob(spec, duration))

    end = at(7, 0)
    service_limit = 14 * 24 * H

    # production inference: two replicas all week; one crashes and is restarted; a daily peak replica
    crash = round(at(rng.randint(0, 4), rng.uniform(13, 17)))
    add("api-0", "production-inference", "ml-platform", "svc", 1, 0, end, service_limit)
    add("api-1", "production-inference", "ml-platform", "svc", 1, 0, crash, service_limit)
    back = crash + rng.randint(30, 120)
    add("api-1-restart", "production-inference", "ml-platform", "svc", 1, back, end - back, service_limit)
    for d in range(5):
        add(f"api-peak-d{d}", "production-inference", "ml-platform", "svc", 1, at(d, rng.uniform(11, 12)),
            rng.uniform(3 * H, 6 * H))

    # training: 2-3 runs a week on distinct weekdays
    for n, d in enumerate(sorted(rng.sample(range(5), rng.choice((2, 3))))):
        add(f"train-{n}", "training", "research", rng.choice(RESEARCHERS[:2]), 4, at(d, rng.uniform(9, 18)),
            rng.uniform(6 * H, 20 * H), preemptible=True, checkpointable=True)

    # the nightly embeddings batch, chunked
    for d in range(7):
        submit = at(d, 22 + rng.uniform(0, 1 / 6))
        left = rng.randint(4, 6)
        c = 0
        while left:
            g = min(left, rng.choice((1, 2)))
            left -= g
            add(f"embed-d{d}-c{c}", "batch", "data", "etl", g, submit, rng.uniform(1.5 * H, 4.5 * H))
            c += 1

    # notebooks on weekdays; some forgotten, some users open a second one while the first is open
    for d in range(5):
        for user in NOTEBOOK_USERS:
            if rng.random() >= 0.75:
                continue
            submit = at(d, rng.uniform(9, 15.5))
            forgotten = rng.random() < 1 / 8
            duration = 3 * 24 * H if forgotten else rng.uniform(0.5 * H, 4 * H)
            add(f"nb-{user}-d{d}", "sandbox", "research", user, 1, submit, duration, SANDBOX_MAX_S)
            if rng.random() < 0.25:
                second = submit + rng.uniform(300, min(duration, H))
                add(f"nb-{user}-d{d}-second", "sandbox", "research", user, 1, second,
                    rng.uniform(0.5 * H, 2 * H), SANDBOX_MAX_S)

    # research training
    for d in range(5):
        for k in range(rng.randint(0, 2)):
            add(f"exp-d{d}-{k}", "research-training", "research", rng.choice(RESEARCHERS),
                rng.choice((1, 1, 2)), at(d, rng.uniform(8, 20)), rng.uniform(2 * H, 10 * H))

    jobs.sort(key=lambda j: (j.spec.submit_time, j.spec.id))
    return jobs


def weeks_workload(seed: int = 0, weeks: int = 1, start: str = WEEK_START) -> list[SimJob]:
    """``weeks`` weeks back to back, week ``k`` drawn by ``week_workload(seed + k)`` from
    its own Monday (``start`` + ``k`` weeks, local time) and shifted to seconds from
    ``start``; with more than one week each id is prefixed ``w<k>-``. One week's
    services end at the next Monday 00:00, when the next week's replicas are submitted.
    What ``bench/compare.py --only week`` replays (design note 045): one week holds
    about 60 jobs, too few to rank schedulers by.

    Raises:
        ValueError: ``weeks`` below 1, or ``start`` not a Monday 00:00 local time.
    """
    if weeks < 1:
        raise ValueError(f"weeks: {weeks!r} is not allowed: at least 1")
    t0 = week_start(start)
    out: list[SimJob] = []
    for k in range(weeks):
        tk = t0 + timedelta(days=7 * k)  # wall-clock arithmetic: Monday 00:00 local time again
        shift = round(tk.timestamp() - t0.timestamp())
        for job in week_workload(seed + k, tk.replace(tzinfo=None).isoformat()):
            spec = job.spec if weeks == 1 else replace(job.spec, id=f"w{k}-{job.spec.id}",
                                                          submit_time=job.spec.submit_time + shift)
            out.append(replace(job, spec=spec))
    return out
