"""Showback/chargeback and the weekly report (note 010) on a scripted week written into a
store the way the daemon writes it (a batch logged, then applied; exits when each job's
scripted run time is up; ticks at the core's next wake-up).

Hand computation of the week (whole week, every job completes):

* serving (production-inference, 1 H100 each): 7 days x 2 h = 14 GPU-h, 14 x 2.50 = 35.00
* research: training 2 GPUs x 5 h + 1 GPU x 8 h (H100) = 18 GPU-h = 45.00, and a sandbox
  ``fraction:0.5`` on the A100 for 4 h = 2 GPU-h = 2.00 (default price 1.00): 20 GPU-h, 47.00
* data (batch, 1 H100 each): 8 x 3 h = 24 GPU-h = 60.00
"""

from __future__ import annotations

import heapq
from datetime import datetime, timezone

import pytest
from typer.testing import CliRunner

from gpushepherd.cli.main import app
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.daemon.store import Store
from gpushepherd.model.decisions import Preempt, Start, Stop
from gpushepherd.model.events import JobCancelled, JobFinished, JobSubmitted, Tick, UsageSample
from gpushepherd.model.job import ExitStatus, GpuShare, JobSpec
from gpushepherd.policy import policy_from_dict
from gpushepherd.report import History, build_report, replay
from plotly_html import assert_self_contained, axis_title, drawn_in_chromium, figures

H = 3600.0
MON = datetime(2026, 11, 30, tzinfo=timezone.utc).timestamp()  # a Monday, 00:00 UTC
H100 = ("H100-80GB",)

POLICY = {
    "clock": {"timezone": "UTC"},
    "cluster": {"nodes": [{"name": "h", "gpus": 4, "gpu_type": "H100-80GB", "gpu_mem_mib": 81920},
                          {"name": "a", "gpus": 1, "gpu_type": "A100-80GB", "gpu_mem_mib": 81920}]},
    "classes": {
        "production-inference": {"reserved_gpus": 1},
        "batch": {"max_gpus": 1, "windows": [{"name": "night", "from": "20:00", "to": "08:00", "max_gpus": 2}]},
    },
    "teams": {"serving": {}, "research": {"nominal_gpus": 2, "max_gpus": 3}, "data": {"nominal_gpus": 1,
                                                                                       "max_gpus": 4}},
    "pricing": {"currency": "EUR", "gpu_hour": {"H100-80GB": 2.5, "default": 1.0}},
}


def week_jobs() -> list[tuple[JobSpec, float]]:
    jobs = []
    for day in range(7):
        jobs.append((JobSpec(f"inf{day}", "serving", "production-inference", 1, user="svc", gpu_types=H100,
                             submit_time=MON + day * 86400 + 9 * H), 2 * H))
    jobs.append((JobSpec("train1", "research", "training", 2, user="ann", gpu_types=H100,
                         submit_time=MON + 10 * H), 5 * H))
    jobs.append((JobSpec("train2", "research", "research-training", 1, user="bob", gpu_types=H100,
                         submit_time=MON + 86400), 8 * H))
    jobs.append((JobSpec("nb1", "research", "sandbox", 1, user="ann", gpu_types=("A100-80GB",),
                         share=GpuShare("fraction", milli=500), submit_time=MON + 2 * 86400 + 10 * H), 4 * H))
    for i in range(8):
        jobs.append((JobSpec(f"b{i}", "data", "batch", 1, user="dan", gpu_types=H100,
                             submit_time=MON + 2 * 86400 + 18 * H), 3 * H))
    return jobs


