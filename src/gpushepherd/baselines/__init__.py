"""Baseline schedulers in the same simulator, to measure gpushepherd against.

Each baseline is a short module that names the system or paper it follows:

* ``fifo`` - strict FIFO (first come, first served; a blocked head blocks everyone);
* ``slurm`` - Slurm-like multifactor priority (age, fair-share, job size, QOS) with
  EASY-style backfill;
* ``tiresias`` - Tiresias' discretised two-dimensional LAS (Gu et al., NSDI'19): no
  runtime knowledge, preemptive, by attained GPU-service;
* ``kueue`` - Kueue-like: quotas and priority with ``BestEffortFIFO`` queueing and no
  backfill reservations;
* ``bestfit`` - shares of a GPU placed by plain node best-fit (Kubernetes-style least
  free capacity left on the node, first GPU that fits), the Best-fit baseline of
  GPU-sharing schedulers (Weng et al., ATC'23); everything else is gpushepherd's core.

``BASELINES[name](rules)`` returns ``(rules, scheduler factory)``: the rules the
baseline runs under and a callable ``factory(rules)`` that builds its scheduler (the
gpushepherd core itself for the baselines that are configurations of it).
"""

from __future__ import annotations

from typing import Callable

from gpushepherd.baselines import bestfit, fifo, kueue, slurm, tiresias
from gpushepherd.core import Scheduler
from gpushepherd.model.rules import Rules

Factory = Callable[[Rules], object]


def gpushepherd(rules: Rules) -> tuple[Rules, Factory]:
    """The policy as written, on gpushepherd's core."""
    return rules, Scheduler


BASELINES: dict[str, Callable[[Rules], tuple[Rules, Factory]]] = {
    "gpushepherd": gpushepherd,
    "fifo": fifo.baseline,
    "slurm": slurm.baseline,
    "tiresias": tiresias.baseline,
    "kueue": kueue.baseline,
    "bestfit": bestfit.baseline,
}

__all__ = ["BASELINES", "Factory"]
