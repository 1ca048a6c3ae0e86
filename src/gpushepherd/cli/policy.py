"""``shepherd policy check | apply | show | history | export | reference`` (design note
008, "Policy changes on a running server"; ``reference``: note 026). ``check`` works offline with the loader the server uses; with a
server (``--server`` or ``$SHEPHERD_SERVER``) it also asks for a dry run of ``apply``."""

from __future__ import annotations

import getpass
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpushepherd.cli.daemon import ServerOpt, TokenOpt, _fmt_t, _request, path_param

if TYPE_CHECKING:
    from gpushepherd.model.rules import Rules
    from gpushepherd.policy.schema import PolicySpec


def _hhmm(seconds: float) -> str:
    return time.strftime("%H:%M", time.gmtime(seconds)) if seconds < 86400 else "24:00"


def _cohort_terms(spec: PolicySpec | None) -> tuple[dict[str, list[str]], list[str], set[str]]:
    """A cohort's part of the summary, in the policy's own numbers (note 005's compiled
    limits - ``nominal + borrowing_limit``, the cohort's guards - are not what anyone
    wrote): ``({team: ["cohort C: nominal_gpus=4, borrowing_limit=2 (at most 6 GPUs),
    lending_limit=1"]}, cohort lines, the paths of the limits compiled from cohorts)``."""
    per_team: dict[str, list[str]] = {}
    lines, paths = [], set()
    if spec is None:
        return per_team, lines, paths
    for cname, co in sorted(spec.cohorts.items()):
        pool = f" (pool {co.pool})" if co.pool is not None else ""
        total = 0
        for entry in co.members:
            t = spec.teams[entry.team]
            nom = entry.nominal_gpus if entry.nominal_gpus is not None else (t.nominal_gpus or 0)
            bl = entry.borrowing_limit if entry.borrowing_limit is not None else t.borrowing_limit
            ll = entry.lending_limit if entry.lending_limit is not None else t.lending_limit
            n = sum(nom.values()) if isinstance(nom, dict) else nom  # per GPU type (note 038): their sum
            total += n
            borrow = "borrowing_limit unset (may borrow all the cohort lends)" if bl is None else \
                f"borrowing_limit={bl} (holds at most {n + bl} GPUs)"
            lend = "lending_limit unset (lends all its idle quota)" if ll is None else f"lending_limit={ll}"
            per_team.setdefault(entry.team, []).append(f"cohort {cname}{pool}: nominal_gpus={nom}, {borrow}, {lend}")
            prefix = f"teams.{entry.team}" if co.pool is None else f"cohorts.{cname}.{entry.team}"
            paths |= {f"{prefix}.borrowing_limit", f"{prefix}.nominal_gpus(not preemptible)"}
        members = ", ".join(e.team for e in co.members)
        lines.append(f"cohort {cname}{pool}: {members}; {total} GPUs of nominal quota shared")
    return per_team, lines, paths


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


#: the weights of ``priority.weights`` by their policy names (``PriorityRules`` fields)
_WEIGHTS = (("class", "class_weight"), ("time_limit", "time_limit_weight"), ("age", "age_weight"),
            ("fair_share", "fair_share_weight"), ("size", "size_weight"), ("deadline", "deadline_weight"))


def _num(x: float) -> str:
    return f"{int(x)}" if float(x).is_integer() else f"{x:g}"


