"""Kueue, with either queueing strategy of a ClusterQueue (kubernetes-sigs/kueue,
"Cluster Queue": ``queueingStrategy``).

Kueue admits the workloads of a ClusterQueue in priority order, then creation time;
each team is one ClusterQueue here (its namespace's LocalQueue), all of them in one
cohort that may use the whole cluster; the policy's quotas still hold. Kueue reserves
nothing for a waiting workload (no backfill planning), and preemption within a
ClusterQueue defaults to ``Never``.

* ``kueue`` - ``BestEffortFIFO``: a workload that cannot be admitted is put aside and
  the next one is tried, so a blocked large job never holds back smaller ones, and
  large jobs can starve behind a stream of small ones. Built as gpushepherd's core with
  backfill on and zero reservations.
* ``kueue-strict`` - ``StrictFIFO``: the head of a ClusterQueue that cannot be admitted
  blocks the workloads behind it in that queue (not the other queues). Built as
  gpushepherd's core that is shown only each team's head (``StrictQueues``); a head
  that starts lets the next one of its queue be tried at the same instant, as Kueue's
  next scheduling cycle does.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import replace
from itertools import groupby

from gpushepherd.core import Scheduler
from gpushepherd.core.admission import FREE, Admission
from gpushepherd.core.verdict import Verdict
from gpushepherd.model import Event, JobCancelled, JobSubmitted
from gpushepherd.model.job import JobSpec, JobState, natural_key
from gpushepherd.model.rules import PriorityRules, Rules


def _best_effort(rules: Rules) -> Rules:
    return replace(rules, priority=PriorityRules(), backfill_enabled=True, backfill_reservations=0,
                   preemption_enabled=False)


def baseline(rules: Rules):
    """``(rules, Scheduler)``: class priority order (then submit time, job id - the
    policy's own priority weights are not used), no reservations, no preemption."""
    return _best_effort(rules), Scheduler


class _HeadsFirst(Admission):
    """The admission rule, refusing a job while a job ahead of it in its team's queue is
    pending: in the core (a head displaced by a higher-priority arrival, or a head that
    started in this pass) or still held by ``StrictQueues`` (``queues``)."""

    queues: "StrictQueues"

    def decide(self, job, profile, *args, **kw):
        q = self.queues
        team = job.spec.team
        key = q.key(job.spec)
        held = q.held.get(team)
        jobs = self.book.jobs
        if (held and held[0][0] < key) or any(
                k < key and jobs[j].state is JobState.PENDING for j, k in q.waiting.get(team, {}).items()):
            return Verdict(FREE, units=job.units, charges=job.charges)  # waits for its queue's head
        return super().decide(job, profile, *args, **kw)


class _HeadsCore(Scheduler):
    admission_class = _HeadsFirst


class StrictQueues:
    """Kueue's ``StrictFIFO`` per team over gpushepherd's core: the core sees only each
    team's head (the first of its pending jobs by class priority, submit time, job id),
    and a job that arrives ahead of the head it has; the others are held here until
    they are the head. Everything else is the core's (``jobs``, ``ledger`` and the rest
    are read from it); a job held here is not in ``jobs`` yet.

    The core runs its reference pass: it only ever holds a few jobs per team."""

    def __init__(self, rules: Rules):
        self.core = _HeadsCore(rules, reference=True)
        self.core.admission.queues = self
        self.held: dict[str, list[tuple[tuple, str, JobSpec]]] = {}
        self.waiting: dict[str, dict[str, tuple]] = {}  # team -> {job id: key} pending in the core
        self._prio = {name: cls.priority for name, cls in rules.classes.items()}

    def __getattr__(self, name):
        return getattr(self.core, name)

    def key(self, spec: JobSpec) -> tuple:
        """A job's place in its team's queue: class priority (high first), submit time, id."""
        return (-self._prio[spec.workload_class], spec.submit_time, natural_key(spec.id))

    def _forward(self, spec: JobSpec, t: float, out: list) -> None:
        self.waiting.setdefault(spec.team, {})[spec.id] = self.key(spec)
        out.append(JobSubmitted(t, spec))

    def _heads(self, team: str, t: float, out: list) -> None:
        """Forward held jobs of ``team`` that are ahead of every job of it in the core."""
        held = self.held.get(team)
        waiting = self.waiting.get(team, {})
        while held and (not waiting or held[0][0] < min(waiting.values())):
            _key, _id, spec = heapq.heappop(held)
            self._forward(spec, t, out)

    def handle(self, events: Event | Iterable[Event]) -> list:
        """The core's ``handle``, shown each team's head: held submissions are forwarded
        when they become the head; a cancel of a held job forwards it first."""
        events = [events] if isinstance(events, Event) else list(events)
        out: list = []
        for t, group in groupby(sorted(events, key=lambda e: e.t), key=lambda e: e.t):
            batch: list = []
            teams: set[str] = set()
            for e in group:
                if isinstance(e, JobSubmitted):
                    heapq.heappush(self.held.setdefault(e.spec.team, []), (self.key(e.spec), e.spec.id, e.spec))
                    teams.add(e.spec.team)
                    continue
                if isinstance(e, JobCancelled):
                    self._release(e.job_id, t, batch)
                batch.append(e)
            for team in sorted(teams):
                self._heads(team, t, batch)
            while batch:
                out.extend(self.core.handle(batch))
                batch = []
                for team in sorted(self.waiting):
                    waiting = self.waiting[team]
                    gone = [j for j in waiting if self.core.jobs[j].state is not JobState.PENDING]
                    for job_id in gone:  # started, rejected or cancelled: the next may be the head
                        del waiting[job_id]
                    if gone:
                        self._heads(team, t, batch)
        return out

    def _release(self, job_id: str, t: float, batch: list) -> None:
        """A held job that is cancelled goes to the core first (it ends there)."""
        for held in self.held.values():
            for i, (_k, jid, spec) in enumerate(held):
                if jid == job_id:
                    held.pop(i)
                    heapq.heapify(held)
                    self._forward(spec, t, batch)
                    return


def strict(rules: Rules):
    """``(rules, StrictQueues)``: as ``baseline``, each team's queue in strict order."""
    return _best_effort(rules), StrictQueues
