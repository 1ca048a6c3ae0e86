"""The oracle's checks (issue 20, item 4; design note 015, section 8), run on one
workload of ``oracle_workloads`` by ``tests/test_oracle.py`` and ``bench/oracle.py``.

``check(wl)`` drives the workload through the simulator with the fast core and with the
reference core (``Scheduler(rules, reference=True)``), and returns a ``Report``: how
many times each property was checked and every failure. The properties:

* ``a_equal`` - fast == reference: the same ``handle()`` calls (wake-ups that decide
  nothing aside) with the same decisions, decision by decision, and the same pending
  reasons over time (``record_reasons``);
* ``b_work`` - work conservation after every instant: no pending job passes the
  admission rule (``admission.decide(job, profile_for(job))``), except behind the first
  blocked job when backfill is off (its reason then reads ``Priority(<that job>)``);
* ``c_reason`` - every reason is the real blocker: the refusing rule lifted (that limit
  raised, that claim dropped from the profile, that class's reservation dropped,
  anti-affinity off) the job is admitted or refused by a later rule (or by the same rule
  for another limit / claim / class); a capacity reason is checked against the free
  GPUs independently (``Resources``: no placement on the free GPUs; ``ExceedsCapacity``:
  none on the empty healthy nodes); the job ids a reason names are what it says;
* ``d_reserved`` - after every instant with a start: the free GPUs cover every class's
  unused ``reserved_gpus`` (a start that leaves them short must be of the class itself
  inside its reservation - a share joining a card only another short reserved class held
  takes the card from it as a fresh GPU would, note 042), and no limit a started job
  counts against is exceeded;
* ``e_preemptor`` - every preemption's preemptor starts at the instant its last victim
  is gone, unless it was cancelled, hardware was lost, a window changed its limits, an
  admin lowered its priority (``nice``), a
  job of a class whose ``reserved_gpus`` now keep it out left in between, earlier than
  planned (a job planned to end by the victims' exit does not excuse it: the plan reads
  the reservation without it, note 090; a preemptor that evicts again at that exit did
  not start), or - a share
  preemptor that was to join its victims' card - the card's other holders all left
  before its victims, earlier than planned, and other classes' ``reserved_gpus`` keep it
  off the fresh GPU the card's is then (counted apart as ``e_excused:<why>``); a
  preemptor that evicts a job of
  another member of its cohort stays within its own nominal quota once it runs (Kueue's
  ``borrowWithinCohort: Never``: borrowing by preemption is undone by the victim team's
  reclaim, and round again - issue 20's endless loop; counted as ``e_no_borrow``);
* ``f_restart`` - a ``Restart`` or a question changes no decision: the run with the
  workload's restarts that asks every pending reason decides as the run with neither;
  and after every instant of the run
  without them a restored core decides nothing at the same instant (a full pass) and
  then the same as the uninterrupted one;
* ``h_estimates`` - after every instant ``estimated_starts()`` answers (``squeue
  --start``, design note 015 section 7): every estimate is of a pending job, after now
  (never in the past, never "now" for a job that waits), on a stated basis, and equal
  to ``estimated_start`` of the same job; asking changes no decision (``f_restart``);
* ``i_share_victims`` - preemption of and for shares (note 042), written plainly: a
  class-preemption victim is of a lower class and evictable, never a MIG instance -
  unless a reclaim may take it, judged per victim from the cohorts (note 065); a
  share preemptor's victims are shares on one card;
* ``j_wasted`` - no eviction is wasted (design note 079, ``oracle_wasted``): a victim is
  not started again on a GPU it was evicted from while its preemptor, not started since,
  still waits - unless something changed the preemptor's plan in between (hardware, an
  operator, a job of its priority or higher, a quota window, a reserved class's job
  leaving, ``e_preemptor``'s judgement at its last victim's exit);
* ``g_live`` - at the end no pending job could start later (each is refused for good:
  a limit it can never fit, no healthy nodes that could hold it); after every instant,
  a job waiting on time (a window, a victim's minimum runtime) has ``next_wakeup()``.
"""

from __future__ import annotations

import json
import os
import re
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field, replace
from itertools import combinations

from gpushepherd.core import admission as A, preemption as P, typed
from gpushepherd.core.filters import share_can_join
from gpushepherd.core.freed import card_of
from gpushepherd.core.ledger import FULL_MILLI
from gpushepherd.core.profile import Profile
from gpushepherd.core.reasons import NOT_PREEMPTIBLE
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.decisions import Preempt, Start
from gpushepherd.model.events import GpuHealthChanged, JobCancelled, NodeLost, Tick
from gpushepherd.model.job import GPU_UNITS, JobState
from gpushepherd.model.reasons import ReasonCode
from gpushepherd.model.rules import week_values
from gpushepherd.sim.engine import SimJob, Simulator
from oracle_wasted import WastedEvictions

#: property j (wasted evictions, ``oracle_wasted``): ``SHEPHERD_ORACLE_WASTED=0`` turns it off,
#: ``=2`` adds its strict form (off by default: it flags plans that ignore room other
#: preemptors' victims are about to leave, note 079)
WASTED = {"0": "", "2": "2"}.get(os.environ.get("SHEPHERD_ORACLE_WASTED", "1"), "1")
PROPERTIES = ("a_equal", "b_work", "c_reason", "d_reserved", "e_preemptor", "f_restart", "g_live", "h_estimates",
              "i_share_victims", *(("j_wasted",) if WASTED else ()))
MAX_CALLS = 3000  # a dozen jobs need a few dozen instants; many more is a livelock
#: wake-ups in a row that decide nothing over more than this many seconds end a run as a
#: livelock (``next_wakeup()`` asking for ticks that change nothing): every window of a
#: workload opens within a week, and every job's true duration is far shorter
IDLE_S = 8 * 86400.0
BIG = 10 ** 12
RULE_NAMES = {A.ADMITTED: "admitted", A.HARD_NEVER: "1 hard-never", A.HARD_NOW: "2 hard-now",
              A.NEVER_FITS: "3 never-fits", A.ORDER: "4 strict-fifo", A.FREE: "5 free", A.COHORT: "6 cohort",
              A.ANTI: "7 anti-affinity", A.CLASS_HOLD: "8 class-hold", A.CLAIMS: "9 claims"}


@dataclass
class Failure:
    prop: str
    text: str

    def __str__(self) -> str:
        return f"{self.prop}: {self.text}"


@dataclass
class Report:
    """Checks done per property (and ``e_excused:<why>``) and the failures found."""

    counts: Counter = field(default_factory=Counter)
    failures: list[Failure] = field(default_factory=list)
    #: seconds of the plain fast simulation (no checks, no reasons, no restarts): the
    #: bench's baseline
    plain_s: float = 0.0

    def fail(self, prop: str, text: str) -> None:
        if sum(1 for f in self.failures if f.prop == prop) < 5:  # the first few of each say enough
            self.failures.append(Failure(prop, text))

    def merge(self, other: Report) -> None:
        self.counts.update(other.counts)
        self.failures.extend(other.failures)
        self.plain_s += other.plain_s


@dataclass
class Call:
    t: float
    batch: list
    decisions: list
    wake: float | None = None  # next_wakeup() after the call


