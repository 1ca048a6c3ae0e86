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
* **class** - the trace's class column if any; otherwise by size and duration:
  1 GPU for at most 15 min -> ``sandbox``; 8 GPUs or more, or 24 h or longer ->
  ``training``; 2 GPUs or more, or 4 h or longer -> ``research-training``; the rest ->
  ``batch``.
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
"""

from __future__ import annotations

import hashlib
import math
from bisect import bisect_left

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


def class_for(gpus: int, duration: float) -> str:
    if gpus == 1 and duration <= 15 * _M:
        return "sandbox"
    if gpus >= 8 or duration >= 24 * _H:
        return "training"
    if gpus >= 2 or duration >= 4 * _H:
        return "research-training"
    return "batch"


def round_limit(seconds: float) -> float:
    """The next round time limit at or above ``seconds`` (at least 5 min)."""
    i = bisect_left(ROUND_LIMITS, seconds)
    if i < len(ROUND_LIMITS):
        return ROUND_LIMITS[i]
    return math.ceil(seconds / _D) * _D


def to_sim_jobs(rows: list[TraceJob], rules: Rules, seed: int = 0, estimates: str = "limit") -> list[SimJob]:
    """Map trace rows to simulator jobs under ``rules`` (see the module docstring).

    Raises:
        TraceError: a row names a team or class the policy does not have.
    """
    if estimates not in ("limit", "perfect"):
        raise TraceError(f"--estimates: {estimates!r} is not allowed: limit or perfect")
    weights = team_weights(rules)
    cum: list[float] = []
    acc = 0.0
    for _, w in weights:
        acc += w
        cum.append(acc)
    out: list[SimJob] = []
    for row in rows:
        jid = row.id
        team = row.team or _pick(weights, cum, unit(seed, "team", jid))
        where = f"{row.where}: job {jid}" if row.where else f"job {jid}"
        if rules.teams and team not in rules.teams:
            raise TraceError(f"{where}: team {team!r} is not allowed: a team of the policy "
                             f"({', '.join(sorted(rules.teams))})")
        cls_name = row.workload_class or class_for(row.gpus, row.duration)
        cls = rules.classes.get(cls_name)
        if cls is None:
            raise TraceError(f"{where}: class {cls_name!r} is not allowed: one of {', '.join(sorted(rules.classes))}")
        user = row.user or f"{team}-u{int(unit(seed, 'user', jid) * USERS_PER_TEAM)}"
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
        out.append(SimJob(JobSpec(
            id=jid, team=team, workload_class=cls_name, gpus=row.gpus, user=user,
            time_limit_s=limit, runtime_estimate_s=estimate, checkpointable=checkpointable,
            submit_time=row.submit, project=row.project,
        ), row.duration))
    return out
