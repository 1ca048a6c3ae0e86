"""The openb (Alibaba GPU-sharing, FGD ATC'23) loader, its replay and the node best-fit baseline."""

from pathlib import Path

import pytest

from gpushepherd.baselines import BASELINES
from gpushepherd.baselines.bestfit import NodeBestFit, node_free_milli
from gpushepherd.core import Scheduler
from gpushepherd.model.decisions import Start
from gpushepherd.model.events import JobSubmitted
from gpushepherd.policy import policy_from_dict
from gpushepherd.sim.openb import (
    OpenbError,
    OpenbNode,
    OpenbPod,
    arrivals,
    job_spec,
    policy_dict,
    read_nodes,
    read_pods,
    replay,
)
from gpushepherd.sim.traces import TraceError
from builders import write_file

ROOT = Path(__file__).resolve().parent.parent
OPENB = ROOT.parent / "shared" / "traces" / "alibaba_gpu_v2023_openb"

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_HEADER = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
              "scheduled_time\n")


_write = write_file


def _node(name: str, gpus: int, model: str = "G2") -> OpenbNode:
    return OpenbNode(name, name, gpus, model, 64000, 262144)


def _pod(name: str, num_gpu: int = 1, milli: int = 1000, spec: tuple[str, ...] = ()) -> OpenbPod:
    return OpenbPod(name, num_gpu, milli, spec, 0.0, 1000, 1024, 0)


def _rules(nodes):
    return policy_from_dict(policy_dict(nodes), "test").rules


def _starts(factory, nodes, pods):
    """Submit ``pods`` one per instant; returns the scheduler and ``{pod: (node, gpu, share)}``."""
    sched = factory(_rules(nodes))
    placed = {}
    for i, p in enumerate(pods):
        for d in sched.handle([JobSubmitted(float(i), job_spec(p, p.name, float(i)))]):
            if isinstance(d, Start):
                (node, gpus), = d.placement.parts
                placed[d.job_id] = (node, gpus, d.placement.share)
    sched.check_invariants()
    return sched, placed


# ------------------------------------------------------------------ loader
def test_reader_keeps_gpu_nodes_and_gpu_pods_in_creation_order(tmp_path):
    nodes = _write(tmp_path, "nodes.csv.gz", NODE_HEADER + "cpu-0,32000,262144,0,\nn-1,96000,786432,8,V100M32\n"
                   "n 2,64000,262144,2,P100\n")
    pods = _write(tmp_path, "pods.csv", POD_HEADER
                  + "p0,4000,1000,1,220,,BE,Running,30,40,30\n"
                  + "p1,8000,1000,0,0,,LS,Running,5,9,5\n"          # CPU-only: left out
                  + "p2,8000,1000,8,1000,V100M16|V100M32,LS,Running,10,20,10\n"
                  + "p3,8000,1000,1,1000,nan,LS,Pending,10,,\n")    # tie with p2: file order
    got = read_nodes(nodes)
    assert [(n.name, n.policy_name, n.gpus, n.model) for n in got] == [("n-1", "n-1", 8, "V100M32"),
                                                                      ("n 2", "n-2", 2, "P100")]
    ps = read_pods(pods)
    assert [p.name for p in ps] == ["p2", "p3", "p0"]
    assert ps[0].gpu_spec == ("V100M16", "V100M32") and ps[1].gpu_spec == ()
    assert [p.demand_milli for p in ps] == [8000, 1000, 220] and [p.shared for p in ps] == [False, False, True]
    assert [p.row for p in ps] == [4, 5, 2]
    assert [p.name for p in read_pods(pods, limit=2)] == ["p2", "p3"]


def test_reader_without_times_keeps_file_order(tmp_path):
    pods = _write(tmp_path, "multigpu.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
                  "b,1000,10,2,1000\na,1000,10,1,500\n")
    ps = read_pods(pods)
    assert [(p.name, p.creation_time, p.gpu_spec) for p in ps] == [("b", None, ()), ("a", None, ())]


