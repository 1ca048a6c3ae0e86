"""What a start in a pass asks of the pass's instant (design note 015, section 3; note 049):
another full pass at once (``book.repass``), or a wake-up when a job it started comes of
age as a victim.

The fast walk and the reference turn each job once, in queue order. A job refused early
in the pass is decided on the state of its turn; a start later in the same pass changes
that state. Free GPUs, victims and quota headroom only shrink in a pass, so a refused job
stays refused - but its *preemption step* (step 5) may find victims that it did not find
at its turn. The decisions of an instant must be those of a full pass on its final state
(issue 20: incremental pass == full pass == ``restore``), so each way a later start can
do that asks for another pass (``Scheduler._schedule``) - each needs a job not started
before, so the repeats end:

* a start a refused job may evict, too young now: a wake-up when it comes of age;
* a start that makes its cohort member borrow after a refused job of another member could
  reclaim nothing, or after the claims refused a job of its own member (it may borrow
  now, and the claims that lend bind it less; seeds 15683, 1430; at its turn or in its
  preemption plan, review of note 082), or of another member (a
  claim of its team may borrow now, and that member's job may reclaim it; note 078's
  review) - another member of any
  cohort of the refused job's: a team borrows as a whole, so a start in one cohort makes
  its jobs in another (a pool's) victims there (seed 235848);
* a share opening a fresh GPU after a share was refused for room: it may join that card
  (seed 19272); any start after a share that may preempt was refused with room left for
  it by a later rule (cohort, anti-affinity, a class hold, the claims): a share preempts
  only when no room takes it (note 042), and the start may take that room (seeds 1323,
  125940, 175695, 189209, 191657);
* a share joining a card after a share could not preempt: evicting a holder of that card
  now leaves a card it may join, where before it had to open the card's GPU afresh
  (seeds 111597, 114465);
* any start after a job of several GPU types (note 038) could not preempt: its preemption
  is planned on the type whose refusal is closest to starting, and a start that takes
  free GPUs of that type may make another type the closest (seed 109485);
* a start charged under a limit of a team that lets a job preempt within it (note 035),
  after a job charged under it too was refused by another rule (no free GPUs, with
  preemption off) or by that limit and another team's: now only such limits may refuse
  it, and its preemption step looks inside the team (seed 494358, note 088);
* a preemptor starting at its turn on free GPUs while its victims are still leaving,
  after a job could not preempt: its hold is dropped, and the GPUs it held may be what
  that job's plan lacked (seeds 168020, 168123);
* a job of a class with ``reserved_gpus`` that starts without taking a free whole GPU
  (a share joining a card, a MIG slice), after a job was refused by a class hold or the
  claims - at its turn (``Turn.held_back``; seeds 119025, 157825) or in its preemption
  plan, on the state without its victims (``Turn.plan_refused``; seed 326198: production
  inference could not evict a sandbox job while training's reserved GPU was half filled
  by a share; a training share then filled the card): the class hold and the claims'
  class slack loosen. Whether the start is *covered* now does not matter (note 074): the
  class hold reads what the class uses, and a plan or a hold's slack reads it without
  victims - a victim of the class, or a preemptor's hold, may have covered the
  reservation now, so a start covered by nothing now fills it there (seed 368854: a
  training share joined a card while a whole training job, which production inference's
  plan would evict, covered training's reservation; 369771: the same with batch).
  After a refusal at a turn only (no refused plan), only when the start filled some of
  its class's reservation that a refusal read unfilled: the class hold (the class's use
  before it below the reservation) or a claim's slack (``Profile.consume`` lowered the
  claim's unfilled part, which it keeps as every later admission reads it, note 078).
  Else nothing loosens, and k such starts took up to k + 1 passes.

Once another pass is asked (by a start, a preemption or a dropped hold), the first job
that would start or reach the preemption step halts the pass (``Turn._decided``,
``Turn.preempt``): nobody behind it preempts or starts, and the next pass turns every job
in queue order (seed 305500: a share that joined a card let a share ahead of it evict the
card's other holders; a share behind it preempted first, before the repeat; seed 341629:
a start made its team borrow, which gave a job ahead a reclaim victim and freed a job
behind from that job's reservation - the job behind started first, and the one ahead had
to evict it too, a second later). Each repeat is asked by a start, a preemption or a
dropped hold of the pass before, so an instant with k of them in all takes up to k + 1
passes (notes 064, 070).
"""

from __future__ import annotations

from gpushepherd.core import preemption, typed
from gpushepherd.core.state import Job
from gpushepherd.model.job import GPU_UNITS


