"""Events: what each event does to the book before the pass (architecture section 1).

Submissions, exits, cancels, operator requeues and updates (``core/amend.py``), adoptions, nodes and GPUs that come and
go, MIG re-partitions and GPU usage samples. Each handler changes the book through its
transitions only; none takes a scheduling decision (the cycle does, after the events of
the instant).
"""

from __future__ import annotations

import heapq

from gpushepherd.core import amend, typed
from gpushepherd.core.filters import (describe, inventory_misfit as _misfit, job_filter, node_ok, share_fits_card,
                                     whole_gpus)
from gpushepherd.core.intake import SpecError, make_job, shape_for, units_of
from gpushepherd.core.placement import place_counts
from gpushepherd.core.state import Job
from gpushepherd.core.usage import SHARED_MEMORY_KINDS, UsageTrack, declared_mib
from gpushepherd.model.cluster import Node
from gpushepherd.model.decisions import Decision, Reject, Stop
from gpushepherd.model.events import (
    Event,
    GpuHealthChanged,
    GpuUnmanaged,
    JobAdopted,
    JobCancelled,
    JobFinished,
    JobRequeueRequested,
    JobSubmitted,
    JobUpdated,
    MigReconfigured,
    NodeAdded,
    NodeLost,
    Tick,
    UsageSample,
)
from gpushepherd.model.job import ExitStatus, JobSpec, JobState
from gpushepherd.model.mig import MigError, MigInstance, validate_layout
from gpushepherd.model.reasons import PendingReason, ReasonCode


def apply(book, e: Event, out: list[Decision], new: list[Job]) -> None:
    """Apply one event; a submitted job is appended to ``new``."""
    if isinstance(e, JobSubmitted):
        job = submit(book, e.spec, out)
        if job is not None:
            new.append(job)
    elif isinstance(e, JobFinished):
        finished(book, e)
    elif isinstance(e, JobCancelled):
        cancel(book, e.job_id, out)
    elif isinstance(e, JobRequeueRequested):
        operator_requeue(book, e.job_id, out)
    elif isinstance(e, NodeAdded):
        node_added(book, e.node)
    elif isinstance(e, NodeLost):
        node_lost(book, e.node, out)
    elif isinstance(e, GpuHealthChanged):
        gpu_health(book, e, out)
    elif isinstance(e, JobAdopted):
        adopt(book, e)
    elif isinstance(e, MigReconfigured):
        mig_reconfigured(book, e)
    elif isinstance(e, UsageSample):
        sample(book, e)
    elif isinstance(e, GpuUnmanaged):
        gpu_unmanaged(book, e)
    elif isinstance(e, JobUpdated):
        amend.apply(book, e)
    elif isinstance(e, Tick):
        pass
    else:  # pragma: no cover
        raise TypeError(f"unknown event {e!r}")


def inventory_misfit(book, job: Job) -> str | None:
    """Why no node the scheduler knows (lost ones included, all idle and healthy) could
    ever hold ``job``; ``None`` when one could. Quota limits are not looked at (a policy
    can change; the job then waits with ``ExceedsCapacity``)."""
    return spec_misfit(book, job.cls, job.spec, job.shape)


def spec_misfit(book, cls, spec: JobSpec, shape=None) -> str | None:
    """``inventory_misfit`` of a spec not submitted (a job kept from the core, an array's
    tasks): its shape is computed as a submission would (``shape``: the one it has).
    Reads the book, changes only its caches."""
    if shape is None:
        shape = shape_for(book, spec, job_filter(cls, spec))
    key = (shape, cls.name, spec.gpus, spec.same_node, spec.gpus_per_pod)
    if key in book.misfit_cache:
        return book.misfit_cache[key]
    ledger = book.ledger
    misfit = _misfit([s.node for s in ledger.slots], cls, spec, shape.ckey, book.rules.mig_reconfigure)
    if misfit is None and shape.mode in ("multi", "pods"):
        cand = [s.idx for s in ledger.slots if node_ok(s.node, shape.ckey)]
        totals = {i: whole_gpus(ledger.slots[i].node) for i in cand}
        if place_counts(dict(totals), cand, totals, shape) is None:
            misfit = f"{describe(cls, spec)}: the gang cannot be laid out on the nodes it may use"
    book.misfit_cache[key] = misfit
    return misfit


