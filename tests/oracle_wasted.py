"""The oracle's wasted-eviction property ``j_wasted`` (issue 20, point 5; design note 079),
read from the decision stream of a run: the events of each ``handle`` call and the
decisions it returned.

An eviction is **wasted** when a victim ``V``, evicted for preemptor ``P`` at ``t0``
(``Preempt(V, preemptor=P)``), is started again at ``t1`` on a GPU it was evicted from
(the same node and GPU index; a share: its card's GPU), one on a node where ``P``'s hold
is short after the call (``facts["short"]``), while ``P`` has not started since ``t0``
and is still pending, and nothing in between may legitimately have changed ``P``'s
plan. The rule broken is the architecture's step 7 ("commit only if the preemptor then
really fits") with R6 (a victim loses its work since its checkpoint): a preemptor's hold
keeps what its victims free for it (note 054), so a victim back on its own GPUs before its
preemptor ran is work lost for nothing.

Legitimate (counted as ``j_excused:<why>``, never failed), for events after the eviction's
call up to and including the restart's:
* ``P`` cancelled (it is then no longer pending: not watched);
* hardware lost: a node lost, a GPU unhealthy or unmanaged, a MIG layout changed (a node
  added or a GPU back in service excuses nothing: a held plan survives them, notes 073,
  077);
* an operator acted on a job: ``JobUpdated`` (nice, time limit), ``JobRequeueRequested``,
  ``JobAdopted``;
* a job was submitted of a class of ``P``'s priority or higher (it may rank ahead of
  ``P`` and take the room);
* a limit's value changed (a quota window opened or closed; ``facts["limits"]``);
* a job of a class with ``reserved_gpus`` left, and ``P`` waits on a class reservation
  (``e_preemptor``'s excuse; ``facts``);
* ``e_preemptor`` already judged this preemption at its last victim's exit: excused
  (``P``'s hold was let go for a stated reason) or failed (the fault is reported there);
  ``P`` preempted again since (a new plan).
A victim started again on other GPUs (room freed elsewhere) is not wasted: ``P`` keeps
its hold, and its plan is judged by ``e_preemptor``. A victim started again on its own
GPUs after ``P`` started elsewhere is counted (``j_info:back on its GPUs, preemptor
elsewhere``), not failed: it is legitimate where the eviction freed quota, a job slot or
a class reservation's slack that ``P`` used.

The strict form (``strict``; off by default, ``SHEPHERD_ORACLE_WASTED=2``) fails that
case too when nothing could have given the room back in between: ``P`` still runs when
``V`` is back, and from the eviction's call to the restart's no event came but ticks,
submissions and the exits of jobs evicted by then no earlier than their grace periods
(exits a plan could count), no job was stopped, no job of a class with
``reserved_gpus`` started, and no limit changed. The eviction then bought ``P`` nothing
that ``V`` does not hold again. It flags plans that ignored room another preemptor's
victims were about to leave (note 079).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from gpushepherd.model.decisions import Preempt, Start
from gpushepherd.model.events import (GpuHealthChanged, GpuUnmanaged, JobAdopted, JobCancelled, JobFinished,
                                      JobRequeueRequested, JobSubmitted, JobUpdated, MigReconfigured, NodeLost, Tick)

#: events after which a preemptor's plan may legitimately no longer hold (module docstring)
OPERATOR = (JobUpdated, JobRequeueRequested, JobAdopted)


def _hardware_lost(e) -> bool:
    """Whether ``e`` takes hardware away (a node lost, a GPU unhealthy or unmanaged) or
    changes a MIG layout. A node added or a GPU back in service never does: a held plan
    survives them (notes 073, 077)."""
    return (isinstance(e, (NodeLost, MigReconfigured)) or (isinstance(e, GpuHealthChanged) and not e.healthy)
            or (isinstance(e, GpuUnmanaged) and e.unmanaged))


@dataclass
class Eviction:
    """One victim's eviction: for ``p`` at call ``call`` (time ``t``), from ``gpus``."""

    victim: str
    p: str
    call: int
    t: float
    gpus: frozenset
    limits: tuple = ()
    reserved: dict = field(default_factory=dict)
    exited: bool = False  # the victim's exit was reported


