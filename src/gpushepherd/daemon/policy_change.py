"""Whether a new policy can replace the one in force on a running server (design note
008, "Policy changes on a running server"). Pure: reads the core, changes nothing."""

from __future__ import annotations

from dataclasses import dataclass

from gpushepherd.core.scheduler import Scheduler, SpecError, validate_spec
from gpushepherd.model.job import JobSpec, JobState, natural_key
from gpushepherd.model.placement import Placement
from gpushepherd.model.rules import Rules


@dataclass(frozen=True)
class Conflict:
    """A live job the new policy would break: ``job`` its id, ``field`` the policy or
    job field at fault, ``msg`` one line naming both."""

    job: str
    field: str
    msg: str


class PolicyConflict(ValueError):
    """A policy refused against the live state; ``conflicts`` names each job and field."""

    def __init__(self, conflicts: list[Conflict]):
        self.conflicts = conflicts
        super().__init__("; ".join(c.msg for c in conflicts))


def conflicts(sched: Scheduler, old: Rules, new: Rules, placements: dict[str, Placement],
              kept: tuple[JobSpec, ...] = ()) -> list[Conflict]:
    """What stops ``new`` from replacing ``old`` under the jobs of ``sched`` that have
    not ended and the jobs ``kept`` from the core (held, waiting for a dependency or a
    begin time: the daemon's, note 021), in job id order:

    * a job the new policy would refuse at submit (``validate_spec``: class, team, time
      limit above the class's max runtime, share kind) - a kept job too: it is submitted
      to the core when released, and would be refused then;
    * a job holding GPUs on a node the new policy removes, on GPU indices it no longer
      has (a node shrunk below the GPUs in use), or in a pool it removes;
    * a pending job whose class may run only in pools the new policy has no node in.

    ``placements``: the last placement of each job holding GPUs.
    """
    out: list[Conflict] = []
    new_nodes = {n.name: n for n in new.nodes}
    old_pool = {n.name: n.pool for n in old.nodes}
    new_pools = {n.pool for n in new.nodes}
    live = [j for j in sched.jobs.values() if not j.state.terminal]
    for job in sorted([*live, *kept], key=lambda j: natural_key(j.id)):
        if isinstance(job, JobSpec):
            _refused_at_submit(new, job, f"job {job.id!r} (PENDING, kept from the scheduler until released)", out)
            continue
        state = f"job {job.id!r} ({job.state.value})"
        _refused_at_submit(new, job.spec, state, out)
        if job.state.holds_gpus:
            for name, gpus in placements[job.id].parts:
                node = new_nodes.get(name)
                if node is None:
                    out.append(Conflict(job.id, "cluster.nodes", f"cluster.nodes: node {name!r} is removed by the new "
                                        f"policy, but {state} holds its GPUs {','.join(map(str, gpus))}"))
                elif gpus and max(gpus) >= node.gpus:
                    out.append(Conflict(job.id, "cluster.nodes.gpus", f"cluster.nodes: node {name!r}: gpus: "
                                        f"{node.gpus} is not allowed: at least {max(gpus) + 1}, {state} holds its "
                                        f"GPU {max(gpus)}"))
                elif old_pool.get(name) not in new_pools:
                    out.append(Conflict(job.id, "cluster.nodes.pool", f"cluster.nodes: pool {old_pool.get(name)!r} "
                                        f"is removed by the new policy, but {state} holds GPUs in it on {name!r}"))
        elif job.state is JobState.PENDING:
            cls = new.classes.get(job.spec.workload_class)
            if cls is not None and cls.pools is not None and not set(cls.pools) & new_pools:
                out.append(Conflict(job.id, f"classes.{cls.name}.pools", f"classes.{cls.name}.pools: "
                                    f"{list(cls.pools)} has no node under the new policy, and {state} waits in it"))
    return out


def _refused_at_submit(new: Rules, spec: JobSpec, state: str, out: list[Conflict]) -> None:
    try:
        validate_spec(new, spec)
    except SpecError as exc:
        field = str(exc).split(": ")[1] if str(exc).count(": ") >= 2 else "spec"
        out.append(Conflict(spec.id, field, f"{exc} under the new policy, and {state} has not ended"))


def never_start(new: Scheduler, kept: tuple[JobSpec, ...] = ()) -> list[tuple[str, str]]:
    """The jobs waiting under the core ``new`` (the live state restored under a new
    policy) and the jobs ``kept`` from it that no node of the new cluster could ever
    hold, as ``(job id, why)`` in job id order - the reason the core rejects such a job
    with at submit (``ExceedsCapacity``). A policy that leaves them is applied (Slurm and
    Kubernetes keep such a job pending too), but says so: a waiting job reads
    ``ExceedsCapacity`` from then on, and a kept job is rejected when released."""
    out = []
    for job in new.jobs.values():
        if job.state is JobState.PENDING and (why := new.inventory_misfit(job)) is not None:
            out.append((job.id, why))
    for spec in kept:
        if spec.workload_class in new.rules.classes and (why := new.spec_misfit(spec)) is not None:
            out.append((spec.id, why + " (kept from the scheduler: rejected when released)"))
    return sorted(out, key=lambda x: natural_key(x[0]))
