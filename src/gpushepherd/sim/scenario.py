"""Scenario files: a small cluster, a policy, jobs, events and the expected outcome.

A scenario is a YAML file run by ``shepherd scenario run FILE`` and by the tests. The
``policy`` section is an ordinary policy file (cluster included); ``jobs`` have true
durations; ``expect`` states who starts when and where, who is preempted, why a job
waits, and what each team holds over time. ``variants`` rerun the scenario with some
jobs or policy fields changed. See ``docs/scenarios.md`` for the format.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpushepherd.core.scheduler import SpecError
from gpushepherd.model.cluster import Node
from gpushepherd.model.events import (
    Event,
    GpuHealthChanged,
    JobAdopted,
    JobCancelled,
    JobRequeueRequested,
    NodeAdded,
    NodeLost,
)
from gpushepherd.model.job import JobSpec
from gpushepherd.model.placement import Placement
from gpushepherd.policy.load import Policy, PolicyError, policy_from_dict
from gpushepherd.sim.engine import Restart, SimJob, SimResult, Simulator


class ScenarioError(ValueError):
    """A scenario file that cannot be run; ``str()`` names the file, path and value."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class GangSpec(_Strict):
    pods: Annotated[int, Field(ge=1)]
    gpus_per_pod: Annotated[int, Field(ge=1)]
    same_node: bool = False


class JobEntry(_Strict):
    id: str
    team: str = "default"
    user: str = ""
    workload_class: str = Field(alias="class")
    submit: Annotated[float, Field(ge=0)]
    gpus: Annotated[int, Field(ge=1)] | None = None
    gang: GangSpec | None = None
    same_node: bool = False
    duration: Annotated[float, Field(ge=0)] | Literal["unbounded"]
    time_limit: Annotated[float, Field(gt=0)] | None = None
    estimate: Annotated[float, Field(gt=0)] | None = None
    preemptible: bool | None = None
    checkpointable: bool | None = None
    gpu_types: list[str] = Field(default_factory=list)
    gpu_mem_mib: Annotated[int, Field(ge=0)] = 0


class EventEntry(_Strict):
    t: Annotated[float, Field(ge=0)]
    type: Literal["cancel", "requeue", "restart", "gpu_unhealthy", "gpu_healthy", "node_lost", "node_added"]
    job: str | None = None
    node: str | None = None
    gpu: Annotated[int, Field(ge=0)] | None = None
    gpus: Annotated[int, Field(ge=1)] | None = None
    gpu_type: str = "generic"


class InitialAllocation(_Strict):
    job: str
    team: str = "default"
    user: str = ""
    workload_class: str = Field(alias="class", default="batch")
    node: str
    gpus: Annotated[int, Field(ge=1)] = 1
    gpu_indices: list[int] | None = None
    ends: Annotated[float, Field(gt=0)]
    preemptible: bool | None = None
    checkpointable: bool | None = None


class StartExpect(_Strict):
    t: float
    node: str | None = None
    nodes: list[str] | None = None
    gpus: list[int] | None = None
    gpus_total: int | None = None


class PendingExpect(_Strict):
    from_: float = Field(alias="from")
    to: float | Literal["never"]
    reason: str


