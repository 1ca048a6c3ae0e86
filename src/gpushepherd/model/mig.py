"""NVIDIA MIG (Multi-Instance GPU) profiles and layouts: pure data and functions.

Source: NVIDIA "Multi-Instance GPU User Guide"
(https://docs.nvidia.com/datacenter/tesla/mig-user-guide/), section "Supported MIG
Profiles" (profile names, compute slices, instances per GPU for A100, H100 and H200) and
the ``nvidia-smi mig -lgipp`` placement listing in "Getting Started with MIG".

Model. A MIG GPU has 8 memory slices (indices 0..7) and 7 compute slices. A GPU instance
of a profile occupies ``size`` consecutive memory slices ``[start, start + size)`` and may
only start at the indices the hardware allows; ``nvidia-smi`` writes this as
``{0,2,4}:2`` (valid starts : size). A layout is valid when every instance sits at an
allowed start, no two memory ranges overlap, no profile exceeds its instances-per-GPU
limit and the compute slices sum to at most 7.

Units: ``memory_mib`` is MiB and *nominal*: the GB figure in the profile name x 1024
(``1g.10gb`` -> 10240 MiB). ``nvidia-smi`` reports slightly less usable memory.
Every error is a :class:`MigError` (a ``ValueError``). Nothing depends on set or dict
iteration order: results are deterministic for a given input.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MEMORY_SLICES = 8
COMPUTE_SLICES = 7


class MigError(ValueError):
    """A GPU type, profile name, placement or layout that MIG does not allow."""


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU-instance profile of one GPU model.

    ``compute_slices`` of 7; ``memory_mib`` nominal MiB; ``size`` memory slices of 8
    occupied; ``starts`` the memory-slice indices it may start at; ``max_count`` the
    most instances of this profile on one GPU.
    """

    name: str
    compute_slices: int
    memory_mib: int
    size: int
    starts: tuple[int, ...]
    max_count: int

    @property
    def placements(self) -> str:
        """The placement in ``nvidia-smi mig -lgipp`` notation, e.g. ``{0,4}:4``."""
        return "{" + ",".join(map(str, self.starts)) + "}:" + str(self.size)


@dataclass(frozen=True, slots=True, order=True)
class MigInstance:
    """A GPU instance of profile ``profile`` starting at memory slice ``start``."""

    start: int
    profile: str


def _table(gb1: int, gb2: int, gb4: int, gb8: int) -> dict[str, MigProfile]:
    # (compute slices, memory slices, nominal GB, suffix, starts, max instances); the
    # shapes are the same on A100, H100 and H200, only the memory per slice differs.
    rows = (
        (1, 1, gb1, "", tuple(range(7)), 7),
        (1, 1, gb1, "+me", tuple(range(7)), 1),
        (1, 2, gb2, "", (0, 2, 4, 6), 4),
        (2, 2, gb2, "", (0, 2, 4), 3),
        (3, 4, gb4, "", (0, 4), 2),
        (4, 4, gb4, "", (0,), 1),
        (7, 8, gb8, "", (0,), 1),
    )
    out = {}
    for compute, size, gb, suffix, starts, max_count in rows:
        name = f"{compute}g.{gb}gb{suffix}"
        out[name] = MigProfile(name, compute, gb * 1024, size, starts, max_count)
    return out


#: canonical GPU model -> profile name -> profile (profiles in the guide's table order)
MIG_MODELS: dict[str, dict[str, MigProfile]] = {
    "A100-40GB": _table(5, 10, 20, 40),
    "A100-80GB": _table(10, 20, 40, 80),
    "H100-80GB": _table(10, 20, 40, 80),
    "H200-141GB": _table(18, 35, 71, 141),
}

_FAMILY = re.compile(r"\b([AH][12]00)\b")
_MEMORY = re.compile(r"\b(\d+) ?GB\b")


