"""The policy file's reference, ``docs/policy.md``, generated from the pydantic schema
(``gpushepherd.policy.schema``, design note 026): every field of every section with its
YAML path, type and bounds (from the JSON schema pydantic derives), default, unit,
meaning and an example (the fields' ``description`` / ``examples``), the standard
workload classes (``STANDARD_CLASSES``) and worked examples, each a whole policy that
``policy check`` accepts.

``shepherd policy reference`` prints it; ``tests/test_policy_reference.py`` fails when
``docs/policy.md`` is not what it prints.
"""

from __future__ import annotations

import types
import typing
from typing import Any

import yaml
from pydantic import BaseModel

from gpushepherd.policy.load import STANDARD_CLASSES
from gpushepherd.policy.schema import DEFAULT_ORDER, PolicySpec

#: how to regenerate the file (the stale-file test says it)
COMMAND = "shepherd policy reference > docs/policy.md"

#: placeholders for mapping keys, by (section model, field)
_KEYS = {("PolicySpec", "classes"): "<class>", ("PolicySpec", "teams"): "<team>",
         ("PolicySpec", "cohorts"): "<cohort>", ("TeamSpec", "classes"): "<class>",
         ("NodeGroupSpec", "mig"): "<gpu>"}

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"
#: JSON-schema patterns of the schema, in words
_PATTERNS = {
    NAME_PATTERN: "a [name](#names)",
    r"^([01][0-9]|2[0-3]):[0-5][0-9]$|^24:00$": "a local time `HH:MM` (`00:00` to `24:00`)",
    r"^(\d+(\.\d+)*)?$": "a dotted version such as `535.104.05`, or ''",
    r"^[A-Za-z0-9][^\s]*$": "`key=value[:Effect]` or `key`, no spaces",
    r"^g?[0-9]+$": "a GPU index: `0`, `g0`",
}

