"""Snapshot and restore: the core's state as plain data, and back (note 008: the daemon's
restart, the simulator's ``Restart``).

Only jobs are saved - specs, states, placements, banked work, the charge of the current
run - with the health of GPUs, lost and added nodes, MIG layouts, usage and predictor
history; the ledger, quota counters and indexes are rebuilt from the live jobs on
restore, so a restart cannot resurrect a stale allocation. Nothing of a pass is saved:
every pass recomputes its reservations from this state, so a restored scheduler takes
the same decisions as one that ran on (the oracle tests check it).
"""

from __future__ import annotations

import heapq
from dataclasses import asdict

from gpushepherd.core import typed
from gpushepherd.core.intake import make_job
from gpushepherd.core.ledger import bits
from gpushepherd.core.lifecycle import unmanaged_gpus
from gpushepherd.core.priority import tier
from gpushepherd.core.state import Transition
from gpushepherd.core.usage import UsageTrack
from gpushepherd.model.cluster import Node
from gpushepherd.model.job import GpuShare, JobSpec, JobState, natural_key
from gpushepherd.model.mig import MigInstance


def snapshot(book) -> dict:
    """The scheduler's state as plain data (JSON-serialisable).

    Only jobs are saved - specs, states, placements, banked work - and the health
    of GPUs; the ledger and usage counters are rebuilt from the live jobs on
    ``restore`` (so a restart cannot resurrect a stale allocation).
    """
    jobs = []
    for job in sorted(book.jobs.values(), key=lambda j: j.seq):
        spec = job.spec
        jobs.append({
            "spec": {f: (asdict(spec.share) if f == "share" and spec.share is not None else getattr(spec, f))
                     for f in spec.__dataclass_fields__},
            "share_at": list(job.share_at),
            "state": job.state.value,
            "alloc": [[book.ledger.slots[i].node.name, list(bits(m))] for i, m in job.alloc],
            "run_start": job.run_start,
            "first_start": job.first_start,
            "runs": job.runs,
            "preemptions": job.preemptions,
            "done_s": job.done_s,
            "signal_t": job.signal_t,
            "preemptor": job.preemptor,
            "victims": sorted(job.victims),
            "plan": [[book.ledger.slots[i].node.name, c] for i, c in job.plan],
            "hold_gpus": [[book.ledger.slots[i].node.name, list(bits(m))] for i, m in sorted(job.hold_gpus.items())],
            "score": -job.key[1],  # key: (tier, -score, submit time, id)
            "tier": job.key[0] if job.key else None,
            "run_units": job.run_units if job.state.holds_gpus else None,
            "covered": job.covered if job.state.holds_gpus else None,
            "start_no": job.start_no if job.state.holds_gpus else None,
            "reclaim": job.reclaim,
            # a preemptor's GPU type (note 038): a share joining a card plans on no node
            "gpu_type": typed.bound_type(job) if job.id in book.preemptors else None,
            "estimate_s": job.estimate_s,
            "deadline_flags": [list(f) for f in job.deadline_flags],
            "stop_reason": job.stop_reason,
            "preempted_by": job.preempted_by,
            "usage": book.tracks[job.id].to_dict() if job.id in book.tracks else None,
        })
    unhealthy = []
    lost = []
    for slot in book.ledger.slots:
        if not slot.alive:
            lost.append(slot.node.name)
            continue
        for g in range(slot.total):
            if g in slot.migs:
                if not slot.migs[g].healthy:
                    unhealthy.append([slot.node.name, g])
            elif slot.sick_mask >> g & 1:
                unhealthy.append([slot.node.name, g])
    static = {n.name: n for n in book.rules.nodes}
    added = [
        {f: ([[g, [[i.start, i.profile] for i in layout]] for g, layout in s.node.mig] if f == "mig"
             else getattr(s.node, f)) for f in s.node.__dataclass_fields__}
        for s in book.ledger.slots if static.get(s.node.name) != s.node  # added, or re-added as another node
    ]
    mig = []
    for slot in book.ledger.slots:
        for g in sorted(slot.migs):
            card = slot.migs[g]
            static = dict(slot.node.mig).get(g)
            if card.layout != static or card.reconfiguring:
                plan = book.mig_plans.get((slot.idx, g))
                mig.append([slot.node.name, g, [[i.start, i.profile] for i in card.layout],
                            [list(x) for x in plan] if plan is not None else None])
    return {"now": book.now, "jobs": jobs, "unhealthy": unhealthy, "lost_nodes": lost, "added_nodes": added,
            "unmanaged": [list(x) for x in unmanaged_gpus(book)],
            "mig": mig,
            "usage": book.usage.snapshot(book.now) if book.now != float("-inf") else [],
            "usage_exact": book.usage.exact() if book.now != float("-inf") else [],
            "priority_recalc": [book.recalc_t, book.next_recalc],
            # the wake-ups a pass asked for (a victim coming of age): not worked out from
            # the state again, so a restored core keeps them (seed 311299)
            "wakeups": sorted(t for t in book.wakeups if t > book.now),
            "predictor": book.predictor.snapshot() if book.predictor is not None else []}