def mig_model(gpu_type: str) -> str | None:
    """The canonical :data:`MIG_MODELS` key for a GPU type string, or None.

    Case-insensitive; ``-``, ``_`` and spaces are interchangeable, and ``nvidia-smi``
    product names work (``"NVIDIA A100-SXM4-80GB"``, ``"NVIDIA H100 80GB HBM3"``,
    ``"NVIDIA H200"``). A100 and H100 need their memory size in the string, because the
    variants have different profiles; plain ``"A100"`` or ``"H100"`` is ambiguous and
    gives None, except ``"NVIDIA H100 PCIe"`` (the 80GB card). H200 is always 141GB.
    None also for GPUs without MIG or variants not covered here (V100, L40S, H100 NVL).
    """
    text = re.sub(r"[^A-Z0-9]+", " ", str(gpu_type).upper())
    family = _FAMILY.search(text)
    if family is None:
        return None
    memory = _MEMORY.search(text)
    gb = int(memory.group(1)) if memory else None
    name = family.group(1)
    if name == "H200":
        gb = 141 if gb is None else gb
    elif name == "H100" and gb is None and re.search(r"\bPCIE\b", text) and "NVL" not in text:
        gb = 80
    key = f"{name}-{gb}GB"
    return key if key in MIG_MODELS else None


def _model(gpu_type: str) -> str:
    model = mig_model(gpu_type)
    if model is None:
        raise MigError(f"GPU type {gpu_type!r} does not support MIG; MIG GPU types: {', '.join(MIG_MODELS)}")
    return model


def profiles_for(gpu_type: str) -> dict[str, MigProfile]:
    """Profile name -> :class:`MigProfile` for ``gpu_type``.

    Raises MigError if the GPU type has no MIG support (or is not covered here).
    """
    return dict(MIG_MODELS[_model(gpu_type)])


def profile(gpu_type: str, name: str) -> MigProfile:
    """The profile ``name`` of ``gpu_type``.

    The name is matched case-insensitively, with an optional ``MIG `` / ``mig-`` prefix
    (``"MIG 3g.40gb"``, ``"mig-3g.40gb"``). Raises MigError for a GPU type without MIG
    or a profile the model does not have (the message lists the allowed names).
    """
    model = _model(gpu_type)
    key = re.sub(r"^mig[ -]", "", str(name).strip().lower())
    table = MIG_MODELS[model]
    if key not in table:
        raise MigError(f"unknown MIG profile {name!r} for {model}; allowed: {', '.join(table)}")
    return table[key]


def _slices(inst: MigInstance, p: MigProfile) -> str:
    return f"{p.name}@{inst.start} (memory slices {inst.start}-{inst.start + p.size - 1})"


def validate_layout(gpu_type: str, instances: Iterable[MigInstance]) -> None:
    """Check a MIG layout for ``gpu_type``; return None if it is valid.

    Raises MigError naming the offending profile/start for: an unknown profile, a start
    not among the profile's allowed starts, two overlapping memory-slice ranges, more
    instances of a profile than ``max_count``, or more than 7 compute slices in total.
    """
    model = _model(gpu_type)
    placed = [(inst, profile(gpu_type, inst.profile)) for inst in sorted(instances)]
    counts: dict[str, int] = {}
    for inst, p in placed:
        if inst.start not in p.starts:
            raise MigError(
                f"{p.name} cannot start at memory slice {inst.start} on {model}; allowed placements {p.placements}"
            )
        counts[p.name] = counts.get(p.name, 0) + 1
        if counts[p.name] > p.max_count:
            raise MigError(f"{counts[p.name]} x {p.name} on {model}; at most {p.max_count} per GPU")
    end, last = 0, None
    for inst, p in placed:
        if last is not None and inst.start < end:
            raise MigError(f"{_slices(inst, p)} overlaps {_slices(*last)} on {model}")
        if inst.start + p.size >= end:
            end, last = inst.start + p.size, (inst, p)
    compute = sum(p.compute_slices for _, p in placed)
    if compute > COMPUTE_SLICES:
        raise MigError(f"layout uses {compute} compute slices on {model}; at most {COMPUTE_SLICES}")


def _order(p: MigProfile) -> tuple[int, int, str]:
    return (-p.size, -p.compute_slices, p.name)