def drive(store: Store, raw: dict, jobs: list[tuple[JobSpec, float]], samples=()) -> list[list]:
    """What the daemon would log for ``jobs`` (exits when their run time is up).
    Returns the batches, as ``Store.batches()`` items, samples included."""
    rules = policy_from_dict(raw).rules
    store.append_policy(MON, raw)
    log: list = [(MON, "policy", raw)]
    sched = Scheduler(rules)
    dur = {s.id: d for s, d in jobs}
    heap: list = [(s.submit_time, 2, s.id, JobSubmitted(s.submit_time, s)) for s, _ in jobs]
    heap += [(e.t, 1, e.job_id, e) for e in samples]
    heapq.heapify(heap)
    run: dict[str, int] = {}
    while heap:
        t = heap[0][0]
        batch = []
        while heap and heap[0][0] == t:
            _t, _k, job_id, e = heapq.heappop(heap)
            if isinstance(e, tuple):  # (run, status): an exit of that run
                if run.get(job_id) == e[0] and sched.jobs[job_id].state.holds_gpus:
                    batch.append(JobFinished(t, job_id, e[1]))
            elif not (isinstance(e, Tick) and batch):
                batch.append(e)
        if not batch:
            continue
        logged = [e for e in batch if not isinstance(e, UsageSample)]  # the daemon does not log samples yet
        if logged:
            store.append(t, logged)
        log.append((t, "events", batch))
        for d in sched.handle(batch):
            if isinstance(d, Start):
                run[d.job_id] = run.get(d.job_id, 0) + 1
                heapq.heappush(heap, (t + dur[d.job_id], 0, d.job_id, (run[d.job_id], ExitStatus.COMPLETED)))
            elif isinstance(d, (Preempt, Stop)) and not getattr(d, "requeue", False):
                status = ExitStatus.PREEMPTED if isinstance(d, Preempt) else ExitStatus.TIMEOUT
                heapq.heappush(heap, (t + d.grace_s, 0, d.job_id, (run[d.job_id], status)))
        wake = sched.next_wakeup()
        if wake is not None and wake > t and len(heap) > 0:
            heapq.heappush(heap, (wake, 3, "", Tick(wake)))
    return log


@pytest.fixture()
def week(tmp_path):
    store = Store(Store.sqlite_url(tmp_path))
    drive(store, POLICY, week_jobs())
    store.close()
    return tmp_path


def _row(df, key, value):
    rows = df[df[df.columns[0]] == value]
    assert len(rows) == 1, f"no single row {key}={value} in\n{df}"
    return rows.iloc[0]


def test_gpu_hours_and_cost_per_team_equal_the_hand_computation(week):
    store = Store(Store.sqlite_url(week))
    hist = History.from_store(store)
    rep = build_report(hist, MON, MON + 7 * 86400)
    teams = rep.tables["usage_by_team"]
    expect = {"serving": (14.0, 35.0), "research": (20.0, 47.0), "data": (24.0, 60.0)}
    for team, (hours, cost) in expect.items():
        r = _row(teams, "team", team)
        assert r["gpu_hours"] == pytest.approx(hours) and r["cost"] == pytest.approx(cost), team
    assert _row(rep.tables["usage_by_user"], "user", "ann")["gpu_hours"] == pytest.approx(12.0)
    assert _row(rep.tables["usage_by_class"], "class", "batch")["gpu_hours"] == pytest.approx(24.0)
    cost = rep.tables["cost_by_team_and_gpu_type"]
    a100 = cost[(cost["team"] == "research") & (cost["gpu_type"] == "A100-80GB")].iloc[0]
    assert a100["gpu_hours"] == pytest.approx(2.0) and a100["cost"] == pytest.approx(2.0)
    assert rep.tables["usage_by_team"]["idle_gpu_hours"].sum() == 0  # no samples: never idle


def test_waits_reasons_and_idle_gaps(week):
    hist = History.from_store(Store(Store.sqlite_url(week)))
    rep = build_report(hist, MON, MON + 7 * 86400)
    waits = rep.tables["waits_by_class"]
    inf = _row(waits, "class", "production-inference")
    assert inf["submitted"] == 7 and inf["waited"] == 0 and inf["wait_p95_s"] == 0
    batch = _row(waits, "class", "batch")
    # by hand: 1 batch GPU by day (18:00-20:00), 2 from 20:00: b0 18:00, b1 20:00, b2 21:00, b3 23:00, b4 00:00,
    # b5 02:00, b6 03:00, b7 05:00 -> waits 0, 2, 3, 5, 6, 8, 9, 11 h
    delays = sorted(hist.jobs.set_index("job_id").loc[[f"b{i}" for i in range(8)]].eval("first_start - submit") / H)
    assert delays == [0, 2, 3, 5, 6, 8, 9, 11]
    assert batch["started"] == 8 and batch["waited"] == 7
    assert batch["wait_p50_s"] == pytest.approx(5.5 * H)
    assert batch["wait_p95_s"] == pytest.approx((9 + 0.65 * 2) * H)  # numpy linear: 7 x 0.95 = 6.65
    top = rep.tables["top_pending_reasons"].iloc[0]
    assert top["reason"] == "WindowLimit" and top["jobs"] == 7
    assert top["job_hours"] == pytest.approx(sum([2, 3, 5, 6, 8, 9, 11]))
    assert top["most_time_in"].startswith("WindowLimit(classes.batch.max_gpus@night=2")
    gaps = rep.tables["idle_gaps"]
    assert (gaps["kind"] == "free GPUs while jobs pending").any()  # batch waits by its window, GPUs free
    assert (gaps["kind"] == "no GPU held").any()  # Monday 00:00-09:00


