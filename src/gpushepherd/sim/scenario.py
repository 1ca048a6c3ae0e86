"""Scenario files: a small cluster, a policy, jobs, events and the expected outcome.

A scenario is a YAML file run by ``shepherd scenario run FILE`` and by the tests. The
``policy`` section is an ordinary policy file (cluster included); ``jobs`` have true
durations; ``expect`` states who starts when and where, who is preempted, why a job
waits, and what each team holds over time. ``variants`` rerun the scenario with some
jobs or policy fields changed. See ``docs/scenarios.md`` for the format.
"""

from __future__ import annotations

import difflib
import re
import typing
from decimal import Decimal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from gpushepherd.core.scheduler import SpecError
from gpushepherd.model.cluster import Node
from gpushepherd.model.events import (
    Event,
    GpuHealthChanged,
    GpuUnmanaged,
    JobAdopted,
    JobCancelled,
    JobRequeueRequested,
    JobUpdated,
    NodeAdded,
    NodeLost,
    UsageSample,
)
from gpushepherd.model.job import GpuShare, JobSpec
from gpushepherd.model.placement import Placement
from gpushepherd.policy.load import Policy, PolicyError, policy_from_dict
from gpushepherd.sim.engine import Restart, SignalAnswer, SimJob, SimResult, Simulator
from gpushepherd.yamlio import YamlError, load_yaml, read_text

#: the most jobs a scenario may expand to (ranges included)
MAX_JOBS = 100_000


class ScenarioError(ValueError):
    """A scenario file that cannot be run; ``str()`` names the file, path and value."""


#: a time or amount a scenario states: a number, never inf or NaN (an expectation of
#: NaN would never fail, a submit at inf would never happen)
Finite = Annotated[float, Field(allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)


class GangSpec(_Strict):
    pods: Annotated[int, Field(ge=1)]
    gpus_per_pod: Annotated[int, Field(ge=1)]
    same_node: bool = False


class JobEntry(_Strict):
    id: str
    team: str = "default"
    user: str = ""
    workload_class: str = Field(alias="class")
    submit: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    gpus: Annotated[int, Field(ge=1)] | None = None
    gang: GangSpec | None = None
    same_node: bool = False
    #: all its GPUs inside one NVLink island (unset: its class's ``require_island``; note 037)
    require_island: bool | None = None
    duration: Annotated[float, Field(ge=0)] | Literal["unbounded"]
    time_limit: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    estimate: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    preemptible: bool | None = None
    checkpointable: bool | None = None
    gpu_types: list[str] = Field(default_factory=list)
    #: whole-GPU jobs: the least memory per GPU; shares: the GPU memory declared
    #: (a job with neither ``gpus`` nor another share field asks for memory only)
    gpu_mem_mib: Annotated[int, Field(ge=0)] = 0
    #: must be done by this time (seconds); a job that cannot make it is flagged
    deadline: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    #: part of one GPU (R10): a fraction, time-slicing replicas, MPS clients, a MIG profile
    gpu_fraction: Annotated[float, Field(gt=0, le=1)] | None = None
    ts_replicas: Annotated[int, Field(ge=1)] | None = None
    #: MPS replicas (client slots of the card's ``max_clients``) the job takes
    mps_replicas: Annotated[int, Field(ge=1)] | None = None
    #: each replica's SM percentage (a multiple of 0.1; default: 100 / the node's
    #: ``max_clients``, where it lands; note 037)
    mps_sm_percent: Annotated[float, Field(gt=0, le=100)] | None = None
    #: MPS client processes it runs on its replicas (default 1; they share its SMs)
    mps_processes: Annotated[int, Field(ge=1, le=48)] | None = None
    mig_profile: str | None = None
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[str] = Field(default_factory=list)
    min_driver: str = ""
    cache_key: str = ""
    cache_required: bool = False
    #: the grace its stops get (seconds; at most its class's, the default)
    grace_period: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    #: how it answers a preemption signal (note 026): it exits this many seconds after
    #: it, having saved its work (unset: when its grace period ends) ...
    exit_after_signal: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    #: ... or it ignores it: killed at the end of its grace period, it keeps only the
    #: work of its last periodic checkpoint
    ignores_signal: bool = False
    #: it checkpoints by itself every this many seconds of a run (what a killed run keeps)
    checkpoint_every: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None


class EventEntry(_Strict):
    t: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    type: Literal["cancel", "requeue", "update", "restart", "gpu_unhealthy", "gpu_healthy", "node_lost",
                  "node_added", "usage", "gpu_unmanaged", "gpu_managed"]
    job: str | None = None
    node: str | None = None
    gpu: Annotated[int, Field(ge=0)] | None = None
    gpus: Annotated[int, Field(ge=1, le=256)] | None = None
    gpu_type: str = "generic"
    #: ``usage``: the job's GPU utilisation (percent) and GPU memory used (MiB), sampled
    #: at ``t`` and, with ``every_s``, again every ``every_s`` seconds up to ``until``
    gpu_util_pct: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)] | None = None
    mem_used_mib: Annotated[int, Field(ge=0)] = 0
    every_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    until: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    #: ``update`` (``scontrol update``, note 039): the job's new time limit (seconds)
    #: and/or nice (score points subtracted from its priority); ``admin``: asked by an
    #: admin (may raise the limit, lower the nice)
    time_limit: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    nice: int | None = None
    admin: bool = True