@pytest.mark.parametrize("row, fragment", [
    ("q,1000,10,x,500,,BE,Running,1,2,1", "row 3: column 'num_gpu': 'x' is not allowed: a whole number from 0 to 256"),
    ("q,1000,10,1.5,500,,BE,Running,1,2,1", "column 'num_gpu': '1.5' is not allowed"),
    ("q,1000,10,1,1500,,BE,Running,1,2,1", "row 3: column 'gpu_milli': '1500' is not allowed: a whole number from 0"),
    ("q,1000,10,1,0,,BE,Running,1,2,1", "column 'gpu_milli': '0' is not allowed: 1 to 1000 for a pod with num_gpu 1"),
    ("q,1000,10,4,500,,BE,Running,1,2,1", "column 'gpu_milli': '500' is not allowed: 1000 for a pod with num_gpu 4"),
    ("q,1000,10,1,500,,BE,Running,-5,2,1", "row 3: column 'creation_time': '-5' is not allowed: a number of seconds"),
    ("q,1000,10,1,500,,BE,Running,,2,1", "column 'creation_time': '' is not allowed"),
    ("q,-1,10,1,500,,BE,Running,1,2,1", "column 'cpu_milli': '-1' is not allowed"),
    ("p,1000,10,1,500,,BE,Running,1,2,1", "row 3: column 'name': 'p' is not allowed: a name used once (first at row 2)"),
    ("q,1000,10,1,500,A||B,BE,Running,1,2,1", "column 'gpu_spec': 'A||B' is not allowed: GPU model names"),
])
def test_malformed_pod_row_names_file_row_column_and_value(tmp_path, row, fragment):
    p = _write(tmp_path, "pods.csv", POD_HEADER + "p,1000,10,1,500,,BE,Running,0,2,0\n" + row + "\n")
    with pytest.raises(OpenbError) as info:
        read_pods(p)
    assert str(info.value).startswith(f"{p}: ")
    assert fragment in str(info.value)
    assert isinstance(info.value, TraceError)


@pytest.mark.parametrize("text, fragment", [
    (NODE_HEADER + "n1,1000,10,two,G2\n", "row 2: column 'gpu': 'two' is not allowed: a whole number from 0 to 256"),
    (NODE_HEADER + "n1,1000,10,2,\n", "row 2: column 'model': '' is not allowed: a GPU model name"),
    (NODE_HEADER + "n1,1000,10,2,G2\nn1,1000,10,2,G2\n", "row 3: column 'sn': 'n1' is not allowed: a name used once"),
    (NODE_HEADER + "n1,1000,10,0,\n", "no GPU nodes"),
    ("sn,cpu_milli,memory_mib,model\nn1,1,1,G2\n", "column 'gpu' is missing: the header must name sn, cpu_milli"),
])
def test_malformed_node_file(tmp_path, text, fragment):
    p = _write(tmp_path, "nodes.csv", text)
    with pytest.raises(OpenbError, match=None) as info:
        read_nodes(p)
    assert fragment in str(info.value)


def test_unreadable_files(tmp_path):
    with pytest.raises(OpenbError, match="cannot read: no such file"):
        read_pods(tmp_path / "missing.csv.gz")
    bad = tmp_path / "bad.csv.gz"
    bad.write_bytes(b"not gzip at all")
    with pytest.raises(OpenbError, match="not a readable CSV file"):
        read_nodes(bad)


# ----------------------------------------------------------------- arrivals
def test_arrivals_repeat_the_trace_in_order_until_the_target():
    pods = [_pod("a", 1, 500), _pod("b", 2), _pod("c", 1, 250)]
    seq = arrivals(pods, capacity_milli=4000, target=1.3)  # 5.2 GPUs
    assert [job for job, _ in seq] == ["a", "b", "c", "a-r1", "b-r1"]
    assert sum(p.demand_milli for _, p in seq) == 5250  # reaches 5,200: the last pod passes it
    assert arrivals(pods, 4000, 1.3) == seq  # deterministic
    drawn = arrivals(pods, 4000, 1.3, seed=42)
    assert drawn == arrivals(pods, 4000, 1.3, seed=42) and drawn != seq
    names = [job for job, _ in drawn]
    assert {"a", "b", "c"} <= set(names) and len(set(names)) == len(names)
    assert sum(p.demand_milli for _, p in drawn) >= 5200
    with pytest.raises(ValueError, match="at least one GPU pod"):
        arrivals([], 4000)


