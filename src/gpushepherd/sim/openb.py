"""Reader for the Alibaba GPU-sharing trace ``cluster-trace-gpu-v2023`` ("openb").

Source: GitHub ``alibaba/clusterdata``, ``cluster-trace-gpu-v2023/csv`` (mirrored in
``hkust-adsl/kubernetes-scheduler-simulator`` ``data/csv``), published with Weng et al.,
"Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient
Descent", USENIX ATC'23. Read from ``../shared/traces/alibaba_gpu_v2023_openb``; never
copied into this repository.

Files (CSV with a header, ``.gz`` read compressed):

* nodes - ``sn, cpu_milli, memory_mib, gpu, model``: node name, CPU in milli-cores,
  memory in MiB, GPUs (count), GPU model (``G1``-``G3`` are undisclosed codes; empty for
  CPU-only nodes). ``openb_node_list_gpu_node.csv`` holds the 1,213 GPU nodes
  (6,212 GPUs).
* pods - ``name, cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec, qos, pod_phase,
  creation_time, deletion_time, scheduled_time``: ``num_gpu`` GPUs (0-8);
  ``gpu_milli`` the part of one GPU in 1/1000 GPU when ``num_gpu`` is 1 (1-1000; 1000
  for multi-GPU pods); ``gpu_spec`` allowed GPU models separated by ``|`` (empty: any);
  times in seconds. The ``multigpu*`` variants have only the first five columns (no
  times): their pods keep file order.

``read_nodes`` returns the GPU nodes; ``read_pods`` the GPU pods in creation order (ties
and files without times: file order). CPU and memory are read and checked but gpushepherd
schedules GPUs only. A malformed row raises ``OpenbError`` naming the file, row (the
line, the header being line 1), column, value and what is allowed; nothing of the file
is used then.

``policy_dict`` and ``job_spec`` map the trace onto gpushepherd's policy and job specs:
one node entry per trace node, every pod a ``batch`` job of team ``openb`` on one node
(a Kubernetes pod never spans nodes); a pod of ``gpu_milli`` < 1000 takes a ``fraction``
share of one GPU, any other pod whole GPUs.

``arrivals`` and ``replay`` are the FGD paper's allocation experiment: pods arrive one
after another and never leave, until the GPUs they requested reach ``target`` x the
cluster's GPUs (Weng et al. use 1.3); the allocation is sampled as the arrived demand
passes given levels. Arrival ``i`` is submitted at ``t = i`` seconds, alone in its
instant (creation times only order the pods).
"""

from __future__ import annotations

import gzip
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from gpushepherd.model.decisions import Reject, Start
from gpushepherd.model.events import JobSubmitted
from gpushepherd.model.job import GpuShare, JobSpec
from gpushepherd.sim.traces import TraceError

#: the trace's files, relative to the repository's parent folder
DEFAULT_DIR = Path(__file__).resolve().parents[3].parent / "shared" / "traces" / "alibaba_gpu_v2023_openb"
DEFAULT_NODES = DEFAULT_DIR / "openb_node_list_gpu_node.csv.gz"
DEFAULT_PODS = DEFAULT_DIR / "openb_pod_list_default.csv.gz"

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")  # gpu_spec, creation_time: optional
MAX_GPUS = 256  # per node or pod (the policy schema's limit)
MAX_NUMBER = 1e12  # CPU milli-cores, MiB, seconds
_NAME_BAD = re.compile(r"[^A-Za-z0-9_.\-]")


class OpenbError(TraceError):
    """An openb file that cannot be read; ``str()`` is one line naming file, row, column and value."""


@dataclass(frozen=True, slots=True)
class OpenbNode:
    """A GPU node: ``name`` as in the trace, ``policy_name`` the name in the policy
    (characters a policy name may not hold replaced by ``-``), GPUs, GPU model, CPU
    (milli-cores) and memory (MiB)."""

    name: str
    policy_name: str
    gpus: int
    model: str
    cpu_milli: int
    memory_mib: int


