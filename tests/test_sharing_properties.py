"""Property tests for GPU sharing (issue #4), checked at every instant of random runs:

* GPU memory is never over-committed on a card; a card's fractions never exceed 1000
  milli-GPU; time-slicing replicas and MPS clients stay within the node's limits;
* MIG instances never overlap and always form a valid layout; a GPU in MIG mode is
  never handed out whole; a whole-GPU allocation never shares its card;
* sandbox and training (anti-affine here) never hold GPUs on one node;
* every job ends (or is rejected at submit, when no node could ever hold it), with
  MIG reconfiguration on or off and across a restart of the scheduler, which changes
  no decision.

The per-instant checks are ``Scheduler.check_invariants`` (``Ledger.check`` asserts
the card sums against their capacity) plus the explicit checks below.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpushepherd.core.ledger import MIG, SHARED
from gpushepherd.model.job import GpuShare, JobSpec
from gpushepherd.model.mig import MIG_MODELS, pack_layout, validate_layout
from gpushepherd.policy import policy_from_dict
from gpushepherd.sim.engine import Restart, SimJob, Simulator

PROFILES = sorted(MIG_MODELS["A100-80GB"])


@st.composite
def clusters(draw):
    nodes = []
    for i in range(draw(st.integers(1, 3))):
        gpus = draw(st.integers(1, 4))
        entry = {"name": f"n{i}", "gpus": gpus, "gpu_type": "A100-80GB",
                 "gpu_mem_mib": draw(st.sampled_from([16000, 40000, 81920]))}
        sharing = {}
        if draw(st.booleans()):
            sharing["time_slicing"] = {"replicas": draw(st.integers(1, 4))}
        if draw(st.booleans()):
            sharing["mps"] = {"max_clients": draw(st.integers(1, 4))}
        if sharing:
            entry["sharing"] = sharing
        if draw(st.booleans()):
            wanted = draw(st.lists(st.sampled_from(PROFILES), min_size=1, max_size=7))
            layout, _left = pack_layout("A100-80GB", wanted)
            entry["mig"] = {"g0": {"layout": [inst.profile for inst in layout]}}
        nodes.append(entry)
    return nodes


@st.composite
def jobs(draw):
    out = []
    for i in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(["whole", "fraction", "memory", "time_slice", "mps", "mig"]))
        share = None
        gpus = 1
        if kind == "whole":
            gpus = draw(st.integers(1, 3))
        elif kind == "fraction":
            share = GpuShare("fraction", milli=draw(st.integers(1, 1000)), mem_mib=draw(st.sampled_from([0, 5000])))
        elif kind == "memory":
            share = GpuShare("fraction", mem_mib=draw(st.integers(1, 50000)))
        elif kind == "time_slice":
            share = GpuShare("time_slice", mem_mib=draw(st.integers(1, 30000)), slots=draw(st.integers(1, 2)))
        elif kind == "mps":
            share = GpuShare("mps", milli=draw(st.integers(50, 500)), mem_mib=draw(st.sampled_from([0, 4000])),
                             slots=draw(st.integers(1, 3)))
        else:
            share = GpuShare("mig", profile=draw(st.sampled_from(PROFILES)))
        spec = JobSpec(id=f"j{i}", team="t", workload_class=draw(st.sampled_from(["training", "batch", "sandbox"])),
                       gpus=gpus, share=share, submit_time=float(draw(st.integers(0, 50))),
                       checkpointable=True)
        out.append(SimJob(spec, float(draw(st.integers(1, 100)))))
    return out


def check_cards(sched) -> None:
    for slot in sched.ledger.slots:
        node = slot.node
        for g, card in slot.cards.items():
            assert card.milli <= 1000 and card.mem <= node.gpu_mem_mib
            if card.mode == "time_slice":
                assert card.slots <= node.ts_replicas
            if card.mode == "mps":
                assert card.slots <= node.mps_clients
            assert slot.holder[g] == SHARED
        for g, mig in slot.migs.items():
            validate_layout(node.gpu_type, mig.layout)
            assert slot.holder[g] == MIG and not slot.healthy_mask >> g & 1
        for g, holder in enumerate(slot.holder):
            if holder not in (None, SHARED, MIG):
                assert g not in slot.cards and g not in slot.migs  # a whole GPU shares its card with nobody
    # class anti-affinity: no node holds sandbox and training jobs at once (both started there)
    for idx, on in enumerate(sched.book.node_classes):
        assert not ("sandbox" in on and "training" in on), f"{sched.ledger.slots[idx].node.name}: {on}"


@settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), jobs(), st.booleans(), st.booleans(), st.none() | st.integers(0, 120))
def test_sharing_invariants_hold_at_every_instant(nodes, sim_jobs, preemption, reconfigure, restart_at):
    rules = policy_from_dict({"cluster": {"nodes": nodes}, "preemption": {"enabled": preemption},
                              "mig": {"reconfigure": reconfigure, "delay_s": 30},
                              "classes": {"sandbox": {"avoid_nodes_with": ["training"]}}}).rules
    events = [Restart(float(restart_at))] if restart_at is not None else []
    sim = Simulator(rules, sim_jobs, events, check_invariants=True)
    orig = sim.sched.check_invariants

    def both():
        orig()
        check_cards(sim.sched)
    sim.sched.check_invariants = both
    result = sim.run()
    if restart_at is not None:  # a restart (snapshot, restore) changes no decision
        plain = Simulator(rules, sim_jobs).run()
        for sj in sim_jobs:
            assert ([(t, str(p)) for t, p in result.records[sj.spec.id].starts]
                    == [(t, str(p)) for t, p in plain.records[sj.spec.id].starts]), f"{sj.spec.id} differs"
    for sj in sim_jobs:
        rec = result.records[sj.spec.id]
        assert rec.state in ("COMPLETED", "REJECTED"), f"{sj.spec.id} ended {rec.state}"
        for _t, placement in rec.starts:
            if sj.spec.share is not None:
                assert len(placement.parts) == 1 and len(placement.parts[0][1]) == 1  # exactly one physical GPU
                assert placement.share
            else:
                assert placement.gpu_count == sj.spec.gpus and not placement.share