# --------------------------------------------------------- the two policies
NODES = [_node("n0", 2), _node("n1", 4), _node("n2", 8, "G3")]


@pytest.mark.parametrize("factory", [Scheduler, NodeBestFit])
def test_both_policies_allocate_exactly_what_fits(factory):
    pods = [_pod("eight", 8), _pod("four", 4), _pod("h1", 1, 500), _pod("h2", 1, 500), _pod("one", 1),
            _pod("late-one", 1), _pod("late-quarter", 1, 250), _pod("too-big", 16), _pod("g9", 1, 1000, ("G9",))]
    sched, placed = _starts(factory, NODES, pods)
    assert placed["eight"][:2] == ("n2", tuple(range(8)))
    assert placed["four"][:2] == ("n1", (0, 1, 2, 3))
    assert placed["h1"] == placed["h2"] == ("n0", (0,), "fraction:0.5")  # one card, filled
    assert placed["one"][:2] == ("n0", (1,))
    assert set(placed) == {"eight", "four", "h1", "h2", "one"}
    assert {j.id for j in sched.pending_jobs()} == {"late-one", "late-quarter"}
    rules = _rules(NODES)
    seq = [(p.name, p) for p in pods]
    samples, wall = replay(rules, factory, seq, 14000, levels=(0.5, 1.0), check=True)
    half, full = samples[0], samples[1]
    assert (half.level, half.pods, half.allocated, half.unallocated) == (0.5, 1, 8.0, 6.0)
    assert (full.level, full.pods, full.arrived, full.allocated, full.unallocated) == (1.0, 5, 14.0, 14.0, 0.0)
    end = samples[-1]
    assert (end.pods, end.allocated, end.started, end.pending, end.rejected) == (9, 14.0, 5, 2, 2)
    assert end.allocated_share == pytest.approx(14.0 / (14.0 + 1.25 + 16 + 1))
    if end.stranded is not None:  # nothing is free: nothing is stranded
        assert end.free == 0.0 and end.stranded == 0.0


def test_node_best_fit_strands_a_gpu_that_tightest_card_does_not():
    """A: 2 GPUs, B: 1 GPU. Shares 0.6, 0.7, 0.3, 0.4, then a whole GPU (3.0 GPUs in all).

    Both open B:0 for 0.6 and A:0 for 0.7. For 0.3 gpushepherd takes the tightest card
    (A:0, room 0.3 - it fills up); node best-fit takes the node with the least free
    capacity (B: 0.4 against A's 1.3) and leaves B:0 with 0.1. Then 0.4 fills B:0 under
    gpushepherd, but fits no card under best-fit and breaks A's last whole GPU - so the
    whole-GPU pod runs under gpushepherd and is stranded under best-fit, 1.0 GPU free in
    slivers of 0.3 + 0.6 + 0.1."""
    nodes = [_node("A", 2), _node("B", 1)]
    pods = [_pod("s60", 1, 600), _pod("s70", 1, 700), _pod("s30", 1, 300), _pod("s40", 1, 400), _pod("whole", 1)]
    gs, gs_at = _starts(Scheduler, nodes, pods)
    bf, bf_at = _starts(NodeBestFit, nodes, pods)
    assert gs_at["s60"][:2] == bf_at["s60"][:2] == ("B", (0,))
    assert gs_at["s70"][:2] == bf_at["s70"][:2] == ("A", (0,))
    assert gs_at["s30"][:2] == ("A", (0,)) and bf_at["s30"][:2] == ("B", (0,))
    assert gs_at["s40"][:2] == ("B", (0,)) and bf_at["s40"][:2] == ("A", (1,))
    assert gs_at["whole"][:2] == ("A", (1,)) and "whole" not in bf_at
    assert [j.id for j in bf.pending_jobs()] == ["whole"] and not gs.pending_jobs()
    assert [node_free_milli(s) for s in bf.ledger.slots] == [300 + 600, 100]
    assert [node_free_milli(s) for s in gs.ledger.slots] == [0, 0]

    seq = [(p.name, p) for p in pods]
    (g_end,), _ = replay(_rules(nodes), Scheduler, seq, 3000, levels=(1.0,), check=True)
    (b_end,), _ = replay(_rules(nodes), NodeBestFit, seq, 3000, levels=(1.0,), check=True)
    assert (g_end.allocated, g_end.unallocated, g_end.pending) == (3.0, 0.0, 0)
    assert (b_end.allocated, b_end.unallocated, b_end.pending) == (2.0, 1.0, 1)
    if b_end.stranded is not None:  # Scheduler.stranded_capacity(): the 1.0 GPU no pending pod can use
        assert b_end.free == pytest.approx(1.0) and b_end.stranded == pytest.approx(1.0)
        assert sum(b_end.by_constraint.values()) == pytest.approx(1.0)
        assert g_end.stranded == 0.0


