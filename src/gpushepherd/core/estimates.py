"""An estimated start for every pending job (Slurm's ``squeue --start``; design notes
015 section 7 and 043).

On demand, the core runs forward on a copy of itself (``forward.first_starts``) with no
new submissions, every job holding GPUs ending at its planned end: a pending job's
estimate is the instant the copy starts it. The copy applies every rule the core does -
the reservation depth (``backfill.reservations``: a job behind the reserved ones
backfills past deeper ones), the priority recalculation, quotas, class holds,
preemption, shares - so with no later submissions and planned ends that come true the
estimate is the start the core gives (note 043 measures how often on Philly and on the
oracle's workloads).

An estimate is never in the past and never "now" for a job the last pass did not start
(it is then the copy's next instant). ``basis`` says what it rests on: ``estimates``
(every planned end it counts on is a runtime estimate shorter than the job's time
limit) or ``time limits`` (then jobs usually end earlier and the job starts earlier -
an upper bound only where note 043 measured it to hold: jobs that rank higher may
arrive, and an earlier end may let a job behind it backfill onto GPUs it would have
taken).

``conservative`` is the earlier plan, kept as the fallback for jobs the copy has not
started within its bound of instants: every pending job planned in queue order on step
functions of free GPUs over time (``Plan``), each taking its claim from its planned
start (conservative backfill: a reservation for every job). Planning ``P`` jobs on
``N`` nodes costs ``O(P x (N + P))``; at most ``limit`` jobs are planned (the rest
have no estimate, like jobs beyond Slurm's ``bf_max_job_test``).
"""
from __future__ import annotations

from bisect import bisect_right, insort
from dataclasses import dataclass

from gpushepherd.core import forward, typed
from gpushepherd.core.placement import fits_island, place_counts
from gpushepherd.core.planning import quota_start
from gpushepherd.core.profile import Claim, basis_of
from gpushepherd.core.releases import free_mask_at, node_releases
from gpushepherd.core.state import INF, Job
from gpushepherd.model.job import JobState

#: jobs planned per request by default (the rest: no estimate)
DEFAULT_LIMIT = 5000


@dataclass(frozen=True, slots=True)
class Estimate:
    """A pending job's planned start: ``t`` (seconds, the scheduler's axis) and ``basis``
    (``estimates`` | ``time limits``)."""

    t: float
    basis: str


class Plan:
    """Free GPUs per node over time: for each node a sorted list of breakpoints
    ``[(t, free from t on)]`` starting at now, from planned ends and claims."""

    def __init__(self, book):
        self.book = book
        self.steps: dict[int, list[tuple[float, int]]] = {}
        self.claims = []  # (start, end, quota) for the quota look-ups

    def of(self, n: int) -> list[tuple[float, int]]:
        found = self.steps.get(n)
        if found is None:
            now = self.book.now
            out: list[tuple[float, int]] = []
            free = 0
            for t in node_releases(self.book, n):
                if t == INF:
                    break
                t = max(t, now)
                free += 1
                if out and out[-1][0] == t:
                    out[-1] = (t, free)
                else:
                    out.append((t, free))
            if not out or out[0][0] > now:
                out.insert(0, (now, 0))
            found = self.steps[n] = out
        return found

    def earliest(self, n: int, k: int, run: float, t_min: float) -> tuple[float, int] | None:
        """The earliest ``t >= t_min`` from which node ``n`` keeps ``k`` GPUs free for
        ``run`` seconds, and its free GPUs then; ``None``: never."""
        steps = self.of(n)
        i = max(0, bisect_right(steps, (t_min, INF)) - 1)
        while i < len(steps):
            t = max(steps[i][0], t_min)
            if steps[i][1] >= k:
                end = t + run
                j = i + 1
                ok = True
                while j < len(steps) and steps[j][0] < end:
                    if steps[j][1] < k:
                        ok = False
                        break
                    j += 1
                if ok:
                    return t, steps[i][1]
                i = j
                continue
            i += 1
        return None

    def free_at(self, n: int, t: float, run: float) -> int:
        """The least free GPUs node ``n`` has over ``[t, t + run)``."""
        steps = self.of(n)
        i = max(0, bisect_right(steps, (t, INF)) - 1)
        least = steps[i][1]
        j = i + 1
        while j < len(steps) and steps[j][0] < t + run:
            least = min(least, steps[j][1])
            j += 1
        return least

    def take(self, n: int, c: int, start: float, end: float) -> None:
        """Claim ``c`` GPUs of node ``n`` over ``[start, end)``."""
        steps = self.of(n)
        for t in (start, end):
            if t == INF:
                continue
            i = bisect_right(steps, (t, INF)) - 1
            if steps[i][0] != t:
                insort(steps, (t, steps[i][1]))
        for i, (t, free) in enumerate(steps):
            if start <= t < end:
                steps[i] = (t, free - c)