def submit(book, spec: JobSpec, out: list[Decision]) -> Job | None:
    job = make_job(book, spec)
    book.jobs[spec.id] = job
    book.log(job, "", JobState.PENDING, "submitted")
    misfit = inventory_misfit(book, job)
    if misfit is not None:
        job.state = JobState.REJECTED
        job.reason = PendingReason(ReasonCode.EXCEEDS_CAPACITY, misfit)
        book.log(job, JobState.PENDING, JobState.REJECTED, f"rejected: {misfit}")
        out.append(Reject(book.now, job.id, misfit))
        return None
    book.check_deadline(job, "submit")
    book.enqueue(job)
    return job


def adopt(book, e: JobAdopted) -> None:
    """A job found running (a re-attach, a scenario's initial allocation): RUNNING on
    its placement since ``started_at``. Raises ``SpecError`` for GPUs that are not free."""
    spec = e.spec
    if spec.share is not None:
        _adopt_share(book, e)
        return
    if e.placement is None or e.placement.gpu_count != spec.gpus:
        raise SpecError(f"job {spec.id!r}: placement: {e.placement} is not allowed: exactly {spec.gpus} GPUs")
    job = make_job(book, spec)
    ledger = book.ledger
    alloc = []
    for name, gpus in e.placement.parts:
        idx = ledger.by_name.get(name)
        if idx is None or not ledger.slots[idx].alive:
            raise SpecError(f"job {spec.id!r}: placement: node {name!r} is not allowed: a live node")
        mask = 0
        for g in gpus:
            mask |= 1 << g
        if mask & ~ledger.slots[idx].free_mask:
            raise SpecError(f"job {spec.id!r}: placement: GPUs {gpus} of {name} are not allowed: free GPUs")
        alloc.append((idx, mask))
    book.jobs[spec.id] = job
    job.runs = 1
    book.occupy(job, alloc, e.started_at if e.started_at is not None else book.now, JobState.RUNNING)
    job.first_start = job.run_start
    book.log(job, "", JobState.RUNNING, f"adopted on {e.placement}")
    book.dirty = True


def _adopt_share(book, e: JobAdopted) -> None:
    """Adopt a running share: a card share on the placement's one GPU, or the free
    instance of its MIG profile with the lowest start on that GPU."""
    spec = e.spec
    where = f"job {spec.id!r}: placement: {e.placement}"
    if e.placement is None or len(e.placement.parts) != 1 or len(e.placement.parts[0][1]) != 1:
        raise SpecError(f"{where} is not allowed: one GPU of one node for a share")
    name, (gpu,) = e.placement.parts[0]
    ledger = book.ledger
    idx = ledger.by_name.get(name)
    if idx is None or not ledger.slots[idx].alive or not 0 <= gpu < ledger.slots[idx].total:
        raise SpecError(f"{where} is not allowed: a GPU of a live node")
    job = make_job(book, spec)
    node = ledger.slots[idx].node
    if not node.supports(spec.share.kind) or not share_fits_card(node, spec.share):
        raise SpecError(f"{where} is not allowed: node {name} does not offer a {spec.share} share")
    try:
        if spec.share.kind == "mig":
            card = ledger.slots[idx].migs.get(gpu)
            pos = card.free_of(spec.share.profile) if card is not None else None
            if pos is None:
                raise ValueError(f"no free {spec.share.profile} instance on GPU {gpu} of {name}")
            ledger.allocate_mig(spec.id, idx, gpu, pos)
            job.share_at = (gpu, pos)
        else:
            ledger.allocate_share(spec.id, idx, gpu, spec.share.kind, spec.share.need(node))
            job.share_at = (gpu,)
    except ValueError as exc:
        raise SpecError(f"{where} is not allowed: {exc}") from None
    book.jobs[spec.id] = job
    job.runs = 1
    units = units_of(book, spec, job.shape.ckey, node)
    book.occupy(job, [(idx, 0)], e.started_at if e.started_at is not None else book.now, JobState.RUNNING, units)
    job.first_start = job.run_start
    book.log(job, "", JobState.RUNNING, f"adopted on {e.placement}[{spec.share}]")
    book.dirty = True


