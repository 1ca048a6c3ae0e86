"""The core run forward on a copy of itself: when each pending job will start if nothing
more is submitted and every job holding GPUs ends at its planned end (design note 043,
"Decision": estimates that model the core's own depth).

The copy is the scheduler itself (``copy.deepcopy``), so every rule the core applies
applies here by construction: the reservation depth (``backfill.reservations``: a job
behind the reserved ones backfills past deeper ones), the priority recalculation (a job
passes another by age), quotas, class holds, preemption, shares. The driver feeds it
what a runner would: each job's exit at its planned end (``Job.end_est``; a signalled
job's at the end of its grace period), a ``Tick`` at each wake-up the core asks for.
It is a pure function of the state: no clock, no I/O; the original is never touched.

Cost: one copy of the state, then one pass per instant until every job asked about has
started - on Philly at 192x8 with a queue of a few hundred jobs, hundreds of passes
(bench/README.md, "Estimated starts"). ``max_instants`` bounds it: the jobs not started
by then are left out (the caller plans them otherwise).
"""

from __future__ import annotations

import copy
import heapq
from dataclasses import replace
from operator import attrgetter

from gpushepherd.core.state import INF
from gpushepherd.model.decisions import Preempt, ReconfigureMig, Start, Stop
from gpushepherd.model.events import JobFinished, MigReconfigured, Tick
from gpushepherd.model.job import ExitStatus, JobState

#: instants (passes) one forward run may take by default
DEFAULT_INSTANTS = 5000
#: bare wake-ups in a row that decided nothing, with no exit planned any more, after
#: which the copy stops (priority recalculations would wake it for ever)
IDLE_INSTANTS = 50


#: the book's tables whose keys and values are all immutable (tuples of atoms, frozen
#: ``Shape``s and ``GpuShare``s, the rules' cohorts, ints, strings, frozensets): a copy
#: copies the dict, not its items (note 062)
_FLAT_TABLES = ("sig_ids", "fkey_ids", "misfit_cache", "cap_cache", "max_node_cache", "cohort_cache",
                "nodeset_cache", "island_cache")

#: the book's tables of lists of group ids, by filter (``fgroups`` holds lists of
#: ``groups_cache``): copied a dict and a list deep, an alias kept one list
_LIST_TABLES = ("groups_cache", "fgroups")
#: a live job's fields of immutable values (``state.SHARED``) that other tables hold
#: too (the queue's keys and heads, the victim orders): shared wherever they are met
_job_values = attrgetter("key", "vkey", "shape", "charges", "run_charges", "share_at", "strict_q", "variants",
                         "base", "cohort", "reason")


def clone(sched):
    """A copy of ``sched`` that shares nothing it may change with it: the compiled rules
    (immutable, and compared by identity: a job's class, its cohort), the ended jobs
    (a pass never looks at them again) and every job's spec (frozen) are shared, the
    tables of immutable items (``_FLAT_TABLES``, the quota's ``_applicable``) are copied
    one level deep, those of lists of ints (``_LIST_TABLES``) two, a live job's
    containers one (``Job.__deepcopy__``: its other fields are immutable values, shared
    wherever they are met); the rest is copied in full (note 062)."""
    book = sched.book
    memo = dict(_rules_memo(sched.rules))
    for name in _FLAT_TABLES:
        table = getattr(book, name)
        memo[id(table)] = table.copy()
    memo[id(book.quota._applicable)] = book.quota._applicable.copy()
    for name in _LIST_TABLES:
        table, copied = getattr(book, name), {}
        for key, ids in table.items():
            kept = memo.get(id(ids))
            if kept is None:
                kept = memo[id(ids)] = ids.copy()
            copied[key] = kept
        memo[id(table)] = copied
    for job in book.jobs.values():
        if job.state.terminal:
            memo[id(job)] = job
            track = book.tracks.get(job.id)
            if track is not None:
                memo[id(track)] = track
        else:
            memo[id(job.spec)] = job.spec
            for value in _job_values(job):
                memo[id(value)] = value
    return copy.deepcopy(sched, memo)


#: the objects reachable from the last rules cloned, by id (``_rules_memo``)
_RULES: list = [None, {}]


def _rules_memo(rules) -> dict[int, object]:
    """Every object reachable from ``rules`` by id, mapped to itself (a deepcopy memo
    that shares them); worked out once per rules object."""
    if _RULES[0] is rules:
        return _RULES[1]
    memo: dict[int, object] = {}
    stack = [rules]
    while stack:
        o = stack.pop()
        if id(o) in memo or isinstance(o, _ATOMS):
            continue
        memo[id(o)] = o
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack.extend(o)
        else:
            d = getattr(o, "__dict__", None)
            if d is not None:
                stack.extend(d.values())
            for klass in type(o).__mro__:
                for name in getattr(klass, "__slots__", ()):
                    if hasattr(o, name) and not name.startswith("__"):
                        stack.append(getattr(o, name))
    _RULES[:] = [rules, memo]
    return memo


_ATOMS = (str, bytes, int, float, bool, type(None), type, type(len), type(lambda: 0))