def order_lines(rules: Rules) -> list[str]:
    """How the class priorities and ``priority`` order the queue and decide preemption
    (design note 045): the top class's hard tier, the aged tier, the score's non-zero
    weights (and class's, even at 0), the tie-breaks; then what the class priorities do
    besides (``core/priority.py``'s queue key; ``core/preemption.py``'s candidates)."""
    pr = rules.priority
    prios = [c.priority for c in rules.classes.values()]
    # the core's top class: priority >= max_prio, which is 1 when every class has 0 (``core/book.py``)
    max_prio = max(prios, default=1) or 1
    top_names = sorted(c.name for c in rules.classes.values() if c.priority >= max_prio)
    tier = pr.top_class_tier and bool(top_names)
    tiers = []
    if tier:
        names = ", ".join(top_names)
        tiers.append(f"jobs of {names} (the top class priority, {max_prio}), a hard tier (top_class_tier)")
    if pr.age_tier_s is not None:
        which = "jobs" if pr.age_tier_jobs is None else f"the {pr.age_tier_jobs} oldest jobs"
        tiers.append(f"{which} that have waited {_num(pr.age_tier_s)} s, oldest first (age_tier_s)")
    weights = [f"{name}={_num(getattr(pr, field))}" + (f" (over {_num(pr.max_age_s)} s)" if name == "age" else "")
               for name, field in _WEIGHTS if name == "class" or getattr(pr, field)]
    recalc = f"; recomputed every {_num(pr.recalc_s)} s" if pr.dynamic else ""
    score = (f"{'the rest ' if tiers else ''}by score: weights {', '.join(weights)}; ties by submit time, job id"
             + recalc)
    steps = tiers + [score]
    lines = [f"order: {k}. {x}" if len(steps) > 1 else f"order: {x}" for k, x in enumerate(steps, 1)]
    uses = ["pick the top tier"] if tier else []
    uses.append(_preempt_use(rules))
    below = bool(top_names) and len(top_names) < len(rules.classes)  # a class the deadline term lifts the top over
    lines.append(f"class priorities: {' and '.join(uses)}; {_queue_use(rules, tier, below)}")
    if pr.top_class_tier and not tier:
        lines.append("top_class_tier: no class has a priority above 0, so no job is in the tier")
    return lines


def _preempt_use(rules: Rules) -> str:
    """What the class priorities decide of preemption (``core/preemption.py``'s
    ``candidates``): lower classes with preemption on, plus cohort reclaim of any class
    (``reclaim: any``); with it off, only ``within_team`` preemption inside those teams."""
    if rules.preemption_enabled:
        anyclass = sorted({c.name for c in rules.cohorts.values() if c.reclaim == "any"})
        extra = (f"; cohort reclaim (reclaim: any in {', '.join(anyclass)}) also evicts borrowers of any class"
                 if anyclass else "")
        return f"decide who may preempt whom (a job may preempt preemptible jobs of a lower class priority{extra})"
    if rules.within_team:
        return ("decide preemption only within teams " + ", ".join(sorted(rules.within_team))
                + " (preemption.enabled is false; within_team: lower_priority)")
    return "decide no preemption (preemption.enabled is false)"


def _queue_use(rules: Rules, tier: bool, below: bool) -> str:
    """Whether the class priorities order the queue by score (``core/priority.py``'s
    ``_terms``): by the class weight when classes differ in priority, and, with a
    deadline weight, the top class's full deadline term."""
    pr = rules.priority
    if pr.class_weight and len({c.priority for c in rules.classes.values()}) > 1:
        return f"class weight {_num(pr.class_weight)}: they order the queue"
    said = f"class weight {_num(pr.class_weight)}"
    if pr.class_weight:
        said += ", but every class has one priority"
    if pr.deadline_weight and below and not tier:
        return said + f"; the top class's jobs get the full deadline weight ({_num(pr.deadline_weight)})"
    return said + ": they do not order the " + ("other classes" if tier else "queue")