def finished(book, e: JobFinished) -> None:
    job = book.jobs.get(e.job_id)
    if job is None or not job.state.holds_gpus:
        return  # a stale or repeated exit: usage is never released twice
    state, status = job.state, e.status
    # a stopped job (time limit, idle, memory overrun) ends as its stop says, whatever its
    # exit: one that catches the signal and exits 0 is TIMEOUT, as in Slurm
    if status is ExitStatus.COMPLETED and state is not JobState.STOPPING:
        if book.predictor is not None:
            ran = (job.done_s if job.checkpointable else 0.0) + book.now - job.run_start
            book.predictor.observe(job.spec.team, job.spec.user, job.time_limit_s, ran)
        book.end(job, JobState.COMPLETED, "exit 0")
    elif state is JobState.PREEMPTING or status is ExitStatus.PREEMPTED:
        ran = (job.signal_t if job.signal_t is not None else book.now) - job.run_start
        job.done_s = job.done_s + ran if job.checkpointable else 0.0
        if state is JobState.PREEMPTING:
            job.preemptions += 1
        book.detach_from_preemptor(job)
        book.requeue(job, "preempted" if state is JobState.PREEMPTING else "checkpointed, asked to requeue")
    elif state is JobState.STOPPING and job.stop_reason == "memory-overrun":
        book.end(job, JobState.FAILED, "stopped: GPU memory over its declaration")
    elif state is JobState.STOPPING and job.stop_reason == "idle":
        book.end(job, JobState.TIMEOUT, "stopped: idle")
    elif state is JobState.STOPPING or status is ExitStatus.TIMEOUT:
        book.end(job, JobState.TIMEOUT, "time limit")
    elif status is ExitStatus.CANCELLED:
        book.end(job, JobState.CANCELLED, "cancelled")
    else:
        book.end(job, JobState.FAILED, f"exit {status.value.lower()}")


def cancel(book, job_id: str, out: list[Decision]) -> None:
    job = book.jobs.get(job_id)
    if job is None or job.state.terminal:
        return
    if job.state is JobState.PENDING:
        book.dequeue(job)
        book.clear_victims(job)
        book.log(job, job.state, JobState.CANCELLED, "cancelled")
        job.state = JobState.CANCELLED
        book.dirty = True  # it may have held a reservation
        return
    book.detach_from_preemptor(job)
    book.end(job, JobState.CANCELLED, "cancelled")
    out.append(Stop(book.now, job.id, reason="cancelled", grace_s=0.0))


def operator_requeue(book, job_id: str, out: list[Decision]) -> None:
    job = book.jobs.get(job_id)
    if job is None or job.state is not JobState.RUNNING:
        return  # requeue of a job that is not running is a no-op (Slurm ticket 24379)
    if job.checkpointable:
        job.done_s += book.now - job.run_start
    else:
        job.done_s = 0.0
    book.requeue(job, "operator requeue")
    out.append(Stop(book.now, job.id, reason="requeue", requeue=True))