@dataclass(frozen=True, slots=True)
class OpenbPod:
    """A GPU pod: GPUs, milli-GPU of one GPU (``num_gpu`` 1) or 1000, allowed GPU models
    (policy names; empty: any), creation time in seconds (``None``: the file has none),
    CPU (milli-cores), memory (MiB) and its row in the file."""

    name: str
    num_gpu: int
    gpu_milli: int
    gpu_spec: tuple[str, ...]
    creation_time: float | None
    cpu_milli: int
    memory_mib: int
    row: int

    @property
    def demand_milli(self) -> int:
        """GPUs requested in milli-GPU (``num_gpu`` x 1000, or the fraction)."""
        return self.gpu_milli if self.num_gpu == 1 else self.num_gpu * 1000

    @property
    def shared(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < 1000


def policy_name(text: str) -> str:
    """A trace name as a policy name: characters outside ``[A-Za-z0-9_.-]`` become ``-``
    and a leading ``-``, ``_`` or ``.`` gets an ``x`` in front."""
    out = _NAME_BAD.sub("-", text.strip())
    if out and not out[0].isalnum():
        out = "x" + out
    return out[:128]


def _read(path: Path, required: tuple[str, ...]) -> pd.DataFrame:
    path = Path(path)
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False, compression="infer", encoding="utf-8-sig")
    except FileNotFoundError:
        raise OpenbError(f"{path}: cannot read: no such file") from None
    except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError, pd.errors.ParserError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise OpenbError(f"{path}: not a readable CSV file: {first}") from None
    except pd.errors.EmptyDataError:
        raise OpenbError(f"{path}: empty file: a header with columns {', '.join(required)}") from None
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise OpenbError(f"{path}: column {missing[0]!r} is missing: the header must name "
                         f"{', '.join(required)} (it names {', '.join(map(str, df.columns))})")
    return df


def _bad(path: Path, i: int, column: str, value: str, allowed: str) -> OpenbError:
    return OpenbError(f"{path}: row {i + 2}: column {column!r}: {value[:40]!r} is not allowed: {allowed}")


def _ints(path: Path, df: pd.DataFrame, column: str, lo: float, hi: float) -> list[int]:
    """The column as integers in ``[lo, hi]``; the first bad row raises."""
    raw = df[column]
    num = pd.to_numeric(raw.str.strip(), errors="coerce")
    ok = num.notna() & (num >= lo) & (num <= hi) & (num == num.round())
    if not ok.all():
        i = int((~ok.to_numpy()).nonzero()[0][0])
        raise _bad(path, i, column, raw.iloc[i], f"a whole number from {lo:g} to {hi:g}")
    return [int(v) for v in num]


def _floats(path: Path, df: pd.DataFrame, column: str, lo: float, hi: float) -> list[float]:
    raw = df[column]
    num = pd.to_numeric(raw.str.strip(), errors="coerce")
    ok = num.notna() & (num >= lo) & (num <= hi)
    if not ok.all():
        i = int((~ok.to_numpy()).nonzero()[0][0])
        raise _bad(path, i, column, raw.iloc[i], f"a number of seconds from {lo:g} to {hi:g}")
    return [float(v) for v in num]


def read_nodes(path: str | Path = DEFAULT_NODES) -> list[OpenbNode]:
    """The GPU nodes of an openb node list (nodes with ``gpu`` 0 are left out), in file order.

    Raises:
        OpenbError: a missing column, a bad number, a GPU node without a model, a name
            repeated (also after making it a policy name).
    """
    path = Path(path)
    df = _read(path, NODE_COLUMNS)
    gpus = _ints(path, df, "gpu", 0, MAX_GPUS)
    cpu = _ints(path, df, "cpu_milli", 0, MAX_NUMBER)
    mem = _ints(path, df, "memory_mib", 0, MAX_NUMBER)
    names = df["sn"].str.strip().tolist()
    models = df["model"].str.strip().tolist()
    seen: dict[str, int] = {}
    out = []
    for i, name in enumerate(names):
        pname = policy_name(name)
        if not pname:
            raise _bad(path, i, "sn", df["sn"].iloc[i], "a node name")
        if pname in seen:
            raise _bad(path, i, "sn", name, f"a name used once (row {seen[pname] + 2} has {names[seen[pname]]!r})")
        seen[pname] = i
        if gpus[i] == 0:
            continue
        model = policy_name(models[i])
        if not model or models[i].lower() == "nan":
            raise _bad(path, i, "model", models[i], "a GPU model name for a node with GPUs")
        out.append(OpenbNode(name, pname, gpus[i], model, cpu[i], mem[i]))
    if not out:
        raise OpenbError(f"{path}: no GPU nodes (every row has gpu 0): at least one node with GPUs")
    return out


