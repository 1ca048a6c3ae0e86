"""Issue #3's acceptance on synthetic weeks (``gpushepherd.sim.synthetic``) replayed under
examples/policies/small-team.yaml, with the clock's ``t = 0`` on the week's Monday 00:00
Europe/Berlin.

Everything is measured from the outcome - who held how many GPUs when, per job, from
the simulator's usage timeline keyed by job id - not read from the policy:

* inference never waits for GPUs held by lower classes: it starts at its submit time,
  or it waits only while the lower-class jobs signalled to make room for it checkpoint
  and exit (their grace period, R6); no lower-class job starts while it waits;
* batch holds more than 2 GPUs only at night and at weekends: by day (08:00-20:00
  Mon-Fri, local time) at most 2 GPUs are held by batch jobs that were not told to stop,
  and more only while the jobs stopped at 08:00 checkpoint; and batch did use more than
  2 GPUs at night;
* no user ever holds more than 1 sandbox GPU, though users ask for two at once;
* every job completes, except forgotten notebooks, which end TIMEOUT after 8 h.

The weeks: seeds 0-49, 72 and 83 of the week from Monday 2026-11-30, and seed 0 of two weeks with a
DST change (2026-03-23, 2026-10-19). Each replay takes a few tens of milliseconds.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from gpushepherd.policy import policy_from_dict, read_policy_dict
from gpushepherd.sim.engine import SimJob, SimResult, Simulator
from gpushepherd.sim.synthetic import WEEK_START, week_workload

POLICY = Path(__file__).resolve().parents[1] / "examples" / "policies" / "small-team.yaml"
BERLIN = ZoneInfo("Europe/Berlin")
H = 3600.0
INF = float("inf")
# seeds 72 and 83: weeks whose nightly batch still holds more than 2 GPUs when a day
# starts under the bundled default order (design note 045; under class order seed 41 did)
SEEDS = [*range(50), 72, 83]
DST_WEEKS = ("2026-03-23T00:00:00", "2026-10-19T00:00:00")  # DST begins / ends on the Sunday
WEEKS = [(WEEK_START, s) for s in SEEDS] + [(start, 0) for start in DST_WEEKS]
RELEASING = ("PREEMPTING", "STOPPING")  # signalled, still holding its GPUs until it exits


@dataclass
class Week:
    start: str
    seed: int
    jobs: list[SimJob]
    res: SimResult
    grace: dict[str, float]  # class -> grace period (only to bound how long a stop may take)
    t0: datetime

    def __str__(self) -> str:
        return f"week {self.start} seed {self.seed}"

    @property
    def spec(self):
        return {j.spec.id: j.spec for j in self.jobs}

    def local(self, t: float) -> datetime:
        return datetime.fromtimestamp(self.t0.timestamp() + t, BERLIN)

    def at(self, day: date, hour: int) -> float:
        """Scheduler time of local ``hour``:00 on ``day``."""
        return datetime(day.year, day.month, day.day, hour, tzinfo=BERLIN).timestamp() - self.t0.timestamp()

    def held(self) -> dict[str, list[tuple[float, float, int]]]:
        """job id -> [(from, to, GPUs)]: when it held GPUs, grace periods included."""
        out = {}
        for job_id, line in self.res.usage_timeline.items():
            out[job_id] = [(t, t_next, g) for (t, g), (t_next, _g) in zip(line, line[1:] + [(INF, 0)]) if g]
        return out

    def signals(self, job_id: str) -> list[tuple[float, str]]:
        """When the job was told to give its GPUs back (preempted, stopped), and why."""
        return [(h.t, h.reason) for h in self.res.scheduler.jobs[job_id].history if h.to_state in RELEASING]

    def total(self, key) -> dict[str, list[tuple[float, int]]]:
        """key(spec) -> [(t, GPUs held from t on)]: the sum over jobs with that key (None: not counted),
        one value per instant."""
        specs = self.spec
        deltas: dict[str, dict[float, int]] = defaultdict(lambda: defaultdict(int))
        for job_id, line in self.res.usage_timeline.items():
            k = key(specs[job_id])
            if k is None:
                continue
            prev = 0
            for t, g in line:
                deltas[k][t] += g - prev
                prev = g
        out = {}
        for k, d in deltas.items():
            level, line = 0, []
            for t in sorted(d):
                level += d[t]
                line.append((t, level))
            out[k] = line
        return out

    def day_windows(self) -> list[tuple[float, float]]:
        """08:00-20:00 local on Mon-Fri, over the week and the one after (the last night's batch)."""
        out = []
        for n in range(14):
            day = self.t0.date() + timedelta(days=n)
            if day.weekday() < 5:
                out.append((self.at(day, 8), self.at(day, 20)))
        return out


def replay(start: str, seed: int) -> Week:
    raw = read_policy_dict(POLICY)
    raw["clock"]["start"] = start
    rules = policy_from_dict(raw, str(POLICY)).rules
    jobs = week_workload(seed, start)
    res = Simulator(rules, jobs, check_invariants=True, record_reasons=True, track_usage=lambda s: s.id).run()
    t0 = datetime.fromisoformat(start).replace(tzinfo=BERLIN)
    return Week(start, seed, jobs, res, {c: r.grace_period_s for c, r in rules.classes.items()}, t0)


@pytest.fixture(scope="module")
def weeks() -> list[Week]:
    return [replay(start, seed) for start, seed in WEEKS]


# ------------------------------------------------------------------ the generator
def test_generator_is_deterministic_and_draws_the_seed_workload():
    jobs = week_workload(0)
    assert week_workload(0) == jobs and week_workload(seed=0, start=WEEK_START) == jobs
    assert week_workload(1) != jobs
    research = 0
    for start, seed in [(WEEK_START, s) for s in range(10)] + [(s, 0) for s in DST_WEEKS]:
        t0 = datetime.fromisoformat(start).replace(tzinfo=BERLIN)
        end = datetime.combine(t0.date() + timedelta(days=7), datetime.min.time(), BERLIN).timestamp() - t0.timestamp()
        jobs = week_workload(seed, start)
        by_class = defaultdict(list)
        for j in jobs:
            by_class[j.spec.workload_class].append(j)
            assert 0 <= j.spec.submit_time < end and j.duration > 0, j.spec.id
            assert j.spec.runtime_estimate_s is None
            if j.spec.workload_class != "sandbox":
                assert j.duration < j.spec.time_limit_s, j.spec.id
        assert [j.spec.submit_time for j in jobs] == sorted(j.spec.submit_time for j in jobs)
        local = {j.spec.id: datetime.fromtimestamp(t0.timestamp() + j.spec.submit_time, BERLIN) for j in jobs}

        inference = by_class["production-inference"]
        assert sum(j.spec.submit_time == 0 and j.duration >= end for j in inference) == 1  # up all week
        assert all(j.spec.gpus == 1 for j in inference) and len(inference) >= 3

        training = by_class["training"]
        assert 2 <= len(training) <= 3
        assert len({local[j.spec.id].date() for j in training}) == len(training)
        assert all(j.spec.gpus == 4 and j.spec.checkpointable and 6 * H <= j.duration <= 20 * H for j in training)

        nights = defaultdict(int)
        for j in by_class["batch"]:
            lt = local[j.spec.id]
            assert (lt.hour, lt.minute // 10) == (22, 0), (j.spec.id, lt)  # ~22:00 local, DST or not
            assert j.spec.gpus in (1, 2)
            nights[lt.date()] += j.spec.gpus
        assert len(nights) == 7 and all(4 <= g <= 6 for g in nights.values())

        for j in by_class["sandbox"]:
            lt = local[j.spec.id]
            assert lt.weekday() < 5 and 9 <= lt.hour < 17 and j.spec.gpus == 1, (j.spec.id, lt)
            assert j.spec.team == "research" and j.spec.time_limit_s == 8 * H
        assert all(j.spec.team == "research" and j.spec.gpus in (1, 2) for j in by_class["research-training"])
        research += len(by_class["research-training"])
    assert research


def test_the_week_must_start_on_a_monday_midnight():
    with pytest.raises(ValueError):
        week_workload(0, "2026-12-01T00:00:00")
    with pytest.raises(ValueError):
        week_workload(0, "2026-11-30T08:00:00")


# ------------------------------------------------------------------ the outcome
def test_inference_never_waits_for_gpus_held_by_lower_classes(weeks):
    waits = []
    for week in weeks:
        specs, held = week.spec, week.held()
        for rec in week.res.records.values():
            if rec.spec.workload_class != "production-inference":
                continue
            assert len(rec.starts) == 1 and not rec.preempted_at and not week.signals(rec.spec.id), (str(week), rec)
            submit, start = rec.spec.submit_time, rec.starts[0][0]
            if start == submit:
                continue
            waits.append((str(week), rec.spec.id, start - submit))
            # it waited only for victims signalled for it when it arrived, and started
            # the moment the last of them exited (their grace period: R6)
            victims = [job_id for job_id in held for s, why in week.signals(job_id)
                       if s == submit and f"preempted for {rec.spec.id} " in why]
            assert victims, (str(week), rec.spec.id, rec.reasons)
            exits = []
            for job_id in victims:
                assert specs[job_id].workload_class != "production-inference", (str(week), job_id)
                [exit_t] = [b for a, b, _g in held[job_id] if a <= submit < b]
                assert exit_t - submit <= week.grace[specs[job_id].workload_class], (str(week), job_id)
                exits.append(exit_t)
            assert start == max(exits), (str(week), rec.spec.id, start, exits)
            # and no lower-class job took a GPU while it waited
            for job_id, runs in held.items():
                if specs[job_id].workload_class != "production-inference":
                    assert not any(submit < a < start for a, _b, _g in runs), (str(week), rec.spec.id, job_id)
    # inference rarely has to wait, and then only for a victim's checkpoint (observed: one
    # 60 s wait for a batch chunk in 52 weeks)
    assert all(w <= 120 for _w, _j, w in waits), waits


def above_two_by_day(line: list[tuple[float, int]], windows) -> list[tuple[float, float, int]]:
    """[(from, to, GPUs)]: the pieces of the step function ``line`` above 2 GPUs inside a day window."""
    out = []
    for (t, g), (t_next, _g) in zip(line, line[1:] + [(INF, 0)]):
        if g > 2:
            out += [(max(t, a), min(t_next, b), g) for a, b in windows if t < b and t_next > a]
    return out


def test_batch_above_two_gpus_only_at_night(weeks):
    stopped_at_eight = []
    for week in weeks:
        specs, held = week.spec, week.held()
        windows = week.day_windows()
        # batch GPUs of runs not told to stop, and of all runs
        deltas_active: dict[float, int] = defaultdict(int)
        for job_id, runs in held.items():
            if specs[job_id].workload_class != "batch":
                continue
            sigs = [s for s, _why in week.signals(job_id)]
            for a, b, g in runs:
                b_active = min([s for s in sigs if a <= s < b] + [b])
                deltas_active[a] += g
                deltas_active[b_active] -= g
        active, level = [], 0
        for t in sorted(deltas_active):
            level += deltas_active[t]
            active.append((t, level))
        batch = week.total(lambda s: "batch" if s.workload_class == "batch" else None)["batch"]

        assert not above_two_by_day(active, windows), (str(week), above_two_by_day(active, windows))
        for a, b, g in above_two_by_day(batch, windows):  # only jobs that the day's start stopped, while they checkpoint
            assert week.local(a).time().isoformat() == "08:00:00", (str(week), a, b, g)
            assert b - a <= week.grace["batch"], (str(week), a, b, g)
        assert max(g for _t, g in batch) > 2, str(week)  # batch did use the night

        # a batch over 2 GPUs when the day starts is stopped at 08:00 by the window
        for a, _b in windows:
            before = max([g for t, g in batch if t < a][-1:] or [0])
            if before > 2:
                stops = [(job_id, why) for job_id, runs in held.items() if specs[job_id].workload_class == "batch"
                         for s, why in week.signals(job_id) if s == a]
                assert stops and all("window-closed" in why for _j, why in stops), (str(week), a, stops)
                stopped_at_eight.append((str(week), week.local(a).isoformat(), stops))
                for job_id, _why in stops:  # checkpointed, requeued, resumed, done
                    assert week.res.records[job_id].state == "COMPLETED", job_id
    # the generator does not force it, but among these weeks the nightly batch does run
    # into the day (seed 72: Thursday's batch still holds more than 2 GPUs at Friday 08:00)
    assert stopped_at_eight


def test_no_user_above_one_sandbox_gpu(weeks):
    asked_for_two = []
    for week in weeks:
        specs, held = week.spec, week.held()
        per_user = week.total(lambda s: s.user if s.workload_class == "sandbox" else None)
        assert per_user
        for user, line in per_user.items():
            assert max(g for _t, g in line) <= 1, (str(week), user, line)
        # a notebook submitted while its user already held a sandbox GPU: it waited
        for rec in week.res.records.values():
            if rec.spec.workload_class != "sandbox":
                continue
            others = [job_id for job_id, runs in held.items() if job_id != rec.spec.id
                      and specs[job_id].workload_class == "sandbox" and specs[job_id].user == rec.spec.user
                      and any(a <= rec.spec.submit_time < b for a, b, _g in runs)]
            if others:
                asked_for_two.append((str(week), rec.spec.id))
                assert rec.starts[0][0] > rec.spec.submit_time, (str(week), rec.spec.id, others)
                assert any("max_gpus_per_user" in why for _a, _b, why in rec.reasons), rec.reasons
    assert any(w == f"week {WEEK_START} seed 0" for w, _j in asked_for_two)  # alice, Monday


def test_every_job_ends_completed_or_at_the_sandbox_time_limit(weeks):
    for week in weeks:
        durations = {j.spec.id: j.duration for j in week.jobs}
        timeouts = 0
        for rec in week.res.records.values():
            assert rec.end is not None and rec.state in ("COMPLETED", "TIMEOUT"), (str(week), rec.spec.id, rec.state)
            if rec.state == "TIMEOUT":
                timeouts += 1
                # a forgotten notebook, stopped after 8 h of run time over all its runs
                assert rec.spec.workload_class == "sandbox" and durations[rec.spec.id] > 8 * H, rec.spec.id
                assert rec.gpu_seconds == pytest.approx(8 * H)
            elif rec.spec.workload_class == "sandbox":
                assert durations[rec.spec.id] <= 8 * H
        assert week.seed != 0 or timeouts  # seed 0 forgets a notebook
