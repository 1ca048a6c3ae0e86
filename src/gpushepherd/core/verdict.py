"""The admission rule's answer (design note 015, section 1): the rule numbers in
precedence order and the ``Verdict`` that ``Admission.decide`` returns."""

from __future__ import annotations

from dataclasses import dataclass

from gpushepherd.core.placement import Counts
from gpushepherd.core.profile import Claim

ADMITTED, HARD_NEVER, HARD_NOW, NEVER_FITS, ORDER, FREE, COHORT, ANTI, CLASS_HOLD, CLAIMS = range(10)
#: rules whose refusal is about capacity: preemption, reclaim and reservations may help
CAPACITY_RULES = frozenset({FREE, COHORT, ANTI, CLASS_HOLD, CLAIMS})
#: rules after whose refusal a job may hold a reservation (a hard limit now may free)
RESERVABLE = CAPACITY_RULES | {HARD_NOW}


def stops_strict_order(job, rule: int) -> bool:
    """Whether ``job`` refused by ``rule`` stops the strict order (backfill off): a
    refusal for capacity - except a share that other classes' ``reserved_gpus`` keep off
    a fresh GPU: it waits for a card a job of a reserved class opens, and such a job
    behind it is the only one that can (seed 22562: a deadlock otherwise)."""
    return rule in CAPACITY_RULES and not (rule == CLASS_HOLD and job.shape.mode == "share")


@dataclass(slots=True)
class Verdict:
    """The answer of the admission rule.

    Attributes:
        rule: ``ADMITTED`` (0) or the first rule that refused.
        counts: whole-GPU placement ``[(node index, GPUs)]`` when admitted.
        spot: a share's ``(node index, GPU, MIG instance position or None, opens a
            fresh GPU)`` when admitted.
        units / charges: what the run would be charged.
        limit: for quota rules, ``(limit index, usage)`` of the limit that refused.
        blocker: for ``CLAIMS``, the claim it would delay.
        holder: for ``CLASS_HOLD``, the class whose reservation binds.
        head: for ``ORDER``, the job ahead of it in its strict FIFO queue.
        variant: for a job of several GPU types with per-type quotas, the index of the
            variant decided on (``Job.variants``; ``-1``: none, note 038).
    """

    rule: int
    counts: Counts | None = None
    spot: tuple | None = None
    units: int = 0
    charges: tuple = ()
    limit: tuple[int, int] | None = None
    blocker: Claim | None = None
    holder: str = ""
    covered: int = 0
    head: str = ""
    variant: int = -1

    @property
    def admitted(self) -> bool:
        return self.rule == ADMITTED
