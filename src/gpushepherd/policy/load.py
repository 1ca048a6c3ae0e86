"""Read a policy file, validate it and compile it into the core's ``Rules``.

Every problem is reported as one ``PolicyError`` whose text names the file, the
field's path (``teams.ml.max_gpus``), the value and what is allowed. Nothing is half
applied: the caller gets a complete ``Policy`` or an exception.
"""

from __future__ import annotations

from dataclasses import replace

import difflib
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from gpushepherd.model.clock import WEEKDAYS, Clock, Window
from gpushepherd.model.cluster import Node
from gpushepherd.model.rules import (
    UNLIMITED,
    ClassRules,
    Cohort,
    IdleStop,
    CohortMember,
    Limit,
    LimitUnit,
    PredictionRules,
    Pricing,
    PriorityRules,
    Rules,
)
from gpushepherd.model.mig import MigError, layout_from_names
from gpushepherd.policy import limits
from gpushepherd.policy.schema import WINDOW_FIELDS, ClassSpec, PolicySpec, WindowSpec
from gpushepherd.yamlio import YamlError, load_yaml, read_text

#: R1's standard workload classes. Priorities follow the public scenario conventions.
STANDARD_CLASSES: dict[str, dict[str, Any]] = {
    "production-inference": dict(
        priority=400, preemptible=False, checkpointable=False, preempt_only_if_checkpointable=False,
        sharing=["whole", "mig"],  # isolated GPUs only: no time-slicing, MPS or fractions
        description="latency-critical serving; never preempted; whole GPUs or MIG instances",
    ),
    "training": dict(
        priority=300, preemptible=True, checkpointable=False, preempt_only_if_checkpointable=True,
        description="important / production retraining; preempted only when it checkpoints",
    ),
    "research-training": dict(
        priority=250, preemptible=True, checkpointable=False, preempt_only_if_checkpointable=False,
        description="shared research training under team quotas",
    ),
    "batch": dict(
        priority=200, preemptible=True, checkpointable=True, preempt_only_if_checkpointable=False,
        description="batch inference, embeddings, offline work; chunked and restartable",
    ),
    "sandbox": dict(
        priority=100, preemptible=True, checkpointable=True, preempt_only_if_checkpointable=False,
        idle_stop=dict(below_util_pct=5.0, after_s=1800.0, setup_s=300.0),  # R16: idle sessions stop
        description="notebooks and ad-hoc work",
    ),
}


#: ``PolicyError``'s value for a field the file does not give
MISSING: Any = type("Missing", (), {"__repr__": lambda self: "<missing>"})()


class PolicyError(ValueError):
    """A policy that cannot be used. ``str()`` is one line:
    ``FILE: PATH: VALUE is not allowed: WHAT IS ALLOWED`` (or ``FILE: PROBLEM`` when
    no single field is at fault)."""

    def __init__(self, source: str, path: str, value: Any, allowed: str):
        missing = value is MISSING
        self.source, self.path, self.value, self.allowed = source, path, None if missing else value, allowed
        if path and missing:  # nothing was written: no value to quote ("None" read as one the file gave)
            super().__init__(f"{source}: {path}: {allowed}")
        elif path:
            super().__init__(f"{source}: {path}: {_short(value)} is not allowed: {allowed}")
        else:
            super().__init__(f"{source}: {allowed}")


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Policy:
    """A validated policy: the parsed file (``spec``) and the core's view (``rules``)."""

    spec: PolicySpec
    rules: Rules
    source: str


def load_policy(path: str | Path) -> Policy:
    """Read and compile the YAML policy at ``path``.

    Raises:
        PolicyError: unreadable file, YAML syntax, schema or consistency problem.
    """
    return policy_from_dict(read_policy_dict(path), str(path))


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    """Parse policy YAML text; see ``load_policy``."""
    return policy_from_dict(_yaml(text, source), source)


def override_cluster(raw: dict, text: str, source: str = "--cluster") -> dict:
    """Replace a policy mapping's nodes with ``N`` x ``G`` GPUs: ``192x8``,
    ``192x8:A100-80GB`` or ``192x8:A100-80GB:81920`` (GPU type, memory MiB). Pools
    declared in the policy are kept; the nodes join the first one (or ``default``).

    Raises:
        PolicyError: ``text`` is not in that form, or ``raw`` is not a mapping.
    """
    if not isinstance(raw, dict):
        raise PolicyError(source, "", None, "the policy file must be a YAML mapping before --cluster can change it")
    parts = text.split(":")
    size = parts[0].lower().split("x")
    try:
        count, gpus = int(size[0]), int(size[1])
        mem = int(parts[2]) if len(parts) > 2 else 0
        if len(size) != 2 or not 1 <= count <= 100_000 or not 1 <= gpus <= 256 or mem < 0 or len(parts) > 3:
            raise ValueError
    except (ValueError, IndexError):
        raise PolicyError(source, "", None, f"{text!r} is not allowed: NODESxGPUS[:GPU_TYPE[:GPU_MEM_MIB]] with "
                          "1-100000 nodes of 1-256 GPUs, e.g. 192x8 or 64x8:H100-80GB") from None
    out = dict(raw) if isinstance(raw, dict) else {}
    cluster = dict(out.get("cluster") or {})
    pools = cluster.get("pools") or []
    group = {"name": "node", "count": count, "gpus": gpus}
    if len(parts) > 1 and parts[1]:
        group["gpu_type"] = parts[1]
    if mem:
        group["gpu_mem_mib"] = mem
    if pools and isinstance(pools[0], dict) and "name" in pools[0]:
        group["pool"] = pools[0]["name"]
    cluster["nodes"] = [group]
    out["cluster"] = cluster
    return out


