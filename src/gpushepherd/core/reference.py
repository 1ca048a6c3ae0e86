"""The reference pass: the same rules as ``cycle.run_fast`` with none of its shortcuts
(design note 015, section 8). Written for clarity, slow by design: every pending job in
queue order takes its turn, every fact is recomputed, reservations are computed when
their job blocks. ``Scheduler(rules, reference=True)`` runs it; the oracle tests
(``tests/test_oracle.py``, ``bench/oracle.py``) require the fast pass to take the same
decisions, decision by decision.

The one thing it does not copy is the fast pass's budget (``backfill.max_job_test``): a
bound on work that no oracle workload reaches.
"""

from __future__ import annotations

from gpushepherd.core import admission as A
from gpushepherd.core.cycle import Turn
from gpushepherd.model.decisions import Decision
from gpushepherd.model.job import JobState


def run_reference(sched, out: list[Decision]) -> Turn:
    """One pass: step 3 (holds), then every pending job in order (steps 4-7)."""
    book = sched.book
    turn = Turn(sched, out, dequeue_now=True)
    turn.holds()
    for job in sorted(book.queue, key=lambda j: j.key):
        if turn.halted:
            break  # another pass was asked before a job could preempt: it turns them all
        if job.state is not JobState.PENDING:
            continue
        _outcome, rule = turn.turn(job)
        turn.materialize()  # a reservation is computed when its job blocks
        if not book.rules.backfill_enabled and A.stops_strict_order(job, rule) and job.id not in book.preemptors:
            break  # no backfill: nobody passes a blocked job
    return turn