def test_still_pending_excludes_rejected_and_cancelled_jobs(tmp_path):
    """Review issue 9a: still_pending was submitted - started, so rejected and cancelled
    jobs read as pending."""
    jobs = week_jobs() + [
        (JobSpec("huge", "research", "training", 8, gpu_types=H100, submit_time=MON + 10 * H), H),  # > the cluster
        (JobSpec("c1", "research", "training", 2, gpu_types=H100, submit_time=MON + 11 * H), H),  # quota: waits
        (JobSpec("stuck", "research", "training", 4, gpu_types=H100, submit_time=MON + 3 * 86400), H)]  # > max 3
    log = drive(Store(Store.sqlite_url(tmp_path)), POLICY, jobs, [JobCancelled(MON + 12 * H, "c1")])
    hist = replay(log).history()
    assert hist.jobs.set_index("job_id").loc[["huge", "c1", "stuck"], "state"].tolist() == [
        "REJECTED", "CANCELLED", "PENDING"]
    train = _row(build_report(hist, MON, MON + 7 * 86400).tables["waits_by_class"], "class", "training")
    assert (train["submitted"], train["started"], train["rejected"], train["cancelled_before_start"],
            train["still_pending"]) == (4, 1, 1, 1, 1)
    assert _row(build_report(hist, MON, MON + 7 * 86400).tables["waits_by_class"], "class", "batch")[
        "still_pending"] == 0
    early = _row(build_report(hist, MON, MON + 11.5 * H).tables["waits_by_class"], "class", "training")
    assert (early["submitted"], early["rejected"], early["cancelled_before_start"], early["still_pending"]) == \
        (3, 1, 0, 1)  # c1 was pending at 11:30, cancelled later


def test_range_clips_intervals(week):
    hist = History.from_store(Store(Store.sqlite_url(week)))
    rep = build_report(hist, MON + 12 * H, MON + 14 * H)  # train1 (2 GPUs, 10:00-15:00), inf0 (09:00-11:00)
    teams = rep.tables["usage_by_team"]
    assert _row(teams, "team", "research")["gpu_hours"] == pytest.approx(4.0)
    assert set(teams["team"]) == {"research"}


def test_range_wider_than_the_log_is_clipped_to_it(week, tmp_path):
    """Review issue 9b: the quota table spanned the whole requested range (a 7-minute log
    with --from a month earlier promised 1,454 GPU-hours of nominal quota)."""
    hist = History.from_store(Store(Store.sqlite_url(week)))
    span_h = (hist.t_last - hist.t_first) / H
    rep = build_report(hist, MON - 30 * 86400, MON + 99 * 86400)
    quota = _row(rep.quota, "team", "research")  # nominal 2 GPUs, max 3
    assert quota["nominal_gpu_hours"] == pytest.approx(2 * span_h)
    assert quota["max_gpu_hours"] == pytest.approx(3 * span_h)
    assert rep.clipped.startswith("range clipped to the event log: from 2026-11-30T09:00:00+00:00 to ")
    assert build_report(hist, hist.t_first, hist.t_last).clipped is None
    res = CliRunner().invoke(app, ["report", "--data-dir", str(week), "--from", "2026-11-01", "--csv",
                                   str(tmp_path / "csv")])
    assert res.exit_code == 0 and "range clipped to the event log: from 2026-11-30T09:00:00" in res.output, res.output
    import pandas as pd

    nominal = pd.read_csv(tmp_path / "csv" / "usage_against_quota.csv").set_index("team")["nominal_gpu_hours"]
    assert nominal["research"] == pytest.approx(2 * span_h)