def restore_into(sched, snap: dict) -> None:
    """Rebuild ``sched`` (new, under its rules) from ``snapshot()`` data.

    Raises:
        ValueError: the snapshot's allocations collide (a GPU given twice) or name
            GPUs that do not exist.
    """
    book = sched.book
    _warm(book)
    for raw in snap.get("added_nodes", []):
        node = Node(**{**raw, "labels": tuple(tuple(x) for x in raw.get("labels", ())),
                       "nvlink_islands": tuple(tuple(x) for x in raw.get("nvlink_islands", ())),
                       **{f: tuple(raw.get(f, ())) for f in ("gpu_uuids", "taints", "cached")},
                       "mig": tuple((g, tuple(MigInstance(start, prof) for start, prof in layout))
                                    for g, layout in raw.get("mig", ()))})
        if node.name in book.ledger.by_name:  # a policy node that came back as another
            book.ledger.remove_node(book.ledger.by_name[node.name])
        book.ledger.add_node(node)
    for name in snap.get("lost_nodes", []):
        if name in book.ledger.by_name:
            book.ledger.remove_node(book.ledger.by_name[name])
    book.reserved = book.reservations()  # over the nodes as restored (note 069)
    for name, g in snap.get("unhealthy", []):
        book.ledger.set_gpu_health(book.ledger.by_name[name], g, False)
    for name, g, layout, plan in snap.get("mig", []):
        idx = book.ledger.by_name[name]
        book.ledger.reconfigure_mig(idx, g, tuple(MigInstance(s, p) for s, p in layout))
        if plan is not None:
            book.ledger.begin_reconfigure(idx, g)
            book.mig_plans[(idx, g)] = tuple((int(s), str(p)) for s, p in plan)
    book.now = snap.get("now", float("-inf"))
    if book.now != float("-inf"):
        book.quota.set_time(book.now)
        book.usage.restore(snap.get("usage", []), book.now)
    book.recalc_t, book.next_recalc = snap.get("priority_recalc", [float("-inf"), float("-inf")])
    book.wakeups = [float(t) for t in snap.get("wakeups", [])]  # sorted: a heap
    if book.predictor is not None:
        book.predictor.restore(snap.get("predictor", []))
    bound: dict[str, str | None] = {}  # a preemptor's GPU type, by job id
    for raw in snap["jobs"]:
        spec_raw = dict(raw["spec"])
        spec_raw["gpu_types"] = tuple(spec_raw.get("gpu_types", ()))
        spec_raw["node_selector"] = tuple(tuple(x) for x in spec_raw.get("node_selector", ()))
        spec_raw["tolerations"] = tuple(spec_raw.get("tolerations", ()))
        if spec_raw.get("share") is not None:
            spec_raw["share"] = GpuShare(**spec_raw["share"])
        spec = JobSpec(**spec_raw)
        job = make_job(book, spec, keyed="score" not in raw)  # keyed below from the snapshot
        book.jobs[spec.id] = job
        job.runs = raw["runs"]
        job.first_start = raw["first_start"]
        job.preemptions = raw["preemptions"]
        job.done_s = raw["done_s"]
        job.signal_t = raw["signal_t"]
        job.preemptor = raw["preemptor"]
        job.victims = set(raw["victims"])
        job.plan = [(book.ledger.by_name[n], c) for n, c in raw["plan"]]
        job.hold_gpus = {book.ledger.by_name[n]: sum(1 << g for g in gpus) for n, gpus in raw.get("hold_gpus", [])}
        job.reclaim = bool(raw.get("reclaim", False))
        bound[spec.id] = raw.get("gpu_type")
        if "estimate_s" in raw:  # the estimate it was given at submit (a prediction may differ now)
            job.estimate_s = raw["estimate_s"]
        job.deadline_flags = [(float(t), str(stage), float(end)) for t, stage, end in raw.get("deadline_flags", [])]
        job.stop_reason = str(raw.get("stop_reason") or "")
        job.preempted_by = str(raw.get("preempted_by") or "")
        if raw.get("usage") is not None:
            tr = book.tracks[spec.id] = UsageTrack.from_dict(raw["usage"])
            rule = job.cls.idle_stop
            if (tr.idle_since is not None and rule is not None and tr.run == job.runs
                    and raw["state"] == JobState.RUNNING.value):
                heapq.heappush(book.idle_timers, (tr.idle_since + rule.after_s, job.seq, job.runs, spec.id,
                                                    tr.idle_since))
        if "score" in raw:  # the score it was queued with (computed at submit or the last recalc)
            job.key = (_restored_tier(book, spec, job.cls, raw.get("tier")), -float(raw["score"]), spec.submit_time,
                       natural_key(spec.id))
        state = JobState(raw["state"])
        job.history.append(Transition(book.now, "", state.value, "restored", 0))
        if state is JobState.PENDING:
            book.enqueue(job)
        elif state.holds_gpus:
            alloc = []
            for name, gpus in raw["alloc"]:
                idx = book.ledger.by_name.get(name)
                if idx is None:
                    raise ValueError(f"snapshot: job {spec.id} holds GPUs on unknown node {name}")
                mask = 0
                for g in gpus:
                    mask |= 1 << g
                alloc.append((idx, mask))
            at = tuple(raw.get("share_at", ()))
            if spec.share is not None:
                if len(alloc) != 1 or not at:
                    raise ValueError(f"snapshot: share job {spec.id} without its card")
                if len(at) == 1:
                    book.ledger.allocate_share(spec.id, alloc[0][0], at[0], spec.share.kind,
                                               spec.share.need(book.ledger.slots[alloc[0][0]].node))
                else:
                    book.ledger.allocate_mig(spec.id, alloc[0][0], at[0], at[1])
                job.share_at = at
            book.occupy(job, alloc, raw["run_start"], state, raw.get("run_units"), raw.get("covered"),
                        raw.get("start_no"))
        else:
            job.state = state
    book.usage.settle(snap.get("usage_exact", []))  # decayed from where it was (older snapshots: from now)
    for job in book.queue:
        if job.victims or job.plan:  # a hold stays in force until the preemptor's turn
            book.preemptors[job.id] = job
            if job.plan:
                typed.at_node(book, job, job.plan[0][0])  # held to the GPU type it planned on (note 038)
            else:
                typed.bind_type(job, bound.get(job.id))
    for name, g in snap.get("unmanaged", []):  # after the jobs: those holding them keep them
        book.ledger.set_gpu_unmanaged(book.ledger.by_name[name], g, True)
        book.any_unmanaged = True
    book.dirty = True


