"""Strict FIFO: jobs start in submit order (ties: job id); the first job that does not
fit blocks every job behind it; no backfill, no preemption, no priority classes.

The classic first-come-first-served batch scheduler (Slurm's ``sched/builtin`` without
backfill behaves so within one priority). Quotas of the policy still hold. Built as a
configuration of gpushepherd's core, so placement is the same as gpushepherd's.
"""

from __future__ import annotations

from dataclasses import replace

from gpushepherd.core import Scheduler
from gpushepherd.model.rules import PriorityRules, Rules


def baseline(rules: Rules):
    """``(rules, Scheduler)``: class weight 0 (order = submit time, job id), backfill
    and preemption off."""
    return replace(rules, priority=PriorityRules(class_weight=0.0), backfill_enabled=False,
                   preemption_enabled=False), Scheduler