def _core_class(sim) -> type:
    """The scheduler class whose ``handle`` the copy runs: the most derived one of this
    package (a baseline's own cycle, say), never a driver's or a test's subclass or
    wrapper that records calls - those must not see the copy's (the oracle's recorder)."""
    return next(c for c in type(sim).__mro__ if c.__module__.startswith("gpushepherd.") and hasattr(c, "handle"))


def first_starts(sched, job_ids: set[str], max_instants: int = DEFAULT_INSTANTS) -> tuple[dict[str, float], float]:
    """Run a copy of ``sched`` forward with no new submissions: ``({job id: first start},
    horizon)`` for the jobs of ``job_ids`` that start within ``max_instants`` instants
    after now, and the last instant the copy reached (``inf``: it ran until nothing more
    was planned to happen). Every start is later than now: a job the copy starts now (a
    victim signalled now with no grace period exits in a second batch of this instant)
    gets the copy's next instant - a job that waits is never "now" - or none.

    A job whose planned end has passed (it outlived its runtime estimate) is taken to
    end at the next instant anything else is planned to happen (a second after now
    when nothing is); a job signalled now with no grace period exits now; a MIG
    re-partition the copy decides is applied ``mig.delay_s`` later, as a driver reports
    it (one under way now: ``mig.delay_s`` from now, the latest a driver reports it).
    The copy stops early when no exit is planned any more and ``IDLE_INSTANTS`` wake-ups
    in a row decided nothing (the horizon is then the last instant reached)."""
    sim = clone(sched)
    core = _core_class(sim)
    handle, next_wakeup = core.handle.__get__(sim), core.next_wakeup.__get__(sim)
    book = sim.book
    now = book.now
    queue: list[tuple[float, int, tuple]] = []  # (t, seq, ("exit", job, run, status) | ("event", e))
    seq = 0

    def push(t: float, item: tuple) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(queue, (t, seq, item))

    def planned_exit(job_id: str, status: ExitStatus) -> None:
        job = book.jobs[job_id]
        if job.state.holds_gpus and job.end_est != INF:
            push(job.end_est, ("exit", job_id, job.runs, status))

    for job in sorted(book.running.values(), key=lambda j: j.seq):
        planned_exit(job.id, ExitStatus.PREEMPTED if job.state is JobState.PREEMPTING else ExitStatus.COMPLETED)
    # outlived their planned ends: they end at the first instant after now - but a job
    # signalled now with no grace period exits now, in a second batch of this instant
    overdue, later = [], []
    for item in queue:
        late = item[0] < now or (item[0] == now and book.jobs[item[2][1]].state is JobState.RUNNING)
        (overdue if late else later).append(item)
    queue[:] = later
    heapq.heapify(queue)
    # a MIG re-partition under way: the driver reports it at the latest its delay from now
    delay = sim.rules.mig_reconfigure_delay_s
    for (idx, g), layout in sorted(book.mig_plans.items()):
        push(now + delay, ("event", MigReconfigured(now + delay, book.ledger.slots[idx].node.name, g, layout)))
    found: dict[str, float] = {}
    at_now: list[str] = []  # started in a second batch of this instant (a grace period of 0)
    left = set(job_ids)
    t_last = now
    idle = 0  # instants in a row that were bare wake-ups and decided nothing
    for _ in range(max_instants):
        if not left and not at_now:
            return found, t_last
        if idle >= IDLE_INSTANTS and not queue and not overdue:
            return found, t_last  # nothing ends any more and waking changes nothing
        # an exit or event due at the last instant (a grace period of 0) comes in a second
        # batch of that instant, as a driver reports it
        times = [queue[0][0]] if queue and queue[0][0] >= t_last else []
        wake = next_wakeup()
        if wake is not None and wake > t_last:
            times.append(wake)
        if not times and overdue:
            times.append(t_last + 1.0)  # nothing else planned: the overdue jobs end a second later
        if not times:
            return found, INF
        t = min(times)
        due, overdue = overdue, []
        while queue and queue[0][0] <= t:
            due.append(heapq.heappop(queue))
        batch: list = []
        ended: set[str] = set()
        for _t, _s, item in due:
            if item[0] == "event":
                batch.append(replace(item[1], t=t))
                continue
            _kind, job_id, run, status = item
            job = book.jobs[job_id]
            if job.state.holds_gpus and job.runs == run and job_id not in ended:
                ended.add(job_id)
                batch.append(JobFinished(t, job_id, status))
        out = handle(batch or [Tick(t)])
        t_last = t
        idle = 0 if batch or out else idle + 1
        if t > now and at_now:  # a job that waits is never "now": the next instant
            found.update(dict.fromkeys(at_now, t))
            at_now = []
        for d in out:
            if isinstance(d, Start):
                if d.job_id in left:
                    if t > now:
                        found[d.job_id] = t
                    else:
                        at_now.append(d.job_id)
                    left.discard(d.job_id)
                planned_exit(d.job_id, ExitStatus.COMPLETED)
            elif isinstance(d, Preempt):
                planned_exit(d.job_id, ExitStatus.PREEMPTED)
            elif isinstance(d, Stop) and not d.requeue and d.reason != "cancelled":
                planned_exit(d.job_id, ExitStatus.TIMEOUT)
            elif isinstance(d, ReconfigureMig):
                done = t + sim.rules.mig_reconfigure_delay_s
                push(done, ("event", MigReconfigured(done, d.node, d.gpu, d.layout)))
    return found, t_last