def _arrange(profs: Sequence[MigProfile]) -> tuple[int, ...] | None:
    """Starts for ``profs`` (in placement order) with no overlap, or None if none exist.

    Depth-first over each profile's starts, lowest first, so the answer is the
    lexicographically smallest start vector: exactly "each at its lowest free start"
    whenever that greedy choice works, and a later start only when it does not.
    """
    starts = [0] * len(profs)

    def place(i: int, used: int) -> bool:
        if i == len(profs):
            return True
        p = profs[i]
        after = starts[i - 1] if i and profs[i - 1].name == p.name else -1  # identical profiles: ascending
        for s in p.starts:
            mask = ((1 << p.size) - 1) << s
            if s > after and not used & mask:
                starts[i] = s
                if place(i + 1, used | mask):
                    return True
        return False

    return tuple(starts) if place(0, 0) else None


def _pack(gpu_type: str, names: Sequence[str]) -> tuple[tuple[MigInstance, ...], tuple[str, ...], str | None]:
    model = _model(gpu_type)
    order = sorted((profile(gpu_type, n) for n in names), key=_order)
    accepted: list[MigProfile] = []
    starts: tuple[int, ...] = ()
    left: list[str] = []
    failed: set[str] = set()  # a profile that did not fit never fits later: the layout only grows
    first_reason: str | None = None
    for p in order:
        if p.name in failed:
            left.append(p.name)
            continue
        count = sum(q.name == p.name for q in accepted)
        compute = sum(q.compute_slices for q in accepted) + p.compute_slices
        memory = sum(q.size for q in accepted) + p.size
        if count >= p.max_count:
            reason = f"at most {p.max_count} x {p.name} per GPU on {model}"
        elif compute > COMPUTE_SLICES:
            reason = f"it would need {compute} of {COMPUTE_SLICES} compute slices on {model}"
        elif memory > MEMORY_SLICES:
            reason = f"it would need {memory} of {MEMORY_SLICES} memory slices on {model}"
        elif (trial := _arrange([*accepted, p])) is None:
            reason = f"no placement {p.placements} is free on {model} next to {', '.join(q.name for q in accepted)}"
        else:
            accepted.append(p)
            starts = trial
            continue
        failed.add(p.name)
        left.append(p.name)
        first_reason = first_reason or f"{p.name} does not fit: {reason}"
    layout = tuple(sorted(MigInstance(s, p.name) for s, p in zip(starts, accepted)))
    return layout, tuple(left), first_reason


def layout_from_names(gpu_type: str, names: Sequence[str]) -> tuple[MigInstance, ...]:
    """Place all the named profiles on one ``gpu_type`` GPU; result sorted by start.

    Deterministic: profiles are taken larger first (memory slices desc, compute slices
    desc, name) and each goes to its lowest allowed start that leaves room for the rest
    (the lowest free start, unless that would make a later profile impossible to place).
    Names are canonicalised as in :func:`profile`. Raises MigError for an unknown
    profile or GPU type, or naming the first profile (in that order) that does not fit
    and why. The result always passes :func:`validate_layout`.
    """
    layout, _, reason = _pack(gpu_type, names)
    if reason is not None:
        raise MigError(reason)
    return layout


def pack_layout(gpu_type: str, wanted: Sequence[str]) -> tuple[tuple[MigInstance, ...], tuple[str, ...]]:
    """Place as many of ``wanted`` as fit on one idle ``gpu_type`` GPU.

    Same order and placement rule as :func:`layout_from_names`, but a profile that no
    longer fits next to those already taken is left out instead of raising. Returns
    ``(layout sorted by start, canonical names left out in placement order)``; the
    layout passes :func:`validate_layout` and ``len(layout) + len(left) == len(wanted)``.
    Raises MigError only for an unknown GPU type or profile name.
    """
    layout, left, _ = _pack(gpu_type, wanted)
    return layout, left


def free_slices(gpu_type: str, instances: Iterable[MigInstance]) -> int:
    """Memory slices (of 8) not covered by any instance.

    Raises MigError for an unknown GPU type or profile, or a start the profile does not allow.
    """
    used = 0
    for inst in instances:
        p = profile(gpu_type, inst.profile)
        if inst.start not in p.starts:
            raise MigError(f"{p.name} cannot start at memory slice {inst.start}; allowed placements {p.placements}")
        used |= ((1 << p.size) - 1) << inst.start
    return MEMORY_SLICES - used.bit_count()