def test_whatif_censors_at_the_last_event_not_at_a_far_to(week):
    """Review issue 9b, same fault in what-if: a job running at the end of the log ran on
    in the simulation until a --to far in the future."""
    from gpushepherd.report.whatif import run_whatif

    cut = [b for b in Store(Store.sqlite_url(week)).batches() if b[0] <= MON + 12 * H]  # train1 runs from 10:00
    rp = replay(cut)
    wi = run_whatif(rp, rp.rules, MON, MON + 365 * 86400)
    research = wi.table.set_index(["by", "group"]).loc[("team", "research")]
    assert research["gpu_hours_current"] == pytest.approx(2 * (rp.t_last - (MON + 10 * H)) / H)


def test_allocated_but_idle_from_usage_samples(tmp_path):
    jobs = [(JobSpec("t1", "research", "training", 2, gpu_types=H100, submit_time=MON), 4 * H)]
    samples = [UsageSample(MON + H, "t1", 50.0, 1000), UsageSample(MON + 2 * H, "t1", 1.0, 1000),
               UsageSample(MON + 3 * H, "t1", 2.0, 1000), UsageSample(MON + 4 * H, "t1", 90.0, 1000)]
    log = drive(Store(Store.sqlite_url(tmp_path)), POLICY, jobs, samples)
    rep = build_report(replay(log).history(), MON, MON + 86400)
    assert _row(rep.tables["usage_by_team"], "team", "research")["idle_gpu_hours"] == pytest.approx(4.0)


def test_cli_report_week_tables_csv_and_html(week, tmp_path):
    html = tmp_path / "out" / "week.html"
    res = CliRunner().invoke(app, ["report", "--data-dir", str(week), "--week", "--csv", str(tmp_path / "csv"),
                                   "--html", str(html)])
    assert res.exit_code == 0, res.output
    assert "GPU-hours per team" in res.output and "research" in res.output
    names = {p.name for p in (tmp_path / "csv").iterdir()}
    assert {"usage_by_team.csv", "waits_by_class.csv", "top_pending_reasons.csv", "idle_gaps.csv",
            "utilisation.csv", "queue_by_class.csv", "cost_by_team_and_gpu_type.csv"} <= names
    page = html.read_text()
    assert_self_contained(page)  # nothing fetched at view time
    figs = figures(page)
    assert list(figs) == ["plot-held", "plot-queue", "plot-quota"]


@pytest.mark.parametrize("args, fragment", [
    (["--from", "yesterday"], "--from: 'yesterday' is not allowed: an ISO date"),
    (["--from", "2026-12-05", "--to", "2026-12-01"], "--from: '2026-12-05' is not allowed: a time before --to"),
    (["--week", "--from", "2026-12-01"], "--from is not allowed with --week"),
    (["--csv", "__FILE__"], "--csv"),
    (["--from", "nan"], "--from: 'nan' is not allowed: NaN is not a time"),
    (["--from", "-99999999999999"], "--from: '-99999999999999' is not allowed: a time from 1970-01-01 to 9999-12-31"),
    (["--from", "0001-01-01"], "--from: '0001-01-01' is not allowed: a time from 1970-01-01"),
    (["--to", "1e20"], "--to: '1e20' is not allowed: a time from 1970-01-01 to 9999-12-31"),
    (["--to", "inf"], "--to: 'inf' is not allowed: a time from 1970-01-01"),
    (["--from", "2030-01-01", "--to", "2030-01-08"], "--from/--to: the range is not allowed: it must overlap the "
                                                     "event log (2026-11-30T09:00:00+00:00 to"),
])
def test_report_bad_options(week, args, fragment):
    args = [str(week / "shepherd.db") if a == "__FILE__" else a for a in args]
    res = CliRunner().invoke(app, ["report", "--data-dir", str(week), *args])
    assert res.exit_code == 2 and fragment in res.output, res.output


def test_report_on_an_empty_or_missing_store(tmp_path):
    res = CliRunner().invoke(app, ["report", "--data-dir", str(tmp_path / "none")])
    assert res.exit_code == 2 and "--data-dir" in res.output and "shepherd.db" in res.output
    Store(Store.sqlite_url(tmp_path)).close()
    res = CliRunner().invoke(app, ["report", "--data-dir", str(tmp_path)])
    assert res.exit_code == 2 and "the event log is empty" in res.output, res.output


