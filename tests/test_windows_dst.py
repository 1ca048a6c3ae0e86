"""A batch window through the scheduler on Europe/Berlin's DST nights (issue 20, observation
13; design note 003, "Window edges at a DST change"), driven only by the public Scheduler
API (``handle``, ``next_wakeup``, ``pending_reason``) as the daemon drives it.

``classes.batch.max_gpus: 1``, with ``night`` 02:30-06:00 at 4 GPUs. On 2026-03-29 02:30
does not exist: the window opens at the change, 03:00 CEST (not 03:30). On 2026-10-25
02:00-03:00 happens twice: the window opens at the first 02:30 (CEST), stays open through
the repeated hour and closes at 06:00 CET; a window ending at 02:30 closes at the first
02:30 and does not reopen in the second pass.
"""

from __future__ import annotations

from datetime import datetime, timezone

from builders import job, policy, submit
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.decisions import Preempt, Start
from gpushepherd.model.events import JobFinished, Tick
from gpushepherd.model.job import ExitStatus

H = 3600.0


def rules_for(start: str, window: dict, on_close: str = "drain"):
    return policy(nodes=[("n1", 8)], preemption=False, classes={"batch": {
        "max_gpus": 1, "on_window_close": on_close, "windows": [{"name": "night", **window, "max_gpus": 4}]}},
        clock={"timezone": "Europe/Berlin", "start": start})


def at(sched: Scheduler, utc: str) -> float:
    """Scheduler time of a UTC instant."""
    return datetime.fromisoformat(utc).replace(tzinfo=timezone.utc).timestamp() - sched.rules.clock.epoch


def run_until(sched: Scheduler, t_end: float, log: list) -> None:
    """Wake the core at every ``next_wakeup`` up to ``t_end`` (as a driver does), then tick at ``t_end``."""
    while (w := sched.next_wakeup()) is not None and w < t_end:
        log += [(w, d) for d in sched.handle(Tick(w))]
    log += [(t_end, d) for d in sched.handle(Tick(t_end))]


def started(log: list) -> list[tuple[float, str]]:
    return [(t, d.job_id) for t, d in log if isinstance(d, Start)]


def test_spring_forward_the_window_opens_at_three_cest_not_an_hour_late():
    jobs = [job(f"b{i}", cls="batch", team="t") for i in range(6)]
    sched = Scheduler(rules_for("2026-03-28T12:00:00", {"from": "02:30", "to": "06:00"}))  # Saturday 12:00 CET
    log = [(0.0, d) for d in sched.handle(submit(*jobs))]
    assert started(log) == [(0.0, "b0")]
    assert "classes.batch.max_gpus@outside windows=1" in str(sched.pending_reason("b1"))
    opens = at(sched, "2026-03-29T01:00:00")  # 03:00 CEST, the first instant after the gap
    assert opens == 14 * H
    assert sched.next_wakeup() == opens
    run_until(sched, opens, log)
    assert started(log) == [(0.0, "b0"), (opens, "b1"), (opens, "b2"), (opens, "b3")]
    assert "classes.batch.max_gpus@night=4" in str(sched.pending_reason("b4"))
    # 05:30 CEST: still open, a finished job's GPU goes to the next one at once
    t = at(sched, "2026-03-29T03:30:00")
    log += [(t, d) for d in sched.handle(JobFinished(t, job_id="b1"))]
    assert started(log)[-1] == (t, "b4")
    # the window closes at 06:00 CEST: the next wake-up, and nothing starts after it
    closes = at(sched, "2026-03-29T04:00:00")
    assert sched.next_wakeup() == closes
    run_until(sched, closes, log)
    t = closes + 0.5 * H
    log += [(t, d) for d in sched.handle(JobFinished(t, job_id="b2"))]
    assert started(log)[-1] == (at(sched, "2026-03-29T03:30:00"), "b4")
    assert "classes.batch.max_gpus@outside windows=1" in str(sched.pending_reason("b5"))


