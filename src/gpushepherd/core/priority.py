"""Step 2 of the cycle, order: multifactor priority (Slurm's priority/multifactor) with
fair-share over exactly decayed GPU-seconds (design notes 004 and 006).

``score = class_weight * class + fair_share_weight * F + age_weight * age +
size_weight * size + time_limit_weight * short + deadline_weight * urgency - nice``,
each factor in [0, 1]; ``nice`` is the job's own adjustment in score points (Slurm's
``nice``, an admin's nudge when negative; note 039). The queue is ordered by
``(tier, -score, submit time, job id)``; scores are recomputed every ``priority.recalc_s`` (at
its multiples), as Slurm's ``PriorityCalcPeriod``. ``urgency`` is least-laxity-first for
jobs at risk of missing their deadline (note 034); for a job known only by its time
limit and its user's history of run time / time limit, the chance it can still end in
time (note 068). Under
``priority.top_class_tier`` the top class's jobs come before all others whatever their
scores (note 045). Under
``priority.age_tier_s`` a job that has waited that long (at the last recalculation) comes
before every job that has not, below the top class, the oldest first (note 053).
"""

from __future__ import annotations

import math

from gpushepherd.core.fairshare import factor
from gpushepherd.core.intake import time_limit
from gpushepherd.model.job import JobSpec, natural_key


def usage_keys(spec: JobSpec) -> tuple[tuple, ...]:
    """The usage accounts a job's GPU-seconds go to: all, its team, its user in the team."""
    return (("all",), ("team", spec.team), ("user", spec.team, spec.user))


def fair_share_factor(book, team: str, user: str = "", memo: dict | None = None) -> float:
    """Slurm's classic ``2^(-U/S)`` now: the team's share of all decayed usage over its
    share of the teams' ``shares``; at ``fair_share.level: user`` times the same for the
    user inside the team (its users share it equally).

    Memoised per instant (``_fs_memo``): the decayed usage at a fixed ``now`` does not
    change within it (``UsageBook.hold`` at ``t`` leaves the value at ``t`` as it was), so
    a team's factor is the same for every job of the team re-keyed at one instant, as long
    as the teams and users seen (the shares' denominators) are the same.
    ``memo``: ``_fs_memo(book)``, when the caller has it already."""
    if memo is None:
        memo = _fs_memo(book)
    level_user = book.rules.priority.fair_share_level == "user"
    key = (team, user, len(book.users_seen.get(team) or ())) if level_user else team
    f = memo.get(key)
    if f is not None:
        return f
    t = book.now
    usage = book.usage
    total_shares = memo.get(_TOTAL)
    if total_shares is None:
        total_shares = memo[_TOTAL] = sum(book.rules.shares.get(x, 1) for x in book.teams_seen) or 1
    f = factor(usage.value(("team", team), t), usage.value(("all",), t), book.rules.shares.get(team, 1) / total_shares)
    if level_user:
        users = book.users_seen.get(team) or {user}
        f *= factor(usage.value(("user", team, user), t), usage.value(("team", team), t), 1 / len(users))
    memo[key] = f
    return f


_TOTAL = ("", "total shares")


def _fs_memo(book) -> dict:
    """The fair-share factors worked out at this instant (cleared when the instant, the
    teams seen, the usage book or the rules change)."""
    stamp = (book.now, len(book.teams_seen), id(book.usage), id(book.rules))
    if book.fs_memo_stamp != stamp:
        book.fs_memo_stamp = stamp
        book.fs_memo = {}
    return book.fs_memo


def factors(book, spec: JobSpec, cls, estimate: float | None = None) -> dict[str, float]:
    """A job's priority factor by factor, weighted (what ``sprio`` shows): ``class``,
    ``fair_share``, ``age``, ``size``, ``time_limit``, ``deadline``, ``nice`` (score
    points subtracted, sprio's NICE column) and ``priority``: the factors' sum less
    ``nice``."""
    c, fs, age, size, tl, dl = _terms(book, spec, cls, estimate)
    return {"class": c, "fair_share": fs, "age": age, "size": size, "time_limit": tl, "deadline": dl,
            "nice": float(spec.nice), "priority": c + fs + age + size + tl + dl - spec.nice}


