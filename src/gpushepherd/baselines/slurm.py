"""Slurm, three ways: its out-of-the-box scheduling, a site's multifactor priority, and
that with gpushepherd's time-limit factor added (design notes 006 and 024).

All three are configurations of gpushepherd's core (its multifactor priority and EASY
backfill follow Slurm's rules: SchedMD, "Multifactor Priority Plugin", "Scheduling
Configuration Guide", ``slurm.conf`` ``SchedulerParameters``), so a difference to
gpushepherd's policy is the configuration alone; the policy's quotas still hold.

* ``slurm-default`` - ``PriorityType=priority/basic`` (submit order, then job id) with
  ``SchedulerType=sched/backfill``: a job that cannot start gets a reservation at its
  earliest start in the time profile, for each of the first ``bf_depth`` such jobs
  (Slurm's ``bf_max_job_test``), and a later job starts only if it delays none of
  them, judged by the users' time limits (never the true duration). On the core v2
  planner each reservation is held from its own start, so this is Slurm's conservative
  plan over the jobs it tests (design note 015, section 2). The default depth is 1
  (EASY backfill), not Slurm's 500: the planner's cost per reservation grows with the
  claims already in the profile, and on the bundled two-day Philly excerpt at 32x8 under
  ``examples/policies/philly.yaml`` depth 10 took 60 s against 0.8 s at depth 1
  (average JCT 2.48x against 2.44x the lower bound) and depth 500 did not end in 14
  minutes (design note 024). Not modelled:
  ``bf_window`` (Slurm plans only one day ahead by default; the core plans without a
  horizon, which reserves more), ``bf_resolution`` (60 s) and the backfill interval
  (the core plans at every event).
* ``slurm`` - ``priority/multifactor`` with a site's QOS: priority = QOS 10000 (the
  workload class, which a site maps to its QOS) + fair-share 10000 (classic
  ``2^(-U/S)`` over usage decayed with ``PriorityDecayHalfLife`` = 7 days) + age 1000
  (capped at ``PriorityMaxAge`` = 7 days) + job size 1000 (``PriorityFavorSmall=NO``:
  larger jobs get more), recomputed every ``PriorityCalcPeriod`` = 5 minutes; the
  same backfill as ``slurm-default``.
* ``slurm-timelimit`` - ``slurm`` plus gpushepherd's time-limit factor
  (``priority.weights.time_limit``: ``1 - limit / max_time_limit_s``) at ten times the
  QOS weight, the ratio of ``examples/policies/philly.yaml``. Slurm has no such factor;
  this row shows what the factor alone is worth on Slurm's other rules.

All three: ``PreemptType=preempt/none`` (Slurm's default): nothing is preempted.
"""

from __future__ import annotations

from dataclasses import replace

from gpushepherd.core import Scheduler
from gpushepherd.model.rules import PriorityRules, Rules

#: Slurm's default ``bf_max_job_test`` (jobs its backfill plans each cycle)
BF_MAX_JOB_TEST = 500
#: the reservation depth of the Slurm baselines unless told (module docstring)
DEFAULT_BF_DEPTH = 1
#: the site's multifactor weights (``PriorityWeight*``)
QOS_WEIGHT = 10_000.0
FAIR_SHARE_WEIGHT = 10_000.0
AGE_WEIGHT = 1_000.0
SIZE_WEIGHT = 1_000.0
#: ``slurm-timelimit``: the time-limit weight over the QOS weight (philly.yaml's ratio)
TIME_LIMIT_OVER_QOS = 10.0


def _backfill(rules: Rules, prio: PriorityRules, bf_depth: int | None) -> Rules:
    depth = DEFAULT_BF_DEPTH if bf_depth is None else bf_depth
    if depth < 1:
        raise ValueError(f"bf_depth: {depth!r} is not allowed: a reservation depth >= 1")
    return replace(rules, priority=prio, backfill_enabled=True, backfill_reservations=depth,
                   preemption_enabled=False)


def multifactor(rules: Rules, time_limit_weight: float = 0.0) -> PriorityRules:
    """The site's ``priority/multifactor`` weights (module docstring); the time-limit
    factor's ``max_time_limit_s`` is the policy's."""
    return PriorityRules(class_weight=QOS_WEIGHT, fair_share_weight=FAIR_SHARE_WEIGHT, age_weight=AGE_WEIGHT,
                         size_weight=SIZE_WEIGHT, time_limit_weight=time_limit_weight,
                         max_time_limit_s=rules.priority.max_time_limit_s, max_age_s=7 * 86400.0, recalc_s=300.0,
                         half_life_s=7 * 86400.0, fair_share_level="team")


def default(rules: Rules, bf_depth: int | None = None):
    """``(rules, Scheduler)``: submit order and backfill with ``bf_depth``
    reservations (default ``DEFAULT_BF_DEPTH``).

    Raises:
        ValueError: ``bf_depth`` below 1.
    """
    return _backfill(rules, PriorityRules(class_weight=0.0), bf_depth), Scheduler


def baseline(rules: Rules, bf_depth: int | None = None):
    """``(rules, Scheduler)``: the site's multifactor priority and backfill (see
    ``default`` for ``bf_depth``)."""
    return _backfill(rules, multifactor(rules), bf_depth), Scheduler


def timelimit(rules: Rules, bf_depth: int | None = None):
    """``(rules, Scheduler)``: ``baseline`` plus the time-limit factor."""
    return _backfill(rules, multifactor(rules, TIME_LIMIT_OVER_QOS * QOS_WEIGHT), bf_depth), Scheduler
