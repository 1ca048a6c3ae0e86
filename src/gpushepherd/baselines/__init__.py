"""Baseline schedulers in the same simulator, to measure gpushepherd against (design
notes 006 and 024). Each is what its name says, at its strongest honest configuration:
it sees what the scheduler it follows would see (time limits, never true durations).

* ``gpushepherd`` - the policy as written, on gpushepherd's core;
* ``slurm-default`` - Slurm out of the box: submit order and backfill with
  ``bf_max_job_test``-deep reservations (``slurm.py``);
* ``slurm`` - Slurm's multifactor priority with a site's QOS (the workload class),
  fair-share, age and size, and the same backfill;
* ``slurm-timelimit`` - ``slurm`` plus gpushepherd's time-limit factor;
* ``kueue`` - Kueue with ``BestEffortFIFO`` queues, no reservations (``kueue.py``);
* ``kueue-strict`` - Kueue with ``StrictFIFO`` queues: a team's blocked head blocks
  its queue;
* ``tiresias`` - Tiresias' discretised two-dimensional LAS (Gu et al., NSDI'19): no
  runtime knowledge, preemptive, by attained GPU-service;
* ``fifo`` - strict FIFO (first come, first served; a blocked head blocks everyone);
* ``bestfit`` - shares of a GPU placed by plain node best-fit (Kubernetes-style least
  free capacity left on the node, first GPU that fits), the Best-fit baseline of
  GPU-sharing schedulers (Weng et al., ATC'23); everything else is gpushepherd's core.

``BASELINES[name](rules)`` returns ``(rules, scheduler factory)``: the rules the
baseline runs under and a callable ``factory(rules)`` that builds its scheduler (the
gpushepherd core itself for the baselines that are configurations of it).
``build(name, rules, bf_depth)`` does the same with a checked name and the Slurm
baselines' reservation depth.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from gpushepherd.model.rules import Rules

Factory = Callable[["Rules"], object]

#: the names of ``BASELINES``, in its order (``tests/test_baselines.py`` checks it): known
#: without importing the core, so that ``shepherd simulate --help`` starts fast (note 028)
NAMES = ("gpushepherd", "slurm-default", "slurm", "slurm-timelimit", "kueue", "kueue-strict", "tiresias", "fifo",
         "bestfit")
#: the baselines that take a backfill reservation depth (``bf_max_job_test``)
BF_DEPTH = frozenset({"slurm-default", "slurm", "slurm-timelimit"})
#: the baselines whose scheduler is not gpushepherd's core as the simulator drives it:
#: no pending reasons, ``--explain``, report page or stranded-capacity samples
NOT_CORE = frozenset({"tiresias", "kueue-strict"})


def gpushepherd(rules: Rules) -> tuple[Rules, Factory]:
    """The policy as written, on gpushepherd's core."""
    from gpushepherd.core import Scheduler

    return rules, Scheduler


@cache
def _registry() -> dict[str, Callable[..., tuple[Rules, Factory]]]:
    from gpushepherd.baselines import bestfit, fifo, kueue, slurm, tiresias

    return {
        "gpushepherd": gpushepherd,
        "slurm-default": slurm.default,
        "slurm": slurm.baseline,
        "slurm-timelimit": slurm.timelimit,
        "kueue": kueue.baseline,
        "kueue-strict": kueue.strict,
        "tiresias": tiresias.baseline,
        "fifo": fifo.baseline,
        "bestfit": bestfit.baseline,
    }


def __getattr__(name: str):
    # ``BASELINES`` (name -> function) imports the baselines, and through them the core,
    # on first use only (PEP 562)
    if name == "BASELINES":
        return _registry()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class BaselineError(ValueError):
    """A scheduler name that is not one of ``BASELINES``, or a depth below 1."""


def build(name: str, rules: Rules, bf_depth: int | None = None) -> tuple[Rules, Factory]:
    """``BASELINES[name](rules)``, with ``bf_depth`` reservations for the Slurm
    baselines (``None``: ``slurm.DEFAULT_BF_DEPTH``; ignored by the others).

    Raises:
        BaselineError: ``name`` is not a baseline (the message lists them), or
            ``bf_depth`` is below 1.
    """
    if name not in NAMES:
        raise BaselineError(f"--scheduler: {name!r} is not allowed: one of {', '.join(NAMES)}")
    if bf_depth is not None and bf_depth < 1:
        raise BaselineError(f"--bf-depth: {bf_depth!r} is not allowed: a reservation depth >= 1")
    baselines = _registry()
    if name in BF_DEPTH:
        return baselines[name](rules, bf_depth=bf_depth)
    return baselines[name](rules)


__all__ = ["BASELINES", "BF_DEPTH", "NOT_CORE", "Factory", "BaselineError", "build"]
