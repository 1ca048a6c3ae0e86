"""Slurm-like: ``priority/multifactor`` with ``sched/backfill`` and no preemption.

Follows Slurm's documented defaults and a typical site configuration (SchedMD,
"Multifactor Priority Plugin" and "Scheduling Configuration Guide"):

* priority = weighted sum of QOS (here: the workload class), age (capped at
  ``PriorityMaxAge`` = 7 days), fair-share (classic ``2^(-U/S)`` over usage decayed with
  ``PriorityDecayHalfLife`` = 7 days) and job size (``PriorityFavorSmall=NO``: larger
  jobs get more); weights QOS 10000, fair-share 10000, age 1000, size 1000; recomputed
  every ``PriorityCalcPeriod`` = 5 minutes;
* backfill: a reservation for each of the top blocked jobs (``bf_max_job_test``-like
  depth 10 here), later jobs start only if they delay none, using the user's time
  limit (never the true duration);
* ``PreemptType=preempt/none`` (Slurm's default): nothing is preempted.

Built as a configuration of gpushepherd's core (its multifactor priority and backfill
follow the same Slurm rules), so the difference to gpushepherd's default policy is the
configuration alone.
"""

from __future__ import annotations

from dataclasses import replace

from gpushepherd.core import Scheduler
from gpushepherd.model.rules import PriorityRules, Rules


def baseline(rules: Rules):
    """``(rules, Scheduler)`` with Slurm-like multifactor weights and backfill."""
    prio = PriorityRules(class_weight=10_000.0, fair_share_weight=10_000.0, age_weight=1_000.0,
                         size_weight=1_000.0, max_age_s=7 * 86400.0, recalc_s=300.0,
                         half_life_s=7 * 86400.0, fair_share_level="team")
    return replace(rules, priority=prio, backfill_enabled=True, backfill_reservations=10,
                   preemption_enabled=False), Scheduler