@dataclass
class Wasted:
    """Failures ``(property, text)`` and counts (``j_wasted``, ``j_excused:<why>``,
    ``j_info:<what>``): the shape of ``oracle_checks.Report`` that the property writes to."""

    failures: list[tuple[str, str]] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)

    def fail(self, prop: str, text: str) -> None:
        self.failures.append((prop, text))


def gpus_of(placement) -> frozenset:
    """The ``(node name, GPU index)`` pairs of a ``Placement``."""
    return frozenset((name, g) for name, gs in placement.parts for g in gs) if placement is not None else frozenset()


class WastedEvictions:
    """Feed it every call of a run in order (``observe``); it records wasted evictions.

    ``priority``: class name -> class priority (``rules.classes[c].priority``); ``report``:
    where failures and counts go (``fail(prop, text)``, ``counts``; default a ``Wasted``).
    """

    def __init__(self, priority: dict[str, int], report=None, strict: bool = False, reserved: frozenset = frozenset()):
        self.priority = priority
        self.strict = strict
        self.reserved = reserved  # classes with ``reserved_gpus`` (the strict form)
        self.leaving: dict[str, tuple[float, int]] = {}  # job evicted -> (end of its grace period, call)
        #: ``(call, since)``: room may have come back at ``call``, unforeseen by a plan made
        #: at or after call ``since`` (the strict form)
        self.freed: list[tuple[int, int]] = []
        self.out = report if report is not None else Wasted()
        self.call = 0
        self.placed: dict[str, frozenset] = {}  # job -> GPUs of its last start
        self.started: dict[str, int] = {}  # job -> call of its last start
        self.running: set[str] = set()  # jobs started and not reported ended since
        self.limits: tuple = ()
        self.cls: dict[str, str] = {}  # job -> class name
        self.gone: set[str] = set()  # jobs cancelled
        self.evicted: dict[str, Eviction] = {}  # victim -> its last eviction for a preemptor
        self.preempted: dict[str, int] = {}  # preemptor -> call of its last preemption
        self.judged: dict[tuple[str, int], str] = {}  # (preemptor, call) -> e_preemptor's outcome
        self.changed: list[tuple[int, str]] = []  # (call, why) of events that may change a plan
        self.high: list[tuple[int, int]] = []  # (call, class priority) of submissions

    def judge(self, p: str, outcome: str) -> None:
        """``e_preemptor``'s outcome for ``p``'s last preemption (``excused: <why>`` or
        ``failed``)."""
        if p in self.preempted:
            self.judged[(p, self.preempted[p])] = outcome

    def observe(self, t: float, batch, out, facts: dict | None = None) -> None:
        """One ``handle`` call: its events ``batch`` and decisions ``out``. ``facts``
        (optional, read after the call): ``limits`` (every limit's value now),
        ``reserved`` (units each class holds), ``left(reserved_before, p)`` (whether a
        reserved class's job left and ``p`` waits on a class reservation), ``short(p)``
        (the node names of ``p``'s plan where its hold is short now; a victim back only
        on other nodes took nothing the plan needs)."""
        self.call += 1
        k = self.call
        facts = facts or {}
        for e in batch:
            if _hardware_lost(e):
                self.changed.append((k, "hardware lost"))
            elif isinstance(e, OPERATOR):
                self.changed.append((k, "an operator acted"))
            elif isinstance(e, JobSubmitted) and e.spec is not None:
                self.cls[e.spec.id] = e.spec.workload_class
                self.high.append((k, self.priority.get(e.spec.workload_class, 0)))
            elif isinstance(e, JobCancelled):
                self.gone.add(e.job_id)
            if isinstance(e, (JobFinished, JobCancelled)):
                self.running.discard(e.job_id)
            if isinstance(e, JobFinished):
                if e.job_id in self.evicted:
                    self.evicted[e.job_id].exited = True
                end, when = self.leaving.pop(e.job_id, (None, k))
                # a job ended; a victim left before its grace was up; or at its end, which
                # plans made from its eviction on could count
                self.freed.append((k, when if end is not None and e.t >= end else k))
            elif not isinstance(e, (Tick, JobSubmitted)):
                self.freed.append((k, k))
        if facts.get("limits", ()) != self.limits:
            self.limits = facts.get("limits", ())
            self.freed.append((k, k))
        back = []  # victims started again in this call: judged once all its starts are known
        for d in out:
            if isinstance(d, Preempt):
                self.leaving[d.job_id] = (t + d.grace_s, k)
            elif not isinstance(d, Start) or self.cls.get(d.job_id) in self.reserved:
                self.freed.append((k, k))  # a stop, or a reserved class filling its reservation
            if isinstance(d, Preempt) and d.preemptor:
                self.preempted[d.preemptor] = k
                self.evicted[d.job_id] = Eviction(d.job_id, d.preemptor, k, t, self.placed.get(d.job_id, frozenset()),
                                                  facts.get("limits", ()), dict(facts.get("reserved", {})))
            elif isinstance(d, Start):
                self.started[d.job_id] = k
                self.running.add(d.job_id)
                self.placed[d.job_id] = gpus_of(d.placement)
                self._early(d.job_id)
                if d.job_id in self.evicted:
                    back.append(self.evicted.pop(d.job_id))
        for ev in back:
            self._restarted(ev, t, facts)

    def _early(self, p: str) -> None:
        """Counted: ``p`` starts while victims of its last preemption still hold their
        GPUs, on none of them (room freed elsewhere; or a plan that needed nothing they
        hold now)."""
        mine = [ev for ev in self.evicted.values() if ev.p == p and ev.call == self.preempted.get(p)]
        if any(not ev.exited for ev in mine) and not any(ev.gpus & self.placed[p] for ev in mine):
            self.out.counts["j_info:preemptor started before its victims left, on none of their GPUs"] += 1

    def _restarted(self, ev: Eviction, t: float, facts: dict) -> None:
        out = self.out
        out.counts["j_wasted"] += 1
        now = self.placed[ev.victim]
        if self.started.get(ev.p, -1) >= ev.call:  # the preemptor ran (or runs) since, or starts now
            if now & ev.gpus and not (self.placed.get(ev.p, frozenset()) & ev.gpus):
                out.counts["j_info:back on its GPUs, preemptor elsewhere"] += 1
                if self.strict and ev.p in self.running and not any(c > ev.call and since > ev.call
                                                                          for c, since in self.freed):
                    out.fail("j_wasted", f"t={t:g}: {ev.victim}, evicted for {ev.p} at t={ev.t:g}, starts again on "
                             f"its own GPUs {sorted(now & ev.gpus)}; {ev.p} runs elsewhere and nothing gave room "
                             "back in between (strict form)")
            return
        if ev.p in self.gone or not (now & ev.gpus):
            return  # cancelled; or started on other GPUs (the preemptor's hold is e_preemptor's)
        short = facts.get("short")
        if short is not None and ev.p in self.preempted and not {n for n, _g in now & ev.gpus} & short(ev.p):
            # back on GPUs of its own that the preemptor's plan leaves (its hold is whole)
            out.counts["j_info:back on GPUs its preemptor's plan does not need"] += 1
            return
        why = self._excuse(ev, facts)
        if why is not None:
            out.counts[f"j_excused:{why}"] += 1
            return
        out.fail("j_wasted", f"t={t:g}: {ev.victim}, evicted for {ev.p} at t={ev.t:g}, starts again on its own "
                                f"GPUs {sorted(now & ev.gpus)} and {ev.p} has not started")

    def _excuse(self, ev: Eviction, facts: dict) -> str | None:
        outcome = self.judged.get((ev.p, ev.call))
        if outcome is not None:
            return outcome if outcome.startswith("excused") else "e_preemptor failed (reported there)"
        if self.preempted.get(ev.p) != ev.call:
            return "preempted again"
        why = next((w for c, w in self.changed if c > ev.call), None)
        if why is not None:
            return why
        mine = self.priority.get(self.cls.get(ev.p, ""), 0)
        if any(c > ev.call and prio >= mine for c, prio in self.high):
            return "a job of its priority or higher came"
        if ev.limits and tuple(facts.get("limits", ev.limits)) != ev.limits:
            return "a window changed a limit"
        left = facts.get("left")
        if left is not None and left(ev.reserved, ev.p):
            return "a reserved class's job left"
        return None