#: worked examples: (title, what it shows, a whole policy); the tests compile each one
EXAMPLES: list[tuple[str, str, dict[str, Any]]] = [
    ("Requirement R4: one 8-GPU server shared by a small team",
     "Production inference keeps 2 GPUs reserved and comes first in the queue (a hard tier); the other classes "
     "are ordered by shortest time limit with age lifting any job that waits (the bundled default order, design "
     "note 045); training holds at most 4; batch at most 2 by day and 6 at night "
     "and at weekends, checkpointed and stopped when the day starts; sandbox 1 GPU per user for at most 8 hours.",
     {"name": "small-team", "clock": {"timezone": "Europe/Berlin"},
      "cluster": {"nodes": [{"name": "gpu-server-1", "gpus": 8, "gpu_type": "H100-80GB", "gpu_mem_mib": 81920,
                             "nvlink_islands": [[0, 1, 2, 3], [4, 5, 6, 7]]}]},
      "classes": {"production-inference": {"reserved_gpus": 2},
                  "training": {"max_gpus": 4, "grace_period_s": 120},
                  "batch": {"max_gpus": 2, "grace_period_s": 60, "on_window_close": "checkpoint-and-stop",
                            "windows": [{"name": "night", "from": "20:00", "to": "08:00", "max_gpus": 6},
                                        {"name": "weekend", "days": ["sat", "sun"], "max_gpus": 6}]},
                  "sandbox": {"max_gpus_per_user": 1, "max_runtime_s": 28800}},
      "teams": {"ml-platform": {}, "research": {"nominal_gpus": 4, "max_gpus": 6},
                "data": {"nominal_gpus": 2, "max_gpus": 4}},
      "preemption": {"enabled": True, "min_runtime_s": 300}, "backfill": {"enabled": True},
      "priority": DEFAULT_ORDER}),
    ("Cohorts: teams lend each other idle quota (Kueue)",
     "`ml` and `vision` are guaranteed 4 GPUs each of the training pool and may borrow what the other does not "
     "use; `vision` lends at most 2 of its 4 and `ml` borrows at most 2. A member that needs its nominal quota "
     "back preempts borrowers of lower classes only. Hierarchy: `ml` and `vision` are children of `research`, "
     "whose limit of 8 GPUs they share.",
     {"cluster": {"pools": [{"name": "training"}, {"name": "inference"}],
                  "nodes": [{"name": "train", "count": 2, "gpus": 4, "pool": "training"},
                            {"name": "infer", "gpus": 4, "pool": "inference"}]},
      "classes": {"training": {"pools": ["training"], "checkpointable": True},
                  "research-training": {"pools": ["training"]},
                  "production-inference": {"pools": ["inference"]}},
      "teams": {"research": {"nominal_gpus": 8, "max_gpus": 8},
                "ml": {"parent": "research", "nominal_gpus": 4, "borrowing_limit": 2},
                "vision": {"parent": "research", "nominal_gpus": 4, "lending_limit": 2},
                "serving": {}},
      "cohorts": {"research-pool": {"members": ["ml", "vision"], "pool": "training",
                                    "reclaim": "lower_priority"}}}),
    ("Quotas per GPU type (Kueue's ResourceFlavor quotas)",
     "`ml` may hold 2 H100s and 8 A100s; a job that may run on either type tries the H100s first (the order the "
     "nodes name the types) and, refused there by `ml`'s H100 quota, starts on A100s, charged there. In cohort "
     "`labs`, `cv` and `nlp` are guaranteed 2 H100s each; the cohort's H100 capacity is the 8 H100s less `ops`' "
     "2, so 2 H100s are guaranteed to no member and either may borrow them (`nlp` at most 3 beyond its 2). A "
     "member under its H100 nominal quota reclaims H100s, never A100s. A plain number still means every type.",
     {"cluster": {"nodes": [{"name": "h100", "gpus": 8, "gpu_type": "H100-80GB"},
                            {"name": "a100", "count": 2, "gpus": 8, "gpu_type": "A100-80GB"}]},
      "teams": {"ml": {"max_gpus": {"H100-80GB": 2, "A100-80GB": 8}},
                "ops": {"nominal_gpus": {"H100-80GB": 2}, "max_gpus": 4},
                "cv": {"nominal_gpus": {"H100-80GB": 2}, "lending_limit": {"H100-80GB": 1}},
                "nlp": {"nominal_gpus": {"H100-80GB": 2, "A100-80GB": 4}, "borrowing_limit": {"H100-80GB": 3}}},
      "cohorts": {"labs": {"members": ["cv", "nlp"], "reclaim": "any"}}}),
    ("Sharing: MIG, MPS and time-slicing",
     "GPU 0 of `a100` is split into MIG instances; its other GPUs take fractions and MPS clients; `l40s` offers "
     "4 time-sliced replicas per GPU. Production inference takes whole GPUs or MIG instances only, sandbox "
     "time-slices or MIG instances, idle notebooks stop after 30 minutes; the core may re-partition an idle MIG "
     "GPU for pending jobs.",
     {"cluster": {"nodes": [
         {"name": "a100", "gpus": 4, "gpu_type": "A100-80GB", "gpu_mem_mib": 81920,
          "mig": {"g0": {"layout": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]}},
          "sharing": {"fractions": True, "mps": {"max_clients": 8}}},
         {"name": "l40s", "gpus": 2, "gpu_type": "L40S", "gpu_mem_mib": 46068,
          "sharing": {"fractions": False, "time_slicing": {"replicas": 4}}}]},
      "classes": {"production-inference": {"sharing": ["whole", "mig"]},
                  "sandbox": {"sharing": ["time_slice", "mig"], "memory_overrun": "stop",
                              "idle_stop": {"below_util_pct": 5, "after_s": 1800, "setup_s": 300}}},
      "mig": {"reconfigure": True, "delay_s": 60}}),
    ("Pools and taints: keep experiments off the inference nodes",
     "The inference node is tainted; only production inference, confined to the `inference` pool, runs there "
     "(its jobs tolerate the taint). Sandbox jobs never start next to production inference (anti-affinity).",
     {"cluster": {"pools": [{"name": "inference", "description": "latency-critical serving"},
                            {"name": "shared"}],
                  "nodes": [{"name": "infer-1", "gpus": 8, "pool": "inference", "gpu_type": "H100-80GB",
                             "taints": ["dedicated=inference:NoSchedule"], "labels": {"zone": "a"}},
                            {"name": "work", "count": 4, "gpus": 8, "pool": "shared", "gpu_type": "A100-80GB",
                             "driver": "535.104.05", "cached": ["llama-70b"]}]},
      "classes": {"production-inference": {"pools": ["inference"], "reserved_gpus": 4},
                  "sandbox": {"pools": ["shared"], "avoid_nodes_with": ["production-inference"],
                              "max_gpus_per_user": 1}}}),
    ("Priority, fair-share, preemption and backfill (Slurm's multifactor)",
     "Class first, then fair-share (usage halving every 7 days, per user inside teams), then age; a running job "
     "is not preempted in its first 10 minutes; the two top blocked jobs get reservations that later jobs may not "
     "delay; runtimes are predicted from each user's completed jobs.",
     {"cluster": {"nodes": [{"name": "node", "count": 4, "gpus": 8}]},
      "teams": {"a": {"shares": 2}, "b": {"shares": 1, "max_running_jobs_per_user": 4}},
      "priority": {"weights": {"class": 1000000, "fair_share": 10000, "age": 1000, "time_limit": 500},
                   "max_age_s": 86400, "recalc_s": 300},
      "fair_share": {"half_life_s": 604800, "level": "user"},
      "preemption": {"enabled": True, "min_runtime_s": 600},
      "backfill": {"enabled": True, "reservations": 2, "max_job_test": 1000},
      "prediction": {"enabled": True, "quantile": 0.9, "history": 20, "min_jobs": 3},
      "pricing": {"currency": "EUR", "gpu_hour": {"default": 1.2}}}),
]