def plan_all(sched, limit: int | None = DEFAULT_LIMIT,
             max_instants: int = forward.DEFAULT_INSTANTS) -> dict[str, Estimate]:
    """The first ``limit`` pending jobs' (all: ``None``) estimated starts: the instant
    each starts when the core runs forward on a copy with no new submissions
    (``forward.first_starts``). A job the copy has not started within ``max_instants``
    instants gets the conservative plan's start (``conservative``), no earlier than the
    last instant the copy reached; a job whose start cannot be planned (it waits for jobs
    without an end) is left out."""
    book = sched.book
    pending = [j.id for j in book.queue if j.state is JobState.PENDING]
    if limit is not None:
        pending = pending[:limit]
    if not pending:
        return {}  # nothing to plan: no copy to run forward (note 056)
    starts, horizon = forward.first_starts(sched, set(pending), max_instants)
    basis = basis_of(book, book.running.values())
    out = {j: Estimate(starts[j], basis) for j in pending if j in starts}
    if len(out) < len(pending) and horizon < INF:
        rest = conservative(sched, limit)
        for j in pending:
            if j not in out and j in rest:
                out[j] = Estimate(max(rest[j].t, horizon), basis)
    return out


def conservative(sched, limit: int | None = DEFAULT_LIMIT) -> dict[str, Estimate]:
    """Plan the first ``limit`` pending jobs (all: ``None``) in queue order, each with a
    reservation (conservative backfill); a job whose start cannot be planned (it waits
    for jobs without an end) is left out."""
    book = sched.book
    now = book.now
    plan = Plan(book)
    out: dict[str, Estimate] = {}
    running_basis = basis_of(book, book.running.values())
    next_change = next((e for e, _s, _j in book.ends if e > now and e != INF), None)
    claims: list[Claim] = []  # the planned jobs' claims, for quota and class holds
    for p in sorted(book.preemptors.values(), key=lambda j: j.key):
        exits = [book.jobs[v].end_est for v in p.victims]
        start = max([now] + exits)
        for n, c in p.plan:
            plan.take(n, c, now, start + p.planned_run())
    for count, job in enumerate(book.queue):
        if limit is not None and count >= limit:
            break
        if job.state is not JobState.PENDING:
            continue
        if job.id in book.preemptors and job.victims:
            exits = [book.jobs[v].end_est for v in job.victims]
            t = max([now] + exits)
            t = t if t > now else _after(now, next_change)
            if t is not None:
                out[job.id] = Estimate(t, running_basis)
            continue
        if job.shape.mode == "share":
            continue  # shares wait for a card; no claim to plan
        found, charges = _earliest_typed(book, plan, claims, job)
        if found is None:
            continue
        t, counts = found
        run = job.planned_run()
        for n, c in counts:
            plan.take(n, c, t, t + run)
        # a reservation as a pass makes one: its class fills that class's ``reserved_gpus``
        claims.append(Claim(job.id, False, t, t + run, dict(counts), quota={(i, u): a for i, u, a in charges},
                            cls=job.cls.name))
        if t <= now:
            t = _after(now, next_change)
            if t is None:
                continue
        out[job.id] = Estimate(t, running_basis)
    return out


def _earliest_typed(book, plan: Plan, claims: list, job: Job) -> tuple[tuple[float, list] | None, tuple]:
    """``_earliest`` and the charges it is for; a job at rest that may run on several GPU
    types under per-type quotas: the earliest over its types (the first type on a tie;
    note 038)."""
    if not typed.at_rest(job):
        return _earliest(book, plan, claims, job), job.charges
    best, charges = None, ()
    for n in range(len(job.variants)):
        with typed.bound(job, n):
            found = _earliest(book, plan, claims, job)
            if found is not None and (best is None or found[0] < best[0]):
                best, charges = found, job.charges
    return best, charges


def _earliest(book, plan: Plan, claims: list, job: Job) -> tuple[float, list] | None:
    """The earliest start of ``job`` on the plan (GPUs), then its quota and class holds
    (``planning.quota_start``), alternating until both hold at one instant."""
    nodes, totals = book.nodes_and_totals(job)
    run = job.planned_run()
    t_min = book.now
    for _ in range(32):
        found = _gpus_from(plan, job, nodes, totals, run, t_min)
        if found is None:
            return None
        t, counts = found
        if not job.charges and not book.reserved:
            return found
        t_q = quota_start(book, job, claims, t, run)
        if t_q is None:
            return None
        if t_q == t:
            return found
        t_min = t_q
    return None


def _gpus_from(plan: Plan, job: Job, nodes: list[int], totals: dict[int, int], run: float,
               t_min: float) -> tuple[float, list] | None:
    shape = job.shape
    if shape.mode == "single":
        best = None
        book = plan.book
        island = shape.island and book.on_islands(job)
        for n in nodes:
            found = plan.earliest(n, shape.k, run, t_min)
            while found is not None and island and not fits_island(
                    free_mask_at(book, n, found[0]), shape.k, book.ledger.slots[n].node.nvlink_islands):
                # an island's GPUs, not only their number (note 037): from the next breakpoint
                later = [t for t, _f in plan.of(n) if t > found[0]]
                found = plan.earliest(n, shape.k, run, later[0]) if later else None
            if found is not None:
                key = (found[0], found[1], n)
                if best is None or key < best:
                    best = key
        return None if best is None else (best[0], [(best[2], shape.k)])
    # gangs: the candidate instants are the nodes' breakpoints; at each, every node
    # offers the least it has over the run
    times = sorted({t for n in nodes for t, _f in plan.of(n) if t >= t_min} | {t_min})
    for t in times:
        avail = {n: max(0, plan.free_at(n, t, run)) for n in nodes}
        counts = place_counts(avail, nodes, totals, shape)
        if counts is not None:
            return t, counts
    return None


def _after(now: float, next_change: float | None) -> float | None:
    """The next instant anything is planned to change (a job that waits is never "now")."""
    return next_change if next_change is not None and next_change > now else None