# ------------------------------------------------------------------ driving
def _probe_class(recorder):
    """A ``Scheduler`` subclass whose ``handle`` tells ``recorder`` about every call;
    the simulator's ``Restart`` rebuilds the same class, so restarts keep recording."""

    class Probe(Scheduler):
        def handle(self, events):
            batch = list(events)
            out = super().handle(batch)
            recorder(self, batch, out)
            return out

    return Probe


class Livelock(Exception):
    """The run was stopped: wake-ups over more than ``IDLE_S`` seconds changed nothing."""

    def __init__(self, sched, calls, since):
        super().__init__(f"{len(calls)} instants, and from t={since:g} to {sched.now:g} only wake-ups that "
                         "decided nothing")
        self.sched = sched
        self.calls = calls


def drive(wl, *, reference: bool = False, restarts: bool = True, record_reasons: bool = True,
          checker: Checker | None = None):
    """Run ``wl`` through the simulator; returns ``(result, calls)``.

    Raises:
        Livelock: instants over more than ``IDLE_S`` seconds were bare wake-ups that
            decided nothing (the run would never end).
        RuntimeError: more than ``MAX_CALLS`` instants.
    """
    calls: list[Call] = []
    idle: list[float | None] = [None]  # when the current run of idle wake-ups began

    def recorder(sched, batch, out):
        calls.append(Call(batch[0].t, batch, list(out), sched.next_wakeup()))
        if len(calls) > MAX_CALLS:
            raise RuntimeError(f"runaway simulation: more than {MAX_CALLS} instants")
        if checker is not None:
            checker.after(sched, batch, out)
        if out or not all(isinstance(e, Tick) for e in batch):
            idle[0] = None
        elif idle[0] is None:
            idle[0] = sched.now
        elif sched.now - idle[0] > IDLE_S:
            raise Livelock(sched, calls, idle[0])

    probe = _probe_class(recorder)
    events = wl.events if restarts else wl.without_restarts().events
    sim = Simulator(wl.rules, [SimJob(s, d) for s, d in wl.jobs], list(events), record_reasons=record_reasons,
                    check_invariants=checker is not None,
                    scheduler=lambda rules: probe(rules, reference=reference))
    result = sim.run()
    return result, calls


def _flat(calls: list[Call]) -> list:
    return [d for c in calls for d in c.decisions]


def _acting(calls: list[Call]) -> list[Call]:
    """The calls that decided something or carried an event other than a tick: a wake-up
    that decides nothing changes nothing (one implementation asking for a wake-up the other
    does not need is no difference of decisions; one missing a wake-up that decides shows
    as the decision it missed)."""
    return [c for c in calls if c.decisions or not all(isinstance(e, Tick) for e in c.batch)]


def _first_difference(a: list[Call], b: list[Call]) -> str | None:
    a, b = _acting(a), _acting(b)
    for i, (x, y) in enumerate(zip(a, b)):
        if x.t != y.t or x.decisions != y.decisions:
            return (f"call {i} at t={x.t:g} (batch {_brief(x.batch)}): fast {_brief(x.decisions)}, "
                    f"reference {_brief(y.decisions)}" if x.t == y.t else
                    f"call {i}: fast at t={x.t:g}, reference at t={y.t:g}")
    if len(a) != len(b):
        return f"fast made {len(a)} calls, reference {len(b)}"
    return None


def _brief(items) -> str:
    text = "[" + ", ".join(_short(x) for x in items) + "]"
    return text if len(text) < 600 else text[:600] + "...]"


def _short(x) -> str:
    name = type(x).__name__
    if isinstance(x, Start):
        return f"Start({x.job_id}@{x.placement})"
    if isinstance(x, Preempt):
        return f"Preempt({x.job_id} for {x.preemptor or x.reason})"
    job = getattr(x, "job_id", None) or (x.spec.id if getattr(x, "spec", None) is not None else None)
    if job:
        return f"{name}({job})"
    node = getattr(x, "node", None)
    if node is not None:
        return f"{name}({getattr(node, 'name', node)})"
    return name