def sections(root: type[BaseModel] = PolicySpec) -> list[tuple[type[BaseModel], list[str]]]:
    """Every model of the schema with the YAML paths it appears at, in the order a
    depth-first walk of ``root``'s fields meets them."""
    found: dict[type[BaseModel], list[str]] = {}

    def walk(model: type[BaseModel], path: str) -> None:
        first = model not in found
        found.setdefault(model, [])
        if path not in found[model]:
            found[model].append(path)
        if not first:
            return
        for name, f in model.model_fields.items():
            key = f.alias or name
            for child, suffix in _children(f.annotation, _KEYS.get((model.__name__, key), "<key>")):
                walk(child, f"{path}.{key}{suffix}" if path else f"{key}{suffix}")

    walk(root, "")
    return list(found.items())


def _children(annotation: Any, key: str) -> list[tuple[type[BaseModel], str]]:
    """The models inside a field's type, with the path suffix that reaches them: ''
    (the field itself), ``[]`` (a list's items) or ``.<key>`` (a mapping's values)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(annotation, "")]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _children(args[0], key)
    if origin in (typing.Union, types.UnionType):
        return [c for a in args for c in _children(a, key)]
    if origin is list:
        return [(m, "[]" + s) for m, s in _children(args[0], key)]
    if origin is dict:
        return [(m, f".{key}" + s) for m, s in _children(args[1], key)]
    return []


def _anchor(model: type[BaseModel]) -> str:
    return model.__name__.lower()


def _num(v: Any) -> str:
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def _type(p: dict[str, Any]) -> str:
    """A JSON-schema fragment in words: type, bounds, pattern, enum, model links."""
    if "$ref" in p:
        name = p["$ref"].rsplit("/", 1)[-1]
        return f"a mapping: [{name}](#{name.lower()})"
    if "anyOf" in p:
        parts = [x for x in p["anyOf"] if x.get("type") != "null"]
        text = " or ".join(_type(x) for x in parts)
        return text + (", or `null`" if len(parts) < len(p["anyOf"]) else "")
    if "enum" in p:
        return "one of " + ", ".join(f"`{v}`" for v in p["enum"])
    if "const" in p:
        return f"`{p['const']}`"
    kind = p.get("type")
    if kind in ("integer", "number"):
        lo = (">=", p["minimum"]) if "minimum" in p else (">", p["exclusiveMinimum"]) if "exclusiveMinimum" in p \
            else None
        hi = ("<=", p["maximum"]) if "maximum" in p else ("<", p["exclusiveMaximum"]) if "exclusiveMaximum" in p \
            else None
        if lo and hi and lo[0] == ">=" and hi[0] == "<=":
            return f"{kind} from {_num(lo[1])} to {_num(hi[1])}"
        bounds = [f"{b[0]} {_num(b[1])}" for b in (lo, hi) if b is not None]
        return kind + (" " + ", ".join(bounds) if bounds else "")
    if kind == "string":
        words = ["string"]
        if "pattern" in p:
            words = [_PATTERNS.get(p["pattern"], f"a string matching `{p['pattern']}`")]
        if p.get("pattern") == NAME_PATTERN and (p.get("minLength"), p.get("maxLength")) == (1, 128):
            return words[0]
        if "minLength" in p or "maxLength" in p:
            words.append(f"({p.get('minLength', 0)}-{p['maxLength']} characters)" if "maxLength" in p
                         else f"(at least {p['minLength']} characters)")
        return " ".join(words)
    if kind == "boolean":
        return "boolean"
    if kind == "array":
        text = "list of " + _type(p.get("items", {}))
        if "minItems" in p or "maxItems" in p:
            text += f" ({p.get('minItems', 0)}" + (f"-{p['maxItems']}" if "maxItems" in p else " or more") + " items)"
        return text
    if kind == "object":
        if "patternProperties" in p:
            (pattern, value), = p["patternProperties"].items()
            keys = _PATTERNS.get(pattern, f"a key matching `{pattern}`")
        else:
            value, keys = p.get("additionalProperties", {}), "a string"
        text = f"mapping of {keys} to {_type(value)}"
        return text + (f" (at least {p['minProperties']})" if "minProperties" in p else "")
    return "any value"


def flow(value: Any) -> str:
    """``value`` as YAML in flow style on one line (``[a, b]``, ``{k: v}``, ``'20:00'``)."""
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=1 << 20, allow_unicode=True)
    return text.removesuffix("\n").removesuffix("\n...").strip()


def _default(f) -> str:
    if f.is_required():
        return "required"
    value = f.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "its fields' defaults"
    return f"`{flow(value)}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _doc(model: type[BaseModel]) -> str:
    """The model's own docstring as one Markdown paragraph per paragraph ('' if none)."""
    text = model.__dict__.get("__doc__") or ""
    lines = text.strip("\n").splitlines()
    indent = min((len(x) - len(x.lstrip()) for x in lines[1:] if x.strip()), default=0)
    text = "\n".join([lines[0].strip()] + [x[indent:] for x in lines[1:]]) if lines else ""
    paras = [" ".join(line.strip() for line in p.splitlines()) for p in text.split("\n\n")]
    return "\n\n".join(paras).replace("``", "`")