def read_policy_dict(path: str | Path) -> Any:
    """The parsed YAML of a policy file, not yet validated.

    Raises:
        PolicyError: unreadable file, larger than ``limits.MAX_FILE_BYTES``, not UTF-8,
            YAML syntax error, a repeated key, a recursive or exploding alias.
    """
    source = str(path)
    try:
        size = Path(path).stat().st_size
    except OSError:
        size = 0  # read_text names why it cannot be read
    if size > limits.MAX_FILE_BYTES:
        raise PolicyError(source, "", None, f"{size:,} bytes is not allowed: a policy file of at most "
                          f"{limits.MAX_FILE_BYTES:,} bytes (gpushepherd.policy.limits)")
    try:
        return load_yaml(read_text(path))
    except YamlError as exc:
        raise PolicyError(source, "", None, str(exc)) from None


def _yaml(text: str, source: str) -> Any:
    try:
        return load_yaml(text)
    except YamlError as exc:
        raise PolicyError(source, "", None, str(exc)) from None


def policy_from_dict(raw: Any, source: str = "<policy>", intake: bool = True) -> Policy:
    """Validate an already-parsed policy mapping; see ``load_policy``. Linear in the
    policy's size.

    Args:
        intake: the policy comes in (a file, ``policy apply``): also refuse what
            ``gpushepherd.policy.limits`` does not allow and windows that can never apply
            (``08:00-08:00``). ``False`` for a policy already in the event log, which
            replays as it was accepted.

    Raises:
        PolicyError: naming the field, the value and what is allowed.
    """
    if not isinstance(raw, dict):
        raise PolicyError(source, "", raw, "a YAML mapping with at least a 'cluster' section")
    if intake:
        problem = limits.size_problem(raw)
        if problem is not None:
            raise PolicyError(source, *problem)
    try:
        spec = PolicySpec.model_validate(raw)
    except ValidationError as exc:
        raise _translate(exc, source) from None
    if intake:
        _refuse_bad_windows(spec, source)
        _refuse_huge_counts(spec, source)
    return Policy(spec=spec, rules=compile_rules(spec, source, max_depth=limits.MAX_TEAM_DEPTH if intake else None),
                  source=source)


def _refuse_bad_windows(spec: PolicySpec, source: str) -> None:
    """Windows of a policy that comes in (a logged policy replays as it was accepted):

    * ``from`` equal to ``to`` covers no time at all: it never applies;
    * ``from: '24:00'``: a start is ``00:00``..``23:59`` (``24:00`` would be the next
      day's ``00:00``, on a day the window does not name); ``24:00`` is an end only;
    * ``days: []``: no day (unset means every day; an empty list is never that).

    A team window's ``max_gpus`` below its ``nominal_gpus`` is allowed (unlike the
    team's own ``max_gpus``): ``nominal_gpus`` has no windows, so a window cap is the one
    way to shrink a team's share for some hours; ``window_notes`` says so in ``policy
    check``.

    Raises:
        PolicyError: naming the window's field, its value and what to write instead.
    """
    for top, section in (("classes", spec.classes), ("teams", spec.teams)):
        for name, entry in section.items():
            for i, w in enumerate(entry.windows if entry is not None else ()):
                at = f"{top}.{name}.windows[{i}]"
                if w.days is not None and not w.days:
                    raise PolicyError(source, f"{at}.days", [], "one or more of mon, tue, wed, thu, fri, sat, sun; "
                                      "omit days for every day")
                if w.from_ == "24:00":
                    raise PolicyError(source, f"{at}.from", w.from_, "00:00 to 23:59 (24:00 is an end only: the "
                                      "next day's 00:00 is written 00:00 on that day)")
                if w.from_ == w.to:
                    raise PolicyError(source, at, f"{w.from_}-{w.to}",
                                      "a window that can apply: from and to differ (00:00-24:00 is a whole day; "
                                      "from later than to wraps past midnight)")


def window_notes(spec: PolicySpec) -> list[str]:
    """What ``policy check`` notes about a valid policy's windows: a team window whose
    ``max_gpus`` is below the team's ``nominal_gpus`` (a top-level ``max_gpus`` below it
    is refused). Allowed, as the one way to shrink a team's share for some hours
    (``nominal_gpus`` has no windows): inside the window the team holds at most that
    many GPUs, reclaims no more than that from its cohort, and the rest of its
    guarantee is lent or idle. One line per window, in policy order."""
    out = []
    for name, team in spec.teams.items():
        nominal = team.nominal_gpus
        for i, w in enumerate(team.windows):
            if nominal is not None and w.max_gpus is not None and w.max_gpus < _total(nominal):
                gpus = f"{w.max_gpus} GPU" + "s" * (w.max_gpus != 1)
                out.append(f"teams.{name}.windows[{i}].max_gpus={w.max_gpus} is below the team's nominal_gpus "
                           f"({_total(nominal)}): in that window it holds at most {gpus}, the rest of its guarantee "
                           "is lent or idle")
    return out


#: fields that count GPUs or jobs (``limits.MAX_COUNT``), in every section that has them
_COUNT_FIELDS = frozenset({"max_gpus", "max_gpus_per_user", "max_running_jobs", "max_running_jobs_per_user",
                           "reserved_gpus", "nominal_gpus", "borrowing_limit", "lending_limit"})


def _refuse_huge_counts(spec: PolicySpec, source: str) -> None:
    """No GPU or job count above ``limits.MAX_COUNT`` in a policy that comes in (a count
    that large reads as "unlimited" in ``policy check`` and 1e+30 in ``/metrics``).
    Linear in the policy's size.

    Raises:
        PolicyError: naming the field (``teams.ml.windows[0].max_gpus``), the value and
        the maximum.
    """
    def walk(node: Any, path: str) -> None:
        if isinstance(node, BaseModel):
            for fname in type(node).model_fields:
                value = getattr(node, fname)
                alias = type(node).model_fields[fname].alias or fname
                at = f"{path}.{alias}" if path else alias
                if fname in _COUNT_FIELDS and value is not None:
                    counts = value.items() if isinstance(value, dict) else [(None, value)]
                    for key, v in counts:
                        if isinstance(v, int) and v > limits.MAX_COUNT:
                            raise PolicyError(source, at + (f"[{key}]" if key is not None else ""), v,
                                              f"at most {limits.MAX_COUNT:,} (gpushepherd.policy.limits.MAX_COUNT; "
                                              "omit the field for no limit)")
                else:
                    walk(value, at)
        elif isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{path}.{k}")
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")

    walk(spec, "")