def test_node_best_fit_keeps_mig_and_whole_gpu_placement_of_the_core():
    """Whole-GPU pods: the same rule (fewest free whole GPUs), so the same placements."""
    pods = [_pod("w2", 2), _pod("w1", 1), _pod("w4", 4), _pod("w8", 8), _pod("w1b", 1)]
    _, gs_at = _starts(Scheduler, NODES, pods)
    _, bf_at = _starts(NodeBestFit, NODES, pods)
    assert gs_at == bf_at


def test_bestfit_is_a_registered_baseline():
    rules = _rules(NODES)
    got_rules, factory = BASELINES["bestfit"](rules)
    assert got_rules is rules and factory is NodeBestFit


def test_gpu_spec_maps_to_gpu_types_and_unknown_types_are_rejected():
    sched, placed = _starts(Scheduler, NODES, [_pod("g3", 1, 300, ("G3",)), _pod("nowhere", 1, 1000, ("T4",))])
    assert placed["g3"] == ("n2", (0,), "fraction:0.3")
    assert sched.jobs["nowhere"].state.value == "REJECTED"


# ------------------------------------------------------------ the real trace
needs_trace = pytest.mark.skipif(not (OPENB / "openb_pod_list_default.csv.gz").exists(),
                                 reason="../shared/traces/alibaba_gpu_v2023_openb not present")


@needs_trace
def test_real_trace_reads():
    nodes = read_nodes(OPENB / "openb_node_list_gpu_node.csv.gz")
    assert len(nodes) == 1213 and sum(n.gpus for n in nodes) == 6212
    assert len(read_nodes(OPENB / "openb_node_list_all_node.csv.gz")) == 1213  # CPU-only nodes left out
    pods = read_pods(OPENB / "openb_pod_list_default.csv.gz")
    assert len(pods) == 7064 and sum(p.shared for p in pods) == 3078
    assert sum(p.demand_milli for p in pods) == 6086800
    assert [p.creation_time for p in pods] == sorted(p.creation_time for p in pods)
    spec = read_pods(OPENB / "openb_pod_list_gpuspec33.csv.gz")
    assert any(p.gpu_spec == ("V100M16", "V100M32") for p in spec)
    assert all(p.creation_time is None for p in read_pods(OPENB / "openb_pod_list_multigpu50.csv.gz", limit=50))


@needs_trace
@pytest.mark.parametrize("factory", [Scheduler, NodeBestFit])
def test_real_trace_excerpt_on_a_small_cluster(factory):
    """The first 600 GPU pods on the trace's first 60 GPU nodes, to 1.3x their GPUs:
    everything fits until the cluster is nearly full, the core stays consistent."""
    nodes = read_nodes(OPENB / "openb_node_list_gpu_node.csv.gz")[:60]
    pods = read_pods(OPENB / "openb_pod_list_default.csv.gz", limit=600)
    capacity = sum(n.gpus for n in nodes) * 1000
    seq = arrivals(pods, capacity)
    samples, _ = replay(_rules(nodes), factory, seq, capacity, levels=(0.5, 0.8, 1.0, 1.3), check=True)
    assert [s.level for s in samples] == [0.5, 0.8, 1.0, 1.3]
    assert samples[0].allocated == pytest.approx(samples[0].arrived)
    assert all(s.allocated <= capacity / 1000 for s in samples)
    assert samples[-1].allocated_share < 1 / 1.2 and samples[-1].pending > 0
    allocated = [s.allocated for s in samples]
    assert allocated == sorted(allocated)  # pods never leave