def validate_hardware(book, e: Event) -> None:
    """Refuse a hardware event before anything of its instant is applied: a GPU that does
    not exist, a node whose MIG layouts are not valid NVIDIA layouts, a reconfiguration
    to an invalid layout.

    Raises:
        ValueError: naming the node, GPU and what is allowed.
    """
    ledger = book.ledger
    if isinstance(e, NodeAdded) and e.node is not None:
        node = e.node
        seen: set[int] = set()
        for g, layout in node.mig:
            if not isinstance(g, int) or not 0 <= g < node.gpus or g in seen:
                raise ValueError(f"node {node.name}: mig: GPU {g!r} is not allowed: distinct indices "
                                 f"0..{node.gpus - 1}")
            seen.add(g)
            try:
                validate_layout(node.gpu_type, layout)
            except MigError as exc:
                raise ValueError(f"node {node.name}: mig: GPU {g}: {exc}") from None
            if not layout:
                raise ValueError(f"node {node.name}: mig: GPU {g}: an empty layout is not allowed")
    elif isinstance(e, GpuHealthChanged):
        idx = ledger.by_name.get(e.node)
        if idx is None or not 0 <= e.gpu < ledger.slots[idx].total:
            raise ValueError(f"gpu health event for unknown GPU {e.node}:{e.gpu}")
    elif isinstance(e, GpuUnmanaged):
        idx = ledger.by_name.get(e.node)
        if idx is None:
            raise ValueError(f"unmanaged-GPU report: node: {e.node!r} is not allowed: a node the scheduler knows")
        total = ledger.slots[idx].total
        if isinstance(e.gpu, bool) or not isinstance(e.gpu, int) or not 0 <= e.gpu < total:
            raise ValueError(f"unmanaged-GPU report for {e.node}: gpu: {e.gpu!r} is not allowed: an index "
                             f"0..{total - 1}")
    elif isinstance(e, MigReconfigured):
        idx = ledger.by_name.get(e.node)
        if idx is not None and (idx, e.gpu) in book.mig_plans:
            try:
                validate_layout(ledger.slots[idx].node.gpu_type,
                                tuple(MigInstance(start, prof) for start, prof in e.layout))
            except (MigError, TypeError, ValueError) as exc:
                raise ValueError(f"MIG reconfiguration of {e.node}:{e.gpu}: {exc}") from None


def node_added(book, node: Node | None) -> None:
    if node is None:
        return
    book.ledger.add_node(node)
    book.misfit_cache.clear()
    book.groups_changed()
    book.topology_changed()
    book.max_node_cache.clear()
    # every job's layout, units and charges - those of a running job once it is requeued -
    # are what a job submitted now gets, as a restored core derives them (seeds 183569: a
    # 3-GPU job came back "multi"; 148721: a memory share was charged by the smaller card)
    for job in list(book.running.values()):
        typed.retype(book, job, shape_for, units_of)
    for job in list(book.queue):
        book.queue.remove(job)
        if job.share is not None:
            book.pending_shares -= 1
        typed.retype(book, job, shape_for, units_of)
        book.enqueue(job)


def node_lost(book, name: str, out: list[Decision]) -> None:
    idx = book.ledger.by_name.get(name)
    if idx is None or not book.ledger.slots[idx].alive:
        return
    for job_id in book.ledger.remove_node(idx):
        book.lose(book.jobs[job_id], "node-lost", out)
    for key in [k for k in book.mig_plans if k[0] == idx]:
        del book.mig_plans[key]  # the node comes back (if it does) as it is then
    book.topology_changed()


def gpu_health(book, e: GpuHealthChanged, out: list[Decision]) -> None:
    idx = book.ledger.by_name[e.node]
    holders = book.ledger.set_gpu_health(idx, e.gpu, e.healthy)
    if not e.healthy:
        for holder in holders:
            book.lose(book.jobs[holder], "gpu-failed", out)
    book.topology_changed()


