"""A preemptor's hold keeps what its plan counted on (design note 054): the whole oracle
(``oracle_checks.check``: fast == reference, the preemptor starts when its victims are
gone, reasons, restarts) on workloads drawn to meet the two classes of fault of the note
- a preemptor that requires one NVLink island while smaller jobs, some preferring or
requiring an island, arrive during its victims' grace period (seed 10002's class), and a
whole-GPU preemptor that empties a shared card on another node for a class reservation
while shares arrive (seed 211517's class). Hand-computed instances: scenarios I20-26 and
I20-27."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from builders import job, node, policy_dict
from gpushepherd.model.events import GpuHealthChanged
from gpushepherd.model.job import GpuShare
from oracle_hypothesis import PROFILE, assert_clean
from oracle_workloads import Workload

ISLANDS = ([[0, 1, 2, 3], [4, 5, 6, 7]], [[0, 1], [2, 3], [4, 5], [6, 7]], [[0, 1, 2, 3], [4, 5], [6, 7]])


@st.composite
def island_holds(draw) -> Workload:
    """One 8-GPU node with islands, its GPUs laid out by drawing: all out of service at
    0; the GPUs of V (sandbox, evictable) come back and V starts on them, then each GPU
    of a drawn busy set comes back and a production-inference job takes it, then the
    rest come back free. P (research-training, 2-4 GPUs, requiring an island) comes at
    20; smaller jobs come during V's grace period, preferring or requiring an island."""
    raw = policy_dict(nodes=[node("n1", 8, nvlink_islands=draw(st.sampled_from(ISLANDS)))],
                      classes={"sandbox": {"grace_period_s": 50.0}},
                      preemption={"enabled": True, "min_runtime_s": 0.0})
    order = draw(st.permutations(range(8)))
    n_v, n_busy = draw(st.integers(1, 3)), draw(st.integers(0, 4))
    events = [GpuHealthChanged(0.0, node="n1", gpu=g, healthy=False) for g in range(8)]
    jobs = []
    for i, g in enumerate(order):
        t = 1.0 + i
        events.append(GpuHealthChanged(t, node="n1", gpu=g, healthy=True))
        if i == n_v - 1:
            jobs.append((job("v", n_v, "sandbox", "u", t + 0.5), 1000.0))
        elif n_v <= i < n_v + n_busy:
            jobs.append((job(f"w{i}", 1, "production-inference", "u", t + 0.5), 1000.0))
    jobs.append((job("p", draw(st.integers(2, 4)), "research-training", "t", 20.0, require_island=True), 100.0))
    for i in range(draw(st.integers(1, 3))):
        spec = job(f"j{i}", draw(st.integers(1, 3)), draw(st.sampled_from(["research-training", "batch"])), "t",
                   21.0 + 10 * i, require_island=draw(st.sampled_from([None, True])))
        jobs.append((spec, draw(st.sampled_from([30.0, 500.0]))))
    return Workload(raw, jobs, events)


@st.composite
def freed_cards(draw) -> Workload:
    """Two or three nodes of one GPU or two; production inference reserves GPUs; lower
    shares open cards, a whole-GPU preemptor of a type only some nodes have comes, and
    shares of the victims' kind arrive while the victims leave."""
    types = ["A100-80GB", "H100-80GB"]
    nodes = [node(f"n{i}", draw(st.integers(1, 2)), types[i % 2]) for i in range(draw(st.integers(2, 3)))]
    raw = policy_dict(nodes=nodes, classes={"production-inference": {"reserved_gpus": draw(st.integers(1, 2))},
                                            "sandbox": {"grace_period_s": 50.0}}, preemption={"enabled": True, "min_runtime_s": 0.0})
    half = GpuShare("fraction", milli=500)
    jobs = []
    for i in range(draw(st.integers(1, 3))):
        jobs.append((job(f"v{i}", 1, "sandbox", "u", i * 0.1, share=half, gpu_types=(draw(st.sampled_from(types)),)),
                     draw(st.sampled_from([10.0, 1000.0]))))
    jobs.append((job("p", 1, "research-training", "t", 1.0, gpu_types=(draw(st.sampled_from(types)),)), 50.0))
    for i in range(draw(st.integers(1, 3))):
        jobs.append((job(f"s{i}", 1, draw(st.sampled_from(["sandbox", "batch"])), "u", 2.0 + i, share=half,
                         gpu_types=(draw(st.sampled_from(types)),)), draw(st.sampled_from([30.0, 1000.0]))))
    return Workload(raw, jobs, [])


@settings(max_examples=100, **PROFILE)
@given(island_holds())
def test_a_preemptor_that_requires_an_island_starts_on_it_when_its_victims_are_gone(wl):
    assert_clean(wl)


@settings(max_examples=60, **PROFILE)
@given(freed_cards())
def test_a_card_a_preemptor_empties_elsewhere_for_a_reservation_stays_empty(wl):
    assert_clean(wl)