class Expect(_Strict):
    starts: dict[str, StartExpect | list[StartExpect]] = Field(default_factory=dict)
    ends: dict[str, float] = Field(default_factory=dict)
    preempted: dict[str, list[float]] = Field(default_factory=dict)
    never_preempted: list[str] = Field(default_factory=list)
    pending: dict[str, PendingExpect | list[PendingExpect]] = Field(default_factory=dict)
    never_starts: list[str] = Field(default_factory=list)
    final_state: dict[str, str] = Field(default_factory=dict)
    team_usage: dict[str, list[tuple[float, int]]] = Field(default_factory=dict)
    max_team_usage: dict[str, int] = Field(default_factory=dict)
    gpu_never_used: list[dict[str, Any]] = Field(default_factory=list)


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
    """``B1..B12`` -> ``B1 .. B12``; ``F01..F20`` keeps the zero padding; else ``[text]``."""
    m = _RANGE.match(text)
    if not m:
        return [text]
    a, b = m.group("a"), m.group("b")
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
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ScenarioError(f"{source}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{source}: not valid YAML: {str(exc).splitlines()[0]}") from None
    try:
        return ScenarioSpec.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ScenarioError(f"{source}: {where}: {err.get('input')!r} is not allowed: {err['msg']}") from None


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
    for entry in spec.jobs:
        for job_id in expand_ids(entry.id):
            data = entry.model_dump(by_alias=False)
            data.update(job_changes.get(job_id, {}))
            jobs.append(_sim_job(job_id, data))
    events: list[Event | Restart] = []
    for i, alloc in enumerate(spec.initial_allocations):
        events.append(_adopt(policy, alloc, spec.initial_allocations[:i]))
        jobs.append(SimJob(events[-1].spec, alloc.ends))
    for e in spec.events:
        events.append(_event(e))
    sim = Simulator(policy.rules, jobs, events, record_reasons=True, check_invariants=True,
                    track_usage=lambda s: s.team)
    try:
        result = sim.run()
    except SpecError as exc:
        raise ScenarioError(f"{source}: {exc}") from None
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
    spec = JobSpec(
        id=job_id, team=data.get("team", "default"), user=data.get("user") or "",
        workload_class=data["workload_class"], gpus=gpus, gpus_per_pod=per_pod, same_node=same_node,
        gpu_mem_mib=data.get("gpu_mem_mib", 0), gpu_types=tuple(data.get("gpu_types") or ()),
        time_limit_s=data.get("time_limit"),
        # the conventions: the duration is the runtime estimate unless a time limit is given
        runtime_estimate_s=data.get("estimate") or (
            None if data.get("time_limit") or duration == "unbounded" else float(duration) or None),
        preemptible=data.get("preemptible"), checkpointable=data.get("checkpointable"),
        submit_time=float(data["submit"]),
    )
    return SimJob(spec, None if duration == "unbounded" else float(duration))


def _adopt(policy: Policy, alloc: InitialAllocation, earlier: list[InitialAllocation]) -> JobAdopted:
    node = next((n for n in policy.rules.nodes if n.name == alloc.node), None)
    if node is None:
        raise ScenarioError(f"initial_allocations: node {alloc.node!r} is not allowed: a node of the cluster")
    if alloc.gpu_indices is not None:
        gpus = tuple(alloc.gpu_indices)
    else:
        taken = {g for a in earlier if a.node == alloc.node for g in (a.gpu_indices or [])}
        used = sum(a.gpus for a in earlier if a.node == alloc.node and a.gpu_indices is None)
        free = [g for g in range(node.gpus) if g not in taken]
        gpus = tuple(free[used:used + alloc.gpus])
    spec = JobSpec(id=alloc.job, team=alloc.team, user=alloc.user, workload_class=alloc.workload_class,
                   gpus=alloc.gpus, preemptible=alloc.preemptible, checkpointable=alloc.checkpointable,
                   runtime_estimate_s=alloc.ends, submit_time=0.0)
    return JobAdopted(0.0, spec, Placement(((alloc.node, gpus),)), 0.0)


def _event(e: EventEntry) -> Event | Restart:
    def need(name: str) -> Any:
        value = getattr(e, name)
        if value is None:
            raise ScenarioError(f"events: a {e.type} event at t={e.t} needs '{name}'")
        return value

    if e.type == "cancel":
        return JobCancelled(e.t, need("job"))
    if e.type == "requeue":
        return JobRequeueRequested(e.t, need("job"))
    if e.type == "restart":
        return Restart(e.t)
    if e.type in ("gpu_unhealthy", "gpu_healthy"):
        return GpuHealthChanged(e.t, need("node"), need("gpu"), e.type == "gpu_healthy")
    if e.type == "node_lost":
        return NodeLost(e.t, need("node"))
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
    for item in expect.gpu_never_used:
        node, gpu, after = item["node"], int(item["gpu"]), float(item.get("after", 0))
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