def test_report_does_not_take_the_server_lock(week):
    store = Store(Store.sqlite_url(week))
    store.acquire_lock(MON + 8 * 86400)
    try:
        res = CliRunner().invoke(app, ["report", "--data-dir", str(week), "--week"])
        assert res.exit_code == 0, res.output
    finally:
        store.release_lock()


# -- what-if ---------------------------------------------------------------------------
def _night(max_gpus: int) -> dict:
    raw = {**POLICY, "classes": {**POLICY["classes"], "batch": {
        "max_gpus": 1, "windows": [{"name": "night", "from": "20:00", "to": "08:00", "max_gpus": max_gpus}]}}}
    return raw


def test_whatif_baseline_reproduces_the_week(week):
    from gpushepherd.report.whatif import run_whatif

    rp = replay(Store(Store.sqlite_url(week)).batches())
    wi = run_whatif(rp, rp.rules, MON, MON + 7 * 86400)
    real = rp.history().jobs.set_index("job_id")["first_start"]
    sim = History.from_sim(wi.current).jobs.set_index("job_id")["first_start"]
    assert sim.sort_index().tolist() == real.sort_index().tolist()
    t = wi.table.set_index(["by", "group"])
    assert t.loc[("team", "data"), "gpu_hours_current"] == pytest.approx(24.0)
    assert (t["wait_mean_s_change"] == 0).all()  # the same policy twice


def test_whatif_more_night_gpus_for_batch(week, tmp_path):
    import yaml

    new = tmp_path / "new.yaml"
    new.write_text(yaml.safe_dump(_night(4)))
    res = CliRunner().invoke(app, ["whatif", "--policy", str(new), "--data-dir", str(week), "--since", "7d",
                                   "--csv", str(tmp_path / "csv"), "--html", str(tmp_path / "new.html")])
    assert res.exit_code == 0, res.output
    assert "What-if" in res.output and "class batch" in res.output
    import pandas as pd

    t = pd.read_csv(tmp_path / "csv" / "whatif.csv").set_index(["by", "group"])
    batch, inf = t.loc[("class", "batch")], t.loc[("class", "production-inference")]
    assert batch["wait_mean_s_proposed"] < batch["wait_mean_s_current"]
    assert inf["wait_mean_s_proposed"] == inf["wait_mean_s_current"] == 0
    assert inf["wait_p95_s_proposed"] == inf["wait_p95_s_current"]
    assert t.loc[("team", "data"), "gpu_hours_proposed"] == pytest.approx(24.0)  # same work, sooner
    assert set(figures((tmp_path / "new.html").read_text())) >= {"plot-wait_mean_s", "plot-gpu_hours"}


def test_whatif_lists_jobs_the_proposed_policy_rejects(tmp_path):
    """Review issue 10a: a logged 4-GPU job that a proposal with 3 H100s can never run dropped
    out silently and its GPU-hours read as a saving."""
    import yaml

    jobs = week_jobs() + [(JobSpec("big", "serving", "training", 4, gpu_types=H100,
                                   submit_time=MON + 4 * 86400), H)]
    drive(Store(Store.sqlite_url(tmp_path)), POLICY, jobs)
    small = {**POLICY, "cluster": {"nodes": [{**POLICY["cluster"]["nodes"][0], "gpus": 3},
                                             POLICY["cluster"]["nodes"][1]]}}
    new = tmp_path / "small.yaml"
    new.write_text(yaml.safe_dump(small))
    res = CliRunner().invoke(app, ["whatif", "--policy", str(new), "--data-dir", str(tmp_path), "--since", "7d",
                                   "--csv", str(tmp_path / "csv")], terminal_width=200)
    assert res.exit_code == 0, res.output
    assert "rejected by the proposed policy: job big (class training, team serving, 4 GPUs): gpus=4: the nodes" \
        in res.output, res.output
    assert "the change in GPU-hours includes jobs a policy rejects" in res.output
    import pandas as pd

    t = pd.read_csv(tmp_path / "csv" / "whatif.csv").set_index(["by", "group"])
    train = t.loc[("class", "training")]
    assert (train["rejected_current"], train["rejected_proposed"]) == (0, 1)
    assert train["gpu_hours_current"] - train["gpu_hours_proposed"] == pytest.approx(4.0)  # big's 4 GPU-h
    rej = pd.read_csv(tmp_path / "csv" / "whatif_rejected.csv")
    assert rej[["run", "job_id"]].values.tolist() == [["proposed", "big"]]