def _terms(book, spec: JobSpec, cls, estimate: float | None, memo: dict | None = None) -> tuple[float, ...]:
    """The weighted factors ``(class, fair_share, age, size, time_limit, deadline)``;
    the priority is their sum, in this order, less ``nice`` (``factors``, ``order_key``)."""
    pr = book.rules.priority
    c = pr.class_weight * cls.priority / book.max_prio
    fs = age = size = tl = dl = 0.0
    if pr.fair_share_weight:
        fs = pr.fair_share_weight * fair_share_factor(book, spec.team, spec.user, memo)
    if pr.age_weight and book.recalc_t > spec.submit_time:
        age = pr.age_weight * min(book.recalc_t - spec.submit_time, pr.max_age_s) / pr.max_age_s
    if pr.size_weight:
        total = book.ledger.healthy_total or 1
        size = pr.size_weight * min(1.0, spec.gpus / total)
    if pr.time_limit_weight:
        limit = time_limit(spec, cls)
        if estimate is None:
            estimate = spec.runtime_estimate_s
        if estimate is not None:  # the job's estimate or a prediction, when it has one
            limit = estimate if limit is None else min(limit, estimate)
        if limit is not None:
            tl = pr.time_limit_weight * max(0.0, 1.0 - limit / pr.max_time_limit_s)
    if pr.deadline_weight:
        if cls.priority >= book.max_prio:
            # the top class (production inference) counts as always at risk: a job the
            # factor lifts never passes one of its jobs it was behind (note 034)
            dl = pr.deadline_weight
        elif spec.deadline is not None:
            dl = pr.deadline_weight * urgency(book, spec, cls, estimate)
    return c, fs, age, size, tl, dl