def field_rows(model: type[BaseModel]) -> list[tuple[str, str, str, str, str, str]]:
    """``(field, type, default, unit, meaning, example)`` of each field of ``model``."""
    props = model.model_json_schema(by_alias=True)["properties"]
    rows = []
    for name, f in model.model_fields.items():
        key = f.alias or name
        p = props[key]
        example = f.examples[0] if f.examples else None
        rows.append((f"`{key}`", _type(p), _default(f), p.get("unit", "-"), f.description or "",
                     f"`{key}: {flow(example)}`" if f.examples else ""))
    return rows


def _standard_classes() -> list[str]:
    lines = ["| class | priority | preemptible | checkpointable | preempt only if checkpointable | sharing | "
             "idle stop | meaning |", "|---|---|---|---|---|---|---|---|"]
    for name, d in STANDARD_CLASSES.items():
        idle = d.get("idle_stop")
        lines.append(f"| `{name}` | {d['priority']} | {flow(d['preemptible'])} | {flow(d['checkpointable'])} | "
                     f"{flow(d['preempt_only_if_checkpointable'])} | "
                     f"{', '.join(d['sharing']) if 'sharing' in d else 'any'} | "
                     f"{_cell(flow(idle)) if idle else '-'} | {d['description']} |")
    return lines