# ------------------------------------------------------------------- checks
class Checker:
    """Properties b, c, d, e, g, checked after every ``handle`` call of the fast core."""

    def __init__(self, wl, report: Report):
        self.wl = wl
        self.rules = wl.rules
        self.report = report
        self.watch: dict[str, dict] = {}  # preemptor -> what its preemption was
        self.hw_lost_at: list[float] = []
        #: property j, read from the decision stream (``oracle_wasted``)
        classes = wl.rules.classes
        self.wasted = WastedEvictions({n: c.priority for n, c in classes.items()}, report, strict=WASTED == "2",
                                      reserved=frozenset(n for n, c in classes.items() if c.reserved_gpus)
                                      ) if WASTED else None

    # -------------------------------------------------------------- per call
    def after(self, sched, batch, out) -> None:
        t = sched.now
        if any(isinstance(e, NodeLost) or (isinstance(e, GpuHealthChanged) and not e.healthy) for e in batch):
            self.hw_lost_at.append(t)
        for e in batch:
            if isinstance(e, JobCancelled) and e.job_id in self.watch:
                self.watch[e.job_id]["cancelled"] = True
        # the estimates first: the core's copy for them (``forward.clone``) then holds none
        # of the profiles ``pending`` has the core build for its questions (note 056)
        self.estimates(sched)
        self.pending(sched)
        self.reserved(sched, out)
        self.preemptions(sched, batch, out)
        self.islands(sched, out)
        if self.wasted is not None:
            self.wasted.observe(t, batch, out, self.facts(sched, out))

    def facts(self, sched, out) -> dict:
        """What property j reads of the core after a call: every limit's value, the units
        each class holds (at an eviction), and whether a reserved class's job left for
        a preemptor waiting on a class reservation (``e_preemptor``'s excuse)."""
        book = sched.book
        facts = {"limits": tuple(book.quota.current),
                 "left": lambda before, p: _reservation_left(book, before, sched.pending_reason(p)),
                 "short": lambda p: _hold_short(book, book.jobs[p])}
        if book.reserved and any(isinstance(d, Preempt) and d.preemptor for d in out):
            facts["reserved"] = _class_use(book)
        return facts

    def estimates(self, sched) -> None:
        """Property h: the estimated starts of every pending job (module docstring)."""
        rep = self.report
        t = sched.now
        pending = {j.id for j in sched.pending_jobs()}
        rep.counts["h_estimates"] += 1
        for jid, est in sorted(sched.estimated_starts().items()):
            if jid not in pending:
                rep.fail("h_estimates", f"t={t:g}: an estimate for {jid}, which is not pending")
            elif not est.t > t:
                rep.fail("h_estimates", f"t={t:g}: {jid}'s estimated start {est.t:g} is not after now")
            elif est.basis not in ("estimates", "time limits"):
                rep.fail("h_estimates", f"t={t:g}: {jid}'s estimate rests on {est.basis!r}")
            elif sched.estimated_start(jid) != est.t:
                rep.fail("h_estimates", f"t={t:g}: {jid}: estimated_start {sched.estimated_start(jid)}, "
                         f"estimated_starts {est.t:g}")

    def islands(self, sched, out) -> None:
        """d: a job that requires an NVLink island starts inside one island of one node
        (a node without declared islands is one; note 037)."""
        book = sched.book
        for d in out:
            if not isinstance(d, Start) or d.job_id not in book.jobs or not book.jobs[d.job_id].shape.island:
                continue
            self.report.counts["d_island"] += 1
            parts = d.placement.parts
            node = book.ledger.slots[book.ledger.by_name[parts[0][0]]].node if len(parts) == 1 else None
            if node is None or (node.nvlink_islands and not any(set(parts[0][1]) <= set(i)
                                                                for i in node.nvlink_islands)):
                self.report.fail("d_island", f"{d.job_id} requires one NVLink island, started on {d.placement} "
                                 f"at t={sched.now:g}")

    def pending(self, sched) -> None:
        rep = self.report
        adm = sched.admission
        wake = sched.next_wakeup()
        t = sched.now
        for job in sched.pending_jobs():
            reason = sched.pending_reason(job.id)
            text = str(reason)
            profile = sched.profile_for(job)
            v = adm.decide(job, profile)
            rep.counts["b_work"] += 1
            if v.admitted:
                first = sched.last_turn.first_blocked if sched.last_turn is not None else None
                strict = not self.rules.backfill_enabled
                if not (strict and first is not None and first.key < job.key and reason.code is ReasonCode.PRIORITY
                        and reason.detail == first.id):
                    ahead = ""
                    if strict:  # who blocks the strict order ahead of it
                        blocker = next((j for j in sched.pending_jobs() if j.key < job.key
                                        and A.stops_strict_order(j, adm.decide(j, sched.profile_for(j)).rule)), None)
                        if blocker is not None:
                            ahead = (f"; backfill off, {blocker.id} ahead is refused for capacity"
                                     + (f" (a {blocker.share.kind} share)" if blocker.share is not None else ""))
                    rep.fail("b_work", f"t={t:g}: {job.id} passes the admission rule ({v.counts or v.spot}) "
                             f"but waits, reason {text}{ahead}")
                continue
            rep.counts["c_reason"] += 1
            with typed.bound(job, v.variant):  # per-GPU-type quotas: on the type the verdict is for (note 038)
                self.lift(sched, job, profile, v, text)
                self.named(sched, job, reason, v, wake)
            if ((reason.code is ReasonCode.WINDOW_LIMIT and not adm.never_fits(job))  # a window to wait for
                    or (reason.code is ReasonCode.NO_PREEMPTIBLE_VICTIMS and reason.detail.startswith("min_runtime"))):
                rep.counts["g_live"] += 1
                if wake is None:
                    rep.fail("g_live", f"t={t:g}: {job.id} waits on time ({text}) and next_wakeup() is None")

    def named(self, sched, job, reason, v, wake) -> None:
        """The job ids and times a reason names are what it says."""
        book = sched.book
        t = sched.now
        code, detail = reason.code, reason.detail
        bad = None
        if code is ReasonCode.PREEMPTION_IN_PROGRESS:
            gone = [x for x in detail.split(",") if not (x in book.jobs and book.jobs[x].state is JobState.PREEMPTING)]
            if gone or job.id not in book.preemptors:
                bad = f"victims {gone} are not exiting"
        elif code is ReasonCode.HELD_FOR_PREEMPTOR:
            p = book.jobs.get(detail)
            if p is None or p.state is not JobState.PENDING or detail not in book.preemptors:
                bad = f"{detail} holds nothing"
        elif code is ReasonCode.RESERVED_FOR and not detail.startswith("classes."):
            r = book.jobs.get(detail)
            if r is None or r.state is not JobState.PENDING:
                bad = f"{detail} is not pending"
            elif detail not in book.preemptors and not r.key < job.key:
                bad = f"{detail} is not ahead of it in the queue"
        elif code is ReasonCode.NO_PREEMPTIBLE_VICTIMS and detail.startswith("min_runtime"):
            at = float(detail.rsplit("t=", 1)[1].rstrip(")"))
            if not at > t or wake is None or wake > at:
                bad = f"eligible at {at:g}, next_wakeup() {wake}"
        elif code is ReasonCode.NO_PREEMPTIBLE_VICTIMS and detail == NOT_PREEMPTIBLE:
            # the claim: some lower-priority job on its nodes may not be evicted (a class
            # that is not preemptible); when every one may, something else keeps the job
            # out (a class reservation the emptied GPU would take, say) and that is its reason;
            # a job a cohort keeps is no such job: that reason names the cohort (note 063)
            nodes = book.nodes_for(job)
            may = {x.id for x in P.candidates(book, job, False)}
            if not any(x.state in (JobState.RUNNING, JobState.STOPPING) and x.cls.priority < job.cls.priority
                       and x.id not in may and (x.state is JobState.STOPPING or not x.evictable
                                                or (P.comes_of_age(book, x) <= t  # young work: min_runtime
                                                    and not any(_kept_by(book, c, job, x)
                                                                for c in self.rules.cohorts.values())))
                       and any(i in nodes for i, _m in x.alloc)
                       for x in book.running.values()):
                bad = "every lower-priority job on its nodes may be preempted or is kept by a cohort"
        elif code is ReasonCode.NO_PREEMPTIBLE_VICTIMS and (m := _KEPT_TEXT.search(detail)):
            # the claim: a cohort keeps a lower-priority job on its nodes from it, for the
            # cause the text says - its team would borrow there, or the job's team is within
            # its nominal there (Kueue's borrowWithinCohort: Never; the guarantee; note 063)
            # (a cohort of per-GPU-type quotas is one per type, all of its name: note 038)
            named = [c for c in self.rules.cohorts.values() if c.name == m["cohort"]]
            cause = "borrow" if m["cause"] == "would borrow beyond" else "guarantee"
            nodes = book.nodes_for(job)
            if not any(x.state is JobState.RUNNING and x.evictable and x.cls.priority < job.cls.priority
                       and any(i in nodes for i, _m in x.alloc) and _kept_by(book, c, job, x) == cause
                       for x in book.running.values() for c in named):
                bad = f"no lower-priority job on its nodes is kept by cohorts.{m['cohort']} ({cause})"
        elif code is ReasonCode.NO_FIT and detail == "whole-gpu":
            # the claim: what is free on its nodes is shares or MIG instances (note 063)
            if not _room_as_shares(book, job):
                bad = "no room is left on its nodes as shared cards or MIG instances"
        elif code is ReasonCode.NO_FIT and detail in ("gpu-fraction", "gpu-memory") and job.share is not None:
            # the claim: a card of its kind on its nodes has room of that dimension left,
            # too little for the job (note 063)
            if not _card_room(book, job, detail):
                bad = f"no {job.share.kind} card on its nodes has {detail} left"
        elif code is ReasonCode.NO_FIT and detail.startswith("mig-slice") and job.share is not None:
            # the claim: no instance of its profile is free and in service on its nodes
            ledger = book.ledger
            if any(ledger.slots[n].alive and card.free_of(job.share.profile) is not None
                   for n in book.nodes_for(job) for card in ledger.slots[n].migs.values()):
                bad = f"a {job.share.profile} instance is free on its nodes"
        elif code is ReasonCode.NO_FIT and detail in _REPLICA and job.share is not None:
            # the claim: cards of its kind are open on its nodes and none has the replicas
            # (MPS clients, with their SMs) it asks; none open at all is capacity (note 076)
            if _replica_free(book, job):
                bad = f"a {job.share.kind} card on its nodes has the replicas it asks free"
            elif not _card_room(book, job, detail):
                bad = f"no {job.share.kind} card is open on its nodes"
        elif code is ReasonCode.PRIORITY and v.rule == A.ORDER:
            h = book.jobs.get(detail)
            if (h is None or h.state is not JobState.PENDING or h.strict_q != job.strict_q or not h.key < job.key
                    or book.nodes_for(h).isdisjoint(book.nodes_for(job))):
                bad = f"{detail} is not ahead of it in its strict FIFO queue for the same nodes"
        elif code is ReasonCode.PRIORITY:
            bad = "a job the admission rule refuses reads Priority"
        if bad is not None:
            self.report.fail("c_reason", f"t={t:g}: {job.id} reads {reason}: {bad} (rule {RULE_NAMES[v.rule]})")

    # ------------------------------------------------------------------- c
    def lift(self, sched, job, profile, v, text) -> None:
        """Lift the rule that refused ``job`` and ask again: admitted, or refused later."""
        book = sched.book
        adm = sched.admission
        quota = book.quota
        t = sched.now
        rule = v.rule
        rep = self.report

        def later(w, same_ok) -> bool:
            if w.rule == A.ORDER and rule > A.ORDER:
                # the lift let a head of its strict FIFO queue start some day, which the
                # rules as they are never let (it holds back nobody then): not the reason
                head = book.jobs[w.head]
                return not adm.may_ever_start(head, head.charges)
            return w.admitted or w.rule > rule or (w.rule == rule and same_ok(w))

        if rule in (A.HARD_NEVER, A.HARD_NOW, A.COHORT):
            i = v.limit[0]
            lim, cur = quota.limits[i], quota.current[i]
            limits = quota.limits
            quota.limits = limits[:i] + (replace(lim, max=BIG, windows=()),) + limits[i + 1:]
            quota.current[i] = BIG
            try:
                w = adm.decide(job, profile)
            finally:
                quota.limits = limits
                quota.current[i] = cur
            if not later(w, lambda w: w.limit is not None and w.limit[0] != i):
                rep.fail("c_reason", f"t={t:g}: {job.id} reads {text}; with {lim.path} raised it is refused by "
                         f"rule {RULE_NAMES[w.rule]} {w.limit and quota.limits[w.limit[0]].path}")
            if rule == A.HARD_NEVER and v.limit[1]:  # windowed limits never open together for it
                wins = [(k, a) for k, _u, a in v.charges if quota.limits[k].windows]
                combos = week_values(tuple(quota.limits[k] for k, _a in wins))
                if any(all(a <= x * quota.scale[k] for (k, a), x in zip(wins, c)) for c in combos):
                    rep.fail("c_reason", f"t={t:g}: {job.id} reads {text} but some time of the week allows it")
            elif rule == A.HARD_NEVER:
                amount = next(a for li, _u, a in v.charges if li == i)
                if not amount > lim.loosest * quota.scale[i]:
                    rep.fail("c_reason", f"t={t:g}: {job.id} reads {text} but {lim.path} reaches "
                             f"{lim.loosest} and it asks {quota.fmt(i, amount)}")
        elif rule == A.NEVER_FITS:
            self.never_fits(sched, job, text)
        elif rule == A.ORDER:
            # out of its strict queue it starts, or a later rule refuses it; and the head it
            # names could start some day (a head that never can holds back nobody)
            head = book.jobs[v.head]
            w = _decide_with(adm, job, profile, job, "strict_q", None)
            if not later(w, lambda w: False):
                rep.fail("c_reason", f"t={t:g}: {job.id} reads {text}; out of its strict FIFO queue it is refused "
                         f"by rule {RULE_NAMES[w.rule]}")
            if not adm.may_ever_start(head, head.charges):
                rep.fail("c_reason", f"t={t:g}: {job.id} reads {text} but {head.id} can never start")
        elif rule == A.FREE:
            if job.shape.mode != "share":
                nodes = book.nodes_for(job)
                avail = {n: book.ledger.slots[n].free for n in nodes}
                if job.shape.island:  # only GPUs inside one island count (note 037)
                    avail = {n: _island_free(book.ledger.slots[n]) for n in nodes}
                if fits(job.shape, avail, {n: book.ledger.slots[n].healthy for n in nodes}):
                    rep.fail("c_reason", f"t={t:g}: {job.id} reads {text} but fits the free GPUs {avail}")
        elif rule == A.ANTI:
            w = _decide_with(adm, job, profile, book, "anti", False)
            if not later(w, lambda w: False):
                rep.fail("c_reason", f"t={t:g}: {job.id} reads {text}; without anti-affinity it is refused by "
                         f"rule {RULE_NAMES[w.rule]}")
        elif rule == A.CLASS_HOLD:
            others = {c: r for c, r in book.reserved.items() if c != v.holder}
            w = _decide_with(adm, job, profile, book, "reserved", others)
            # a share that no fresh GPU is left for can only join a card a reserved class
            # that may take its kind opened (``Admission.never_fits``): lifting that class's
            # reservation also lifts the card it could join, so it then never fits - the
            # reservation is still its blocker (seed 15055)
            joins_holder = (w.rule == A.NEVER_FITS and job.shape.mode == "share"
                            and (book.rules.classes[v.holder].sharing is None
                                 or job.share.kind in book.rules.classes[v.holder].sharing))
            if not joins_holder and not later(w, lambda w: w.holder != v.holder):
                rep.fail("c_reason", f"t={t:g}: {job.id} reads {text}; without {v.holder}'s reserved_gpus it is "
                         f"refused by rule {RULE_NAMES[w.rule]}")
        elif rule == A.CLAIMS:
            c = v.blocker or adm.blocker_of(job, profile, v.charges)
            if c is None or not any(x is c for x in profile.claims):
                rep.fail("c_reason", f"t={t:g}: {job.id} reads {text}: the claim is not in its profile")
                return
            lifted = profile_without(book, profile, c)
            w = adm.decide(job, lifted)

            def other_claim(w):
                b = w.blocker or adm.blocker_of(job, lifted, w.charges)
                return b is not None and b.job_id != c.job_id

            if not later(w, other_claim):
                rep.fail("c_reason", f"t={t:g}: {job.id} reads {text}; without {c.job_id}'s "
                         f"{'hold' if c.hold else 'reservation'} it is refused by rule {RULE_NAMES[w.rule]}"
                         + (f" ({w.blocker.job_id})" if w.blocker is not None else ""))  # noqa: E501

    def never_fits(self, sched, job, text) -> None:
        book = sched.book
        t = sched.now
        if job.shape.mode == "share":
            return  # the inventory check of shares is the core's own (filters.inventory_misfit)
        self.report.counts["c_never_fits"] += 1
        ledger = book.ledger
        totals = {n: ledger.slots[n].healthy for n in book.nodes_for(job)}
        if job.shape.island:  # only GPUs inside one island count (note 037)
            totals = {n: _island_free(ledger.slots[n], ledger.slots[n].healthy_mask) for n in totals}
        other = sum(r for c, r in book.reserved.items() if c != job.cls.name)
        by_reservation = job.units > ledger.healthy_total * GPU_UNITS - other
        if fits(job.shape, totals, totals) and not by_reservation:
            self.report.fail("c_reason", f"t={t:g}: {job.id} reads {text} but fits the empty healthy nodes {totals}"
                             f" (other classes reserve {other // GPU_UNITS})")

    # ------------------------------------------------------------------- d
    def reserved(self, sched, out) -> None:
        book = sched.book
        starts = [d for d in out if isinstance(d, Start)]
        if not starts:
            return
        rep = self.report
        t = sched.now
        rep.counts["d_reserved"] += 1
        used = _class_use(book)
        held = {c: max(0, r - used.get(c, 0)) for c, r in book.reserved.items()}
        slack = book.ledger.free_total * GPU_UNITS - sum(held.values())
        if slack < 0:
            order = {d.job_id: n for n, d in enumerate(starts)}
            for d in starts:
                job = book.jobs[d.job_id]
                if not job.state.holds_gpus:
                    continue
                name = job.cls.name
                if name in book.reserved and used.get(name, 0) <= book.reserved[name]:
                    continue  # inside its class's own reservation: the slack is as before
                if _takes_gpu(book, job):
                    rep.fail("d_reserved", f"t={t:g}: after {job.id} ({name}) started, {book.ledger.free_total} "
                             f"GPUs are free for unused reservations {_gpus(held)}")
                    break
                joined = _joined_class(book, job, order)
                if joined is not None and held.get(joined):
                    rep.fail("d_reserved", f"t={t:g}: {job.id} ({name}) joined a card only {joined} held; "
                             f"{book.ledger.free_total} GPUs are free for unused reservations {_gpus(held)}")
                    break
        quota = book.quota
        for d in starts:
            job = book.jobs[d.job_id]
            for i, user, _a in job.run_charges:
                used = quota.usage.get((i, user), 0)
                if used > quota.current[i]:
                    rep.fail("d_reserved", f"t={t:g}: {job.id} started and {quota.limits[i].path}"
                             f"{'[' + user + ']' if user else ''} holds {quota.fmt(i, used)} of "
                             f"{quota.fmt(i, quota.current[i])}")

    # ------------------------------------------------------------------- e
    def preemptions(self, sched, batch, out) -> None:
        book = sched.book
        t = sched.now
        started = {d.job_id for d in out if isinstance(d, Start)}
        self.share_victims(book, [d for d in out if isinstance(d, Preempt) and d.preemptor])
        # the watches are judged before this call's preemptions replace them: a preemptor
        # that evicts again at its last victim's exit did not start when they were gone
        for pid in sorted(self.watch):
            w = self.watch[pid]
            p = book.jobs[pid]
            if pid in started and w["t"] <= t:
                del self.watch[pid]
                self.report.counts["e_preemptor"] += 1
                continue
            alive = [v for v, runs in w["victims"].items()
                     if book.jobs[v].state.holds_gpus and book.jobs[v].runs == runs]
            if alive:
                continue
            del self.watch[pid]
            self.report.counts["e_preemptor"] += 1
            why = None
            if w["cancelled"] or p.state is not JobState.PENDING:
                why = "cancelled"
            elif len(self.hw_lost_at) > w["hw"]:
                why = "hardware lost"
            elif any(book.quota.current[i] != m for i, m in w["limits"].items()):
                why = "window changed its limits"
            elif _reservation_left(book, w["reserved"], sched.pending_reason(pid),
                                   any(isinstance(d, Preempt) and d.preemptor == pid for d in out)):
                why = "a reserved class's job left"
            elif p.spec.nice > w["nice"]:  # an admin lowered it: a job now ahead may take the room (seed 102576)
                why = "its priority was lowered"
            elif _card_left_first(book, w, sched.pending_reason(pid)):
                why = "the other holders of its card left first"
            if self.wasted is not None:
                self.wasted.judge(pid, "failed" if why is None else f"excused: {why}")
            if why is not None:
                self.report.counts[f"e_excused:{why}"] += 1
                continue
            self.report.fail("e_preemptor", f"t={t:g}: the last victim of {pid} (preempted {sorted(w['victims'])} at "
                             f"t={w['t']:g}) is gone and {pid} does not start: {sched.pending_reason(pid)}")
        for d in out:
            if isinstance(d, Preempt) and d.preemptor:
                self.guarantee(book, d)
                w = self.watch.get(d.preemptor)
                if w is None or w["t"] != t:
                    p = book.jobs[d.preemptor]
                    w = self.watch[d.preemptor] = {
                        "t": t, "victims": {}, "cancelled": False, "hw": len(self.hw_lost_at),
                        "limits": {i: book.quota.current[i] for i, _u, _a in p.charges},
                        "reserved": _class_use(book, _exit_of(book, out, d.preemptor)) if book.reserved else {},
                        "nice": p.spec.nice, "others": {}}
                w["victims"][d.job_id] = book.jobs[d.job_id].runs
                card = card_of(book.jobs[d.job_id]) if book.jobs[d.preemptor].share is not None else None
                if card is not None:  # the other holders of the card a share preemptor joins
                    for h in book.ledger.slots[card[0]].cards[card[1]].holders:
                        w["others"].setdefault(h, (book.jobs[h].runs, book.jobs[h].end_est))

    def share_victims(self, book, preempts: list) -> None:
        """Preemption of and for shares, written plainly (note 042): a class-preemption
        victim is of a lower class and may be evicted, never a MIG instance - unless a
        reclaim may take it (``_reclaims``); a share preemptor's victims are shares on
        one card; a whole-GPU preemptor's share victims leave their card empty or free
        quota it needs (counted apart)."""
        by: dict[str, list] = {}
        for d in preempts:
            by.setdefault(d.preemptor, []).append(book.jobs[d.job_id])
        for pid, victims in sorted(by.items()):
            p = book.jobs[pid]
            shares = [v for v in victims if v.share is not None]
            if not shares:
                continue
            self.report.counts["i_share_victims"] += 1
            t = book.now
            for v in victims:
                if self._reclaims(p, v):
                    continue
                if not (v.cls.priority < p.cls.priority and v.evictable) or (v.share and v.share.kind == "mig"):
                    self.report.fail("i_share_victims", f"t={t:g}: {pid} ({p.cls.name}) preempts {v.id} "
                                     f"({v.cls.name}, evictable {v.evictable}, {v.share})")
            if p.share is not None:
                self.report.counts["i_share_preemptor"] += 1
                cards = {(v.alloc[0][0], v.share_at) for v in victims if v.share is not None}
                if len(cards) != 1 or len(shares) != len(victims):
                    self.report.fail("i_share_victims", f"t={t:g}: share {pid} preempts "
                                     f"{sorted(v.id for v in victims)} on {len(cards)} cards")
            else:
                ids = {v.id for v in victims}
                for v in shares:
                    card = book.ledger.slots[v.alloc[0][0]].cards.get(v.share_at[0])
                    if card is not None and not set(card.holders) <= ids | {
                            h for h in card.holders if book.jobs[h].state is JobState.PREEMPTING}:
                        self.report.counts["i_share_for_quota"] += 1

    def _reclaims(self, p, v) -> bool:
        """Whether a reclaim may take ``v`` for ``p`` by its kind (note 005, Kueue's
        ``reclaimWithinCohort``): ``p`` is a whole-GPU job (a share reclaims nothing,
        note 042), ``v`` may be evicted and is a job of another member of a cohort both
        count in that reclaims from any class, or from lower ones than ``p``'s. Whether
        ``v``'s team borrowed and ``p``'s stays within its nominal quota is
        ``guarantee``'s. Judged per victim from the rules, not from the preemptor's
        ``reclaim`` flag: the core clears it when the preemptor starts or lets its hold
        go, which may be later in the same instant (seed 316833: ``j1`` reclaimed two
        shares, then started on other GPUs that its victims' exit let it take) - and
        with ``p``'s charges on every GPU type it may use (note 038: it may have started
        on another type than the one it reclaimed on)."""
        if p.share is not None or not v.evictable:
            return False
        charges = [p.charges, *(x.charges for x in p.variants)]
        for cohort in self.rules.cohorts.values():
            member = _member(cohort, v.run_charges)
            if member is None or cohort.reclaim == "never" or not any(
                    (own := _member(cohort, c)) is not None and own is not member for c in charges):
                continue
            if cohort.reclaim == "any" or v.cls.priority < p.cls.priority:
                return True
        return False

    def guarantee(self, book, d: Preempt) -> None:
        """A job of another member of a cohort the preemptor counts in is evicted only
        while its team borrows (holds more than its nominal quota): a member within its
        nominal quota keeps it (Kueue's guarantee; note 005). Membership is read from the
        charges - a job confined to a pool counts in the pool's cohort and in a cohort of
        every pool (seed 143208: ``Job.cohort`` names only the first)."""
        p, v = book.jobs[d.preemptor], book.jobs[d.job_id]
        for cohort in self.rules.cohorts.values():
            own, member = _member(cohort, p.charges), _member(cohort, v.run_charges)
            if own is not None and member is not None and own is not member:
                self._guarantee(book, p, v, cohort, own, member)

    def _guarantee(self, book, p, v, cohort, own, member) -> None:
        self.report.counts["d_guarantee"] += 1
        used = book.quota.usage.get((member.limit, ""), 0)
        if used <= member.nominal * GPU_UNITS:
            self.report.fail("d_reserved", f"t={book.now:g}: {p.id} (team {p.spec.team}) preempts {v.id} of team "
                             f"{member.team}, which holds {used / GPU_UNITS:g} GPUs of its nominal {member.nominal} "
                             f"in cohorts.{cohort.name}")
        # the preemptor's team once it runs: at least what its jobs that ran before this
        # instant hold (jobs started in this pass may have come after the plan) plus it
        self.report.counts["e_no_borrow"] += 1
        t = book.now
        held = book.quota.usage.get((own.limit, ""), 0) - sum(
            a for j in book.running.values() if j.run_start >= t
            for i, u, a in j.run_charges if i == own.limit and not u)
        if held + p.units > own.nominal * GPU_UNITS:
            self.report.fail("e_preemptor", f"t={t:g}: {p.id} (team {p.spec.team}) preempts {v.id} of team "
                             f"{member.team} and would then borrow: its team holds at least "
                             f"{(held + p.units) / GPU_UNITS:g} GPUs of its nominal {own.nominal} in "
                             f"cohorts.{cohort.name}")

    # ------------------------------------------------------------------- g
    def end(self, sched) -> None:
        """At the end of the run: every pending job is refused for good."""
        adm = sched.admission
        for job in sched.pending_jobs():
            self.report.counts["g_live"] += 1
            v = adm.decide(job, sched.profile_for(job))
            if v.rule in (A.HARD_NEVER, A.NEVER_FITS):
                continue
            if _waits_for_a_card(sched, job, v):
                self.report.counts["g_waits_for_a_card"] += 1
                continue
            if v.rule == A.ORDER:
                head = sched.book.jobs[v.head]
                if _waits_for_a_card(sched, head, adm.decide(head, sched.profile_for(head))):
                    # behind such a share in its strict FIFO queue (note 031: a head that
                    # could ever start holds back the jobs behind it): the same submission
                    self.report.counts["g_behind_a_card"] += 1
                    continue
            self.report.fail("g_live", f"the run ends with {job.id} pending, refused by rule {RULE_NAMES[v.rule]} "
                             f"({sched.pending_reason(job.id)}): it could start later")