class InitialAllocation(_Strict):
    job: str
    team: str = "default"
    user: str = ""
    workload_class: str = Field(alias="class", default="batch")
    node: str
    gpus: Annotated[int, Field(ge=1)] = 1
    gpu_indices: list[Annotated[int, Field(ge=0)]] | None = None
    ends: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    #: a share of GPU ``gpu``: a fraction (and/or ``gpu_mem_mib``) or a MIG profile
    gpu: Annotated[int, Field(ge=0)] | None = None
    fraction: Annotated[float, Field(gt=0, le=1)] | None = None
    gpu_mem_mib: Annotated[int, Field(ge=0)] = 0
    mig_profile: str | None = None
    preemptible: bool | None = None
    checkpointable: bool | None = None


class StartExpect(_Strict):
    t: Finite
    node: str | None = None
    nodes: list[str] | None = None
    gpus: list[int] | None = None
    gpus_total: int | None = None


class PendingExpect(_Strict):
    from_: Finite = Field(alias="from")
    to: Finite | Literal["never"]
    reason: str


class GpuUnused(_Strict):
    node: str
    gpu: Annotated[int, Field(ge=0)]
    after: Finite = 0.0


class UsageAt(_Strict):
    """Decayed usage (GPU-seconds) of a team, or of a user of a team, at ``t``."""

    t: Finite
    team: str
    user: str | None = None
    gpu_seconds: Finite
    tolerance: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.5



def _job_state(value: str) -> str:
    """A job state an expectation names (any case): one of ``JobState``'s."""
    from gpushepherd.model.job import JobState

    names = [st.value for st in JobState]
    if value.upper() not in names:
        raise ValueError(f"one of {', '.join(names)}")
    return value

class Expect(_Strict):
    starts: dict[str, StartExpect | list[StartExpect]] = Field(default_factory=dict)
    #: jobs refused at submit (state REJECTED) and a text their reason contains
    rejected: dict[str, str] = Field(default_factory=dict)
    ends: dict[str, Finite] = Field(default_factory=dict)
    preempted: dict[str, list[Finite]] = Field(default_factory=dict)
    never_preempted: list[str] = Field(default_factory=list)
    pending: dict[str, PendingExpect | list[PendingExpect]] = Field(default_factory=dict)
    never_starts: list[str] = Field(default_factory=list)
    final_state: dict[str, Annotated[str, AfterValidator(_job_state)]] = Field(default_factory=dict)
    team_usage: dict[str, list[Annotated[tuple[Finite, int], Field(strict=False)]]] = Field(default_factory=dict)
    max_team_usage: dict[str, int] = Field(default_factory=dict)
    gpu_never_used: list[GpuUnused] = Field(default_factory=list)
    usage_at: list[UsageAt] = Field(default_factory=list)


class Variant(_Strict):
    name: str
    jobs: dict[str, dict[str, Any]] = Field(default_factory=dict)
    policy: dict[str, Any] = Field(default_factory=dict)
    expect: Expect


class ScenarioSpec(_Strict):
    scenario: str
    source: str = ""
    description: str = ""
    policy: dict[str, Any]
    jobs: list[JobEntry] = Field(default_factory=list)
    events: list[EventEntry] = Field(default_factory=list)
    initial_allocations: list[InitialAllocation] = Field(default_factory=list)
    expect: Expect
    variants: list[Variant] = Field(default_factory=list)


_RANGE = re.compile(r"^(?P<prefix>[A-Za-z_\-]*)(?P<a>\d+)\.\.(?P=prefix)(?P<b>\d+)$")


def expand_ids(text: str) -> list[str]:
    """``B1..B12`` -> ``B1 .. B12``; ``F01..F20`` keeps the zero padding; else ``[text]``.

    Raises:
        ScenarioError: a ``..`` that is no valid range, an empty range, or one of more
            than ``MAX_JOBS`` ids.
    """
    if ".." not in text:
        return [text]
    m = _RANGE.match(text)
    if not m:
        raise ScenarioError(f"id {text!r} is not allowed: a plain id or a range PREFIX<a>..PREFIX<b> such as B1..B12")
    a, b = m.group("a"), m.group("b")
    if int(b) < int(a) or int(b) - int(a) >= MAX_JOBS:
        raise ScenarioError(f"id range {text!r} is not allowed: a range from a low to a high number, "
                            f"at most {MAX_JOBS:,} ids")
    width = len(a) if a.startswith("0") else 0
    return [f"{m.group('prefix')}{i:0{width}d}" for i in range(int(a), int(b) + 1)]


@dataclass
class Outcome:
    """The result of one scenario run (or variant): failures are human-readable lines."""

    name: str
    result: SimResult
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


