"""From trace rows to job specs: the documented, seeded mapping.

Public traces carry submit time, GPUs and duration, rarely a team, a class or a user's
time limit. So that the policy has something to decide, each missing field is derived
from a hash of ``(seed, field, job id)`` - the same seed gives the same jobs on every
machine, and one job's mapping never depends on another's:

* **team** - the trace's own team column if it has one; otherwise one of the policy's
  teams that have no child teams, weighted by ``shares`` (else ``nominal_gpus``, else
  ``max_gpus``, else equally); a policy without teams gets Philly's 11 main virtual
  clusters, weighted by their node counts (Helios QSSF artifact, ``philly_vc_nodes.csv``).
  The same names are used for any trace without teams (ITP included).
* **class** - the trace's class column if any; otherwise only from what a scheduler
  knows at submit, never the true duration (``class_for``; design note 024): 8 GPUs or
  more -> ``training``; 2 to 7 GPUs -> ``research-training``; 1 GPU -> ``sandbox`` for
  the users who work interactively (a quarter of users, drawn from ``(seed, user)``),
  else ``batch``. A class with a ``max_runtime_s`` is never derived (which jobs would
  fit it cannot be known without their durations; a derived class would stop every
  longer job at that limit): the first of ``batch``, ``research-training``,
  ``training`` without one is taken instead (the class as derived when all have one).
  The time limit is left out too: it is drawn from the duration below, so a class read
  from it would carry the duration into every class-ruled policy (the leak of issue 17:
  long jobs became ``training``, the top class, so class order ran close to
  longest-job-first). Policies that want the limit read it from the time-limit
  priority factor.
* **checkpointable** - ``training`` and ``research-training`` jobs checkpoint with
  probability 0.7; other classes keep their class default.
* **user** - ``<team>-u<k>`` with ``k`` uniform in 0..7 (8 users a team).
* **time limit** - what a user would ask for: the true duration times a factor drawn
  log-uniformly from [1, 8] (median 2.8), rounded up to the next "round" value
  (5 min ... 90 days, then whole days), at least 5 min, and at most the class's max
  runtime. Users' requests are round numbers and over-estimate run times by several
  times (Tsafrir, Etsion, Feitelson: "Modeling user runtime estimates", JSSPP 2005). The
  policy sees only this limit, never the duration; with ``estimates="perfect"`` the
  runtime estimate is the true duration instead (for reference runs only).
* **deadline** - only from the trace (``--map deadline=`` or ``deadline_after=``, design
  note 030): submit + the row's seconds to its deadline; never derived.

A row the policy cannot take at all - a team or class the policy does not have, or a
job its submit validation refuses (``validate_spec``: e.g. a class whose ``sharing``
leaves out whole GPUs) - is the row's fault, as a bad value is: ``to_sim_jobs`` refuses
the trace naming the first such row and counting them, or, given a ``skipped`` list
(``shepherd simulate --skip-bad-rows``), leaves them out and adds their errors to it.
A job the policy takes but the scheduler then rejects (more GPUs than the nodes it may
use have) is not a bad row: it is replayed and counted as rejected.
"""

from __future__ import annotations

import hashlib
import math
from bisect import bisect_left

from gpushepherd.core.scheduler import SpecError, validate_spec
from gpushepherd.model.job import JobSpec
from gpushepherd.model.rules import Rules
from gpushepherd.sim.engine import SimJob
from gpushepherd.sim.traces import TraceError, TraceJob

#: Philly's 11 main virtual clusters and their node counts (8 GPUs each).
PHILLY_VCS: tuple[tuple[str, int], ...] = (
    ("vc6214e9", 64), ("vc7f04ca", 32), ("vc11cb48", 16), ("vcb436b2", 64), ("vcee9e8c", 64),
    ("vce13805", 16), ("vc6c71a0", 32), ("vc2869ce", 16), ("vced69ec", 8), ("vc103959", 8), ("vc0e4a51", 32),
)

_M = 60.0
_H = 3600.0
_D = 86400.0
ROUND_LIMITS = (5 * _M, 10 * _M, 15 * _M, 30 * _M, _H, 2 * _H, 4 * _H, 6 * _H, 8 * _H, 12 * _H, _D, 2 * _D,
                3 * _D, 5 * _D, 7 * _D, 14 * _D, 30 * _D, 60 * _D, 90 * _D)
USERS_PER_TEAM = 8
CHECKPOINT_SHARE = 0.7
#: the share of users whose 1-GPU jobs are interactive work (``sandbox``)
INTERACTIVE_SHARE = 0.25