#: a ``NoPreemptibleVictims`` detail that names the cohort keeping the victims (note 063)
_KEPT_TEXT = re.compile(r"(?P<cause>would borrow beyond|is within) its nominal \S+ in cohorts\.(?P<cohort>[^:]+):")


def _kept_by(book, cohort, job, x) -> str | None:
    """Why ``cohort`` keeps running job ``x`` from preempting ``job`` (both count in it as
    jobs of different members): ``"borrow"`` - ``job``'s team would hold more than its
    nominal quota there once it runs (Kueue's ``borrowWithinCohort: Never``);
    ``"guarantee"`` - ``x``'s team holds no more than its nominal there; else ``None``."""
    own, member = _member(cohort, job.charges), _member(cohort, x.run_charges)
    if own is None or member is None or own is member:
        return None
    usage = book.quota.usage
    if usage.get((own.limit, ""), 0) + job.units > own.nominal * GPU_UNITS:
        return "borrow"
    if usage.get((member.limit, ""), 0) <= member.nominal * GPU_UNITS:
        return "guarantee"
    return None


def _room_as_shares(book, job) -> bool:
    """Whether some node ``job`` may use has room left on a shared card in service (the
    tightest of compute, memory and slots left above 0) or a free MIG instance in service
    (``stranded.py``'s free capacity)."""
    ledger = book.ledger
    for n in book.nodes_for(job):
        slot = ledger.slots[n]
        if not slot.alive:
            continue
        if any(card.key and card.room_fraction() > 0 for card in slot.cards.values()):
            return True
        if any(card.free_count() for card in slot.migs.values()):
            return True
    return False