def load_scenario(path: str | Path) -> ScenarioSpec:
    """Read and validate a scenario file.

    Raises:
        ScenarioError: unreadable file, bad YAML or a field the format does not allow.
    """
    source = str(path)
    try:
        raw = load_yaml(read_text(path))
    except YamlError as exc:
        raise ScenarioError(f"{source}: {exc}") from None
    if not isinstance(raw, dict):
        what = ("an empty file (or comments only)" if raw is None else "a YAML list" if isinstance(raw, list)
                else f"a lone YAML value ({str(raw)[:40]!r})")
        raise ScenarioError(f"{source}: {what} is not allowed: a YAML mapping with scenario, policy, jobs and "
                            "expect")
    try:
        spec = ScenarioSpec.model_validate(raw)
    except ValidationError as exc:
        raise ScenarioError(f"{source}: {_pydantic_line(exc)}") from None
    validate_scenario(spec, source)
    return spec


def _pydantic_line(exc: ValidationError, prefix: str = "", model: type[BaseModel] = ScenarioSpec) -> str:
    """The first error of ``exc`` (validating ``model``) as one line; an unknown field
    first (a typo, ``clas`` for ``class``, also leaves its right name missing: the typo
    is the error to name), with the fields allowed there and the closest one."""
    errors = exc.errors()
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    parts = []
    for p in err["loc"]:
        if isinstance(p, int):
            parts.append(f"[{p}]")
        elif (p in _LOC_NOISE or "[" in str(p) or "-" in str(p) and str(p).split("-")[0] in _LOC_NOISE
              or p in {c.__name__ for c in _Strict.__subclasses__()}):
            continue  # pydantic's union-member tags (a type or a model of a union), not fields
        else:
            parts.append(("." if parts else "") + str(p))
    where = prefix + "".join(parts)
    if err["type"] == "missing":
        return f"{where}: a value is required here"
    if err["type"] == "extra_forbidden":
        names = _fields_at(model, err["loc"][:-1])
        if not names:
            return f"{where}: unknown field is not allowed"
        close = difflib.get_close_matches(str(err["loc"][-1]), names, n=1)
        return (f"{where}: {err['loc'][-1]!r} is not allowed: unknown field; allowed fields here: {', '.join(names)}"
                + (f" (did you mean {close[0]!r}?)" if close else ""))
    value = repr(err.get("input"))
    value = value if len(value) <= 60 else value[:57] + "..."
    msg = err["msg"].removeprefix("Value error, ")
    return f"{where}: {value} is not allowed: {msg[:1].lower()}{msg[1:]}"


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """The fields (as a file writes them) of the model that holds ``loc``'s fields, or
    ``[]`` where it cannot be told (a free-form mapping: ``policy``, a variant's jobs)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int) or part in _LOC_NOISE or "[" in str(part):
            continue
        if isinstance(current, type) and issubclass(current, BaseModel) and part == current.__name__:
            continue  # a union's member tag
        if isinstance(current, tuple):  # a dict's values: ``part`` is a key
            current = current[1]
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return []
        fields = {(f.alias or n): f for n, f in current.model_fields.items()}
        if part not in fields:
            return []
        current = _inner_model(fields[part].annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return sorted((f.alias or n) for n, f in current.model_fields.items())
    return []


def _inner_model(annotation: Any) -> Any:
    """The model inside an annotation (``X | None``, ``list[X]``, ``X | list[X]``); a
    dict of models as ``("dict", X)``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is dict and len(args) == 2:
        inner = _inner_model(args[1])
        return ("dict", inner) if inner is not None else None
    for arg in args:
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


_LOC_NOISE = {"constrained-float", "constrained-int", "float", "int", "str", "bool", "list", "dict", "function-after",
              "function-before", "function-wrap", "literal", "nullable", "union"}


