"""Intake: what a job spec becomes in the core - validation, time limit, quota units,
shape - and the fixed order of the events of one instant.

Nothing here keeps state; ``make_job`` reads the book's caches and the policy.
"""

from __future__ import annotations

from dataclasses import replace

from gpushepherd.core import typed
from gpushepherd.core.filters import job_filter, needs_island, node_ok, whole_gpus
from gpushepherd.core.placement import Shape
from gpushepherd.core.state import INF, Job
from gpushepherd.model.cluster import Node
from gpushepherd.model.events import Event, JobAdopted, JobSubmitted
from gpushepherd.model.job import GPU_UNITS, MAX_NICE, SHARE_KINDS, GpuShare, JobSpec, natural_key
from gpushepherd.model.mig import MIG_MODELS, MigError, profile as mig_profile
from gpushepherd.model.rules import Rules


class SpecError(ValueError):
    """A job spec the policy cannot take; ``str()`` names the field, value and what is allowed."""


def validate_spec(rules: Rules, spec: JobSpec) -> None:
    """Check a job spec against the policy before it is submitted.

    Raises:
        SpecError: unknown class or team, non-positive GPUs, a pod size that does not
            divide the GPUs, negative times, a time limit above the class's max runtime,
            ``require_island`` on a gang of pods.
    """
    where = f"job {spec.id!r}"
    if not spec.id:
        raise SpecError("job id: '' is not allowed: a non-empty id")
    if spec.workload_class not in rules.classes:
        raise SpecError(f"{where}: class: {spec.workload_class!r} is not allowed: one of {', '.join(sorted(rules.classes))}")
    if rules.teams and spec.team not in rules.teams:
        raise SpecError(f"{where}: team: {spec.team!r} is not allowed: one of {', '.join(sorted(rules.teams))}")
    if not isinstance(spec.gpus, int) or spec.gpus < 1:
        raise SpecError(f"{where}: gpus: {spec.gpus!r} is not allowed: an integer >= 1")
    if spec.gpus_per_pod is not None and (spec.gpus_per_pod < 1 or spec.gpus % spec.gpus_per_pod):
        raise SpecError(f"{where}: gpus_per_pod: {spec.gpus_per_pod!r} is not allowed: a divisor of gpus ({spec.gpus})")
    for name in ("time_limit_s", "runtime_estimate_s"):
        value = getattr(spec, name)
        if value is not None and not value > 0:
            raise SpecError(f"{where}: {name}: {value!r} is not allowed: seconds > 0")
    if spec.gpu_mem_mib < 0:
        raise SpecError(f"{where}: gpu_mem_mib: {spec.gpu_mem_mib!r} is not allowed: MiB >= 0")
    if spec.submit_time != spec.submit_time or spec.submit_time in (INF, -INF):
        raise SpecError(f"{where}: submit_time: {spec.submit_time!r} is not allowed: a finite number of seconds")
    if spec.deadline is not None and not (spec.deadline == spec.deadline and spec.deadline > spec.submit_time
                                          and spec.deadline != INF):
        raise SpecError(f"{where}: deadline: {spec.deadline!r} is not allowed: a finite time after submit_time "
                        f"({spec.submit_time})")
    cls = rules.classes[spec.workload_class]
    _validate_share(spec, cls, where)
    if spec.require_island and spec.gpus_per_pod and spec.gpus_per_pod < spec.gpus and not spec.same_node:
        raise SpecError(f"{where}: require_island: True is not allowed with gpus_per_pod ({spec.gpus_per_pod}): a "
                        "gang of pods spans nodes, an NVLink island is inside one node (ask for same_node, or drop "
                        "gpus_per_pod)")
    if spec.preemptible and cls.name == "production-inference":
        raise SpecError(f"{where}: preemptible: True is not allowed: production inference is never preempted "
                        "(use another class for work that may be)")
    grace = spec.grace_period_s
    if grace is not None and (not isinstance(grace, (int, float)) or isinstance(grace, bool)
                              or not 0 <= grace <= cls.grace_period_s):
        raise SpecError(f"{where}: grace_period_s: {grace!r} is not allowed: seconds from 0 to the grace period of "
                        f"class {cls.name} ({cls.grace_period_s:g} s)")
    nice = spec.nice
    if isinstance(nice, bool) or not isinstance(nice, int) or abs(nice) > MAX_NICE:
        raise SpecError(f"{where}: nice: {nice!r} is not allowed: an integer from -{MAX_NICE} to {MAX_NICE}")
    if cls.max_runtime_s is not None and spec.time_limit_s is not None and spec.time_limit_s > cls.max_runtime_s:
        raise SpecError(f"{where}: time_limit_s: {spec.time_limit_s!r} is not allowed: at most the max runtime of "
                        f"class {cls.name} ({cls.max_runtime_s} s)")