def read_pods(path: str | Path = DEFAULT_PODS, limit: int | None = None) -> list[OpenbPod]:
    """The GPU pods of an openb pod list (``num_gpu`` >= 1) in creation order (ties: file
    order; files without ``creation_time``: file order); the first ``limit`` of them
    when given. Every row is checked, CPU-only pods too.

    Raises:
        OpenbError: a missing column, a bad number, ``gpu_milli`` outside 1-1000 for a
            GPU pod or not 1000 for a multi-GPU pod, a repeated pod name.
    """
    path = Path(path)
    df = _read(path, POD_COLUMNS)
    num_gpu = _ints(path, df, "num_gpu", 0, MAX_GPUS)
    milli = _ints(path, df, "gpu_milli", 0, 1000)
    cpu = _ints(path, df, "cpu_milli", 0, MAX_NUMBER)
    mem = _ints(path, df, "memory_mib", 0, MAX_NUMBER)
    times = _floats(path, df, "creation_time", 0, MAX_NUMBER) if "creation_time" in df.columns else None
    specs = df["gpu_spec"].tolist() if "gpu_spec" in df.columns else None
    names = df["name"].str.strip().tolist()
    seen: dict[str, int] = {}
    out = []
    for i, name in enumerate(names):
        if not name:
            raise _bad(path, i, "name", df["name"].iloc[i], "a pod name")
        if name in seen:
            raise _bad(path, i, "name", name, f"a name used once (first at row {seen[name] + 2})")
        seen[name] = i
        n = num_gpu[i]
        if n == 0:
            continue
        if n == 1 and milli[i] < 1:
            raise _bad(path, i, "gpu_milli", df["gpu_milli"].iloc[i], "1 to 1000 for a pod with num_gpu 1")
        if n > 1 and milli[i] != 1000:
            raise _bad(path, i, "gpu_milli", df["gpu_milli"].iloc[i],
                       f"1000 for a pod with num_gpu {n} (a multi-GPU pod takes whole GPUs)")
        types: tuple[str, ...] = ()
        if specs is not None:
            text = specs[i].strip()
            if text and text.lower() != "nan":
                parts = [policy_name(p) for p in text.split("|")]
                if not all(parts):
                    raise _bad(path, i, "gpu_spec", specs[i], "GPU model names separated by '|' (empty: any)")
                types = tuple(dict.fromkeys(parts))
        out.append(OpenbPod(name, n, milli[i], types, times[i] if times is not None else None, cpu[i], mem[i], i + 2))
    if times is not None:
        out.sort(key=lambda p: p.creation_time)  # stable: ties keep file order
    return out[:limit] if limit is not None else out


def policy_dict(nodes: list[OpenbNode]) -> dict:
    """A gpushepherd policy (as a dict for ``policy_from_dict``) for ``nodes``: one node
    entry each, GPU memory unknown (0), no preemption, no quotas. Backfill stays on: a
    pod that does not fit must not block the pods behind it (each Kubernetes pod is
    scheduled on its own); pods have no runtime estimate, so no reservation ever holds
    GPUs back."""
    return {
        "name": "openb",
        "cluster": {"nodes": [{"name": n.policy_name, "gpus": n.gpus, "gpu_type": n.model} for n in nodes]},
        "preemption": {"enabled": False},
        "backfill": {"enabled": True},
    }


def job_spec(pod: OpenbPod, job_id: str, t: float) -> JobSpec:
    """``pod`` as a job submitted at ``t`` seconds: a fraction share of one GPU when
    ``gpu_milli`` < 1000, else ``num_gpu`` whole GPUs on one node."""
    share = GpuShare(kind="fraction", milli=pod.gpu_milli) if pod.shared else None
    return JobSpec(id=job_id, team="openb", workload_class="batch", gpus=pod.num_gpu, same_node=True,
                   gpu_types=pod.gpu_spec, submit_time=t, share=share)