@pytest.mark.parametrize("args, fragment", [
    (["--since", "a week"], "--since: 'a week' is not allowed: MM:SS, HH:MM:SS, D-HH"),
    (["--since", "7"], "--since: '7' is not allowed: give its unit (7s, 7m, 7h)"),
    (["--since", "0d"], "--since: '0d' is not allowed"),
    (["--since", "7d", "--from", "2026-11-30"], "--from is not allowed with --week or --since"),
    (["--from", "2026-12-05", "--to", "2026-12-01"], "--from: '2026-12-05' is not allowed: a time before --to"),
    (["--from", "nan"], "--from: 'nan' is not allowed: NaN is not a time"),
    (["--to", "99999999999999"], "--to: '99999999999999' is not allowed: a time from 1970-01-01 to 9999-12-31"),
])
def test_whatif_bad_options(week, tmp_path, args, fragment):
    import yaml

    new = tmp_path / "new.yaml"
    new.write_text(yaml.safe_dump(_night(4)))
    res = CliRunner().invoke(app, ["whatif", "--policy", str(new), "--data-dir", str(week), *args])
    assert res.exit_code == 2 and fragment in res.output, res.output


def test_whatif_invalid_or_unfit_policy(week, tmp_path):
    import yaml

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**POLICY, "pricing": {"gpu_hour": {"H200": 1.0}}}))
    res = CliRunner().invoke(app, ["whatif", "--policy", str(bad), "--data-dir", str(week)])
    assert res.exit_code == 2 and "pricing.gpu_hour.H200" in res.output, res.output
    unfit = tmp_path / "unfit.yaml"
    unfit.write_text(yaml.safe_dump({**POLICY, "teams": {"other": {}}}))
    res = CliRunner().invoke(app, ["whatif", "--policy", str(unfit), "--data-dir", str(week)], terminal_width=200)
    assert res.exit_code == 2 and "unfit.yaml: no job of the history can run under this policy" in res.output \
        and "team data not in the proposed policy" in res.output, res.output
    res = CliRunner().invoke(app, ["whatif", "--policy", str(tmp_path / "nope.yaml"), "--data-dir", str(week)])
    assert res.exit_code == 2 and "nope.yaml" in res.output


def test_whatif_leaves_out_jobs_of_a_removed_class_or_team(tmp_path):
    """Review issue 10b: a proposal without the class of one logged job (cancelled while
    pending) was refused outright; now that job is listed as not replayed and the rest
    is compared."""
    import yaml

    legacy = {**POLICY, "classes": {**POLICY["classes"], "legacy": {"priority": 10}}}
    jobs = week_jobs() + [(JobSpec("j47", "research", "legacy", 2, gpu_types=H100, submit_time=MON + 11 * H), H)]
    drive(Store(Store.sqlite_url(tmp_path)), legacy, jobs, [JobCancelled(MON + 12 * H, "j47")])
    new = tmp_path / "new.yaml"
    new.write_text(yaml.safe_dump(POLICY))  # no class legacy
    res = CliRunner().invoke(app, ["whatif", "--policy", str(new), "--data-dir", str(tmp_path), "--since", "7d",
                                   "--csv", str(tmp_path / "csv")], terminal_width=200)
    assert res.exit_code == 0, res.output
    assert "job j47: not replayed: class legacy not in the proposed policy" in res.output, res.output
    import pandas as pd

    t = pd.read_csv(tmp_path / "csv" / "whatif.csv").set_index(["by", "group"])
    assert ("class", "legacy") not in t.index
    assert t.loc[("team", "research"), "jobs"] == 3  # train1, train2, nb1 compared; j47 left out
    assert t.loc[("team", "data"), "gpu_hours_proposed"] == pytest.approx(24.0)
    no_team = tmp_path / "no-data.yaml"
    no_team.write_text(yaml.safe_dump({**POLICY, "teams": {"research": {}, "serving": {}}}))
    res = CliRunner().invoke(app, ["whatif", "--policy", str(no_team), "--data-dir", str(tmp_path)],
                             terminal_width=200)
    assert res.exit_code == 0 and "job b0: not replayed: team data not in the proposed policy" in res.output, \
        res.output


