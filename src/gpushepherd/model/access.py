"""Which workload classes a team may use at all, checked at submit (design note 023,
"Which classes a team may use").

Two things of the policy close a class to a team for good: ``teams.T.allowed_classes``
(Kueue's LocalQueue -> ClusterQueue binding, Slurm's account ``AllowQOS`` list) and a
limit that is 0 at every time of the week (``teams.T.classes.C.max_gpus: 0``). A
submission they close is refused when it is made - the server answers 422, the
simulator records the job ``REJECTED`` with the same words - instead of waiting for
ever as ``ExceedsCapacity``. A limit above 0 that a job is merely too big for stays a
pending ``ExceedsCapacity`` (design note 007: the policy may change); jobs queued
before a policy narrows a team's classes are not touched.

Outside the core on purpose: the core's admission rule never sees such a job.
"""

from __future__ import annotations

from gpushepherd.model.job import JobSpec
from gpushepherd.model.rules import Limit, Rules


def class_refusal(rules: Rules, spec: JobSpec) -> str | None:
    """Why team ``spec.team`` may never run a job of class ``spec.workload_class``
    under ``rules`` (``'class: 'X' is not allowed for team T: ...'``, naming the policy
    field); ``None``: it may. An unknown team or class is ``validate_spec``'s to refuse
    (``None`` here). The team's ancestors' ``allowed_classes`` bind it too; the limits
    counted are the plain ones of the team, its ancestors and the class (no cohort,
    pool, GPU-type or unevictable-only limit: those close a class only to some jobs)."""
    cls = spec.workload_class
    if cls not in rules.classes or (rules.teams and spec.team not in rules.teams):
        return None
    chain = rules.ancestors(spec.team) if spec.team in rules.teams else (spec.team,)
    head = f"class: {cls!r} is not allowed for team {spec.team}"
    for team in chain:
        allowed = rules.allowed_classes.get(team)
        if allowed is not None and cls not in allowed:
            return (f"{head}: one of {', '.join(allowed) or '(none)'} (teams.{team}.allowed_classes of the policy "
                    "in force)")
    for lim in rules.limits:
        if _closes(lim, chain, cls):
            return (f"{head}: {lim.path}=0 at every time of the week, so such a job could never start (raise the "
                    "limit, or submit another class)")
    return None


def _closes(lim: Limit, chain: tuple[str, ...], cls: str) -> bool:
    """``lim`` counts every job of ``chain[0]`` in class ``cls`` and never allows one."""
    return (lim.loosest == 0 and (lim.team is None or lim.team in chain)
            and (lim.workload_class is None or lim.workload_class == cls)
            and not lim.members and not lim.cohort and lim.pools is None and not lim.unevictable_only
            and lim.gpu_type is None)