def gpu_unmanaged(book, e: GpuUnmanaged) -> None:
    """A GPU runs (or no longer runs) processes the scheduler did not start: while it
    does, nothing of it is handed out; jobs holding it keep it (note 009)."""
    ledger = book.ledger
    idx = ledger.by_name[e.node]
    slot = ledger.slots[idx]
    was = slot.migs[e.gpu].unmanaged if e.gpu in slot.migs else bool(slot.unmanaged_mask >> e.gpu & 1)
    if was == e.unmanaged or not slot.alive:
        return
    for holder in ledger.set_gpu_unmanaged(idx, e.gpu, e.unmanaged):
        job = book.jobs[holder]
        book.log(job, job.state, job.state, f"GPU {e.node}:{e.gpu} " + (
            "runs processes the scheduler did not start (unmanaged); the job keeps it" if e.unmanaged
            else "no longer runs unmanaged processes"))
    book.any_unmanaged = bool(unmanaged_gpus(book))
    book.topology_changed()


def unmanaged_gpus(book) -> list[tuple[str, int]]:
    """``(node, GPU index)`` of the live GPUs reported unmanaged, by node order then index."""
    out = []
    for slot in book.ledger.slots:
        if slot.alive:
            out.extend((slot.node.name, g) for g in range(slot.total)
                       if (slot.migs[g].unmanaged if g in slot.migs else slot.unmanaged_mask >> g & 1))
    return out


def mig_reconfigured(book, e: MigReconfigured) -> None:
    """Apply a reconfiguration the core asked for; a report for a plan it does not hold
    (its node was lost since, or a repeated report) is stale and ignored."""
    ledger = book.ledger
    idx = ledger.by_name.get(e.node)
    if idx is None or (idx, e.gpu) not in book.mig_plans:
        return
    slot = ledger.slots[idx]
    layout = tuple(MigInstance(start, prof) for start, prof in e.layout)
    validate_layout(slot.node.gpu_type, layout)
    ledger.reconfigure_mig(idx, e.gpu, layout)
    book.mig_plans.pop((idx, e.gpu), None)
    book.topology_changed()


def idle_entry_live(book, entry: tuple[float, int, int, str, float]) -> bool:
    _t, _seq, run, job_id, since = entry
    job = book.jobs[job_id]
    tr = book.tracks.get(job_id)
    return (job.state is JobState.RUNNING and job.runs == run and tr is not None and tr.run == run
            and tr.idle_since == since)


def sample(book, e: UsageSample) -> None:
    """Take a usage sample (note 009): peaks, the memory flag, the idle stretch."""
    job = book.jobs.get(e.job_id)
    if job is None or not job.state.holds_gpus:
        return  # a late sample of a run that ended: nothing to say about any run
    tr = book.tracks.get(job.id)
    if tr is None:
        tr = book.tracks[job.id] = UsageTrack()
    if tr.run != job.runs:
        tr.new_run(job.runs)
    util, mem = float(e.gpu_util_pct), e.mem_used_mib
    tr.samples += 1
    tr.last_util = util
    tr.last_t = book.now
    tr.run_peak_mib = max(tr.run_peak_mib, mem)
    tr.peak_mib = max(tr.peak_mib, mem)
    declared = declared_mib(job.spec)
    if declared is not None and mem > declared and tr.over_at is None:
        tr.over_at = book.now
        tr.over_runs += 1
        shared = job.share is not None and job.share.kind in SHARED_MEMORY_KINDS
        stop = shared and job.cls.memory_overrun == "stop" and job.preemptible
        book.log(job, job.state, job.state, f"GPU memory {mem} MiB over the {declared} MiB declared"
                 + (" on a shared GPU: stopping" if stop else " (flagged)"))
        if stop and job.state is JobState.RUNNING:
            book.mem_stops.append(job)
    rule = job.cls.idle_stop
    if rule is None or not job.preemptible or job.state is not JobState.RUNNING:
        return
    if util >= rule.below_util_pct:
        tr.idle_since = None
    elif tr.idle_since is None:
        tr.idle_since = max(book.now, job.run_start + rule.setup_s)  # setup counts as activity
        heapq.heappush(book.idle_timers, (tr.idle_since + rule.after_s, job.seq, job.runs, job.id, tr.idle_since))