def validate_scenario(spec: ScenarioSpec, source: str = "<scenario>") -> None:
    """What the schema alone cannot check: ids (ranges, duplicates), that events,
    allocations, expectations and variants name jobs, teams, nodes and GPUs that exist.

    Raises:
        ScenarioError: the first problem, naming the file and the field's path.
    """
    def fail(path: str, value: Any, allowed: str) -> None:
        text = repr(value)
        raise ScenarioError(f"{source}: {path}: {text if len(text) <= 60 else text[:57] + '...'} is not allowed: {allowed}")

    ids: dict[str, str] = {}
    teams: set[str] = set()
    total = 0
    for i, entry in enumerate(spec.jobs):
        try:
            expanded = expand_ids(entry.id)
        except ScenarioError as exc:
            raise ScenarioError(f"{source}: jobs[{i}].{exc}") from None
        total += len(expanded)
        if total > MAX_JOBS:
            fail(f"jobs[{i}].id", entry.id, f"at most {MAX_JOBS:,} jobs in a scenario")
        for job_id in expanded:
            if job_id in ids:
                fail(f"jobs[{i}].id", job_id, f"an id used once only (also in {ids[job_id]})")
            ids[job_id] = f"jobs[{i}]"
        teams.add(entry.team)
        _check_share_fields(entry, f"jobs[{i}]", fail)
        if entry.ignores_signal and entry.exit_after_signal is not None:
            fail(f"jobs[{i}].exit_after_signal", entry.exit_after_signal, "no exit_after_signal with "
                 "ignores_signal: true (a job that ignores the signal does not exit by itself)")
    try:
        node_list = policy_from_dict(spec.policy, f"{source}#policy").rules.nodes
    except PolicyError as exc:
        raise ScenarioError(str(exc)) from None
    nodes = {n.name: n.gpus for n in node_list}
    mig_gpus = {n.name: {g for g, _ in n.mig} for n in node_list}
    used: dict[str, set[int]] = {}
    for i, a in enumerate(spec.initial_allocations):
        path = f"initial_allocations[{i}]"
        if a.job in ids:
            fail(f"{path}.job", a.job, f"an id used once only (also in {ids[a.job]})")
        ids[a.job] = path
        teams.add(a.team)
        if a.node not in nodes:
            fail(f"{path}.node", a.node, "a node of the cluster: " + ", ".join(sorted(nodes)))
        taken = used.setdefault(a.node, set(mig_gpus[a.node]))
        if a.fraction is not None or a.mig_profile is not None or a.gpu_mem_mib:
            if a.gpu is None or a.gpu >= nodes[a.node]:
                fail(f"{path}.gpu", a.gpu, f"the index of the GPU the share is on, 0 to {nodes[a.node] - 1}")
            if a.gpus != 1 or a.gpu_indices is not None:
                fail(f"{path}.gpus", a.gpus, "1 and no gpu_indices for a share (it is part of one GPU)")
            if a.fraction is not None and a.mig_profile is not None:
                fail(f"{path}.mig_profile", a.mig_profile, "a MIG instance or a fraction, not both")
            if a.fraction is not None:
                _exact(a.fraction, 1000, f"{path}.fraction", "a multiple of 0.001 GPU", fail)
            taken.add(a.gpu)  # no whole-GPU allocation may pick it
            continue
        if a.gpu is not None:
            if a.gpu_indices is not None or a.gpus != 1:
                fail(f"{path}.gpu", a.gpu, "for a share or a single GPU; use gpu_indices for several")
            a = a.model_copy(update={"gpu_indices": [a.gpu]})
        if a.gpu_indices is not None:
            gpus = a.gpu_indices
            if len(gpus) != a.gpus or len(set(gpus)) != len(gpus) or max(gpus, default=0) >= nodes[a.node]:
                fail(f"{path}.gpu_indices", gpus, f"{a.gpus} distinct indices from 0 to {nodes[a.node] - 1}")
            if taken & set(gpus):
                fail(f"{path}.gpu_indices", gpus, f"GPUs of {a.node} no other allocation holds "
                     f"(taken: {sorted(taken)})")
            taken.update(gpus)
        else:
            free = [g for g in range(nodes[a.node]) if g not in taken]
            if len(free) < a.gpus:
                fail(f"{path}.gpus", a.gpus, f"at most the {len(free)} GPU(s) of {a.node} still free")
            taken.update(free[:a.gpus])
    live = dict(nodes)
    for i, e in enumerate(sorted(enumerate(spec.events), key=lambda ie: ie[1].t)):
        idx, e = e
        path = f"events[{idx}]"
        needs = {"cancel": ("job",), "requeue": ("job",), "update": ("job",), "gpu_unhealthy": ("node", "gpu"),
                 "gpu_healthy": ("node", "gpu"), "node_lost": ("node",), "node_added": ("node", "gpus"),
                 "usage": ("job", "gpu_util_pct"), "gpu_unmanaged": ("node", "gpu"),
                 "gpu_managed": ("node", "gpu")}.get(e.type, ())
        for name in needs:
            if getattr(e, name) is None:
                fail(f"{path}.{name}", None, f"a value: a {e.type} event needs '{name}'")
        if e.type in ("cancel", "requeue", "update", "usage") and e.job not in ids:
            fail(f"{path}.job", e.job, "a job of the scenario")
        if e.type == "update" and e.time_limit is None and e.nice is None:
            fail(f"{path}.time_limit", None, "a value: an update event needs 'time_limit' or 'nice'")
        if e.type == "usage" and e.every_s is not None:
            if e.until is None or e.until < e.t:
                fail(f"{path}.until", e.until, f"a time >= t ({e.t}) up to which the sample repeats")
            if (e.until - e.t) / e.every_s >= MAX_JOBS:
                fail(f"{path}.every_s", e.every_s, f"an interval giving at most {MAX_JOBS:,} samples")
        if e.type in ("gpu_unhealthy", "gpu_healthy", "node_lost", "gpu_unmanaged", "gpu_managed") \
                and e.node not in nodes:
            fail(f"{path}.node", e.node, "a node of the cluster: " + ", ".join(sorted(nodes)))
        if e.type in ("gpu_unhealthy", "gpu_healthy", "gpu_unmanaged", "gpu_managed") and e.gpu >= nodes[e.node]:
            fail(f"{path}.gpu", e.gpu, f"a GPU index of {e.node}: 0 to {nodes[e.node] - 1}")
        if e.type == "node_lost":
            live.pop(e.node, None)
        if e.type == "node_added":
            if not e.node or e.node in live:
                fail(f"{path}.node", e.node, "the name of a node that is not in the cluster at that time")
            live[e.node] = nodes[e.node] = e.gpus
    _check_expect(spec.expect, "expect", ids, teams, nodes, fail)
    for i, v in enumerate(spec.variants):
        for job_id, change in v.jobs.items():
            if job_id not in ids or not ids[job_id].startswith("jobs["):
                fail(f"variants[{i}].jobs.{job_id}", job_id, "a job of the scenario's jobs list")
            unknown = sorted((set(change) - set(JobEntry.model_fields) - {"class"}) | ({"id"} & set(change)))
            if unknown:
                fail(f"variants[{i}].jobs.{job_id}.{unknown[0]}", unknown[0],
                     "a job field other than id: " + ", ".join(sorted(set(JobEntry.model_fields) - {"workload_class", "id"}
                                                                     | {"class"})))
        _check_expect(v.expect, f"variants[{i}].expect", ids, teams, nodes, fail)
        if v.policy:  # a variant's policy must compile before anything runs
            try:
                policy_from_dict(_merge(spec.policy, v.policy), f"{source}#variants[{i}].policy")
            except PolicyError as exc:
                raise ScenarioError(str(exc)) from None