#: the ``NoFit`` details that say "no free replica" (the conventions' ``no_free_mps_replica``)
_REPLICA = ("time-slice-replica", "mps-client")


def _card_room(book, job, detail: str) -> bool:
    """Whether a card in service of ``job``'s share kind on its nodes has compute left
    (``gpu-fraction``); or memory left, or - a share that asks compute, or a replica of a
    card with a replica limit (time-slicing, MPS) - the compute and the replica it asks
    (``gpu-memory``: memory is what binds there; note 076); or is open at all (the
    replicas ``time-slice-replica`` / ``mps-client`` says are taken)."""
    ledger = book.ledger
    for n in book.nodes_for(job):
        slot = ledger.slots[n]
        milli, _mem, slots = job.share.need(slot.node)
        for card in slot.cards.values():
            if not (slot.alive and card.key and card.mode == job.share.kind):
                continue
            if detail == "gpu-fraction" and card.milli < FULL_MILLI:
                return True
            if detail == "gpu-memory" and (card.mem < card.cap_mem
                                           or ((milli or card.cap_slots) and card.fits(milli, 0, slots))):
                return True
            if detail in _REPLICA:  # a card of its kind is open at all
                return True
    return False


def _replica_free(book, job) -> bool:
    """Whether a card in service of ``job``'s share kind on its nodes has the replicas
    (time-slicing) or MPS clients it asks free - an MPS client with its SM percentage:
    then ``NoFit(time-slice-replica)`` / ``NoFit(mps-client)`` ("no free replica") is not
    true (note 076)."""
    ledger = book.ledger
    for n in book.nodes_for(job):
        slot = ledger.slots[n]
        milli, _mem, slots = job.share.need(slot.node)
        if any(slot.alive and card.key and card.mode == job.share.kind and card.cap_slots
               and card.fits(milli, 0, slots) for card in slot.cards.values()):
            return True
    return False