def test_simulate_writes_the_same_report_page(tmp_path):
    page = tmp_path / "sim.html"
    res = CliRunner().invoke(app, ["simulate", "--days", "45.0:45.2", "--no-progress", "--html", str(page)])
    assert res.exit_code == 0, res.output
    text = page.read_text()
    assert_self_contained(text)
    assert set(figures(text)) == {"plot-held", "plot-queue", "plot-quota"}
    assert "GPU-hours per team" in text and "Top pending reasons" in text
    res = CliRunner().invoke(app, ["simulate", "--days", "45.0:45.2", "--html", str(tmp_path / "sim.txt")])
    assert res.exit_code == 2 and "--html" in res.output


@pytest.mark.browser
def test_report_page_renders_in_chromium_with_its_plots(week, tmp_path, capsys):
    """Issue 6, issue 18 point 10: the weekly report's HTML page renders in a real
    (headless) Chromium from the file alone: plotly (inlined) draws every figure with
    a size and its legend naming the teams, and a screenshot is saved."""
    html = tmp_path / "week.html"
    res = CliRunner().invoke(app, ["report", "--data-dir", str(week), "--week", "--html", str(html)])
    assert res.exit_code == 0, res.output
    figs = drawn_in_chromium(html, capsys, "report.png")
    assert [f[0] for f in figs] == ["plot-held", "plot-queue", "plot-quota"]
    assert all(w > 300 and h > 200 for _id, w, h, _legend in figs), figs
    # the stack's order, top first
    assert figs[0][3] == ["capacity (5 GPUs)", "serving", "research", "data"], figs[0]


def test_tails_by_size_and_fairness_across_users_equal_the_hand_computation(week):
    # 1 GPU or less: 7 inference (no wait, 2 h), train2, the half-GPU notebook (no wait) and 8 batch jobs of 3 h
    # waiting 0, 2, 3, 5, 6, 8, 9, 11 h; 2-4 GPUs: train1 (no wait)
    rep = build_report(History.from_store(Store(Store.sqlite_url(week))), MON, MON + 7 * 86400)
    tails = rep.tables["tails_by_size"].set_index("size_gpus")
    assert list(tails.index) == ["1", "2-4"]
    one = tails.loc["1"]
    assert one["jobs"] == one["started"] == one["ended"] == 17 and one["not_started"] == 0
    assert one["wait_mean_s"] == pytest.approx(44 * H / 17) and one["wait_max_s"] == pytest.approx(11 * H)
    # sorted waits: ten of 0 h, then 2, 3, 5, 6, 8, 9, 11 h; p90 at 0.9 x 16 = 14.4: 8 h + 0.4 x (9 - 8) h
    assert one["wait_p90_s"] == pytest.approx(8.4 * H)
    assert one["slowdown_max"] == pytest.approx(14 / 3)  # b7: (11 h + 3 h) / 3 h
    assert tails.loc["2-4", "wait_max_s"] == 0 and tails.loc["2-4", "slowdown_max"] == pytest.approx(1.0)
    fair = rep.tables["fairness_across_users"].iloc[0]
    # users with >= 5 ended jobs: svc (mean slowdown 1) and dan ((3+5+6+8+9+11+12+14) / 3 / 8)
    dan = 68 / 24
    assert fair["users"] == 2 and fair["worst_user"] == "dan"
    assert fair["worst_mean_slowdown"] == pytest.approx(dan)
    assert fair["value"] == pytest.approx((1 + dan) ** 2 / (2 * (1 + dan ** 2)))


