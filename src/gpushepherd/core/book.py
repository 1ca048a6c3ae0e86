"""The core's state and its transitions: who is pending, who holds which GPUs, what each
limit counts, and the indexes kept from them (Kueue keeps its cache apart from its
queues; here the pending queue and the allocation ledger are two rooms of one book).

Every change of a job's state goes through one method here (``launch``, ``release``,
``signal``, ``end``, ``requeue``, ``preempt``, ``stop``), which logs the transition and
keeps every index consistent; ``core/invariants.py`` checks them. No policy decision is
taken here: the stages (admission, preemption, the cycle) decide, the book records.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort

from gpushepherd.core import priority, typed
from gpushepherd.core.fairshare import UsageBook
from gpushepherd.core.ends import EndsByKey
from gpushepherd.core.filters import node_ok
from gpushepherd.core.freed import share_victim
from gpushepherd.core.ledger import Ledger, bits
from gpushepherd.core.placement import members_of
from gpushepherd.core.predict import RuntimePredictor
from gpushepherd.core.queue import PendingQueue, estimate_band
from gpushepherd.core.quota import QuotaBook
from gpushepherd.core.releases import ReleaseIndex
from gpushepherd.core.state import INF, Job, Transition
from gpushepherd.core.usage import UsageTrack
from gpushepherd.model.decisions import Decision, Preempt, Start, Stop
from gpushepherd.model.job import GPU_UNITS, JobState, natural_key
from gpushepherd.model.placement import Placement
from gpushepherd.model.reasons import PendingReason, ReasonCode, time_text
from gpushepherd.model.rules import LimitUnit, Rules


def victim_order_key(job: Job) -> tuple:
    """The global victim order (the conventions'): lowest class first, most recently
    started first, highest job id first."""
    return (job.cls.priority, -job.run_start, _neg_natural(job.id))


def _neg_natural(text: str) -> tuple:
    # invert a natural key so that ascending order puts the highest id first
    return tuple((-a, -b, tuple(-ord(ch) for ch in c) + (1,)) for a, b, c in natural_key(text)) + ((2, 0, ()),)


class Book:
    """Everything the core knows, and the one place that changes it.

    Attributes:
        rules: the compiled policy.
        ledger: the allocation ledger (who holds which GPU).
        quota: usage of every policy limit, in GPU units (7000 per GPU) or jobs.
        jobs: every job ever submitted, by id.
        queue: the pending jobs, in sub-queues (``core/queue.py``).
        running: jobs holding GPUs (RUNNING, PREEMPTING, STOPPING), by id.
        ends: ``(planned end, seq, id)`` of the jobs holding GPUs, sorted (note 015).
        preemptors: pending jobs that hold GPUs their victims free, by id.
        now: the time of the last handled event (seconds).
    """

    def __init__(self, rules: Rules):
        self.rules = rules
        self.ledger = Ledger(rules.nodes)
        self.quota = QuotaBook(rules)
        self.jobs: dict[str, Job] = {}
        self.queue = PendingQueue()
        self.running: dict[str, Job] = {}
        self.ends: list[tuple[float, int, str]] = []
        self.ends_by_key = EndsByKey()  # the same, per quota key (note 046)
        self.timers: list[tuple[float, int, int, str]] = []  # time-limit timers
        self.wakeups: list[float] = []  # times a victim comes of age (minimum runtime)
        self.preemptors: dict[str, Job] = {}
        self.now = float("-inf")
        self.seq = 0
        self.event_no = 0
        self.last_submit = float("-inf")
        # fair-share and multifactor priority (``core/priority.py``)
        self.usage = UsageBook(rules.priority.half_life_s, GPU_UNITS)
        self.max_prio = max((c.priority for c in rules.classes.values()), default=1) or 1
        self.recalc_t = float("-inf")
        self.next_recalc = float("-inf")
        self.teams_seen: set[str] = set(rules.teams)
        self.users_seen: dict[str, set[str]] = {}
        #: fair-share factors of this instant (``priority._fs_memo``)
        self.fs_memo: dict = {}
        self.fs_memo_stamp: tuple = ()
        pr = rules.prediction
        # a deadline weight keeps the ratios too, without predicting (its chances; note 068)
        self.predictor = (RuntimePredictor(pr.quantile, pr.history, pr.min_jobs, predicts=pr.enabled)
                          if pr.enabled or rules.priority.deadline_weight else None)
        # per class: units held, units covered by its reserved_gpus
        self.class_units: dict[str, int] = {}
        self.covered_units: dict[str, int] = {}
        self.class_jobs: dict[str, dict[str, Job]] = {}  # reserved classes: their jobs holding GPUs
        self.start_seq = 0  # runs started, in order (a run's start_no)
        self.reserved = self.reservations()
        # class anti-affinity: per node index, class -> jobs of it holding GPUs there
        self.anti = any(c.avoid for c in rules.classes.values())
        self.node_classes: list[dict[str, int]] = [{} for _ in self.ledger.slots]
        # RUNNING jobs per class priority, and the evictable ones themselves
        self.running_prio: dict[int, int] = {}
        self.evictable: dict[int, dict[str, Job]] = {}
        # per node and class priority (by position): GPUs of RUNNING jobs of a lower
        # class, all of them / the evictable ones (necessary conditions of victim searches)
        self.prios = sorted({c.priority for c in rules.classes.values()})
        self.prio_pos = {p: i for i, p in enumerate(self.prios)}
        self.lower_all: list[list[int]] = [[0] * len(self.prios) for _ in self.ledger.slots]
        self.lower_vic: list[list[int]] = [[0] * len(self.prios) for _ in self.ledger.slots]
        # caches of static facts (node filters): cleared when the topology changes
        self.groups_cache: dict[tuple, list[int]] = {}
        self.nodeset_cache: dict[int, frozenset[int]] = {}
        self.fgroups: dict[int, list[int]] = {}
        self.island_cache: dict[int, bool] = {}
        self.totals_cache: dict[int, tuple[list[int], dict[int, int]]] = {}
        self.release_cache: dict[int, tuple[int, list[float]]] = {}  # node -> (version, releases)
        self.release_index = ReleaseIndex()  # single-node reservations (releases.py)
        self.reference = False  # the reference pass's book: planning walks, no index reads (note 059)
        self.max_node_cache: dict[tuple, int] = {}
        self.misfit_cache: dict[tuple, str | None] = {}
        self.cap_cache: dict[tuple, bool] = {}
        self.cohort_cache: dict[tuple, tuple | None] = {}
        self.sig_ids: dict[tuple, int] = {}
        self.fkey_ids: dict[tuple, int] = {}
        self.uniform: int | None = None
        self.pending_shares = 0
        # MIG re-partitioning and GPU usage samples (notes 007, 009)
        self.mig_plans: dict[tuple[int, int], tuple[tuple[int, str], ...]] = {}
        self.tracks: dict[str, UsageTrack] = {}
        self.idle_timers: list[tuple[float, int, int, str, float]] = []
        self.mem_stops: list[Job] = []
        self.any_unmanaged = False
        #: something other than a submission changed since the last pass
        self.dirty = True
        #: the last pass changed what it decided earlier on (it began a preemption, or a
        #: borrower started after a reclaimer found no victims): another pass at once
        self.repass = False

    # ------------------------------------------------------------- look-ups
    def order_key(self, job: Job) -> tuple:
        """``job``'s queue key ``(tier, -score, submit s, id)`` (``priority.order_key``); a
        job already queued keeps its aged tier (note 053) through ``prev``."""
        return priority.order_key(self, job.spec, job.cls, job.estimate_s, prev=job.key[0] if job.key else None)

    def groups_of(self, ckey: tuple) -> list[int]:
        """Shape groups of the ledger whose nodes pass the filter ``ckey``."""
        found = self.groups_cache.get(ckey)
        if found is None:
            found = self.groups_cache[ckey] = [g.gid for g in self.ledger.groups if node_ok(g.node, ckey)]
        return found

    def groups_for(self, job: Job) -> list[int]:
        """Shape groups whose nodes the job may use (``filters.node_ok``), cached by the
        job's filter id (hashing the filter itself costs more than the look-up)."""
        found = self.fgroups.get(job.fkey)
        if found is None:
            found = self.fgroups[job.fkey] = self.groups_of(job.shape.ckey)
        return found

    def nodes_for(self, job: Job) -> frozenset[int]:
        """Indices of the live nodes the job may use."""
        found = self.nodeset_cache.get(job.fkey)
        if found is None:
            found = self.nodeset_cache[job.fkey] = frozenset(members_of(self.ledger, self.groups_for(job)))
        return found

    def on_islands(self, job: Job) -> bool:
        """Whether some node the job may use has NVLink islands (placement prefers one)."""
        found = self.island_cache.get(job.fkey)
        if found is None:
            ledger = self.ledger
            found = self.island_cache[job.fkey] = any(ledger.groups[g].node.nvlink_islands
                                                      for g in self.groups_for(job))
        return found

    def filter_id(self, shape) -> int:
        """A small int for a job's filter and layout (the memos and caches key on it)."""
        fk = (shape.ckey, shape.mode, shape.per_pod if shape.mode == "pods" else 0, shape.share, shape.island)
        return self.fkey_ids.setdefault(fk, len(self.fkey_ids))

    def groups_changed(self) -> None:
        """Nodes were added: every filter's groups are looked up again."""
        self.groups_cache.clear()
        self.fgroups.clear()
        self.island_cache.clear()

    def nodes_and_totals(self, job: Job) -> tuple[list[int], dict[int, int]]:
        """The live nodes a job may take a reservation on (ascending; not those it avoids
        now) and each one's GPUs in service (cached per filter until the topology
        changes, when it avoids none)."""
        avoided = self.avoided_nodes(job)
        found = None if avoided else self.totals_cache.get(job.fkey)
        if found is None:
            ledger = self.ledger
            nodes = [i for i in members_of(ledger, self.groups_for(job)) if i not in avoided]
            found = (nodes, {i: ledger.slots[i].healthy for i in nodes})
            if not avoided:
                self.totals_cache[job.fkey] = found
        return found

    def avoided_nodes(self, job: Job, node_classes: list[dict[str, int]] | None = None) -> frozenset[int]:
        """Nodes the job may not start on now: a job of a class it avoids holds GPUs
        there (``classes.X.avoid_nodes_with``, symmetric)."""
        avoid = job.cls.avoid
        if not avoid or not self.anti:
            return frozenset()
        table = self.node_classes if node_classes is None else node_classes
        return frozenset(i for i, on in enumerate(table) if on and not avoid.isdisjoint(on))

    def avoidance_end(self, job: Job, avoided: frozenset[int]) -> float:
        """When the last running job of a class ``job`` avoids (``avoid_nodes_with``) on
        the nodes ``avoided`` is planned to end (seconds; ``INF`` when one has no end):
        from then on the job may use them."""
        avoid = job.cls.avoid
        end = self.now
        for other in self.running.values():
            if other.cls.name in avoid and any(idx in avoided for idx, _m in other.alloc):
                end = max(end, other.end_est)
        return end

    def cohort_of(self, team: str, pools, gpu_type: str | None = None):
        key = (team, pools, gpu_type)
        if key not in self.cohort_cache:
            self.cohort_cache[key] = self.rules.cohort_of(team, pools, gpu_type) if self.rules.cohorts else None
        return self.cohort_cache[key]

    def uniform_nodes(self) -> int:
        """The GPU count of every live node when all have the same, else 0."""
        if self.uniform is None:
            sizes = {s.total for s in self.ledger.slots if s.alive}
            self.uniform = sizes.pop() if len(sizes) == 1 else 0
        return self.uniform

    def lower_gpus(self, idx: int, prio: int, victims_only: bool) -> int:
        """GPUs on node ``idx`` held by RUNNING jobs of a class priority below ``prio``
        (``victims_only``: only evictable ones, minimum runtime aside)."""
        table = self.lower_vic if victims_only else self.lower_all
        return table[idx][self.prio_pos[prio]] if idx < len(table) else 0

    def reservations(self) -> dict[str, int]:
        """Units each class's ``reserved_gpus`` keep from the others, over every node
        the ledger knows (``ClassRules.reserved_within``; note 069)."""
        nodes = [s.node for s in self.ledger.slots]
        kept = {c.name: c.reserved_within(nodes) * GPU_UNITS for c in self.rules.classes.values()}
        return {name: units for name, units in kept.items() if units}

    def topology_changed(self) -> None:
        self.reserved = self.reservations()  # an added node may widen a class's reach
        self.uniform = None
        self.nodeset_cache.clear()
        self.totals_cache.clear()
        self.cap_cache.clear()
        self.dirty = True

    def holds_reserved_class(self) -> bool:
        return bool(self.reserved)

    def coverage_for(self, job: Job, units: int) -> int:
        """Units of a run of ``units`` starting now that its class's ``reserved_gpus``
        would cover (0 for a class without a reservation)."""
        res = self.reserved.get(job.cls.name)
        if not res:
            return 0
        return max(0, min(units, res - self.covered_units.get(job.cls.name, 0)))

    def charges_with(self, job: Job, units: int, covered: int) -> tuple:
        """The job's quota charges for a run of ``units`` with ``covered`` of them in its
        class's reservation (limits compiled from cohorts do not count the covered part)."""
        if units == job.units and not covered:
            return job.charges
        limits = self.quota.limits
        out = []
        for i, user, amount in job.charges:
            if limits[i].unit is LimitUnit.GPUS:  # job-count limits charge 1 whatever the size
                amount = units
                if covered and limits[i].covers_reserved:
                    amount -= covered
            out.append((i, user, amount))
        return tuple(out)

    # ---------------------------------------------------------- transitions
    def log(self, job: Job, old: JobState | str, new: JobState, reason: str) -> None:
        old_s = old.value if isinstance(old, JobState) else old
        job.history.append(Transition(self.now, old_s, new.value, reason, self.event_no))

    def enqueue(self, job: Job) -> None:
        """Put a job in its sub-queue (signature: shape, class, charges, estimate band,
        strict FIFO queue). A preemptor queued again (a node added, its spec amended) is
        signed at rest, then bound again to the GPU type it planned on, as a restore binds
        it (notes 038, 071)."""
        job.pend_est = job.planned_run()
        held = typed.bound_type(job) if job.id in self.preemptors else None
        typed.rest(job)  # per-GPU-type quotas: a pending job at rest is bound to its base (note 038)
        shape = job.shape
        # failures are monotone in the GPU count within one filter and layout (and pod
        # size), so the memo key leaves the count out
        job.fkey = self.filter_id(shape)
        job.strict_q = self.rules.strict_queue(job.spec.team, job.cls.name)
        sig = (shape, job.cls.name, job.charges, estimate_band(None if job.pend_est == INF else job.pend_est),
               job.strict_q, tuple((v.charges, v.cohort) for v in job.variants))
        job.sig = self.sig_ids.setdefault(sig, len(self.sig_ids))
        typed.bind_type(job, held)
        self.queue.add(job)
        if job.share is not None:
            self.pending_shares += 1
        job.state = JobState.PENDING
        job.reason = PendingReason(ReasonCode.NEW)
        job.reason_pass = -1

    def dequeue(self, job: Job) -> None:
        self.preemptors.pop(job.id, None)
        self.queue.remove(job)
        if job.share is not None:
            self.pending_shares -= 1

    def occupy(self, job: Job, alloc: list[tuple[int, int]], started: float, state: JobState,
               units: int | None = None, covered: int | None = None, start_no: int | None = None) -> None:
        """Give ``job`` the GPUs of ``alloc`` since ``started`` and book what follows from
        holding them: its charges (``units`` for a memory share: by its card; ``covered``
        of them in its class's ``reserved_gpus``, else what is left of it), usage, its
        planned end, its time-limit timer and the running indexes. Shared by start, adopt
        and restore (which gives the run's own ``start_no``)."""
        for idx, mask in alloc:
            self.ledger.allocate(job.id, idx, mask)
        if job.variants and alloc:
            typed.at_node(self, job, alloc[0][0])  # charged against the GPU type it is placed on (note 038)
        job.run_units = job.units if units is None else units
        job.covered = self.coverage_for(job, job.run_units) if covered is None else covered
        job.run_charges = self.charges_with(job, job.run_units, job.covered)
        self.quota.charge(job.run_charges, +1)
        if start_no is None:
            self.start_seq += 1
            start_no = self.start_seq
        else:
            self.start_seq = max(self.start_seq, start_no)
        job.start_no = start_no
        if self.anti:
            for idx, _mask in alloc:
                while idx >= len(self.node_classes):
                    self.node_classes.append({})
                on = self.node_classes[idx]
                on[job.cls.name] = on.get(job.cls.name, 0) + 1
        job.alloc = alloc
        job.state = state
        job.run_start = started
        job.vkey = victim_order_key(job)
        self.running[job.id] = job
        self.usage.hold(priority.usage_keys(job.spec), self.now, job.run_units)
        name = job.cls.name
        self.class_units[name] = self.class_units.get(name, 0) + job.run_units
        if name in self.reserved:
            self.class_jobs.setdefault(name, {})[job.id] = job
            if job.covered:
                self.covered_units[name] = self.covered_units.get(name, 0) + job.covered
        if state is JobState.RUNNING:
            self.ends_add(job, started + job.planned_run())
            limit = job.run_limit()
            if limit is not None:
                heapq.heappush(self.timers, (started + limit, job.seq, job.runs, job.id))
            self.count_running(job, +1)
        else:  # signalled before a restart: it leaves at the end of its grace period
            self.ends_add(job, (job.signal_t if job.signal_t is not None else self.now) + job.stop_grace)

    def launch(self, job: Job, alloc: list[tuple[int, int]], placement: Placement, out: list[Decision],
               units: int | None = None, dequeue: bool = True, covered: int | None = None) -> None:
        """PENDING -> RUNNING on ``placement`` now (a ``Start`` decision). A pass that
        walks the queue's lists passes ``dequeue=False`` and dequeues when it is done."""
        job.runs += 1
        job.stop_reason, job.preempted_by = "", ""
        if job.first_start is None:
            job.first_start = self.now
        self.clear_victims(job)
        if dequeue:
            self.dequeue(job)
        self.occupy(job, alloc, self.now, JobState.RUNNING, units, covered)
        self.log(job, JobState.PENDING, JobState.RUNNING, f"placed on {placement}")
        out.append(Start(self.now, job.id, placement))
        self.check_deadline(job, "start")

    def release(self, job: Job) -> None:
        """Take back every GPU and charge the job holds."""
        if job.state is JobState.RUNNING:
            self.count_running(job, -1)
        ledger = self.ledger
        for idx, mask in job.alloc:
            ledger.release(job.id, idx, mask)
            if self.anti:
                on = self.node_classes[idx]
                on[job.cls.name] -= 1
                if not on[job.cls.name]:
                    del on[job.cls.name]
            if job.share_at:
                if len(job.share_at) == 1:
                    ledger.release_share(job.id, idx, job.share_at[0])
                else:
                    ledger.release_mig(job.id, idx, *job.share_at)
        job.alloc = []
        job.share_at = ()
        self.quota.charge(job.run_charges, -1)
        self.usage.hold(priority.usage_keys(job.spec), self.now, -job.run_units)
        self.ends_remove(job)
        del self.running[job.id]
        name = job.cls.name
        left = self.class_units[name] - job.run_units
        if left:
            self.class_units[name] = left
        else:
            del self.class_units[name]
        if name in self.reserved:
            self._set_covered(job, 0, charge=False)
            del self.class_jobs[name][job.id]
            self.pass_on_coverage(name)
        job.run_charges = ()
        self.dirty = True

    def pass_on_coverage(self, name: str) -> None:
        """What class ``name``'s ``reserved_gpus`` cover no more (a covered run ended)
        goes to its running jobs not fully covered, earliest started first: charges only
        ever shrink (note 015, section 6)."""
        left = self.reserved[name] - self.covered_units.get(name, 0)
        if left <= 0:
            return
        for job in sorted(self.class_jobs.get(name, {}).values(), key=lambda j: (j.run_start, j.start_no)):
            more = min(job.run_units - job.covered, left)
            if more > 0:
                self._set_covered(job, job.covered + more)
                left -= more
                if not left:
                    break

    def _set_covered(self, job: Job, covered: int, charge: bool = True) -> None:
        name = job.cls.name
        if charge:
            self.quota.charge(job.run_charges, -1)
        total = self.covered_units.get(name, 0) - job.covered + covered
        if total:
            self.covered_units[name] = total
        else:
            self.covered_units.pop(name, None)
        job.covered = covered
        if charge:
            job.run_charges = self.charges_with(job, job.run_units, covered)
            self.quota.charge(job.run_charges, +1)
            self.ends_by_key.recharged((job.end_est, job.seq, job.id), job.run_charges)

    def count_running(self, job: Job, sign: int) -> None:
        """The indexes of RUNNING jobs by class priority: counts of all, the evictable
        ones themselves (whole-GPU jobs and shares but MIG instances, note 042), and per
        node the whole GPUs of lower classes."""
        p = job.cls.priority
        left = self.running_prio.get(p, 0) + sign
        if left:
            self.running_prio[p] = left
        else:
            del self.running_prio[p]
        victim = job.evictable and share_victim(job)  # a MIG instance is no victim (note 042)
        if victim:
            if sign > 0:
                self.evictable.setdefault(p, {})[job.id] = job
            else:
                table = self.evictable[p]
                del table[job.id]
                if not table:
                    del self.evictable[p]
        first = self.prio_pos[p] + 1  # thresholds above this class
        n = len(self.prios)
        for idx, mask in job.alloc:
            while idx >= len(self.lower_all):
                self.lower_all.append([0] * n)
                self.lower_vic.append([0] * n)
            g = sign * mask.bit_count()
            row = self.lower_all[idx]
            for j in range(first, n):
                row[j] += g
            if victim:
                row = self.lower_vic[idx]
                for j in range(first, n):
                    row[j] += g

    def ends_add(self, job: Job, end: float) -> None:
        """Record ``job``'s planned end (seconds) in ``ends`` and ``ends_by_key`` (note 046)."""
        job.end_est = end
        insort(self.ends, (end, job.seq, job.id))
        self.ends_by_key.add((end, job.seq, job.id), job.run_charges)

    def ends_remove(self, job: Job) -> None:
        """Take ``job``'s planned end out of ``ends`` and ``ends_by_key``."""
        i = bisect_left(self.ends, (job.end_est, job.seq, job.id))
        assert self.ends[i][1] == job.seq, f"{job.id} missing from the end list"
        self.ends_by_key.remove(self.ends[i])
        del self.ends[i]

    def signal(self, job: Job, state: JobState, grace: float) -> None:
        """RUNNING -> PREEMPTING or STOPPING: it keeps its GPUs until it exits, at the
        latest ``grace`` seconds from now."""
        self.count_running(job, -1)
        self.ends_remove(job)
        for idx, _mask in job.alloc:  # no longer a victim candidate; its planned end moved
            self.ledger.touch(idx)
        job.state = state
        job.signal_t = self.now
        self.ends_add(job, self.now + grace)
        self.dirty = True

    def end(self, job: Job, state: JobState, reason: str) -> None:
        old = job.state
        self.release(job)
        self.detach_from_preemptor(job)  # a victim that ended inside its grace is no longer awaited
        self.clear_victims(job)
        job.state = state
        self.log(job, old, state, reason)

    def requeue(self, job: Job, reason: str) -> None:
        """Back to the queue - unless it has used all of its time limit (its banked
        work reached it): then it ends TIMEOUT (a run of zero seconds is no run)."""
        old = job.state
        self.release(job)
        job.signal_t = None
        job.preemptor = None
        if job.run_limit() is not None and job.run_limit() <= 0:
            self.clear_victims(job)
            job.state = JobState.TIMEOUT
            self.log(job, old, JobState.TIMEOUT, f"{reason}; no time left of its time limit")
            return
        self.log(job, old, JobState.PENDING, reason)
        self.enqueue(job)

    def detach_from_preemptor(self, victim: Job) -> None:
        if victim.preemptor is not None:
            p = self.jobs.get(victim.preemptor)
            if p is not None:
                p.victims.discard(victim.id)
            victim.preemptor = None

    def clear_victims(self, job: Job) -> None:
        """Forget a job's preemption: its victims no longer exit for it; its hold is gone."""
        for vid in sorted(job.victims):
            v = self.jobs[vid]
            if v.preemptor == job.id:
                v.preemptor = None
        job.victims = set()
        job.plan = []
        job.hold_gpus = {}
        job.reclaim = False
        self.preemptors.pop(job.id, None)

    def preempt(self, victim: Job, preemptor: Job | None, out: list[Decision], reason: str = "") -> None:
        """RUNNING -> PREEMPTING for ``preemptor`` (or for ``reason``): a ``Preempt``
        decision with the victim's grace period."""
        grace = victim.stop_grace
        self.signal(victim, JobState.PREEMPTING, grace)
        victim.preemptor = preemptor.id if preemptor is not None else None
        why = f"preempted for {preemptor.id}" if preemptor is not None else f"stopped: {reason}"
        self.log(victim, JobState.RUNNING, JobState.PREEMPTING, f"{why} (grace {grace:g} s)")
        victim.stop_reason = reason or f"priority:{preemptor.cls.name}"
        victim.preempted_by = preemptor.id if preemptor is not None else ""
        out.append(Preempt(self.now, victim.id, grace_s=grace, reason=victim.stop_reason,
                           preemptor=victim.preempted_by))

    def stop(self, job: Job, reason: str, grace: float, why: str, out: list[Decision]) -> None:
        """RUNNING -> STOPPING for ``reason``: the job keeps its GPUs through ``grace``."""
        self.signal(job, JobState.STOPPING, grace)
        job.stop_reason = reason
        self.log(job, JobState.RUNNING, JobState.STOPPING, why)
        out.append(Stop(self.now, job.id, reason=reason, grace_s=grace))

    def lose(self, job: Job, reason: str, out: list[Decision]) -> None:
        """The job's current run is lost (node lost, GPU failed): no chance to
        checkpoint, it restarts from what it banked before this run."""
        if not job.checkpointable:
            job.done_s = 0.0
        self.detach_from_preemptor(job)
        self.requeue(job, reason)
        out.append(Stop(self.now, job.id, reason=reason, requeue=True))

    def check_deadline(self, job: Job, stage: str) -> None:
        """Flag a job that cannot end by its deadline even if it runs from now on
        without a break (by its remaining estimate, else its time limit)."""
        deadline = job.spec.deadline
        if deadline is None:
            return
        rem = job.remaining_estimate()
        if rem is None:
            rem = job.run_limit()
        if rem is None:
            return
        end = self.now + rem
        if end > deadline:
            job.deadline_flags.append((self.now, stage, end))
            self.log(job, job.state, job.state, f"deadline at risk ({stage}): ends at {time_text(end)} at the "
                     f"earliest, deadline {time_text(deadline)}")

    def alloc_names(self, job: Job) -> list[list]:
        return [[self.ledger.slots[i].node.name, list(bits(m))] for i, m in job.alloc]