def _waits_for_a_card(sched, job, v) -> bool:
    """Whether ``job``, refused by ``v``, is a share other classes' reservations keep off
    a fresh GPU: it waits for a job of a reserved class to open a card it may join - a
    submission, not a stall."""
    return (v.rule == A.CLASS_HOLD and job.share is not None and job.share.kind != "mig"
            and any(share_can_join(sched.book.ledger.groups[g].node, job.share) for g in sched.book.groups_for(job)))


def _decide_with(adm, job, profile, obj, attr: str, value):
    """The admission rule's verdict for ``job`` with ``obj.attr`` set to ``value`` for the
    question (a rule lifted), restored after."""
    old = getattr(obj, attr)
    setattr(obj, attr, value)
    try:
        return adm.decide(job, profile)
    finally:
        setattr(obj, attr, old)


def _takes_gpu(book, job) -> bool:
    """Whether the run holds whole GPUs, or a card it opened alone (a share on a fresh GPU)."""
    if job.share is None:
        return True
    if len(job.share_at) != 1:
        return False  # a MIG instance: never a whole GPU
    idx = job.alloc[0][0]
    card = book.ledger.slots[idx].cards.get(job.share_at[0])
    return card is not None and list(card.holders) == [job.id]


def _reservation_left(book, before: dict[str, int], reason, again: bool = False) -> bool:
    """Whether ``reason`` is a class reservation (``ReservedFor(classes.X.reserved_gpus)``)
    whose class holds less than ``before`` (at the preemption, without the jobs planned to
    end by the victims' exit: ``_class_use``): a job of it ended or left, earlier than
    planned, and the GPUs the plan left others are its reservation's again
    (oracle seed 20199: production inference's MIG job ended before its estimate).
    ``again``: the preemptor evicted again in the same call - its reason names the new
    victims; then a reserved class holding less than ``before`` and now short of its
    reservation excuses it (its new plan was made without that job; note 090)."""
    if again:
        used = _class_use(book)
        return any(used.get(name, 0) < min(units, res) for name, res in book.reserved.items()
                   if (units := before.get(name, 0)))
    m = re.fullmatch(r"classes\.(.+)\.reserved_gpus", reason.detail or "")
    if reason.code is not ReasonCode.RESERVED_FOR or m is None:
        return False
    name = m.group(1)
    return _class_use(book).get(name, 0) < before.get(name, 0)