def unit(seed: int, salt: str, job_id: str) -> float:
    """A uniform number in [0, 1) from ``(seed, salt, job id)`` (BLAKE2b, first 8 bytes)."""
    digest = hashlib.blake2b(f"{seed}:{salt}:{job_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def team_weights(rules: Rules) -> list[tuple[str, float]]:
    """Teams a mapped job may land in, with their weights (see the module docstring)."""
    if not rules.teams:
        return [(name, float(n)) for name, n in PHILLY_VCS]
    parents = {p for p in rules.teams.values() if p is not None}
    leaves = sorted(t for t in rules.teams if t not in parents)
    maxes = {lim.team: lim.max for lim in rules.limits if lim.path == f"teams.{lim.team}.max_gpus"}
    out = []
    for t in leaves:
        w = rules.shares.get(t) or rules.nominal_gpus.get(t) or maxes.get(t) or 0
        out.append((t, float(w)))
    if sum(w for _, w in out) <= 0:
        out = [(t, 1.0) for t in leaves]
    return out


def _pick(weights: list[tuple[str, float]], cum: list[float], u: float) -> str:
    return weights[min(bisect_left(cum, u * cum[-1]), len(weights) - 1)][0]


def class_for(gpus: int, user: str, seed: int = 0, capped: frozenset[str] = frozenset()) -> str:
    """The workload class of a trace job that has none, from what a scheduler knows at
    submit: its GPU count and its user (never its duration, nor the time limit the
    mapping draws from it; module docstring, design note 024).

    ``gpus >= 8`` -> ``training``; ``2..7`` -> ``research-training``; 1 GPU ->
    ``sandbox`` when ``unit(seed, "interactive", user) < INTERACTIVE_SHARE``, else
    ``batch``. A class in ``capped`` (classes with a ``max_runtime_s``) gives way to
    the first of ``batch``, ``research-training``, ``training`` not in it.
    """
    if gpus >= 8:
        cls = "training"
    elif gpus >= 2:
        cls = "research-training"
    else:
        cls = "sandbox" if unit(seed, "interactive", user) < INTERACTIVE_SHARE else "batch"
    if cls in capped:
        cls = next((c for c in ("batch", "research-training", "training") if c not in capped), cls)
    return cls


def round_limit(seconds: float) -> float:
    """The next round time limit at or above ``seconds`` (at least 5 min)."""
    i = bisect_left(ROUND_LIMITS, seconds)
    if i < len(ROUND_LIMITS):
        return ROUND_LIMITS[i]
    return math.ceil(seconds / _D) * _D


def to_sim_jobs(rows: list[TraceJob], rules: Rules, seed: int = 0, estimates: str = "limit",
                skipped: list[TraceError] | None = None) -> list[SimJob]:
    """Map trace rows to simulator jobs under ``rules`` (see the module docstring).
    With ``skipped``, a row the policy cannot take is left out and its error appended
    (``TraceError.line``: the row's line).

    Raises:
        TraceError: without ``skipped``, rows the policy cannot take (a team or class it
            does not have, a spec its submit validation refuses): the first, and their count.
    """
    if estimates not in ("limit", "perfect"):
        raise TraceError(f"--estimates: {estimates!r} is not allowed: limit or perfect")
    weights = team_weights(rules)
    capped = frozenset(name for name, c in rules.classes.items() if c.max_runtime_s is not None)
    cum: list[float] = []
    acc = 0.0
    for _, w in weights:
        acc += w
        cum.append(acc)
    out: list[SimJob] = []
    bad: list[TraceError] = []
    for row in rows:
        try:
            out.append(_sim_job(row, rules, seed, estimates, weights, cum, capped))
        except TraceError as exc:
            bad.append(exc)
    if skipped is not None:
        skipped.extend(bad)
    elif bad:
        n = len(bad)
        raise TraceError(f"{bad[0]} ({n:,} row{'' if n == 1 else 's'} the policy cannot take, nothing of the trace is "
                         "used; --skip-bad-rows skips and counts them)")
    return out


def _sim_job(row: TraceJob, rules: Rules, seed: int, estimates: str, weights: list[tuple[str, float]],
             cum: list[float], capped: frozenset[str]) -> SimJob:
    """One row's job (``to_sim_jobs``); ``TraceError`` for a row the policy cannot take."""
    jid = row.id
    team = row.team or _pick(weights, cum, unit(seed, "team", jid))
    where = f"{row.where}: job {jid}" if row.where else f"job {jid}"
    if rules.teams and team not in rules.teams:
        raise TraceError(f"{where}: team {team!r} is not allowed: a team of the policy "
                         f"({', '.join(sorted(rules.teams))})", row.line)
    user = row.user or f"{team}-u{int(unit(seed, 'user', jid) * USERS_PER_TEAM)}"
    cls_name = row.workload_class or class_for(row.gpus, user, seed, capped)
    cls = rules.classes.get(cls_name)
    if cls is None:
        raise TraceError(f"{where}: class {cls_name!r} is not allowed: one of {', '.join(sorted(rules.classes))}",
                         row.line)
    checkpointable = None
    if cls_name in ("training", "research-training"):
        checkpointable = unit(seed, "checkpoint", jid) < CHECKPOINT_SHARE
    factor = 2.0 ** (3.0 * unit(seed, "limit", jid))
    limit = round_limit(max(row.duration * factor, 1.0))
    if cls.max_runtime_s is not None:
        limit = min(limit, cls.max_runtime_s)
    estimate = row.duration if estimates == "perfect" else None
    if estimate is not None:
        estimate = min(max(estimate, 1.0), limit)
    spec = JobSpec(
        id=jid, team=team, workload_class=cls_name, gpus=row.gpus, user=user,
        time_limit_s=limit, runtime_estimate_s=estimate, checkpointable=checkpointable,
        submit_time=row.submit, project=row.project,
        deadline=None if row.deadline_after_s is None else row.submit + row.deadline_after_s,
    )
    try:  # what the simulator's submit would refuse, refused here with the row's line
        validate_spec(rules, spec)
    except SpecError as exc:
        raise TraceError(f"{row.where}: {exc}" if row.where else str(exc), row.line) from None
    return SimJob(spec, row.duration)