def test_fall_back_the_window_opens_once_and_stays_open_through_the_repeated_hour():
    jobs = [job(f"b{i}", cls="batch", team="t") for i in range(6)]
    sched = Scheduler(rules_for("2026-10-24T12:00:00", {"from": "02:30", "to": "06:00"}))  # Saturday 12:00 CEST
    log = [(0.0, d) for d in sched.handle(submit(*jobs))]
    opens = at(sched, "2026-10-25T00:30:00")  # the first 02:30 (CEST)
    assert sched.next_wakeup() == opens == 14.5 * H
    run_until(sched, opens, log)
    assert started(log) == [(0.0, "b0"), (opens, "b1"), (opens, "b2"), (opens, "b3")]
    # 02:10 CET, the repeated hour's second pass: the window is still open (before the fix
    # it read 02:10 < 02:30, closed, and the GPU waited until the next night's 02:30)
    t = at(sched, "2026-10-25T01:10:00")
    assert sched.next_wakeup() == at(sched, "2026-10-25T05:00:00")  # 06:00 CET; no second 02:30
    log += [(t, d) for d in sched.handle(JobFinished(t, job_id="b1"))]
    assert started(log)[-1] == (t, "b4")
    assert "classes.batch.max_gpus@night=4" in str(sched.pending_reason("b5"))
    closes = at(sched, "2026-10-25T05:00:00")  # 06:00 CET
    run_until(sched, closes, log)
    t = closes + 60.0
    log += [(t, d) for d in sched.handle(JobFinished(t, job_id="b2"))]
    assert started(log)[-1] == (at(sched, "2026-10-25T01:10:00"), "b4")
    assert "classes.batch.max_gpus@outside windows=1" in str(sched.pending_reason("b5"))


def test_fall_back_a_window_ending_at_0230_closes_once_and_does_not_reopen():
    jobs = [job(f"b{i}", cls="batch", team="t") for i in range(4)]
    sched = Scheduler(rules_for("2026-10-24T12:00:00", {"from": "22:00", "to": "02:30"}, "checkpoint-and-stop"))
    log = [(0.0, d) for d in sched.handle(submit(*jobs))]
    opens = at(sched, "2026-10-24T20:00:00")  # Saturday 22:00 CEST
    run_until(sched, opens, log)
    assert [j for t, j in started(log) if t == opens] == ["b1", "b2", "b3"]
    closes = at(sched, "2026-10-25T00:30:00")  # the first 02:30 (CEST)
    assert sched.next_wakeup() == closes
    run_until(sched, closes, log)
    stopped = [(t, d) for t, d in log if isinstance(d, Preempt)]
    assert sorted(d.job_id for _t, d in stopped) == ["b1", "b2", "b3"] and {t for t, _d in stopped} == {closes}
    for _t, d in stopped:  # they checkpoint and exit; requeued, they wait for the next night
        log += [(closes + d.grace_s, e) for e in sched.handle(
            JobFinished(closes + d.grace_s, job_id=d.job_id, status=ExitStatus.PREEMPTED))]
    # the second pass through 02:00-03:00 (CET): the window does not reopen
    for minute in (0, 10, 20, 29):
        t = at(sched, "2026-10-25T01:00:00") + minute * 60
        log += [(t, d) for d in sched.handle(Tick(t))]
        assert "classes.batch.max_gpus@outside windows=1" in str(sched.pending_reason("b1")), minute
    assert [j for t, j in started(log) if t > closes] == []
    reopens = at(sched, "2026-10-25T21:00:00")  # Sunday 22:00 CET
    assert sched.next_wakeup() == reopens
    run_until(sched, reopens, log)
    assert sorted(j for t, j in started(log) if t > closes) == ["b1", "b2", "b3"]
    assert {t for t, _j in started(log) if t > closes} == {reopens}