def _check_expect(expect: Expect, where: str, ids: dict, teams: set, nodes: dict, fail) -> None:
    for name in ("starts", "ends", "preempted", "pending", "final_state", "rejected"):
        for job_id in getattr(expect, name):
            if job_id not in ids:
                fail(f"{where}.{name}.{job_id}", job_id, "a job of the scenario")
    for name in ("never_preempted", "never_starts"):
        for job_id in getattr(expect, name):
            if job_id not in ids:
                fail(f"{where}.{name}", job_id, "a job of the scenario")
    for name in ("team_usage", "max_team_usage"):
        for team in getattr(expect, name):
            if team not in teams:
                fail(f"{where}.{name}.{team}", team, "a team of the scenario's jobs: " + ", ".join(sorted(teams)))
    for i, u in enumerate(expect.usage_at):
        if u.team not in teams:
            fail(f"{where}.usage_at[{i}].team", u.team, "a team of the scenario's jobs: " + ", ".join(sorted(teams)))
    for i, g in enumerate(expect.gpu_never_used):
        if g.node not in nodes or g.gpu >= nodes[g.node]:
            fail(f"{where}.gpu_never_used[{i}]", f"{g.node}:{g.gpu}", "a GPU of a node of the scenario")


def run_scenario(spec: ScenarioSpec, source: str = "<scenario>") -> list[Outcome]:
    """Run the scenario and each variant; returns one ``Outcome`` each.

    Raises:
        ScenarioError: the scenario's policy or jobs are invalid.
    """
    outcomes = [_run_one(spec, spec.scenario, spec.policy, {}, spec.expect, source)]
    for v in spec.variants:
        policy = _merge(spec.policy, v.policy)
        outcomes.append(_run_one(spec, f"{spec.scenario}/{v.name}", policy, v.jobs, v.expect, source))
    return outcomes


