"""Exact runtime estimates against over-estimates on the same jobs (issue 17, point 5;
design note 044): under shortest-estimate-first order exact estimates give no worse JCT;
under submit order with EASY backfill over-estimates may give a better one (Tsafrir and
Feitelson's effect: an over-estimated running job puts the head's reservation later, so
more jobs backfill), and the planner is not the cause: with exact estimates every job
ends at its planned end and a job that ends exactly at a reservation's start backfills."""

from builders import job, policy_dict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpushepherd.baselines import build
from gpushepherd.core import Scheduler
from gpushepherd.model.events import JobFinished
from gpushepherd.policy import policy_from_dict
from gpushepherd.sim.engine import SimJob, Simulator

#: (id, GPUs, submit s, true duration s, time limit s) on one node of 2 GPUs
JOBS = (("a", 1, 0, 5, 20), ("b", 2, 0, 4, 40), ("c", 1, 1, 10, 12))
#: shortest estimate first: the time-limit priority factor alone (its ``max_time_limit_s``
#: above every limit, so that no two limits share a score)
SHORTEST_FIRST = {"priority": {"weights": {"time_limit": 1000}, "max_time_limit_s": 100000}}


def _run(order: str, exact: bool, jobs=JOBS, gpus: int = 2) -> dict[str, tuple[float, float]]:
    """``{job: (first start, JCT)}``: ``exact`` gives each job its true duration as its
    runtime estimate, else it has its time limit only (the trace mapping's ``perfect``
    and ``limit``). ``order``: ``fifo`` (``slurm-default``: submit order, EASY backfill)
    or ``shortest`` (``SHORTEST_FIRST``, EASY backfill)."""
    extra = SHORTEST_FIRST if order == "shortest" else {}
    rules = policy_from_dict(policy_dict(nodes=[("n1", gpus)], preemption=False, backfill=1, **extra)).rules
    factory = Scheduler
    if order == "fifo":
        rules, factory = build("slurm-default", rules, 1)
    sim = [SimJob(job(i, g, submit=s, time_limit_s=lim, runtime_estimate_s=d if exact else None), d)
           for i, g, s, d, lim in jobs]
    res = Simulator(rules, sim, scheduler=factory, check_invariants=True).run()
    return {i: (r.starts[0][0], r.end - r.spec.submit_time) for i, r in res.records.items()}


def _total(out: dict[str, tuple[float, float]]) -> float:
    return sum(jct for _start, jct in out.values())


def test_shortest_estimate_first_exact_estimates_are_no_worse_than_over_estimates():
    exact, over = _run("shortest", True), _run("shortest", False)
    # exact: b (4 s) then a (5 s) then c (10 s); b takes both GPUs at once
    assert exact == {"b": (0, 4), "a": (4, 9), "c": (4, 13)}
    # over: a (limit 20) before b (limit 40); c (limit 12) arrives ahead of b and takes
    # the free GPU; b starts when c ends
    assert over == {"a": (0, 5), "c": (1, 10), "b": (11, 15)}
    assert _total(exact) == 26 and _total(over) == 30
    assert _total(exact) <= _total(over)


def test_submit_order_over_estimates_let_more_jobs_backfill():
    # the known effect under submit order, on the same jobs: with exact estimates b's
    # reservation is at 5 (a's true end) and c (10 s) cannot end by it; with time limits
    # it is at 20 (a's limit), c (limit 12) ends by 13 and backfills, and a's early end
    # at 5 leaves b waiting for c (to 11), which EASY allows
    exact, over = _run("fifo", True), _run("fifo", False)
    assert exact == {"a": (0, 5), "b": (5, 9), "c": (9, 18)}
    assert over == {"a": (0, 5), "c": (1, 10), "b": (11, 15)}
    assert _total(exact) == 32 > _total(over) == 30


def test_a_job_ending_exactly_at_the_reservation_backfills():
    # exact estimates leave no slack: c (4 s from 1) ends at 5, b's reservation; one
    # second longer and it waits behind b
    fits = _run("fifo", True, (("a", 1, 0, 5, 20), ("b", 2, 0, 4, 40), ("c", 1, 1, 4, 12)))
    assert fits["c"] == (1, 4) and fits["b"] == (5, 9)
    late = _run("fifo", True, (("a", 1, 0, 5, 20), ("b", 2, 0, 4, 40), ("c", 1, 1, 5, 12)))
    assert late["c"] == (9, 13) and late["b"] == (5, 9)


def test_exact_estimates_plan_every_end_where_it_happens():
    # with exact estimates a running job's planned end is its true end (no stop grace,
    # never the time limit): checked at every finish of a small mixed workload
    seen = []

    class Watch(Scheduler):
        def handle(self, events):
            for e in events:
                if isinstance(e, JobFinished):
                    seen.append((self.book.jobs[e.job_id].end_est, e.t))
            return super().handle(events)

    # checkpointable with a 60 s grace: a stop at the time limit would hold the GPUs 60 s more
    raw = policy_dict(nodes=[("n1", 4), ("n2", 4)], classes={"batch": {"grace_period_s": 60, "checkpointable": True}})
    rules, _ = build("slurm-default", policy_from_dict(raw).rules, 1)
    jobs = [SimJob(job(f"j{k}", 1 + k % 4 * (1 + k % 2), submit=k * 7, time_limit_s=3600,
                       runtime_estimate_s=100 + 37 * k), 100 + 37 * k) for k in range(12)]
    Simulator(rules, jobs, scheduler=Watch, check_invariants=True).run()
    assert len(seen) == 12 and all(planned == t for planned, t in seen)


@settings(max_examples=60, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(gpus=st.integers(1, 3),
       jobs=st.lists(st.tuples(st.integers(1, 50), st.integers(0, 400)), min_size=1, max_size=7))
def test_shortest_estimate_first_with_exact_estimates_is_optimal_for_jobs_submitted_together(gpus, jobs):
    # one GPU each, all submitted at 0 on one node: shortest estimate first with exact
    # estimates is shortest processing time first, which minimises the sum of
    # completion times on identical machines (Conway, Maxwell, Miller 1967); any
    # over-estimates (a limit of duration + extra) can only be as good
    spec = tuple((f"j{k}", 1, 0, d, d + extra) for k, (d, extra) in enumerate(jobs))
    exact, over = _run("shortest", True, spec, gpus), _run("shortest", False, spec, gpus)
    free = [0.0] * gpus
    spt = 0.0
    for d in sorted(d for d, _extra in jobs):
        free.sort()
        free[0] += d
        spt += free[0]
    assert _total(exact) == spt
    assert _total(exact) <= _total(over)