def _card_left_first(book, w: dict, reason) -> bool:
    """Whether a share preemptor that was to join its victims' card beside other holders
    (``w["others"]``, not victims) waits on a class reservation (rule 8) because they
    all left before its victims, earlier than planned (oracle seed 137455: a co-holder
    ended before its estimate): the card's GPU is then a fresh one, which other classes'
    ``reserved_gpus`` keep - the plan could not know; a departure it could foresee (a
    co-holder signalled, or planned to end first) it must plan for (``share_plan``)."""
    others = [h for h in w["others"] if h not in w["victims"]]
    if not others or reason.code is not ReasonCode.RESERVED_FOR or not (reason.detail or "").startswith("classes."):
        return False
    exit_t = max(w["others"][v][1] for v in w["victims"] if v in w["others"])  # the victims' planned exit
    return all(w["others"][h][1] > exit_t
               and (not book.jobs[h].state.holds_gpus or book.jobs[h].runs != w["others"][h][0]) for h in others)


def _joined_class(book, job, order: dict[str, int]) -> str | None:
    """The class whose card a share joined: the one class of the card's holders before
    it (running before this instant, or started earlier in it), when that class is
    another with ``reserved_gpus`` - the card counted whole for it before (``_class_use``)."""
    if job.share is None or len(job.share_at) != 1:
        return None
    card = book.ledger.slots[job.alloc[0][0]].cards.get(job.share_at[0])
    if card is None:
        return None
    mine = order[job.id]
    before = {book.jobs[h].cls.name for h in card.holders if h != job.id and order.get(h, -1) < mine}
    if len(before) != 1:
        return None
    (name,) = before
    return name if name != job.cls.name and name in book.reserved else None


def _exit_of(book, out, pid: str) -> tuple[float, set[str]]:
    """The exit of ``pid``'s victims preempted in ``out`` (their latest deadline) and their ids."""
    ids = {d.job_id for d in out if isinstance(d, Preempt) and d.preemptor == pid}
    return max(book.jobs[v].end_est for v in ids), ids


def _class_use(book, exit_: tuple[float, set[str]] | None = None) -> dict[str, int]:
    """Units each class holds, a shared card that only one class's jobs hold counted
    whole (it is out of the free GPUs; the room left on it is the class's), MIG
    instances by their units (MIG GPUs are never free whole GPUs). ``exit_``: ``(time,
    victim ids)`` of a preemption - the use left at its victims' exit, without the jobs
    (victims aside) planned to end by then: their leaving is foreseen, and the plan
    reads the reservation without them too (note 090)."""
    used: dict[str, int] = {}
    cards: dict[tuple[int, int], set[str]] = {}
    running = book.running.values()
    if exit_ is not None:
        running = [j for j in running if not book.now < j.end_est <= exit_[0] or j.id in exit_[1]]
    for job in running:
        if job.share is not None and len(job.share_at) == 1:
            cards.setdefault((job.alloc[0][0], job.share_at[0]), set()).add(job.cls.name)
    for job in running:
        name = job.cls.name
        if job.share is not None and len(job.share_at) == 1:
            classes = cards[(job.alloc[0][0], job.share_at[0])]
            if len(classes) == 1:
                continue  # counted once per card below
        used[name] = used.get(name, 0) + job.run_units
    for classes in cards.values():
        if len(classes) == 1:
            (name,) = classes
            used[name] = used.get(name, 0) + GPU_UNITS
    return used


def _hold_short(book, p) -> set[str]:
    """The nodes of preemptor ``p``'s plan where its hold is short now: the GPUs free
    there and those its victims still hold there are fewer than the plan counts (a
    share's plan: every node of it; no plan: none)."""
    ledger = book.ledger
    out = set()
    for idx, count in p.plan:
        slot = ledger.slots[idx]
        held = sum(mask.bit_count() for v in p.victims for i, mask in book.jobs[v].alloc if i == idx)
        if p.share is not None or slot.free + held < count:
            out.add(slot.node.name)
    return out