def reference() -> str:
    """``docs/policy.md``: the whole reference as Markdown."""
    secs = sections()
    out = [
        "# Policy file reference",
        "",
        f"<!-- generated from src/gpushepherd/policy/schema.py by `{COMMAND}`; do not edit by hand -->",
        "",
        "A policy is one YAML file: the cluster, the workload classes, the teams and the rules between them. "
        "`shepherd policy check FILE` validates one offline and prints a summary; a bad file gives one line "
        "naming the file, the field's path, the value and what is allowed. Every section refuses unknown fields "
        "(a typo is an error, never ignored) and types are strict (`\"8\"` is no integer, `yes` no `true`).",
        "",
        '<a id="names"></a>A *name* (of a node, pool, class, team, cohort, label key) is 1 to 128 letters, digits, '
        "`_`, `.` or `-`, starting with a letter or digit.",
        "",
        "Units: times are seconds, GPU memory MiB, quotas and limits whole GPUs (a share counts its part of a "
        "GPU: a MIG `1g.10gb` 1/7, `fraction: 0.5` one half). An unset limit (`null`, the default of every "
        "limit) means no limit. Paths below write `<team>`, `<class>`, ... for the names you choose and `[]` for "
        "the entries of a list.",
        "",
        "## Contents",
        "",
        "* [Worked examples](#worked-examples)",
        "* [Standard workload classes](#standard-workload-classes)",
    ]
    out += [f"* [`{paths[0] or '(top level)'}`](#{_anchor(m)})" for m, paths in secs]
    out += ["", "## Worked examples", ""]
    for title, what, policy in EXAMPLES:
        out += [f"### {title}", "", what, "", "```yaml",
                yaml.safe_dump(policy, sort_keys=False, default_flow_style=None, width=100).rstrip(), "```", ""]
    out += ["## Standard workload classes", "",
            "These five classes (requirement R1) exist in every policy with these defaults; an entry under "
            "`classes` with one of their names changes only the fields it gives. Any other name is a new class "
            "and needs a `priority`. Fields not shown default to unset.", ""]
    out += _standard_classes()
    for model, paths in secs:
        title = ", ".join(f"`{p}`" for p in paths) if paths[0] else "top level"
        out += ["", f'<a id="{_anchor(model)}"></a>', "", f"## {title}", ""]
        out += [f"*{model.__name__}*" + (f" - {_doc(model)}" if _doc(model) else ""), ""]
        out += ["| field | type | default | unit | meaning | example |", "|---|---|---|---|---|---|"]
        out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in field_rows(model)]
    return "\n".join(out) + "\n"


def doc_problems(root: type[BaseModel] = PolicySpec) -> list[str]:
    """Fields of the schema the reference cannot document: no description or no
    example (``schema.doc``), each as ``path (Model.field): what is missing``. Empty
    when every field has both."""
    problems = []
    for model, paths in sections(root):
        for name, f in model.model_fields.items():
            where = f"{paths[0] + '.' if paths[0] else ''}{f.alias or name} ({model.__name__}.{name})"
            if not f.description:
                problems.append(f"{where}: no description")
            if not f.examples:
                problems.append(f"{where}: no example")
    return problems


__all__ = ["COMMAND", "EXAMPLES", "doc_problems", "field_rows", "flow", "reference", "sections"]
