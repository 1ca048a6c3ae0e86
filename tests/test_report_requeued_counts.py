"""``shepherd report``'s waits per class counted a preempted, requeued job both as
started and as still pending (a newcomer read ``training submitted 2, started 1,
still_pending 2``). A job is counted once: ``submitted = started + rejected +
cancelled_before_start + still_pending``, ``still_pending`` being the jobs that never
started; a job started and pending again at the end is in ``started`` and in
``requeued_pending``, which says how many of them wait again."""

from __future__ import annotations

from test_report import H, MON, _row, drive

from gpushepherd.daemon.store import Store
from gpushepherd.model.job import JobSpec
from gpushepherd.report import build_report, replay
from gpushepherd.report.render import TITLES

POLICY = {
    "clock": {"timezone": "UTC"},
    "cluster": {"nodes": [{"name": "h", "gpus": 2, "gpu_type": "H100-80GB", "gpu_mem_mib": 81920}]},
    "classes": {"batch": {"grace_period_s": 0}},
    "preemption": {"enabled": True, "min_runtime_s": 0},
    "teams": {"data": {}, "serving": {}},
}


def test_a_requeued_job_is_started_once_and_not_still_pending(tmp_path):
    jobs = [(JobSpec("b1", "data", "batch", 2, submit_time=MON), 5 * H),
            (JobSpec("b2", "data", "batch", 2, submit_time=MON + 60), 5 * H),
            (JobSpec("inf", "serving", "production-inference", 2, submit_time=MON + H), 100 * H)]
    hist = replay(drive(Store(Store.sqlite_url(tmp_path)), POLICY, jobs)).history()
    t_end = MON + 2 * H  # inf runs; b1 was preempted and requeued, b2 never started
    assert hist.jobs.set_index("job_id").loc["b1", "first_start"] == MON
    batch = _row(build_report(hist, MON, t_end).tables["waits_by_class"], "class", "batch")
    got = {k: int(batch[k]) for k in ("submitted", "started", "rejected", "cancelled_before_start", "still_pending",
                                      "requeued_pending")}
    assert got == {"submitted": 2, "started": 1, "rejected": 0, "cancelled_before_start": 0, "still_pending": 1,
                   "requeued_pending": 1}, got
    assert got["submitted"] == got["started"] + got["rejected"] + got["cancelled_before_start"] + got["still_pending"]
    assert "submitted = started + rejected + cancelled_before_start + still_pending" in TITLES["waits_by_class"]