def arrivals(pods: Sequence[OpenbPod], capacity_milli: int, target: float = 1.3,
             seed: int | None = None) -> list[tuple[str, OpenbPod]]:
    """The arrival sequence ``[(job id, pod)]``: pods until the GPUs they request reach
    ``target`` x ``capacity_milli`` (the last pod may pass it by less than its own size).

    ``seed`` ``None``: the pods in the given (creation) order, repeated - copy ``r`` of
    pod ``p`` is job ``p-r<r>`` - so the same input always gives the same sequence.
    With a seed, the ATC'23 artifact's workload tuning (``TunePodsByNodeTotalResource``
    and ``--shuffle-pod`` in hkust-adsl/kubernetes-scheduler-simulator): every pod once,
    then pods drawn with replacement (``random.Random(seed)``) until the target, the
    whole list shuffled.

    Raises:
        ValueError: no pods, a capacity or target that is not positive.
    """
    if not pods:
        raise ValueError("pods: [] is not allowed: at least one GPU pod")
    if capacity_milli <= 0 or not target > 0:
        raise ValueError(f"capacity {capacity_milli} milli-GPU, target {target!r}: both must be > 0")
    limit = target * capacity_milli
    out: list[tuple[str, OpenbPod]] = []
    total = 0
    if seed is None:
        i = 0
        while total < limit:
            pod = pods[i % len(pods)]
            rep = i // len(pods)
            out.append((f"{pod.name}-r{rep}" if rep else pod.name, pod))
            total += pod.demand_milli
            i += 1
        return out
    rng = random.Random(seed)
    for pod in pods:
        if total >= limit:  # the trace alone is above the target: a prefix of it
            break
        out.append((pod.name, pod))
        total += pod.demand_milli
    n = 0
    while total < limit:
        pod = pods[rng.randrange(len(pods))]
        out.append((f"{pod.name}-t{n}", pod))
        total += pod.demand_milli
        n += 1
    rng.shuffle(out)
    return out


@dataclass(slots=True)
class Sample:
    """The cluster as the arrived demand first reaches ``level`` (fraction of capacity).

    GPUs are GPU counts (shares as fractions); ``stranded`` / ``by_constraint`` come
    from ``Scheduler.stranded_capacity()`` (``None`` when the scheduler has none)."""

    level: float
    pods: int
    arrived: float
    allocated: float
    unallocated: float
    started: int
    pending: int
    rejected: int
    wall_s: float
    free: float | None = None
    stranded: float | None = None
    by_constraint: dict[str, float] = field(default_factory=dict)

    @property
    def allocated_share(self) -> float:
        """Share of the arrived requested GPU capacity that is allocated."""
        return self.allocated / self.arrived if self.arrived else 1.0


def replay(rules, factory: Callable, seq: Sequence[tuple[str, OpenbPod]], capacity_milli: int,
           levels: Sequence[float], progress: Callable[[int], None] | None = None,
           check: bool = False) -> tuple[list[Sample], float]:
    """Submit ``seq`` one pod per instant to ``factory(rules)``; pods never leave.

    Returns the samples (one per level of ``levels`` the arrived demand reaches, and
    one after the last pod when that pod reached none) and the wall time of the replay in seconds. ``progress(n)``
    is called every 256 pods; ``check`` runs the core's invariant check at each sample.
    """
    sched = factory(rules)
    todo = sorted(levels)
    samples: list[Sample] = []
    arrived = started = rejected = 0
    t0 = time.perf_counter()
    last = len(seq) - 1
    for i, (job_id, pod) in enumerate(seq):
        for d in sched.handle([JobSubmitted(float(i), job_spec(pod, job_id, float(i)))]):
            if isinstance(d, Start):
                started += 1
            elif isinstance(d, Reject):
                rejected += 1
        arrived += pod.demand_milli
        if progress is not None and i % 256 == 255:
            progress(i + 1)
        crossed = []
        while todo and arrived >= todo[0] * capacity_milli:
            crossed.append(todo.pop(0))
        if not crossed and i == last:
            crossed.append(arrived / capacity_milli)
        for level in crossed:
            samples.append(_sample(sched, level, i + 1, arrived, capacity_milli, started, rejected,
                                   time.perf_counter() - t0, check))
    if progress is not None:
        progress(len(seq))
    return samples, time.perf_counter() - t0


def _sample(sched, level, pods, arrived, capacity_milli, started, rejected, wall, check) -> Sample:
    if check:
        sched.check_invariants()
    held = 0
    for job in sched.holding():
        share = job.spec.share
        held += share.milli if share is not None else job.spec.gpus * 1000
    free = stranded = None
    by: dict[str, float] = {}
    sc = getattr(sched, "stranded_capacity", None)
    if sc is not None:
        got = sc()
        free, stranded, by = got["free_gpus"], got["stranded_gpus"], dict(got.get("by_constraint", {}))
    return Sample(level, pods, arrived / 1000, held / 1000, (capacity_milli - held) / 1000, started,
                  len(sched.pending_jobs()), rejected, wall, free, stranded, by)