def _merge(base: dict, change: dict) -> dict:
    out = dict(base)
    for k, v in change.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _run_one(spec: ScenarioSpec, name: str, policy_raw: dict, job_changes: dict, expect: Expect,
             source: str) -> Outcome:
    try:
        policy: Policy = policy_from_dict(policy_raw, f"{source}#policy")
    except PolicyError as exc:
        raise ScenarioError(str(exc)) from None
    jobs: list[SimJob] = []
    rules = policy.rules
    for i, entry in enumerate(spec.jobs):
        for job_id in expand_ids(entry.id):
            data, where = entry, f"jobs[{i}]"
            if job_id in job_changes:
                try:
                    data = JobEntry.model_validate({**entry.model_dump(by_alias=True), **job_changes[job_id]})
                except ValidationError as exc:
                    raise ScenarioError(f"{source}: {_pydantic_line(exc, f'{name}: jobs.{job_id}.', JobEntry)}") from None
                where = f"{name}: jobs.{job_id}"
            # a class or team the policy lacks is a fault of the file (like an unknown job
            # in events), not a submission the core refuses: nothing would run it
            if data.workload_class not in rules.classes:
                raise ScenarioError(f"{source}: {where}.class: {data.workload_class!r} is not allowed: a class of "
                                    f"the policy: {', '.join(sorted(rules.classes))}")
            if rules.teams and data.team not in rules.teams:
                raise ScenarioError(f"{source}: {where}.team: {data.team!r} is not allowed: a team of the "
                                    f"policy: {', '.join(sorted(rules.teams))}")
            if data.ignores_signal and data.exit_after_signal is not None:
                raise ScenarioError(f"{source}: {where}.exit_after_signal: {data.exit_after_signal!r} is not "
                                    "allowed: no exit_after_signal with ignores_signal: true")
            jobs.append(_sim_job(job_id, data.model_dump(by_alias=False)))
    events: list[Event | Restart] = []
    for i, alloc in enumerate(spec.initial_allocations):
        events.append(_adopt(policy, alloc, spec.initial_allocations[:i]))
        jobs.append(SimJob(events[-1].spec, alloc.ends))
    known = {n.name: n for n in policy.rules.nodes}
    for e in spec.events:
        if e.type == "usage" and e.every_s is not None:
            n = int((Decimal(str(e.until)) - Decimal(str(e.t))) // Decimal(str(e.every_s)))
            events.extend(UsageSample(float(Decimal(str(e.t)) + k * Decimal(str(e.every_s))), e.job,
                                      e.gpu_util_pct, e.mem_used_mib) for k in range(n + 1))
        else:
            events.append(_event(e, known))
    # a job the core refuses at submit is REJECTED with its reason, the run goes on (note 026)
    sim = Simulator(policy.rules, jobs, events, record_reasons=True, check_invariants=True,
                    track_usage=lambda s: s.team, probe_times=tuple(u.t for u in expect.usage_at),
                    reject_invalid=True)
    try:
        result = sim.run()
    except (SpecError, ValueError) as exc:
        raise ScenarioError(f"{source}: {name}: {exc}") from None
    return Outcome(name, result, check_expect(result, expect))


def _sim_job(job_id: str, data: dict) -> SimJob:
    gang = data.get("gang")
    if gang:
        gpus = gang["pods"] * gang["gpus_per_pod"]
        per_pod = gang["gpus_per_pod"]
        same_node = gang.get("same_node", False) or data.get("same_node", False)
    else:
        gpus = data.get("gpus") or 1
        per_pod = None
        same_node = data.get("same_node", False)
    duration = data["duration"]
    share = _share_of(job_id, data)
    spec = JobSpec(
        id=job_id, team=data.get("team", "default"), user=data.get("user") or "",
        workload_class=data["workload_class"], gpus=gpus, gpus_per_pod=per_pod, same_node=same_node,
        gpu_mem_mib=0 if share is not None else data.get("gpu_mem_mib", 0),
        gpu_types=tuple(data.get("gpu_types") or ()), share=share,
        node_selector=tuple(sorted((data.get("node_selector") or {}).items())),
        tolerations=tuple(data.get("tolerations") or ()), min_driver=data.get("min_driver") or "",
        cache_key=data.get("cache_key") or "", cache_required=bool(data.get("cache_required")),
        time_limit_s=data.get("time_limit"), grace_period_s=data.get("grace_period"),
        # the conventions: the duration is the runtime estimate unless a time limit is given
        runtime_estimate_s=data.get("estimate") or (
            None if data.get("time_limit") or duration == "unbounded" else float(duration) or None),
        preemptible=data.get("preemptible"), checkpointable=data.get("checkpointable"),
        submit_time=float(data["submit"]),
        deadline=data.get("deadline"), require_island=data.get("require_island"),
    )
    if data.get("ignores_signal"):
        answers: tuple[SignalAnswer, ...] = (SignalAnswer(None),)
    elif data.get("exit_after_signal") is not None:
        answers = (SignalAnswer(float(data["exit_after_signal"])),)
    else:
        answers = ()
    return SimJob(spec, None if duration == "unbounded" else float(duration), signal_answers=answers,
                  checkpoint_every_s=data.get("checkpoint_every"))


def _exact(value: float, scale: int, path: str, allowed: str, fail) -> int:
    """``value`` x ``scale`` as the decimal the user wrote (``0.18`` -> 180 milli-GPU,
    not its binary float); ``fail(path, value, allowed)`` when that is no integer."""
    exact = Decimal(repr(value)) * scale
    if exact != exact.to_integral_value():
        fail(path, value, allowed)
    return int(exact)


def _raise(path: str, value: Any, allowed: str) -> None:
    raise ScenarioError(f"{path}: {value!r} is not allowed: {allowed}")


SHARE_FIELDS = ("gpu_fraction", "ts_replicas", "mps_replicas", "mig_profile")


def _check_share_fields(entry: JobEntry, path: str, fail) -> None:
    """One share kind per job, none with ``gpus`` or a gang; exact fractions."""
    given = [f for f in SHARE_FIELDS if getattr(entry, f) is not None]
    if len(given) > 1:
        fail(f"{path}.{given[1]}", getattr(entry, given[1]), f"one of {', '.join(SHARE_FIELDS)} per job "
             f"(it also has {given[0]})")
    for name in ("mps_sm_percent", "mps_processes"):
        if getattr(entry, name) is not None and entry.mps_replicas is None:
            fail(f"{path}.{name}", getattr(entry, name), "only with mps_replicas")
    if given and (entry.gpus is not None or entry.gang is not None):
        fail(f"{path}.gpus", entry.gpus if entry.gpus is not None else "gang", f"no gpus or gang with {given[0]} "
             "(a share is part of one GPU)")
    if entry.gpu_fraction is not None:
        _exact(entry.gpu_fraction, 1000, f"{path}.gpu_fraction", "a multiple of 0.001 GPU in (0, 1]", fail)
    if entry.mps_sm_percent is not None:
        _exact(entry.mps_sm_percent, 10, f"{path}.mps_sm_percent", "a multiple of 0.1 percent in (0, 100]", fail)


def _share_of(job_id: str, data: dict) -> GpuShare | None:
    mem = data.get("gpu_mem_mib", 0) or 0
    where = f"job {job_id}"
    if data.get("mig_profile"):
        return GpuShare("mig", profile=data["mig_profile"])
    if data.get("ts_replicas"):
        return GpuShare("time_slice", mem_mib=mem, slots=data["ts_replicas"])
    if data.get("mps_replicas"):
        pct = data.get("mps_sm_percent")
        milli = 0 if pct is None else _exact(pct, 10, f"{where}: mps_sm_percent", "a multiple of 0.1 percent", _raise)
        return GpuShare("mps", milli=milli, mem_mib=mem, slots=data["mps_replicas"],
                        procs=data.get("mps_processes") or 1)
    if data.get("gpu_fraction") is not None:
        return GpuShare("fraction", milli=_exact(data["gpu_fraction"], 1000, f"{where}: gpu_fraction",
                                                               "a multiple of 0.001 GPU", _raise), mem_mib=mem)
    if not data.get("gpus") and not data.get("gang") and mem:
        return GpuShare("fraction", mem_mib=mem)
    return None


def _adopt(policy: Policy, alloc: InitialAllocation, earlier: list[InitialAllocation]) -> JobAdopted:
    node = next((n for n in policy.rules.nodes if n.name == alloc.node), None)
    if node is None:
        raise ScenarioError(f"initial_allocations: node {alloc.node!r} is not allowed: a node of the cluster")
    share = _share_of(alloc.job, {"mig_profile": alloc.mig_profile, "gpu_fraction": alloc.fraction,
                                  "gpu_mem_mib": alloc.gpu_mem_mib})
    if share is not None:
        spec = JobSpec(id=alloc.job, team=alloc.team, user=alloc.user, workload_class=alloc.workload_class,
                       gpus=1, share=share, preemptible=alloc.preemptible, checkpointable=alloc.checkpointable,
                       runtime_estimate_s=alloc.ends, submit_time=0.0)
        return JobAdopted(0.0, spec, Placement(((alloc.node, (alloc.gpu or 0,)),)), 0.0)
    if alloc.gpu_indices is not None:
        gpus = tuple(alloc.gpu_indices)
    elif alloc.gpu is not None:
        gpus = (alloc.gpu,)
    else:
        # GPUs named by earlier allocations (indices, a share's GPU) and MIG GPUs are
        # not picked; earlier automatic picks took the lowest of the rest
        taken = {g for g, _ in node.mig}
        for a in earlier:
            if a.node == alloc.node:
                taken.update(a.gpu_indices or ([a.gpu] if a.gpu is not None else []))
        used = sum(a.gpus for a in earlier if a.node == alloc.node and a.gpu_indices is None and a.gpu is None)
        free = [g for g in range(node.gpus) if g not in taken]
        gpus = tuple(free[used:used + alloc.gpus])
    spec = JobSpec(id=alloc.job, team=alloc.team, user=alloc.user, workload_class=alloc.workload_class,
                   gpus=alloc.gpus, preemptible=alloc.preemptible, checkpointable=alloc.checkpointable,
                   runtime_estimate_s=alloc.ends, submit_time=0.0)
    return JobAdopted(0.0, spec, Placement(((alloc.node, gpus),)), 0.0)


def _event(e: EventEntry, known: dict[str, Node] | None = None) -> Event | Restart:
    def need(name: str) -> Any:
        value = getattr(e, name)
        if value is None:
            raise ScenarioError(f"events: a {e.type} event at t={e.t} needs '{name}'")
        return value

    if e.type == "cancel":
        return JobCancelled(e.t, need("job"))
    if e.type == "requeue":
        return JobRequeueRequested(e.t, need("job"))
    if e.type == "update":
        if e.time_limit is None and e.nice is None:
            raise ScenarioError(f"events: an update event at t={e.t} needs 'time_limit' or 'nice'")
        return JobUpdated(e.t, need("job"), e.time_limit, e.nice, e.admin)
    if e.type == "restart":
        return Restart(e.t)
    if e.type in ("gpu_unhealthy", "gpu_healthy"):
        return GpuHealthChanged(e.t, need("node"), need("gpu"), e.type == "gpu_healthy")
    if e.type == "node_lost":
        return NodeLost(e.t, need("node"))
    if e.type == "usage":
        return UsageSample(e.t, need("job"), need("gpu_util_pct"), e.mem_used_mib)
    if e.type in ("gpu_unmanaged", "gpu_managed"):
        return GpuUnmanaged(e.t, need("node"), need("gpu"), e.type == "gpu_unmanaged")
    if known and e.node in known and e.gpus is None:
        return NodeAdded(e.t, known[e.node])  # a policy node comes back as the policy defines it
    return NodeAdded(e.t, Node(need("node"), need("gpus"), e.gpu_type))


def _reason_matches(actual: str, expected: str) -> bool:
    return actual == expected or ("(" not in expected and actual.split("(", 1)[0] == expected)


def check_expect(result: SimResult, expect: Expect) -> list[str]:
    """Compare a run with its expectations; returns one line per mismatch."""
    fails: list[str] = []
    recs = result.records

    def rec(job_id: str):
        r = recs.get(job_id)
        if r is None:
            fails.append(f"{job_id}: no such job in the scenario")
        return r

    for job_id, want in expect.starts.items():
        r = rec(job_id)
        if r is None:
            continue
        wants = want if isinstance(want, list) else [want]
        if len(r.starts) < len(wants) or (isinstance(want, list) and len(r.starts) != len(wants)):
            fails.append(f"{job_id}: started {len(r.starts)} time(s) {[t for t, _ in r.starts]}, expected {len(wants)}")
            continue
        for k, w in enumerate(wants):
            t, placement = r.starts[k]
            if abs(t - w.t) > 1e-6:
                fails.append(f"{job_id}: start #{k + 1} at t={t:g}, expected t={w.t:g}")
            if w.node is not None and placement.nodes != (w.node,):
                fails.append(f"{job_id}: start #{k + 1} on {'+'.join(placement.nodes)}, expected {w.node}")
            if w.nodes is not None and sorted(placement.nodes) != sorted(w.nodes):
                fails.append(f"{job_id}: start #{k + 1} on {'+'.join(placement.nodes)}, expected {'+'.join(w.nodes)}")
            if w.gpus is not None:
                got = [g for _, gs in placement.parts for g in gs]
                if got != w.gpus:
                    fails.append(f"{job_id}: start #{k + 1} on GPUs {got}, expected {w.gpus}")
            if w.gpus_total is not None and placement.gpu_count != w.gpus_total:
                fails.append(f"{job_id}: start #{k + 1} with {placement.gpu_count} GPUs, expected {w.gpus_total}")
    for job_id, t in expect.ends.items():
        r = rec(job_id)
        if r is not None and (r.end is None or abs(r.end - t) > 1e-6):
            fails.append(f"{job_id}: ended at {r.end}, expected {t:g}")
    for job_id, times in expect.preempted.items():
        r = rec(job_id)
        if r is not None and [round(x, 6) for x in r.preempted_at] != [round(x, 6) for x in times]:
            fails.append(f"{job_id}: preempted at {r.preempted_at}, expected {times}")
    for job_id in expect.never_preempted:
        r = rec(job_id)
        if r is not None and r.preempted_at:
            fails.append(f"{job_id}: preempted at {r.preempted_at}, expected never")
    for job_id in expect.never_starts:
        r = rec(job_id)
        if r is not None and r.starts:
            fails.append(f"{job_id}: started at {r.starts[0][0]:g}, expected never")
    for job_id, text in expect.rejected.items():
        r = rec(job_id)
        if r is not None and (r.state != "REJECTED" or text not in r.rejected):
            got = f"rejected: {r.rejected}" if r.state == "REJECTED" else f"final state {r.state}"
            fails.append(f"{job_id}: {got}, expected rejected with a reason containing {text!r}")
    for job_id, state in expect.final_state.items():
        r = rec(job_id)
        if r is not None and r.state.lower() != state.lower():
            fails.append(f"{job_id}: final state {r.state}, expected {state}")
    for job_id, want in expect.pending.items():
        r = rec(job_id)
        if r is None:
            continue
        for w in want if isinstance(want, list) else [want]:
            fails.extend(_check_pending(job_id, r, w, result.t_last))
    for team, line in expect.team_usage.items():
        got = [(round(t, 6), u) for t, u in result.usage_timeline.get(team, [])]
        exp = [(round(float(t), 6), int(u)) for t, u in line]
        if got != exp:
            fails.append(f"team {team}: usage over time {got}, expected {exp}")
    for team, cap in expect.max_team_usage.items():
        peak = max((u for _, u in result.usage_timeline.get(team, [])), default=0)
        if peak > cap:
            fails.append(f"team {team}: held {peak} GPUs at peak, expected at most {cap}")
    for u in expect.usage_at:
        key = ("team", u.team) if u.user is None else ("user", u.team, u.user)
        got = result.usage_probes.get(u.t, {}).get(key, 0.0)
        if abs(got - u.gpu_seconds) > u.tolerance:
            who = u.team if u.user is None else f"{u.team}/{u.user}"
            fails.append(f"usage of {who} at t={u.t:g}: {got:.1f} GPU-s, expected {u.gpu_seconds:g} +- {u.tolerance:g}")
    for item in expect.gpu_never_used:
        node, gpu, after = item.node, item.gpu, item.after
        for r in recs.values():
            for t, placement in r.starts:
                if t >= after and any(n == node and gpu in gs for n, gs in placement.parts):
                    fails.append(f"{r.spec.id}: given {node} GPU {gpu} at t={t:g}, expected it unused after {after:g}")
    return fails


def _check_pending(job_id: str, r, w: PendingExpect, t_last: float) -> list[str]:
    lo = w.from_
    hi = float("inf") if w.to == "never" else float(w.to)
    spans = [(a, b if b is not None else float("inf"), reason) for a, b, reason in r.reasons if b is None or b > a]
    covered = lo
    out = []
    for a, b, reason in spans:
        if b <= lo or a >= hi:
            continue
        if a > covered + 1e-6:
            out.append(f"{job_id}: not pending during [{covered:g}, {a:g}), expected pending {w.reason} from {lo:g}")
        if not _reason_matches(reason, w.reason):
            out.append(f"{job_id}: pending for {reason} during [{max(a, lo):g}, {min(b, hi):g}), expected {w.reason}")
        covered = max(covered, b)
    if covered < hi - 1e-6 and not (hi == float("inf") and covered == float("inf")):
        if hi == float("inf"):
            out.append(f"{job_id}: pending until {covered:g}, expected pending forever ({w.reason})")
        else:
            out.append(f"{job_id}: pending until {covered:g}, expected pending {w.reason} until {hi:g}")
    return out