def summary(rules: Rules, spec: PolicySpec | None = None) -> list[str]:
    """Lines describing a compiled policy: pools (nodes, GPUs), the order of the queue and
    what class priorities decide (``order_lines``), classes (priority,
    preemptible), teams (nominal quota, limits and allowed classes; with ``spec``, a cohort member's
    nominal_gpus, borrowing_limit and lending_limit as the policy writes them), cohorts,
    other limits, windows."""
    pools: dict[str, list[int]] = {}
    for n in rules.nodes:
        pools.setdefault(n.pool, []).append(n.gpus)
    lines = ["pools: " + ", ".join(f"{p} ({len(g)} node{'s' if len(g) != 1 else ''}, {_gpus(sum(g))})"
                                   for p, g in sorted(pools.items()))]
    lines += order_lines(rules)
    for c in sorted(rules.classes.values(), key=lambda c: (-c.priority, c.name)):
        how = ("preemptible only if it checkpoints" if c.preempt_only_if_checkpointable else "preemptible") \
            if c.preemptible else "never preempted"
        extra = f", reserved {_gpus(c.reserved_gpus)}" if c.reserved_gpus else ""
        if c.reserved_within(rules.nodes) < c.reserved_gpus:
            extra += f" (keeps {c.reserved_within(rules.nodes)}: its pools hold no more)"
        extra += f", pools {','.join(c.pools)}" if c.pools else ""
        lines.append(f"class {c.name}: priority {c.priority}, {how}{extra}")
    team_limits: dict[str, list[str]] = {}
    in_cohorts, cohort_lines, compiled = _cohort_terms(spec)
    other = []
    for lim in rules.limits:
        if lim.path in compiled or (spec is not None and getattr(lim, "cohort", None)):
            continue  # said in the policy's own numbers below
        mine = f"teams.{lim.team}." if lim.team is not None else None
        # a team's own limits named from the team on (classes.training.max_gpus, not max_gpus)
        name = lim.path[len(mine):] if mine and lim.path.startswith(mine) else lim.path.rsplit(".", 1)[-1]
        value = f"{name}={lim.max if lim.max < 10**12 else 'unlimited'}" + "".join(
            f", {w.name}={m}" for w, m in lim.windows)
        if mine and lim.path.startswith(mine):
            team_limits.setdefault(lim.team, []).append(value)
        else:
            other.append(f"{lim.path.rsplit('.', 1)[0]}: {value}")
    for team in sorted(rules.teams):
        quota = [f"nominal_gpus={rules.nominal_gpus[team]}"] if rules.nominal_gpus.get(team) else []
        if team in rules.nominal_by_type:  # per GPU type (note 038)
            quota = [f"nominal_gpus[{t}]={n}" for t, n in rules.nominal_by_type[team]]
        quota += team_limits.get(team, [])
        parts = ([", ".join(quota)] if quota else []) + in_cohorts.get(team, [])
        if team in rules.allowed_classes:  # teams.T.allowed_classes
            parts.append("allowed classes " + (", ".join(rules.allowed_classes[team]) or "none"))
        parent = f" (in {rules.teams[team]})" if rules.teams[team] else ""
        lines.append(f"team {team}{parent}: {'; '.join(parts) or 'no quota'}")
    lines += cohort_lines
    lines += [f"limit {x}" for x in other]
    for key, co in sorted(rules.cohorts.items()):
        cap = next((lim.max for lim in rules.limits if lim.cohort == co.name and lim.gpu_type == co.gpu_type
                    and lim.pools == co.pools and "(keeping" not in lim.path), None)
        guaranteed = sum(m.nominal for m in co.members)
        if cap is not None:
            lines.append(f"cohort {key}: capacity {cap} GPUs, {guaranteed} guaranteed to members ("
                         + ", ".join(f"{m.team} {m.nominal}" for m in co.members) + f"), {cap - guaranteed} to none")
    windows = {w.name: w for lim in rules.limits for w, _ in lim.windows}
    days = "Mon Tue Wed Thu Fri Sat Sun".split()
    for w in sorted(windows.values(), key=lambda w: w.name):
        lines.append(f"window {w.name}: {_hhmm(w.start)}-{_hhmm(w.end)} {','.join(days[d] for d in sorted(w.days))}")
    return lines


def _body(path: Path) -> dict:
    """The API body of a policy file, validated here first with the server's loader.

    Raises:
        PolicyError: the file is invalid (field, value, what is allowed).
    """
    from gpushepherd.policy.load import policy_from_dict, read_policy_dict

    raw = read_policy_dict(path)
    policy_from_dict(raw, source=str(path))
    return {"policy": json.loads(json.dumps(raw, default=str)), "source": str(path.resolve()),
            "user": os.environ.get("USER") or getpass.getuser()}