#: every MIG profile name of every GPU model we know, sorted
_MIG_NAMES = sorted({name for profiles in MIG_MODELS.values() for name in profiles},
                    key=lambda n: (int(n.split("g.")[0]), n))


def _validate_share(spec: JobSpec, cls, where: str) -> None:
    share = spec.share
    if share is not None and not isinstance(share, GpuShare):
        raise SpecError(f"{where}: share: {share!r} is not allowed: a GpuShare or None")
    mode = share.kind if share is not None else "whole"
    if cls.sharing is not None and mode not in cls.sharing:
        raise SpecError(f"{where}: sharing: {mode!r} is not allowed for class {cls.name}: one of "
                        f"{', '.join(cls.sharing)}")
    if share is None:
        return
    if share.kind not in SHARE_KINDS:
        raise SpecError(f"{where}: share.kind: {share.kind!r} is not allowed: one of {', '.join(SHARE_KINDS)}")
    if spec.gpus != 1 or spec.gpus_per_pod:
        raise SpecError(f"{where}: gpus: {spec.gpus!r} is not allowed with a {share.kind} share: 1 (a share is "
                        "part of one GPU)")
    # each error names the spec's field (``share.slots``: what the API's share object and
    # a JobSpec call it), the value and what is allowed
    for name in ("milli", "mem_mib", "slots", "procs"):
        value = getattr(share, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise SpecError(f"{where}: share.{name}: {value!r} is not allowed: an integer >= 0")
    kind = share.kind
    if kind == "fraction" and not (0 < share.milli <= 1000 or (share.milli == 0 and share.mem_mib > 0)):
        raise SpecError(f"{where}: share.milli: {share.milli!r} is not allowed for a fraction share: 1 to 1000 "
                        "(thousandths of a GPU), or 0 with share.mem_mib > 0 (a memory-only share)")
    if kind in ("time_slice", "mps") and share.slots < 1:
        raise SpecError(f"{where}: share.slots: {share.slots!r} is not allowed for a {kind} share: at least 1 "
                        f"{'time-slice replica' if kind == 'time_slice' else 'MPS replica'}")
    if kind == "time_slice" and share.mem_mib < 1:
        raise SpecError(f"{where}: share.mem_mib: {share.mem_mib!r} is not allowed for a time_slice share: the GPU "
                        "memory it uses must be declared, MiB >= 1 (time-sliced jobs share memory without isolation)")
    if kind == "mps" and not 0 <= share.milli <= 1000:
        raise SpecError(f"{where}: share.milli: {share.milli!r} is not allowed for an mps share: each replica's SM "
                        "percentage x 10, 1 to 1000 (0: 100 / the node's max_clients)")
    if share.procs != 1 and (kind != "mps" or not 1 <= share.procs <= 48):
        raise SpecError(f"{where}: share.procs: {share.procs!r} is not allowed: MPS client processes, 1 to 48 "
                        "(CUDA's clients per GPU); 1 for other shares")
    if kind == "mig" and share.profile not in _MIG_NAMES:
        raise SpecError(f"{where}: share.profile: {share.profile!r} is not allowed: a MIG profile as NVIDIA names it "
                        f"(lower case), one of {', '.join(_MIG_NAMES)}")


#: within one instant's hardware and operator events: a node lost, then a node added
#: (it may come back), then GPU health (of the node as it is now), then operator actions
#: (a GPU's foreign processes after its health; usage samples of the jobs on the
#: hardware as it is then)
_SUBRANK = {"NodeLost": 0, "NodeAdded": 1, "GpuHealthChanged": 2, "GpuUnmanaged": 3, "MigReconfigured": 4,
            "UsageSample": 5, "JobAdopted": 6, "JobCancelled": 7, "JobRequeueRequested": 8,
            "JobUpdated": 9}


class _Text:
    """An event's full text as the last key of ``event_order``, worked out only when the
    keys before it tie (``repr`` of a submission cost more than the sort, note 059)."""

    __slots__ = ("e", "text")

    def __init__(self, e: Event):
        self.e, self.text = e, None

    def __str__(self) -> str:
        if self.text is None:
            self.text = repr(self.e)
        return self.text

    def __eq__(self, other) -> bool:
        return str(self) == str(other)

    def __lt__(self, other) -> bool:
        return str(self) < str(other)

    __hash__ = None


def event_order(e: Event) -> tuple:
    """A total order of the events of one instant that does not depend on the order
    they were given in (ties end on the event's full text; a GPU reported both healthy
    and unhealthy at once ends unhealthy)."""
    if isinstance(e, JobSubmitted):
        return (e.t, e.rank, 0, natural_key(e.spec.id if e.spec else ""), _Text(e))
    job = getattr(e, "job_id", "") or ""
    if isinstance(e, JobAdopted) and e.spec is not None:
        job = e.spec.id
    node = getattr(e, "node", "")
    node = node.name if isinstance(node, Node) else node
    healthy = getattr(e, "healthy", False) or not getattr(e, "unmanaged", True)
    return (e.t, e.rank, _SUBRANK.get(type(e).__name__, 9), node or "", getattr(e, "gpu", 0), natural_key(job),
            not healthy, _Text(e))


def time_limit(spec: JobSpec, cls) -> float | None:
    """Seconds a job may run: its own limit, else the class default, else the class's
    max runtime; never above the class's max runtime (``None``: no limit)."""
    limit = spec.time_limit_s or cls.default_time_limit_s or cls.max_runtime_s
    if limit is not None and cls.max_runtime_s is not None:
        limit = min(limit, cls.max_runtime_s)
    return limit


def spec_with(spec: JobSpec, **changes) -> JobSpec:
    """A copy of ``spec`` with ``changes`` (a small helper for drivers and tests)."""
    return replace(spec, **changes)


def estimate_for(book, spec: JobSpec, limit: float | None) -> float | None:
    """A job's runtime estimate in seconds under time limit ``limit``: the user's, else a
    prediction, else the limit; never above the limit (``None``: none)."""
    estimate = spec.runtime_estimate_s
    if estimate is None and book.predictor is not None:
        estimate = book.predictor.predict(spec.team, spec.user, limit)
    if estimate is None:
        estimate = limit
    if estimate is not None and limit is not None:
        estimate = min(estimate, limit)
    return estimate


def make_job(book, spec: JobSpec, keyed: bool = True) -> Job:
    """The core's record of a submitted (or adopted, or restored) job: its class, time
    limit, estimate (the user's, else a prediction, else the time limit; never above the
    limit), node filter, shape, quota charges and cohort. Not yet queued or logged.
    ``keyed=False``: its queue key is left empty - a restore sets the one its snapshot
    holds (note 062)."""
    rules = book.rules
    cls = rules.classes[spec.workload_class]
    book.last_submit = max(book.last_submit, spec.submit_time)  # also on restore
    limit = time_limit(spec, cls)
    estimate = estimate_for(book, spec, limit)
    ckey = job_filter(cls, spec)
    shape = shape_for(book, spec, ckey)
    book.seq += 1
    preemptible = cls.preemptible if spec.preemptible is None else spec.preemptible
    checkpointable = cls.checkpointable if spec.checkpointable is None else spec.checkpointable
    evictable = preemptible and not (cls.preempt_only_if_checkpointable and not checkpointable)
    units = units_of(book, spec, ckey)
    charges, cohort, base, variants = typed.of_job(book, spec, cls, ckey, shape, units, evictable, shape_for,
                                                   units_of)
    book.teams_seen.add(spec.team)
    book.users_seen.setdefault(spec.team, set()).add(spec.user)
    job = Job(
        spec=spec,
        seq=book.seq,
        cls=cls,
        key=(),
        shape=shape,
        charges=charges,
        preemptible=preemptible,
        checkpointable=checkpointable,
        estimate_s=estimate,
        time_limit_s=limit,
        cohort=cohort,
        units=units,
        variants=variants,
        base=base,
    )
    job.evictable = evictable
    grace = cls.grace_period_s if spec.grace_period_s is None else spec.grace_period_s
    job.stop_grace = float(grace) if checkpointable else 0.0
    job.fkey = book.filter_id(shape)
    if keyed:
        job.key = book.order_key(job)
    return job


def units_of(book, spec: JobSpec, ckey: tuple, node: Node | None = None) -> int:
    """GPU units (7000 per GPU) the job counts against quotas: whole GPUs x 7000; a
    fraction its milli x 7 (memory only: its memory over the memory of the card it holds,
    on ``node``, rounded up - while pending, over the largest card it may use, the least
    it can be charged); time-slicing its replicas' share of the card (the most replicas a
    node it may use offers); MPS its replicas' SM share (no SM percentage given: 1 /
    ``max_clients`` per replica of ``node`` - while pending, of the node it may use with
    the most clients, the least it can be charged; note 037); MIG its compute slices x
    1000 (a seventh of the GPU each)."""
    share = spec.share
    if share is None:
        return spec.gpus * GPU_UNITS
    nodes = [book.ledger.groups[g].node for g in book.groups_of(ckey)] or list(book.rules.nodes)
    if share.kind == "fraction":
        if share.milli:
            return share.milli * 7
        mem = node.gpu_mem_mib if node is not None and node.gpu_mem_mib else max((n.gpu_mem_mib for n in nodes),
                                                                                 default=0)
        return GPU_UNITS if not mem else max(1, min(GPU_UNITS, -(-share.mem_mib * GPU_UNITS // mem)))
    if share.kind == "time_slice":
        reps = max((n.ts_replicas for n in nodes), default=0)
        return GPU_UNITS if not reps else max(1, min(GPU_UNITS, -(-share.slots * GPU_UNITS // reps)))
    if share.kind == "mps":
        milli = share.milli
        if not milli:
            clients = node.mps_clients if node is not None else max((n.mps_clients for n in nodes), default=0)
            milli = 1000 // clients if clients else 1000
        return min(GPU_UNITS, milli * share.slots * 7)
    try:
        types = {n.gpu_type for n in nodes if n.mig}
        slices = max((mig_profile(t, share.profile).compute_slices for t in sorted(types)), default=7)
    except MigError:
        slices = 7
    return slices * 1000


def shape_for(book, spec: JobSpec, ckey: tuple) -> Shape:
    """How the job's GPUs are laid out: ``share``, ``single`` (one node; with ``island``
    inside one NVLink island), ``multi`` (larger than any node it may use: whole nodes
    plus a remainder) or ``pods``."""
    if spec.share is not None:
        return Shape(1, "share", 1, 1, ckey, spec.share)
    biggest = book.max_node_cache.get(ckey)
    if biggest is None:
        biggest = max((whole_gpus(s.node) for s in book.ledger.slots if node_ok(s.node, ckey)), default=0)
        book.max_node_cache[ckey] = biggest
    if spec.gpus_per_pod and spec.gpus_per_pod < spec.gpus and not spec.same_node:
        return Shape(spec.gpus, "pods", spec.gpus_per_pod, spec.gpus // spec.gpus_per_pod, ckey)
    if spec.gpus > 1 and needs_island(book.rules.classes[spec.workload_class], spec):
        return Shape(spec.gpus, "single", spec.gpus, 1, ckey, island=True)  # one island: one node
    if spec.one_node or spec.gpus <= biggest or biggest == 0:
        return Shape(spec.gpus, "single", spec.gpus, 1, ckey)
    return Shape(spec.gpus, "multi", spec.gpus, 1, ckey)