def test_a_simulator_page_writes_days_from_the_trace_start_and_a_report_its_zone(week, tmp_path):
    """Issue 18 point 10: trace time as days from the start, never 1970 dates; the
    daemon's report in the policy's zone, named on the axis and the page."""
    from gpushepherd.report.render import time_axis, when

    page = tmp_path / "sim.html"
    res = CliRunner().invoke(app, ["simulate", "--days", "45.0:45.2", "--no-progress", "--html", str(page)])
    assert res.exit_code == 0, res.output
    text = page.read_text()
    import json
    import re

    shown = re.sub(r"<script[^>]*>.*?</script>", "", text, flags=re.S)  # the page less plotly.js and the specs
    assert "1970" not in shown and "From day 45." in shown
    assert "1970" not in json.dumps(figures(text))

    store = Store(Store.sqlite_url(week))
    rep = build_report(History.from_store(store), MON, MON + 7 * 86400)
    store.close()
    xs, label = time_axis(rep, [rep.t_start, rep.t_start + 3600.0])
    assert label == f"time ({POLICY['clock']['timezone']})"
    assert xs[0].utcoffset() is not None and (xs[1] - xs[0]).total_seconds() == 3600.0
    assert when(rep, rep.t_start) == rep.local(rep.t_start).strftime("%Y-%m-%d %H:%M")
    rep.time_axis = "days"
    assert time_axis(rep, [0.0, 86400.0 * 1.5]) == ([0.0, 1.5], "days from the start of the trace")
    assert when(rep, 86400.0 * 45.2) == "day 45.20"


def test_report_page_plots_name_teams_classes_units_and_the_hand_computed_hours(week, tmp_path):
    """Issue 18 point 10 (note 040): the page's interactive figures carry the report's
    numbers, legends naming teams and classes, units on every axis, times in the
    policy's zone."""
    html = tmp_path / "week.html"
    res = CliRunner().invoke(app, ["report", "--data-dir", str(week), "--from", "2026-11-30", "--to",
                                   "2026-12-07", "--html", str(html)])
    assert res.exit_code == 0, res.output
    page = html.read_text()
    assert_self_contained(page)
    figs = figures(page)
    quota = figs["plot-quota"]
    bars = quota["data"][0]
    assert bars["name"] == "GPU-hours held" and bars["x"] == ["data", "research", "serving"]
    assert bars["y"] == pytest.approx([24.0, 20.0, 14.0])  # the module docstring's hand computation
    assert [t["name"] for t in quota["data"][1:]] == ["nominal GPUs x hours", "max GPUs x hours"]
    assert (axis_title(quota["layout"], "xaxis"), axis_title(quota["layout"], "yaxis")) == ("team", "GPU-hours")

    held = figs["plot-held"]
    names = [t["name"] for t in held["data"]]
    assert names == ["data", "research", "serving", "capacity (5 GPUs)"]
    assert held["layout"]["legend"]["title"]["text"] == "team"
    assert axis_title(held["layout"], "xaxis") == "time (UTC)" and axis_title(held["layout"], "yaxis") == "GPUs held"
    peak = {t["name"]: max(t["y"]) for t in held["data"]}
    assert (peak["data"], peak["research"], peak["serving"]) == (2, 2, 1)  # batch at night: 2; train1: 2 GPUs
    assert held["data"][0]["x"][0] == "2026-11-30 09:00:00"  # the log's first event, wall clock in UTC
    assert all(t.get("stackgroup") == "held" for t in held["data"][:3])

    queue = figs["plot-queue"]
    assert queue["layout"]["legend"]["title"]["text"] == "class"
    assert axis_title(queue["layout"], "yaxis") == "pending jobs"
    assert {t["name"]: max(t["y"]) for t in queue["data"]}["batch"] == 7  # 8 submitted at 18:00, one starts


def test_a_simulator_page_plots_days_from_the_trace_start(tmp_path):
    page = tmp_path / "sim.html"
    res = CliRunner().invoke(app, ["simulate", "--days", "45.0:45.2", "--no-progress", "--html", str(page)])
    assert res.exit_code == 0, res.output
    figs = figures(page.read_text())
    for name in ("plot-held", "plot-queue"):
        layout, xs = figs[name]["layout"], [x for t in figs[name]["data"] for x in t["x"]]
        assert axis_title(layout, "xaxis") == "days from the start of the trace"
        # days, not seconds or 1970 dates: from the window's start (day 45) while its jobs run on
        if name == "plot-queue" and not xs:
            continue  # nothing pended in this window
        assert xs and all(isinstance(x, float) for x in xs) and 45.0 <= min(xs) < 45.2 and max(xs) < 400, \
            (min(xs), max(xs))
