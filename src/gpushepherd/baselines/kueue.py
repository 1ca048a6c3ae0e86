"""Kueue-like: quotas and priority with ``BestEffortFIFO`` queueing and no backfill.

Kueue (kubernetes-sigs/kueue) admits workloads of a ClusterQueue in priority order,
then creation time; with ``queueingStrategy: BestEffortFIFO`` a workload that cannot
be admitted is put aside and the next one is tried, so a blocked large job never holds
back smaller ones - and nothing is reserved for it (Kueue has no backfill
reservations, so large jobs can starve behind a stream of small ones). Preemption
within a ClusterQueue defaults to ``Never``. Quotas of the policy hold.

Built as a configuration of gpushepherd's core: backfill on with zero reservations.
"""

from __future__ import annotations

from dataclasses import replace

from gpushepherd.core import Scheduler
from gpushepherd.model.rules import PriorityRules, Rules


def baseline(rules: Rules):
    """``(rules, Scheduler)``: class priority order (then submit time, job id - the
    policy's own priority weights are not used), no reservations, no preemption."""
    return replace(rules, priority=PriorityRules(), backfill_enabled=True, backfill_reservations=0,
                   preemption_enabled=False), Scheduler