def urgency(book, spec: JobSpec, cls, estimate: float | None = None) -> float:
    """The deadline factor in [0, 1] at the last recalculation: ``1 - slack / horizon``
    for ``0 <= slack <= horizon``, slack = deadline - now - what the job still needs
    (its estimate, else its time limit, else nothing); 0 for a job with slack to spare
    or one that can no longer make it (boosting it would only make others miss theirs).
    Least laxity first (Mok's LLF); among jobs of equal laxity the earlier deadline.

    A job with no estimate of its own whose user (else team) has a history of ratios
    (``RuntimePredictor.ratios_for``; kept whenever the deadline weight is set, with or
    without ``prediction.enabled``) has no known slack: its
    time limit over-estimates its run time and a prediction is one quantile. Its factor
    is the chance it can still end in time if it starts now - the share of the history's
    ratios ``run time / time limit`` at most ``(deadline - now) / limit`` - while its
    slack by the history's median ratio (the upper one of an even count) is within the
    horizon, else 0 (note 068)."""
    pr = book.rules.priority
    ratios, limit = _history(book, spec, cls)
    if ratios is not None:
        left = spec.deadline - max(book.recalc_t, spec.submit_time)
        if left - ratios[len(ratios) // 2] * limit > pr.deadline_horizon_s:
            return 0.0
        return sum(1 for r in ratios if r * limit <= left) / len(ratios)
    slack = _slack(book, spec, cls, estimate, book.recalc_t)
    if slack < 0 or slack > pr.deadline_horizon_s:
        return 0.0
    return 1.0 - slack / pr.deadline_horizon_s


def _history(book, spec: JobSpec, cls) -> tuple[list[float] | None, float | None]:
    """``(sorted ratios run time / time limit, time limit)`` for a job whose deadline
    factor is a chance (``urgency``): no estimate of its own, a time limit, and a
    history of ratios for its user or team; else ``(None, None)``."""
    if spec.runtime_estimate_s is not None or book.predictor is None:
        return None, None
    limit = time_limit(spec, cls)
    ratios = book.predictor.ratios_for(spec.team, spec.user) if limit else None
    return (ratios, limit) if ratios is not None else (None, None)


def _slack(book, spec: JobSpec, cls, estimate: float | None, at: float | None = None) -> float:
    """Seconds a job with a deadline may still wait at ``at`` (default: now) and end by
    it: deadline - at - its estimate (else its time limit, else nothing); for a job whose
    factor is a chance (``urgency``), what its shortest ratio of history needs (after
    that the chance is 0)."""
    ratios, limit = _history(book, spec, cls)
    if ratios is not None:
        need = ratios[0] * limit
    else:
        need = estimate if estimate is not None else spec.runtime_estimate_s
        limit = time_limit(spec, cls)
        if need is None or (limit is not None and limit < need):
            need = limit
    return spec.deadline - max(book.now if at is None else at, spec.submit_time) - (need or 0.0)


def tier(book, spec: JobSpec, cls, prev: int | None = None) -> int:
    """A job's priority tier: 0 for the top class (the highest class priority) under
    ``priority.top_class_tier``; 1 for a job that had waited ``priority.age_tier_s``
    or longer at the last recalculation (``aged``) - under ``priority.age_tier_jobs``
    only one the recalculations promoted (``prev``, its tier so far, is kept); else 2.
    Lower tiers are ordered first, whatever the scores (Slurm's partition
    ``PriorityTier``; notes 045, 053)."""
    pr = book.rules.priority
    if pr.top_class_tier and cls.priority >= book.max_prio:
        return 0
    if not aged(book, spec):
        return 2
    if pr.age_tier_jobs is None:
        return 1
    return 1 if prev == 1 else 2


def aged(book, spec: JobSpec) -> bool:
    """Whether a job had waited ``priority.age_tier_s`` seconds or more (since its submit
    time) at the last recalculation; always false without ``age_tier_s`` (note 053)."""
    limit = book.rules.priority.age_tier_s
    return limit is not None and book.recalc_t - spec.submit_time >= limit


def _key(book, spec: JobSpec, tier_: int, score: float, id_key) -> tuple:
    """The order key ``(tier, -score, submit time, id)``; in the aged tier (1) the score
    is ``-nice`` alone, so that aged jobs go oldest first (an admin's ``nice`` still
    moves one; note 053)."""
    if tier_ == 1:
        return (1, float(spec.nice), spec.submit_time, id_key)
    return (tier_, -score, spec.submit_time, id_key)


def order_key(book, spec: JobSpec, cls, estimate: float | None = None, memo: dict | None = None,
              prev: int | None = None) -> tuple:
    """Queue order: tier (``tier``; ``prev``: the job's tier so far, if it had a key),
    then priority (high first; in the aged tier ``-nice`` alone), then submit time, then
    job id (``memo``: the instant's fair-share factors, ``_fs_memo``)."""
    pr = book.rules.priority
    t = tier(book, spec, cls, prev)
    if not (pr.dynamic or pr.size_weight or pr.time_limit_weight):
        return _key(book, spec, t, pr.class_weight * cls.priority / book.max_prio - spec.nice, natural_key(spec.id))
    c, fs, age, size, tl, dl = _terms(book, spec, cls, estimate, memo)
    return _key(book, spec, t, c + fs + age + size + tl + dl - spec.nice, natural_key(spec.id))


def by_class_alone(book) -> bool:
    """Whether the order is class priority alone (then submit time and id)."""
    pr = book.rules.priority
    return not (pr.dynamic or pr.size_weight or pr.time_limit_weight)


def maybe_recalc(book, t: float) -> None:
    """Every ``priority.recalc_s`` (at its multiples) scores are recomputed from the usage
    and waits of now; the queue is rebuilt in the new order."""
    pr = book.rules.priority
    if not pr.dynamic or t < book.next_recalc:
        return
    book.next_recalc = (math.floor(t / pr.recalc_s) + 1) * pr.recalc_s
    book.recalc_t = t
    if not book.queue:
        return
    memo = _fs_memo(book)
    limited = pr.age_tier_jobs is not None
    promoted, candidates = 0, []
    for job in book.queue.jobs():  # ``order_key`` of a dynamic order, the id's part kept
        spec = job.spec
        t_ = job.key[0]
        if t_ == 2 and aged(book, spec):  # once aged, aged for good: recalc_t only grows
            if limited:
                candidates.append(job)
            else:
                t_ = 1
        if t_ == 1:
            promoted += 1
            job.key = (1, float(spec.nice), spec.submit_time, job.key[3])
            continue
        c, fs, age, size, tl, dl = _terms(book, spec, job.cls, job.estimate_s, memo)
        job.key = (t_, -(c + fs + age + size + tl + dl - spec.nice), spec.submit_time, job.key[3])
    if limited and promoted < pr.age_tier_jobs and candidates:
        # under age_tier_jobs the oldest aged jobs fill the tier up to that many
        candidates.sort(key=lambda j: (j.spec.submit_time, j.key[3]))
        for job in candidates[:pr.age_tier_jobs - promoted]:
            job.key = (1, float(job.spec.nice), job.spec.submit_time, job.key[3])
    book.queue.rekeyed()
    book.dirty = True


def _tier_has_room(book, most: int) -> bool:
    """Whether the aged tier holds fewer than ``most`` jobs while an aged job waits below
    it (``age_tier_jobs``: a recalculation would lift it)."""
    lifted = waiting = 0
    for job in book.queue:
        if job.key[0] == 1:
            lifted += 1
        elif job.key[0] == 2 and not waiting and aged(book, job.spec):
            waiting = 1
    return bool(waiting) and lifted < most


def recalc_matters(book) -> bool:
    """Whether a recalculation can reorder the queue: usage changes only while GPUs are
    held (idle decay scales every account alike, so shares keep their ratios), age
    grows only until ``max_age_s`` (a job enters the aged tier at ``age_tier_s``), and a
    deadline's urgency only while its slack lasts."""
    pr = book.rules.priority
    if pr.fair_share_weight and book.running:
        return True
    # age: some pending job may still be below max_age_s (the newest submission is a
    # cheap upper bound; a spare recalculation is harmless)
    if pr.age_weight and book.last_submit > book.recalc_t - pr.max_age_s:
        return True
    if pr.age_tier_s is not None:
        if book.last_submit > book.recalc_t - pr.age_tier_s:
            return True  # some pending job may still become aged
        if pr.age_tier_jobs is not None and _tier_has_room(book, pr.age_tier_jobs):
            return True  # an aged job waits to be lifted into the tier
    # deadlines (the one scan, last: next_wakeup asks this on the event loop's path):
    # slack shrinks as time passes, until it is gone (then the factor stays 0)
    return bool(pr.deadline_weight) and any(
        j.spec.deadline is not None and _slack(book, j.spec, j.cls, j.estimate_s) >= 0 for j in book.queue)