def _member(cohort, charges):
    """The member of ``cohort`` whose limit ``charges`` count in (a member's limit counts
    all its GPUs in the cohort), else ``None``."""
    return next((m for m in cohort.members if any(i == m.limit and not u for i, u, _a in charges)), None)


def _gpus(held: dict) -> dict:
    return {c: u / GPU_UNITS for c, u in held.items() if u}


def profile_without(book, profile: Profile, claim) -> Profile:
    """``profile`` rebuilt without ``claim`` (holds first, then reservations in order, as
    ``Scheduler.profile_for`` builds one)."""
    out = Profile(book)
    for c in profile.claims:
        if c is not claim and c.hold:
            out.add_hold(book.jobs[c.job_id])
    for c in profile.claims:
        if c is not claim and not c.hold:
            out.add_reservation(book.jobs[c.job_id], c.start, list(c.gpus.items()), c.basis)
    return out


def _island_free(slot, mask: int | None = None) -> int:
    """The most GPUs of ``mask`` (default: the free ones) of a node inside one NVLink
    island (no islands declared: the node is one island)."""
    mask = slot.free_mask if mask is None else mask
    islands = slot.node.nvlink_islands or (tuple(range(slot.total)),)
    return max(sum(mask >> g & 1 for g in island) for island in islands)


def fits(shape, avail: dict[int, int], totals: dict[int, int]) -> bool:
    """Whether a whole-GPU job of ``shape`` has a placement on ``avail`` GPUs per node
    (``totals``: each node's healthy GPUs), written here from the placement rules, not
    with the core's placement code: ``single`` on one node; ``pods`` each pod on one
    node, pods may share one; ``multi`` whole free nodes plus at most one remainder
    node."""
    if shape.mode == "single":
        return any(a >= shape.k for a in avail.values())
    if shape.mode == "pods":
        return sum(max(0, a) // shape.per_pod for a in avail.values()) >= shape.pods
    whole_ok = [n for n, a in avail.items() if 0 < a and a >= totals[n]]
    for r in range(len(whole_ok) + 1):
        for whole in combinations(whole_ok, r):
            got = sum(avail[n] for n in whole)
            if got == shape.k:
                return True
            if got < shape.k and any(a >= shape.k - got for n, a in avail.items() if n not in whole):
                return True
    return False


# -------------------------------------------------------------------- restart
def restart_divergences(rules, calls: list[Call], horizon: int | None = None) -> list[str]:
    """After every call of an uninterrupted run: a core restored from its snapshot
    decides nothing at the same instant (a full pass), and one restored there decides
    the next ``horizon`` calls (all: ``None``) as the uninterrupted one did."""
    out: list[str] = []
    a = Scheduler(rules)
    for cut, call in enumerate(calls[:-1]):
        a.handle(call.batch)
        # JSON as a restart reads it; read once - restore_into copies what it keeps
        snap = json.loads(json.dumps(a.snapshot()))
        b = Scheduler.restore(rules, snap)
        again = b.handle([Tick(a.now)])
        if again:
            out.append(f"after t={a.now:g}: a second full pass at the same instant decided {_brief(again)}")
        b = Scheduler.restore(rules, snap)
        rest = calls[cut + 1:] if horizon is None else calls[cut + 1: cut + 1 + horizon]
        for i, nxt in enumerate(rest):
            got = b.handle(nxt.batch)
            if got != nxt.decisions:
                out.append(f"restored after t={a.now:g}, at t={nxt.t:g}: restored {_brief(got)}, "
                           f"uninterrupted {_brief(nxt.decisions)}")
                break
            wake = b.next_wakeup()
            if nxt.wake is not None and (wake is None or wake > nxt.wake):
                # the restored core would sleep through the uninterrupted one's wake-up:
                # a divergence if that wake-up is the next call (no event comes first,
                # after which the restored core may ask for it too) and decided something
                later = calls[cut + 2 + i:cut + 3 + i]
                woke = later[0] if later and later[0].t == nxt.wake and all(
                    isinstance(e, Tick) for e in later[0].batch) else None
                if woke is not None and woke.decisions:
                    out.append(f"restored after t={a.now:g}: after t={nxt.t:g} it sleeps until {wake}, the "
                               f"uninterrupted core wakes at {nxt.wake:g} and decides {_brief(woke.decisions)}")
                    break
        if len(out) >= 3:
            break
    return out


# ---------------------------------------------------------------------- all
def check(wl, *, horizon: int | None = 8) -> Report:
    """Every property on ``wl``; ``horizon``: calls a restored core is followed for."""
    rep = Report()
    try:
        _check(wl, rep, horizon)
    except Exception as exc:  # noqa: BLE001 - a crash of the core (or of a check) is a failure too
        tb = traceback.extract_tb(exc.__traceback__)[-1]
        rep.failures.append(Failure("crash", f"{type(exc).__name__}: {exc} ({tb.filename.rsplit('/', 1)[-1]}:"
                                             f"{tb.lineno})"))
    return rep


def _check(wl, rep: Report, horizon: int | None) -> None:
    checker = Checker(wl, rep)
    try:
        fast, fast_calls = drive(wl, checker=checker)
    except Livelock as stop:
        # the core keeps asking for wake-ups that change nothing: the run never ends
        rep.counts["g_live"] += 1
        waiting = [f"{j.id}: {stop.sched.pending_reason(j.id)}" for j in stop.sched.pending_jobs()]
        rep.fail("g_live", f"{stop}; next_wakeup() {stop.sched.next_wakeup()}, pending {waiting}")
        checker.end(stop.sched)
        return
    checker.end(fast.scheduler)
    ref, ref_calls = drive(wl, reference=True)
    rep.counts["a_equal"] += 1
    diff = _first_difference(fast_calls, ref_calls)
    if diff is not None:
        rep.fail("a_equal", diff)
    else:
        for jid, rec in fast.records.items():
            if rec.reasons != ref.records[jid].reasons:
                rep.fail("a_equal", f"{jid}'s reasons: fast {rec.reasons}, reference {ref.records[jid].reasons}")
                break
    t0 = time.perf_counter()
    _plain, plain_calls = drive(wl, restarts=False, record_reasons=False)
    rep.plain_s = time.perf_counter() - t0
    # the fast run asked every pending reason (and restarted, when the workload says so):
    # neither may change a decision
    kind = "f_restart"
    rep.counts[kind] += 1
    a, b = _flat(plain_calls), _flat(fast_calls)
    if a != b:
        i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        what = f"with restarts at {wl.restarts} and reasons asked" if wl.restarts else "with reasons asked"
        rep.fail(kind, f"{what}: decision {i} is "
                 f"{_short(b[i]) + ' at t=' + format(b[i].t, 'g') if i < len(b) else 'missing'}, without "
                 f"{_short(a[i]) + ' at t=' + format(a[i].t, 'g') if i < len(a) else 'missing'}")
    rep.counts["f_restart"] += len(plain_calls)
    for line in restart_divergences(wl.rules, plain_calls, horizon):
        rep.fail("f_restart", line)