def _loc_to_path(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The pydantic model that holds the field at ``loc`` (for 'allowed fields' lists)."""
    model: Any = PolicySpec
    for part in loc:
        if isinstance(part, int):
            continue
        if model is None:
            return None
        if isinstance(model, type) and issubclass(model, BaseModel):
            field = _fields_by_name(model).get(part)
            if field is None:
                return model
            model = _inner_model(field.annotation)
        elif isinstance(model, tuple) and model[0] == "dict":
            model = model[1]
    return None


def _fields_by_name(model: type[BaseModel]) -> dict:
    """A model's fields by the name a policy file writes: the alias where one is set
    (``priority.weights.class`` is the field ``class_``)."""
    return {(f.alias or name): f for name, f in model.model_fields.items()}


def _inner_model(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if origin is dict and len(args) == 2:
        return ("dict", _inner_model(args[1]))
    for arg in args:
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def _translate(exc: ValidationError, source: str) -> PolicyError:
    """The first error of ``exc`` as a ``PolicyError``; an unknown field first (a typo,
    ``replica`` for ``replicas``, also leaves its right name missing: the typo is the
    error to name), with the field it is closest to."""
    errors = exc.errors()
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = tuple(err["loc"])
    path = _loc_to_path(loc)
    value = err.get("input")
    if err["type"] == "extra_forbidden":
        parent = _model_at(loc)
        names = sorted(_fields_by_name(parent)) if parent is not None else []
        allowed = "unknown field; allowed fields here: " + ", ".join(names) if names else "unknown field"
        close = difflib.get_close_matches(str(loc[-1]), names, n=1)
        return PolicyError(source, path, loc[-1], allowed + (f" (did you mean {close[0]!r}?)" if close else ""))
    if err["type"] == "missing":
        return PolicyError(source, path, MISSING, "a value is required here")
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    return PolicyError(source, path, value, msg[0].lower() + msg[1:] if msg else "a valid value")


def expand_nodes(spec: PolicySpec, source: str = "<policy>") -> tuple[Node, ...]:
    """Node groups -> nodes, in file order. A group of ``count`` > 1 named ``gpu``
    becomes ``gpu-001 .. gpu-NNN`` (zero-padded to the count's width, at least 3)."""
    nodes: list[Node] = []
    for gi, group in enumerate(spec.cluster.nodes):
        width = max(3, len(str(group.count)))
        names = [group.name] if group.count == 1 else [f"{group.name}-{i:0{width}d}" for i in range(1, group.count + 1)]
        islands = tuple(tuple(sorted(i)) for i in group.nvlink_islands)
        labels = tuple(sorted(group.labels.items()))
        sharing = group.sharing
        mig = _mig_layouts(group, source, f"cluster.nodes[{gi}]")
        for name in names:
            nodes.append(Node(name=name, gpus=group.gpus, gpu_type=group.gpu_type, gpu_mem_mib=group.gpu_mem_mib,
                              pool=group.pool, labels=labels, nvlink_islands=islands,
                              gpu_uuids=tuple(group.gpu_uuids), driver=group.driver, cuda=group.cuda,
                              taints=tuple(sorted(group.taints)), cached=tuple(sorted(set(group.cached))),
                              fractions=sharing.fractions,
                              ts_replicas=sharing.time_slicing.replicas if sharing.time_slicing else 0,
                              mps_clients=sharing.mps.max_clients if sharing.mps else 0, mig=mig,
                              mps_mem_mib=(sharing.mps.max_memory_per_client_mib or 0) if sharing.mps else 0))
    return tuple(nodes)


def _mig_layouts(group, source: str, path: str) -> tuple:
    """``(gpu index, layout)`` for each GPU of ``group`` in MIG mode, validated against
    NVIDIA's profiles for the group's GPU type (``gpushepherd.model.mig``).

    Raises:
        PolicyError: a GPU type without MIG, an unknown profile, a layout that does not
            fit the GPU (naming the field and what is allowed).
    """
    out = []
    for key in sorted(group.mig, key=lambda k: int(k.lstrip("g"))):
        spec = group.mig[key]
        if not spec.enabled:
            continue
        where = f"{path}.mig.{key}.layout"
        if not spec.layout:
            raise PolicyError(source, where, [], "at least one MIG profile (a GPU in MIG mode with no instances "
                              "serves nobody; set enabled: false instead)")
        try:
            layout = layout_from_names(group.gpu_type, spec.layout)
        except MigError as exc:
            raise PolicyError(source, where, spec.layout, str(exc)) from None
        out.append((int(key.lstrip("g")), layout))
    return tuple(out)


def resolve_class(name: str, spec: ClassSpec | None) -> ClassRules:
    base = dict(STANDARD_CLASSES.get(name, {}))
    given = spec.model_dump(exclude_none=True) if spec is not None else {}
    if spec is not None and "idle_stop" in spec.model_fields_set and spec.idle_stop is None:
        given["idle_stop"] = None  # an explicit `idle_stop: null` turns the standard default off
    if "idle_stop" not in given and not given.get("preemptible", base.get("preemptible", True)):
        base.pop("idle_stop", None)  # a default never applies to a class made non-preemptible
    base.update(given)
    idle = base.get("idle_stop")
    return ClassRules(
        name=name,
        priority=int(base["priority"]),
        preemptible=bool(base.get("preemptible", True)),
        checkpointable=bool(base.get("checkpointable", False)),
        preempt_only_if_checkpointable=bool(base.get("preempt_only_if_checkpointable", False)),
        max_runtime_s=base.get("max_runtime_s"),
        default_time_limit_s=base.get("default_time_limit_s"),
        grace_period_s=float(base.get("grace_period_s", 0.0)),
        pools=tuple(base["pools"]) if base.get("pools") is not None else None,
        reserved_gpus=int(base.get("reserved_gpus", 0)),
        on_window_close=base.get("on_window_close") or "drain",
        sharing=tuple(base["sharing"]) if base.get("sharing") is not None else None,
        avoid=frozenset(base.get("avoid_nodes_with") or ()),
        idle_stop=IdleStop(float(idle["below_util_pct"]), float(idle["after_s"]), float(idle["setup_s"]))
        if idle is not None else None,
        memory_overrun=base.get("memory_overrun") or "warn",
        stop_signal=base.get("stop_signal") or "SIGTERM",
        strict_fifo=base.get("queueing") == "strict_fifo",
        require_island=bool(base.get("require_island", False)),
    )


def compile_rules(spec: PolicySpec, source: str = "<policy>", max_depth: int | None = None) -> Rules:
    """Check what the schema alone cannot (names that must exist, sums that must fit)
    and build the core's ``Rules``. ``max_depth``: the longest parent chain allowed
    (``None``: any without a cycle).

    Raises:
        PolicyError: duplicate node, unknown pool/class/parent team, a parent cycle,
            nominal or reserved GPUs that add up to more than their pool has.
    """
    nodes = expand_nodes(spec, source)
    seen: set[str] = set()
    for i, node in enumerate(nodes):
        if node.name in seen:
            raise PolicyError(source, f"cluster.nodes[{i}].name", node.name, "a node name used once only")
        seen.add(node.name)

    declared_pools = [p.name for p in spec.cluster.pools]
    pool_gpus: dict[str, int] = {}
    for node in nodes:
        pool_gpus[node.pool] = pool_gpus.get(node.pool, 0) + node.gpus
    known_pools = sorted(set(declared_pools) | set(pool_gpus))
    if declared_pools:
        for i, group in enumerate(spec.cluster.nodes):
            if group.pool not in declared_pools:
                raise PolicyError(source, f"cluster.nodes[{i}].pool", group.pool,
                                  "one of the pools in cluster.pools: " + ", ".join(declared_pools))
    total_gpus = sum(pool_gpus.values())
    if total_gpus > 1_000_000:
        raise PolicyError(source, "cluster.nodes", total_gpus, "at most 1,000,000 GPUs in all")

    classes: dict[str, ClassRules] = {}
    for name in STANDARD_CLASSES:
        classes[name] = resolve_class(name, spec.classes.get(name))
    for name, cls in spec.classes.items():
        if name in STANDARD_CLASSES:
            continue
        if cls.priority is None:
            raise PolicyError(source, f"classes.{name}.priority", MISSING,
                              "a priority (integer) for a class that is not one of the standard ones: "
                              + ", ".join(STANDARD_CLASSES))
        classes[name] = resolve_class(name, cls)
    if classes["production-inference"].preemptible:  # R1, R6: serving is never interrupted
        raise PolicyError(source, "classes.production-inference.preemptible", True,
                          "false (or unset): production inference is never preempted (requirements R1, R6); "
                          "put serving that may be preempted in a class of its own")
    for name, cls in classes.items():
        for pool in cls.pools or ():
            if pool not in known_pools:
                raise PolicyError(source, f"classes.{name}.pools", pool, "a pool of the cluster: " + ", ".join(known_pools))
        if cls.max_runtime_s and cls.default_time_limit_s and cls.default_time_limit_s > cls.max_runtime_s:
            raise PolicyError(source, f"classes.{name}.default_time_limit_s", cls.default_time_limit_s,
                              f"at most max_runtime_s ({cls.max_runtime_s})")
        if not cls.preemptible:
            # jobs that may not be preempted are never stopped for what they use (note 009)
            given = spec.classes.get(name)
            if cls.idle_stop is not None:
                raise PolicyError(source, f"classes.{name}.idle_stop", given.idle_stop.model_dump() if given else None,
                                  f"not set (null) on class {name}, whose jobs are not preemptible: they are never "
                                  "stopped for being idle (make the class preemptible, or drop idle_stop)")
            if cls.memory_overrun == "stop":
                raise PolicyError(source, f"classes.{name}.memory_overrun", "stop",
                                  f"'warn' on class {name}, whose jobs are not preemptible: they are never stopped "
                                  "for their GPU memory (make the class preemptible, or use warn)")
    avoid: dict[str, set[str]] = {name: set() for name in classes}
    for name, cls in classes.items():
        for other in sorted(cls.avoid):
            if other not in classes:
                raise PolicyError(source, f"classes.{name}.avoid_nodes_with", other,
                                  "a workload class: " + ", ".join(sorted(classes)))
            avoid[name].add(other)
            avoid[other].add(name)
    classes = {name: replace(cls, avoid=frozenset(avoid[name])) for name, cls in classes.items()}
    reserved_total = sum(c.reserved_gpus for c in classes.values())
    if reserved_total > total_gpus:
        raise PolicyError(source, "classes.*.reserved_gpus", reserved_total,
                          f"reserved GPUs that add up to at most the cluster's {total_gpus} GPUs")

    gpu_types = tuple(dict.fromkeys(n.gpu_type for n in nodes))
    type_gpus = {t: sum(n.gpus for n in nodes if n.gpu_type == t) for t in gpu_types}
    _check_gpu_types(spec, gpu_types, source)
    teams: dict[str, str | None] = {}
    for name, team in spec.teams.items():
        _check_nominal_within_max(name, team, source)
        if team.parent is not None and team.parent not in spec.teams:
            raise PolicyError(source, f"teams.{name}.parent", team.parent,
                              "a team defined under teams: " + ", ".join(sorted(spec.teams)))
        for cname in team.classes:
            if cname not in classes:
                raise PolicyError(source, f"teams.{name}.classes.{cname}", cname,
                                  "a workload class: " + ", ".join(sorted(classes)))
        for k, cname in enumerate(team.allowed_classes or ()):
            if cname not in classes:
                raise PolicyError(source, f"teams.{name}.allowed_classes[{k}]", cname,
                                  "a workload class: " + ", ".join(sorted(classes)))
        teams[name] = team.parent
    _check_chains(teams, spec, source, max_depth)

    # Guaranteed (nominal) GPUs must exist: top-level teams share the cluster, children
    # share their parent's nominal quota.
    # (per GPU type: the sum over its types; note 038)
    nominal = {n: _total(t.nominal_gpus) for n, t in spec.teams.items() if t.nominal_gpus is not None}
    top_sum = sum(v for n, v in nominal.items() if teams[n] is None) + reserved_total
    if top_sum > total_gpus:
        raise PolicyError(source, "teams.*.nominal_gpus", top_sum,
                          f"guaranteed GPUs (nominal_gpus of top-level teams plus reserved_gpus of classes) "
                          f"that add up to at most the cluster's {total_gpus} GPUs")
    for gt in gpu_types:
        typed_sum = sum(t.nominal_gpus.get(gt, 0) for n, t in spec.teams.items()
                        if teams[n] is None and isinstance(t.nominal_gpus, dict))
        if typed_sum > type_gpus[gt]:
            raise PolicyError(source, f"teams.*.nominal_gpus[{gt}]", typed_sum,
                              f"nominal GPUs of type {gt} of top-level teams that add up to at most the cluster's "
                              f"{type_gpus[gt]} {gt} GPUs")
    kids_nominal: dict[str, int] = {}  # parent -> the sum of its children's nominal_gpus (one pass)
    for n, parent in teams.items():
        if parent is not None and n in nominal:
            kids_nominal[parent] = kids_nominal.get(parent, 0) + nominal[n]
    for parent, total in kids_nominal.items():
        cap = spec.teams[parent].nominal_gpus
        if cap is not None and total > _total(cap):
            raise PolicyError(source, f"teams.{parent}.nominal_gpus", cap,
                              f"at least the sum of its child teams' nominal_gpus ({total})")

    try:
        clock = Clock.starting(spec.clock.timezone, spec.clock.start)
    except (ValueError, KeyError, OSError) as exc:
        field = "clock.start" if spec.clock.start and "zone" not in str(exc).lower() else "clock.timezone"
        value = spec.clock.start if field == "clock.start" else spec.clock.timezone
        raise PolicyError(source, field, value, "an IANA time zone such as Europe/Berlin (clock.timezone) and an "
                          "ISO 8601 local time such as 2026-11-30T08:00:00 (clock.start)") from None

    limits = _limits(spec, source)
    cohorts = _cohorts(spec, teams, nominal, limits, source, pool_gpus, [c.pools for c in classes.values()], nodes)

    if spec.default_team is not None and spec.teams and spec.default_team not in spec.teams:
        raise PolicyError(source, "default_team", spec.default_team, "a team defined under teams")
    pricing = _pricing(spec, nodes, source)

    return Rules(
        nodes=nodes,
        classes=classes,
        teams=teams,
        nominal_gpus={n: v for n, v in nominal.items()},
        shares={n: t.shares for n, t in spec.teams.items() if t.shares is not None},
        limits=tuple(limits),
        cohorts=cohorts,
        prediction=PredictionRules(enabled=spec.prediction.enabled, quantile=spec.prediction.quantile,
                                   history=spec.prediction.history, min_jobs=spec.prediction.min_jobs),
        preemption_enabled=spec.preemption.enabled,
        preemption_min_runtime_s=spec.preemption.min_runtime_s,
        backfill_enabled=spec.backfill.enabled,
        backfill_reservations=spec.backfill.reservations,
        backfill_max_job_test=spec.backfill.max_job_test,
        mig_reconfigure=spec.mig.reconfigure,
        mig_reconfigure_delay_s=spec.mig.delay_s,
        default_team=spec.default_team,
        clock=clock,
        priority=PriorityRules(
            class_weight=spec.priority.weights.class_,
            fair_share_weight=spec.priority.weights.fair_share,
            age_weight=spec.priority.weights.age,
            size_weight=spec.priority.weights.size,
            max_age_s=spec.priority.max_age_s,
            time_limit_weight=spec.priority.weights.time_limit,
            max_time_limit_s=spec.priority.max_time_limit_s,
            recalc_s=spec.priority.recalc_s,
            half_life_s=spec.fair_share.half_life_s,
            fair_share_level=spec.fair_share.level,
            deadline_weight=spec.priority.weights.deadline,
            deadline_horizon_s=spec.priority.deadline_horizon_s,
            top_class_tier=spec.priority.top_class_tier,
            age_tier_s=spec.priority.age_tier_s,
            age_tier_jobs=spec.priority.age_tier_jobs,
        ),
        pricing=pricing,
        allowed_classes={n: tuple(dict.fromkeys(t.allowed_classes)) for n, t in spec.teams.items()
                         if t.allowed_classes is not None},
        strict_queues=frozenset((name, cname) for name, team in spec.teams.items()
                                for cname, lim in team.classes.items() if lim.queueing == "strict_fifo"),
        within_team=frozenset(name for name, team in spec.teams.items()
                              if team.preemption.within_team == "lower_priority"),
        gpu_types=gpu_types,
        typed=any(lim.gpu_type is not None for lim in limits),
        nominal_by_type={n: tuple(t.nominal_gpus.items()) for n, t in spec.teams.items()
                         if isinstance(t.nominal_gpus, dict)},
    )


def _pricing(spec: PolicySpec, nodes: tuple[Node, ...], source: str) -> Pricing | None:
    """The price table, every GPU type of the cluster priced (note 010).

    Raises:
        PolicyError: a named type that no node has, or a node type without a price and
            no ``default``.
    """
    if spec.pricing is None:
        return None
    types = sorted({n.gpu_type for n in nodes})
    given = spec.pricing.gpu_hour
    for name in sorted(given):
        if name != "default" and name not in types:
            raise PolicyError(source, f"pricing.gpu_hour.{name}", name,
                              "a GPU type of the cluster (" + ", ".join(types) + ") or default")
    if "default" not in given:
        missing = [t for t in types if t not in given]
        if missing:
            raise PolicyError(source, "pricing.gpu_hour", dict(given),
                              f"a price for every GPU type of the cluster: add {', '.join(missing)} or a default")
    return Pricing(currency=spec.pricing.currency,
                   gpu_hour=tuple(sorted((k, float(v)) for k, v in given.items() if k != "default")),
                   default=float(given["default"]) if "default" in given else None)


def _window(w: WindowSpec) -> Window:
    def secs(hhmm: str) -> float:
        h, m = hhmm.split(":")
        return int(h) * 3600.0 + int(m) * 60.0

    days = frozenset(WEEKDAYS.index(d) for d in w.days) if w.days else frozenset(range(7))
    label = w.name or (f"{w.from_}-{w.to}" + (f"/{'+'.join(w.days)}" if w.days else ""))
    return Window(label, days, secs(w.from_), secs(w.to))


#: limit fields that windows may change: (field, unit, per user)
_WINDOWED = {"max_gpus": (LimitUnit.GPUS, False), "max_gpus_per_user": (LimitUnit.GPUS, True),
             "max_running_jobs": (LimitUnit.JOBS, False), "max_running_jobs_per_user": (LimitUnit.JOBS, True)}


def _windowed_limits(prefix: str, holder, fields: tuple[str, ...], **scope) -> list[Limit]:
    """A class's or team's limits, with the windows that change each (a limit set only
    inside windows is unlimited outside them)."""
    out = []
    windows = [(_window(w), w) for w in holder.windows]
    for field in fields:
        base = getattr(holder, field, None)
        wins = tuple((win, getattr(w, field)) for win, w in windows if getattr(w, field) is not None)
        if base is None and not wins:
            continue
        unit, per_user = _WINDOWED[field]
        out.append(Limit(f"{prefix}.{field}", UNLIMITED if base is None else base, unit, per_user=per_user,
                         windows=wins, **scope))
    return out


def _limits(spec: PolicySpec, source: str) -> list[Limit]:
    out: list[Limit] = []
    for name, cls in sorted(spec.classes.items()):
        out += _windowed_limits(f"classes.{name}", cls, ("max_gpus", "max_gpus_per_user", "max_running_jobs_per_user"),
                                workload_class=name)
        unused = [f for w in cls.windows for f in WINDOW_FIELDS if getattr(w, f) is not None and f == "max_running_jobs"]
        if unused:
            raise PolicyError(source, f"classes.{name}.windows", "max_running_jobs",
                              "max_gpus, max_gpus_per_user or max_running_jobs_per_user (classes count jobs per user)")
    for name, team in sorted(spec.teams.items()):
        if isinstance(team.max_gpus, dict):  # per GPU type (note 038): windows change the other limits
            if any(w.max_gpus is not None for w in team.windows):
                raise PolicyError(source, f"teams.{name}.windows", "max_gpus",
                                  f"no max_gpus in windows of a team whose max_gpus is per GPU type "
                                  f"({dict(team.max_gpus)}); allowed: " + ", ".join(WINDOW_FIELDS[1:]))
            out += _windowed_limits(f"teams.{name}", team, WINDOW_FIELDS[1:], team=name)
            out += [Limit(f"teams.{name}.max_gpus[{gt}]", v, team=name, gpu_type=gt)
                    for gt, v in team.max_gpus.items()]
        else:
            out += _windowed_limits(f"teams.{name}", team, WINDOW_FIELDS, team=name)
        # the team's class limits, whatever its max_gpus (a per-type one once left them out)
        for cname, lim in sorted(team.classes.items()):
            if lim.max_gpus is not None:
                out.append(Limit(f"teams.{name}.classes.{cname}.max_gpus", lim.max_gpus, team=name, workload_class=cname))
            if lim.max_running_jobs is not None:
                out.append(Limit(f"teams.{name}.classes.{cname}.max_running_jobs", lim.max_running_jobs,
                                 LimitUnit.JOBS, team=name, workload_class=cname))
    return out


#: at most this many members of a cohort may keep part of their nominal quota from
#: lending (each subset of them is one compiled limit)
MAX_GUARDED = 8


def _cohorts(spec: PolicySpec, teams: dict[str, str | None], nominal: dict[str, int],
             limits: list[Limit], source: str, pool_gpus: dict[str, int] | None = None,
             class_pools: list | None = None, nodes: tuple[Node, ...] = ()) -> dict[str, Cohort]:
    """Check the cohorts and compile them into limits (appended to ``limits``).

    A member T may hold at most ``nominal + borrowing_limit`` (a limit that also counts
    all of T's GPUs for reclaim). The cohort's rule ``sum of max(usage_m, guard_m) <= C``
    (``guard = nominal - lending_limit``, ``C`` the sum of nominal quotas) becomes, for
    every subset S of the guarded members, ``usage of the members outside S <= C - guard
    of S`` (design note 005). A cohort with a ``pool`` counts only the jobs whose class
    may run in that pool alone; a team is in at most one cohort per pool (and one
    without a pool). A cohort of per-GPU-type quotas (note 038) compiles the same per
    type, into one ``Cohort`` per type (``name[type]``) whose limits count only jobs
    placed on that type; its capacity per type is the type's GPUs on the cohort's nodes
    less other top-level teams' nominal GPUs of the type (at least the members' sum)."""
    pool_gpus = pool_gpus or {}
    where: dict[tuple[str, str | None], str] = {}
    quota: dict[str, list[tuple[str, Any, Any, Any]]] = {}
    typed: dict[str, bool] = {}
    gpu_types = tuple(dict.fromkeys(n.gpu_type for n in nodes))
    for cname, co in sorted(spec.cohorts.items()):
        if co.pool is not None and co.pool not in pool_gpus:
            raise PolicyError(source, f"cohorts.{cname}.pool", co.pool, "a pool of the cluster: " + ", ".join(sorted(pool_gpus)))
        rows = []
        given = []  # (field path, value) of each member's quota fields, for the typed/untyped check
        for k, entry in enumerate(co.members):
            field = f"cohorts.{cname}.members[{k}]"
            team = entry.team
            if team not in spec.teams:
                raise PolicyError(source, field, team, "a team defined under teams: " + ", ".join(sorted(spec.teams)))
            if (team, co.pool) in where:
                scope = f"pool {co.pool}" if co.pool else "all pools"
                raise PolicyError(source, field, team,
                                  f"a team in one cohort per pool only (it is in {where[(team, co.pool)]} for {scope})")
            where[(team, co.pool)] = cname
            t = spec.teams[team]
            # the entry's own quota fields, else the team's
            row = [team]
            for fld in ("nominal_gpus", "borrowing_limit", "lending_limit"):
                own = getattr(entry, fld)
                value = own if own is not None else getattr(t, fld)
                row.append(value)
                if value is not None:
                    given.append((f"{field}.{fld}" if own is not None else f"teams.{team}.{fld}", value))
            rows.append(tuple(row))
        typed[cname] = any(isinstance(v, dict) for _f, v in given)
        if typed[cname]:
            scalar = next(((f, v) for f, v in given if not isinstance(v, dict)), None)
            if scalar is not None:
                raise PolicyError(source, scalar[0], scalar[1],
                                  f"a mapping GPU type -> GPUs, as the other members of cohort {cname} give theirs "
                                  "(a cohort's quotas are all per GPU type or all in GPUs of every type)")
        for k, (team, nom, _bl, ll) in enumerate(rows):
            lfield = (f"cohorts.{cname}.members[{k}].lending_limit" if co.members[k].lending_limit is not None
                      else f"teams.{team}.lending_limit")
            if ll is None:
                continue
            if typed[cname]:
                for gt, v in ll.items():
                    if v > (nom or {}).get(gt, 0):
                        raise PolicyError(source, f"{lfield}[{gt}]", v, f"at most the team's nominal_gpus of "
                                          f"{gt} in the cohort ({(nom or {}).get(gt, 0)})")
            elif ll > (nom if nom is not None else 0):
                raise PolicyError(source, lfield, ll, "at most the team's nominal_gpus in the cohort "
                                  f"({nom if nom is not None else 0})")
        members = [r[0] for r in rows]
        member_set = set(members)
        for team in members:  # chains are at most MAX_TEAM_DEPTH long: linear in the members
            other = next((a for a in _chain(teams, team) if a in member_set), None)
            if other is not None:
                raise PolicyError(source, f"cohorts.{cname}.members", team,
                                  f"teams that are not each other's parents ({other} is an ancestor of {team})")
        have = pool_gpus[co.pool] if co.pool is not None else sum(pool_gpus.values())
        where_ = f"pool {co.pool}'s" if co.pool is not None else "the cluster's"
        noms = [_total(r[1]) for r in rows]
        if sum(noms) > have:
            raise PolicyError(source, f"cohorts.{cname}.members", sum(noms),
                              f"nominal GPUs that add up to at most {where_} {have} GPUs")
        for k, (team, nom, _bl, _ll) in enumerate(rows):
            cap = spec.teams[team].max_gpus
            if isinstance(cap, int) and noms[k] > cap:
                raise PolicyError(source, f"cohorts.{cname}.members[{k}].nominal_gpus", nom,
                                  f"at most team {team}'s max_gpus ({cap})")
        if co.pool is not None and class_pools is not None and not any(
                p is not None and set(p) <= {co.pool} for p in class_pools):
            raise PolicyError(source, f"cohorts.{cname}.pool", co.pool,
                              "a pool some class is confined to (classes.X.pools: [" + co.pool + "]); "
                              "otherwise the cohort counts no job")
        quota[cname] = rows
    in_cohort = {team for team, _pool in where}
    for name, team in sorted(spec.teams.items()):
        for fld in ("borrowing_limit", "lending_limit"):
            if getattr(team, fld) is not None and name not in in_cohort:
                raise PolicyError(source, f"teams.{name}.{fld}", getattr(team, fld),
                                  "set only for a team that is a member of a cohort (cohorts.<name>.members)")
    out: dict[str, Cohort] = {}
    for cname, co in sorted(spec.cohorts.items()):
        pools = None if co.pool is None else (co.pool,)
        if not typed[cname]:
            rows = [(team, nom if nom is not None else 0, bl, ll) for team, nom, bl, ll in quota[cname]]
            out[cname] = _compile_cohort(cname, co, rows, pools, None, None, limits, source)
            continue
        scope = [n for n in nodes if co.pool is None or n.pool == co.pool]
        members = {r[0] for r in quota[cname]}
        named = {gt for row in quota[cname] for v in row[1:] if v for gt in v}
        for gt in (g for g in gpu_types if g in named):  # a type no member names is outside the cohort
            rows = [(team, (nom or {}).get(gt, 0), (bl or {}).get(gt), (ll or {}).get(gt))
                    for team, nom, bl, ll in quota[cname]]
            # the type's GPUs the cohort counts, less what other top-level teams are guaranteed of it
            others = sum(t.nominal_gpus.get(gt, 0) for n, t in spec.teams.items()
                         if teams[n] is None and isinstance(t.nominal_gpus, dict) and n not in members
                         and not any(n in _chain(teams, m) for m in members))
            have = sum(n.gpus for n in scope if n.gpu_type == gt)
            capacity = max(sum(r[1] for r in rows), have - others)
            out[f"{cname}[{gt}]"] = _compile_cohort(cname, co, rows, pools, gt, capacity, limits, source)
    return out


def _compile_cohort(cname: str, co, rows: list, pools, gpu_type: str | None, capacity: int | None,
                    limits: list[Limit], source: str) -> Cohort:
    """One cohort's limits (appended to ``limits``) from its members' ``(team, nominal,
    borrowing limit, lending limit)`` in GPUs (of ``gpu_type`` only, when given: paths
    name it, ``cohorts.c[H100-80GB]``); ``capacity`` ``None``: the members' sum."""
    tag = f"[{gpu_type}]" if gpu_type is not None else ""
    members = []
    guards = {}
    for team, nom, bl, ll in rows:
        idx = len(limits)
        cap = UNLIMITED if bl is None else nom + bl
        path = f"teams.{team}.borrowing_limit" if co.pool is None else f"cohorts.{cname}.{team}.borrowing_limit"
        limits.append(Limit(path + tag, cap, team=team, pools=pools, covers_reserved=True, gpu_type=gpu_type))
        members.append(CohortMember(team, nom, idx))
        # work that may not be preempted could never be reclaimed: it never borrows
        prefix = f"teams.{team}" if co.pool is None else f"cohorts.{cname}.{team}"
        limits.append(Limit(f"{prefix}.nominal_gpus{tag}(not preemptible)", nom, team=team, pools=pools,
                            unevictable_only=True, covers_reserved=True, gpu_type=gpu_type))
        if ll is not None and ll < nom:
            guards[team] = nom - ll
    if capacity is None:
        capacity = sum(m.nominal for m in members)
    if len(guards) > MAX_GUARDED:
        raise PolicyError(source, f"cohorts.{cname}.members", len(guards),
                          f"at most {MAX_GUARDED} members with a lending_limit below their nominal_gpus")
    guarded = sorted(guards)
    for bits in range(1 << len(guarded)):
        subset = [g for j, g in enumerate(guarded) if bits >> j & 1]
        outside = tuple(m.team for m in members if m.team not in subset)
        if not outside:
            continue
        cap = capacity - sum(guards[g] for g in subset)
        path = f"cohorts.{cname}{tag}" + (f"(keeping {'+'.join(subset)} lending_limit)" if subset else "")
        limits.append(Limit(path, cap, members=outside, cohort=cname, pools=pools, covers_reserved=True,
                            gpu_type=gpu_type))
    return Cohort(cname, tuple(members), co.reclaim, pools, gpu_type)


def _total(value) -> int:
    """GPUs of a quota field: the number, or the sum over its GPU types (``None``: 0)."""
    if value is None:
        return 0
    return sum(value.values()) if isinstance(value, dict) else value


_GPU_QUOTA_FIELDS = ("nominal_gpus", "max_gpus", "borrowing_limit", "lending_limit")


def _check_gpu_types(spec: PolicySpec, gpu_types: tuple[str, ...], source: str) -> None:
    """Every GPU type a per-type quota names is one some node has (note 038).

    Raises:
        PolicyError: naming the field (``teams.ml.max_gpus[H100-80GB]``), the type and
            the cluster's types."""
    known = set(gpu_types)
    places = [(f"teams.{n}", t, _GPU_QUOTA_FIELDS) for n, t in spec.teams.items()]
    places += [(f"cohorts.{c}.members[{k}]", m, ("nominal_gpus", "borrowing_limit", "lending_limit"))
               for c, co in spec.cohorts.items() for k, m in enumerate(co.members)]
    for prefix, holder, fields in places:
        for fld in fields:
            value = getattr(holder, fld)
            if isinstance(value, dict):
                for gt in value:
                    if gt not in known:
                        raise PolicyError(source, f"{prefix}.{fld}[{gt}]", gt,
                                          "a GPU type of the cluster's nodes: " + ", ".join(sorted(known)))


def _check_nominal_within_max(name: str, team, source: str) -> None:
    """``nominal_gpus`` at most ``max_gpus``: per type where both are per type, in all
    where both are numbers or the nominal per type and the cap a number.

    Raises:
        PolicyError: on ``teams.<name>.nominal_gpus`` (``[type]`` for a type)."""
    nom, cap = team.nominal_gpus, team.max_gpus
    if nom is None or cap is None:
        return
    if isinstance(nom, dict) and isinstance(cap, dict):
        for gt, v in nom.items():
            if gt in cap and v > cap[gt]:
                raise PolicyError(source, f"teams.{name}.nominal_gpus[{gt}]", v,
                                  f"at most the team's max_gpus[{gt}] ({cap[gt]})")
    elif isinstance(cap, int) and _total(nom) > cap:
        raise PolicyError(source, f"teams.{name}.nominal_gpus", nom, f"at most the team's max_gpus ({cap})")


def _check_chains(teams: dict[str, str | None], spec: PolicySpec, source: str, max_depth: int | None) -> None:
    """Every parent chain ends (no cycle), within ``max_depth`` teams when given; each
    team is walked once (depths memoised): linear in the teams.

    Raises:
        PolicyError: on ``teams.T.parent``: a cycle, or a chain too deep.
    """
    depth: dict[str, int] = {}
    for name in teams:
        path, cur = [], name
        on_path: set[str] = set()
        while cur is not None and cur not in depth:
            if cur in on_path:
                raise PolicyError(source, f"teams.{cur}.parent", spec.teams[cur].parent, "a parent chain without cycles")
            on_path.add(cur)
            path.append(cur)
            cur = teams[cur]
        d = depth[cur] if cur is not None else 0
        for t in reversed(path):
            d += 1
            depth[t] = d
            if max_depth is not None and d > max_depth:
                raise PolicyError(source, f"teams.{t}.parent", spec.teams[t].parent,
                                  f"a parent chain of at most {max_depth} teams (gpushepherd.policy.limits)")


def _chain(teams: dict[str, str | None], team: str) -> list[str]:
    chain, cur = [], teams.get(team)
    while cur is not None and cur not in chain:
        chain.append(cur)
        cur = teams.get(cur)
    return chain
