"""MIG re-partitioning for the pending mix (``mig.reconfigure``, design note 007).

After the pass, pending MIG jobs that find no free instance of their profile (nor one in
a layout being applied), and that no limit nor their cohort's capacity would keep
waiting on one, get, in queue order, the first idle, healthy MIG GPU of a node they may
use whose model has their profile. The new layout holds their profile, then the
profiles of later waiting jobs that still fit (queue order), then the smallest profile
in what is left, so that no slice is wasted. The GPU serves nobody until the driver
reports ``MigReconfigured``.
"""

from __future__ import annotations

from gpushepherd.core import admission as A, typed
from gpushepherd.core.placement import members_of
from gpushepherd.model.decisions import Decision, ReconfigureMig
from gpushepherd.model.job import JobState
from gpushepherd.model.mig import MigError, layout_from_names, mig_model, profiles_for


def fits_layout(gpu_type: str, names: list[str]) -> bool:
    try:
        layout_from_names(gpu_type, names)
    except MigError:
        return False
    return True


def plan_mig(book, adm, out: list[Decision]) -> None:
    """Emit ``ReconfigureMig`` decisions for the waiting MIG jobs (module docstring)."""
    ledger = book.ledger
    waiting = sorted((j for j in book.queue if j.share is not None and j.share.kind == "mig"), key=lambda j: j.key)
    if not waiting:
        return
    supply = {key: [p for _s, p in layout] for key, layout in sorted(book.mig_plans.items())}
    #: idle cards a free instance of which an earlier waiting job counts on: never
    #: re-partitioned under it (seed 17695: a 3g job's plan took the 2g card a 2g job
    #: ahead of it was to use, and that job needed a plan of its own a pass later)
    relied: set[tuple[int, int]] = set()
    for i, job in enumerate(waiting):
        prof = job.share.profile
        v = adm.decide(job, None)
        if v.rule in (A.HARD_NEVER, A.HARD_NOW, A.NEVER_FITS, A.COHORT):
            continue  # a limit, not a missing instance, keeps it waiting
        if v.rule == A.FREE and job.cohort is not None and adm._blocking(v.charges, True, None) is not None:
            # the cohort's capacity (rule 6, read only once an instance is found) would
            # keep it waiting on the new instance too: a card re-partitioned for it would
            # be re-partitioned for the next such job, and back (oracle seed 152755)
            continue
        with typed.bound(job, v.variant):  # per-type quotas: only cards of a type it may take (note 038)
            groups = book.groups_for(job)
            nodes = book.nodes_for(job)
        free = ledger.best_mig(groups, prof)
        if free is not None:
            relied.add(free[:2])
            continue  # an instance is free: the job waits for something else
        served = next((k for k in sorted(supply) if k[0] in nodes and prof in supply[k]), None)
        if served is not None:
            supply[served].remove(prof)
            continue
        target = None
        for idx in members_of(ledger, groups):
            slot = ledger.slots[idx]
            model = mig_model(slot.node.gpu_type)
            if model is None or prof not in profiles_for(model):
                continue
            for gpu in sorted(slot.migs):
                card = slot.migs[gpu]
                if card.idle and card.in_service and (idx, gpu) not in relied:
                    target = (idx, gpu)
                    break
            if target is not None:
                break
        if target is None:
            continue
        idx, gpu = target
        node = ledger.slots[idx].node
        names = [prof]
        for other in waiting[i + 1:]:
            if idx in book.nodes_for(other) and fits_layout(node.gpu_type, names + [other.share.profile]):
                names.append(other.share.profile)
        profs = profiles_for(node.gpu_type)
        smallest = min(profs.values(), key=lambda p: (p.size, p.compute_slices, "+" in p.name, p.name)).name
        while fits_layout(node.gpu_type, names + [smallest]):
            names.append(smallest)
        layout = tuple((inst.start, inst.profile) for inst in layout_from_names(node.gpu_type, names))
        ledger.begin_reconfigure(idx, gpu)
        book.mig_plans[target] = layout
        rest = [p for _s, p in layout]
        rest.remove(prof)
        supply[target] = rest
        book.log(job, JobState.PENDING, JobState.PENDING,
                 f"MIG reconfiguration of {node.name}:{gpu} to {','.join(p for _s, p in layout)}")
        out.append(ReconfigureMig(book.now, job.id, node=node.name, gpu=gpu, layout=layout))
        book.topology_changed()