def register(policy_app: typer.Typer) -> None:
    """Add the policy commands to ``policy_app``."""
    from gpushepherd.cli.main import _console, _errors, _plural

    out = _console()

    @policy_app.command("check")
    def check(files: Annotated[list[Path], typer.Argument(metavar="FILE...", help="Policy YAML files.", parser=path_param)],
              server: ServerOpt = None, token: TokenOpt = None) -> None:
        """Validate policy files and print a summary of each; with a server (--server or
        $SHEPHERD_SERVER) also ask it whether each could be applied now (a dry run)."""
        from gpushepherd.policy.load import load_policy, window_notes

        live = server or os.environ.get("SHEPHERD_SERVER")
        with _errors():
            for path in files:
                loaded = load_policy(path)
                r = loaded.rules
                gpus = sum(n.gpus for n in r.nodes)
                classes = f"{len(r.classes)} class" + ("" if len(r.classes) == 1 else "es")
                out.print(f"{path}: OK - {_plural(len(r.nodes), 'node')}, {_plural(gpus, 'GPU')}, {classes}, "
                          f"{_plural(len(r.teams), 'team')}, {_plural(len(r.limits), 'limit')}", soft_wrap=True)
                for line in summary(r, loaded.spec):
                    out.print(f"  {line}", soft_wrap=True)
                for line in window_notes(loaded.spec):
                    out.print(f"  note: {line}", soft_wrap=True, markup=False)
                if live:
                    res = _request(live, "POST", "/policy", token=token, params={"dry_run": "true"},
                                   json=_body(path)).json()
                    out.print(f"server: {res['message']}", soft_wrap=True)

    @policy_app.command("apply")
    def apply(file: Annotated[Path, typer.Argument(metavar="FILE", help="Policy YAML file.", parser=path_param)],
              server: ServerOpt = None, token: TokenOpt = None) -> None:
        """Apply a policy on the running server as its next version (admin token once
        tokens exist); running jobs keep their accounting. Refused, with nothing
        applied, if it is invalid or would break a live job (each job and field named)."""
        with _errors():
            body = _body(file)
        res = _request(server, "POST", "/policy", token=token, json=body).json()
        out.print(f"policy {res['message']}: version {res['version']} in force since {_fmt_t(res['t'])} "
                  f"(by {res['by'] or '-'})", soft_wrap=True)

    @policy_app.command("show")
    def show(server: ServerOpt = None, token: TokenOpt = None,
             as_json: Annotated[bool, typer.Option("--json", help="The policy as JSON.")] = False) -> None:
        """The policy in force on the server: version, when and by whom, and a summary."""
        from gpushepherd.policy.load import policy_from_dict

        res = _request(server, "GET", "/policy", token=token).json()
        if as_json:
            print(json.dumps(res, indent=2, sort_keys=True))
            return
        out.print(f"version {res['version']}, applied {_fmt_t(res['t'])} by {res['by'] or '-'} from "
                  f"{res['source'] or '-'}", soft_wrap=True)
        shown = policy_from_dict(res["policy"], "server", intake=False)
        for line in summary(shown.rules, shown.spec):
            out.print(f"  {line}", soft_wrap=True)

    @policy_app.command("export")
    def export(file: Annotated[Path, typer.Argument(metavar="FILE", help="Policy YAML file.", parser=path_param)],
               kueue: Annotated[bool, typer.Option("--kueue", help="Kueue's objects (kueue.x-k8s.io/v1beta2): "
                                                   "ResourceFlavors, Cohorts, ClusterQueues, LocalQueues, "
                                                   "WorkloadPriorityClasses.")] = False,
               output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the YAML here "
                                                           "(default: stdout).", parser=path_param)] = None) -> None:
        """Export a policy for another scheduler (design note 016): with --kueue, the
        parts Kueue can express as YAML; what it cannot is listed at the top of the YAML
        and on stderr."""
        from gpushepherd.cli.main import err
        from gpushepherd.policy.kueue import export_kueue, to_yaml
        from gpushepherd.policy.load import load_policy

        if not kueue:
            err.print("error: shepherd policy export: name the target: --kueue", soft_wrap=True)
            raise typer.Exit(2)
        with _errors():
            objects, cannot = export_kueue(load_policy(file))
        text = to_yaml(objects, cannot, str(file))
        if output is None:
            print(text, end="")
        else:
            try:
                output.write_text(text)
            except OSError as exc:  # a folder, a missing folder, no permission: one line, not a traceback
                err.print(f"error: --output: {str(output)!r} cannot be written ({exc.strerror or exc}): a file path "
                          "in a folder you can write to", soft_wrap=True, markup=False)
                raise typer.Exit(2) from None
            err.print(f"{output}: {_plural(len(objects), 'Kueue object')}", soft_wrap=True)
        err.print(f"not expressible in Kueue ({len(cannot)}):", soft_wrap=True)
        for line in cannot:
            err.print(f"  - {line}", soft_wrap=True)

    @policy_app.command("reference")
    def reference() -> None:
        """Print the policy file's reference (Markdown, generated from the schema: every
        field's type, default, unit, meaning and an example; worked examples). It is
        docs/policy.md: shepherd policy reference > docs/policy.md"""
        from gpushepherd.policy.reference import reference as text

        print(text(), end="")

    @policy_app.command("history")
    def history(server: ServerOpt = None, token: TokenOpt = None) -> None:
        """Every policy version the server ran: when, by whom, from which file."""
        from rich.table import Table

        table = Table("VERSION", "APPLIED", "BY", "SOURCE", box=None)
        for v in _request(server, "GET", "/policy/history", token=token).json():
            table.add_row(str(v["version"]), _fmt_t(v["t"]), v["by"] or "-", v["source"] or "-")
        out.print(table)