#: the rules of the last restore, and its memos of pure functions of the rules alone
_WARM: list = [None, {}, {}]


def _warm(book) -> None:
    """Give a new book the memos of the last book restored under the same rules object:
    the limits a team and class count in (``QuotaBook.applicable``) and the cohorts
    (``Book.cohort_of``) are functions of the (immutable) rules alone, so one memo
    serves every book under them - a restore (the oracle: two per instant) then does
    not work them out again for every job (note 062)."""
    if _WARM[0] is not book.rules:
        _WARM[:] = [book.rules, {}, {}]
    book.quota._applicable = _WARM[1]
    book.cohort_cache = _WARM[2]


def _restored_tier(book, spec, cls, stored) -> int:
    """The tier a restored job is keyed with: the one it was queued with (``stored``; a
    running job keeps the key it was last queued with, and a requeue brings it back
    under that key, so recomputing the aged tier from now would differ from the run that
    was not restarted), as far as the rules (maybe changed) still allow it: the top
    class's tier from the class, the aged tier only while ``age_tier_s`` is set (aged
    stays aged; a job the restored rules would lift is lifted at the next
    recalculation). An older snapshot (no ``tier``): from the class and age."""
    if stored is None:
        return tier(book, spec, cls)
    pr = book.rules.priority
    if pr.top_class_tier and cls.priority >= book.max_prio:
        return 0
    return 1 if int(stored) == 1 and pr.age_tier_s is not None else 2