def after_start(turn, job: Job, spot, preemptor: bool, fills: bool) -> None:
    """Ask for what ``job``'s start in ``turn``'s pass calls for (module docstring):
    ``spot`` is a share's ``(node index, GPU, MIG position or None, fresh GPU)`` (``None``:
    whole GPUs); ``preemptor``: it started at its turn as a preemptor whose victims had
    not all left; ``fills``: it filled some of its class's reservation that the class hold
    (its use now) or a claim's class slack (``Profile.consume``) counted unfilled."""
    book = turn.book
    no_victims = turn.no_victims
    if job.evictable and (job.cls.priority < turn.no_victims_prio
                          or any(typed.may_evict(p, job) for p in no_victims)):
        turn.sched.wake_at(preemption.comes_of_age(book, job))
    if book.repass:
        return
    if (spot is not None and not spot[3] and (turn.plan_refused or (turn.held_back and fills))
            and job.cls.name in book.reserved):
        book.repass = True  # its class uses more, no free GPU taken: the class hold may loosen (note 074)
        return
    if spot is None or spot[2] is None:  # whole GPUs, or a card (no MIG instance)
        card = spot is not None
        if (turn.share_may_preempt or (card and spot[3] and turn.share_refused)
                or (card and not spot[3] and any(p.share is not None for p in no_victims))):
            book.repass = True
            return
    if (preemptor and no_victims) or any(typed.at_rest(p) for p in no_victims):
        book.repass = True
        return
    if turn.order_refused and _binds_now(book, job, turn.order_refused):
        book.repass = True
        return
    if turn.within_refused and _within_now(book, job, turn.within_refused):
        book.repass = True
        return
    # (a member's borrowing is its team's: a start in one cohort may make that team's jobs
    # in another cohort - a pool's - victims of a refused job there; seed 235848)
    if job.cohort is not None and (_member_refused(book, job, turn.claims_refused) or any(
            _lent_to(book, p, job) for p in no_victims) or (
            any(typed.borrows_from(p, job) or _team_in_cohorts_of(p, job.cohort[1].team) for p in no_victims)
            and preemption.borrows(book, job))):
        book.repass = True


def _within_now(book, job: Job, refused: list[Job]) -> bool:
    """Whether ``job``'s start, charged under a limit that a refused job is charged under
    too, made that limit refuse it where only limits of teams that let a job preempt within
    the team refuse it (``preemption.within_team``): its preemption step now looks inside
    the team, where at its turn another rule refused it and it could not (seed 494358)."""
    keys = {(i, user) for i, user, _a in (job.run_charges or job.charges)}
    return any(typed.any_variant(p, lambda q: any((i, user) in keys for i, user, _a in q.charges)
                                 and preemption.within_team(book, q)) for p in refused)


def _binds_now(book, job: Job, refused: list[Job]) -> bool:
    """Whether ``job``'s start made a hard limit it is charged under refuse a job that a
    strict FIFO queue's order refused (rule 4, no reservation): rule 2 comes first, and
    a job it refuses may take a reservation slot or preempt within its team (review of
    note 088)."""
    quota = book.quota
    usage, current, cohorts = quota.usage, quota.current, quota.cohort_limits
    keys = {(i, user) for i, user, _a in (job.run_charges or job.charges)}
    return any(typed.any_variant(p, lambda q: any(
        (i, user) in keys and i not in cohorts and usage.get((i, user), 0) + a > current[i]
        for i, user, a in q.charges)) for p in refused)


def _counts_in(book, job: Job) -> list:
    """The cohorts ``job`` counts in: ``typed.cohorts_of`` (its own, or its variants'
    while at rest) and every other policy cohort its charges name a member's limit in
    (a job confined to a pool counts in a cohort of every pool too; note 082)."""
    out = [c for c, _own in typed.cohorts_of(job)]
    for c in book.rules.cohorts.values():
        if c not in out and typed.any_variant(job, lambda j: typed.member_in(c, j) is not None):
            out.append(c)
    return out


def _lent_to(book, p: Job, job: Job) -> bool:
    """Whether ``job``'s start made its member start to borrow in a cohort where the
    refused ``p`` counts as a job of another member and stays within its own nominal
    quota, on some type ``p`` may take: ``job``'s team's lower-class jobs there are
    victims for ``p`` now (the victim rule, ``preemption._lenders``, reads the same
    facts; note 082, oracle seed 441895: a pool job's second cohort). A member that
    borrowed before the start was read so at ``p``'s turn, or asked for its own repeat
    (review of note 082: fewer needless passes)."""
    def lent(q: Job) -> bool:
        for c in book.rules.cohorts.values():
            own = typed.member_in(c, q)
            if own is None or (m := typed.member_in(c, job)) is None or m is own:
                continue
            if (_usage(book, own) + q.units <= own.nominal * GPU_UNITS
                    and _usage(book, m) - _charged(job, m) <= m.nominal * GPU_UNITS < _usage(book, m)):
                return True
        return False
    return typed.any_variant(p, lent)


def _usage(book, member) -> int:
    return book.quota.usage.get((member.limit, ""), 0)


def _charged(job: Job, member) -> int:
    """What a running ``job`` holds of ``member``'s limit, in GPU units."""
    return sum(units for i, user, units in (job.run_charges or job.charges) if i == member.limit and not user)


def _member_refused(book, job: Job, refused: set[str]) -> bool:
    """Whether the claims refused a job of a member (``job``'s own team or another) of a
    cohort ``job`` counts in: its start may make its team's claims borrow, and a refused
    job of another member within its nominal quota may reclaim a borrowing claim's GPUs
    (``Profile.reclaimers_of``; note 078, review of 2026-12-07; every cohort it counts
    in, note 082)."""
    return bool(refused) and any(m.team in refused for c in _counts_in(book, job) for m in c.members)


def _team_in_cohorts_of(job: Job, team: str) -> bool:
    """Whether ``team`` is another member of a cohort ``job`` may count in (a cohort of
    ``typed.cohorts_of``; every other cohort is ``_lent_to``'s, note 082)."""
    return any(m.team == team and m is not own for c, own in typed.cohorts_of(job) for m in c.members)
