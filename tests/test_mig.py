"""MIG profiles and layouts (gpushepherd.model.mig), checked against NVIDIA's MIG User Guide.

The property tests compare layout_from_names / pack_layout with an oracle written here:
every valid layout of a model, enumerated by brute force from the profile table.
"""

from __future__ import annotations

from collections import Counter
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushepherd.model.mig import (
    MIG_MODELS,
    MigError,
    MigInstance,
    free_slices,
    layout_from_names,
    mig_model,
    pack_layout,
    profile,
    profiles_for,
    validate_layout,
)

PROFILE = {"derandomize": True, "database": None, "deadline": None}


def layout(*pairs: tuple[int, str]) -> list[MigInstance]:
    return [MigInstance(start, name) for start, name in pairs]


# --------------------------------------------------------------------------- the table


def test_models_and_profile_names():
    assert list(MIG_MODELS) == ["A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB"]
    assert list(MIG_MODELS["A100-40GB"]) == [
        "1g.5gb",
        "1g.5gb+me",
        "1g.10gb",
        "2g.10gb",
        "3g.20gb",
        "4g.20gb",
        "7g.40gb",
    ]
    assert list(MIG_MODELS["A100-80GB"]) == list(MIG_MODELS["H100-80GB"]) == [
        "1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb",
    ]  # fmt: skip
    assert list(MIG_MODELS["H200-141GB"]) == [
        "1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb",
    ]  # fmt: skip


@pytest.mark.parametrize("model", list(MIG_MODELS))
def test_profile_shapes_match_the_guide(model):
    # (compute slices, placements as nvidia-smi mig -lgipp prints them, instances per GPU)
    shapes = [(1, "{0,1,2,3,4,5,6}:1", 7), (1, "{0,1,2,3,4,5,6}:1", 1), (1, "{0,2,4,6}:2", 4),
              (2, "{0,2,4}:2", 3), (3, "{0,4}:4", 2), (4, "{0}:4", 1), (7, "{0}:8", 1)]  # fmt: skip
    got = [(p.compute_slices, p.placements, p.max_count) for p in MIG_MODELS[model].values()]
    assert got == shapes
    for p in MIG_MODELS[model].values():
        gb = int(p.name.split(".")[1].removesuffix("+me").removesuffix("gb"))
        assert p.memory_mib == gb * 1024
        assert p.name.startswith(f"{p.compute_slices}g.")


def test_nominal_memory():
    assert profile("A100-40GB", "1g.5gb").memory_mib == 5120
    assert profile("H100-80GB", "3g.40gb").memory_mib == 40960
    assert profile("H200-141GB", "7g.141gb").memory_mib == 144384
    assert profile("H200-141GB", "1g.18gb+me").memory_mib == 18432


# --------------------------------------------------------------------------- GPU types


@pytest.mark.parametrize(
    ("gpu_type", "model"),
    [
        ("A100-80GB", "A100-80GB"),
        ("a100_80gb", "A100-80GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA A100-PCIE-40GB", "A100-40GB"),
        ("A100-40GB", "A100-40GB"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("H100-SXM5-80GB", "H100-80GB"),
        ("h100 80 gb", "H100-80GB"),
        ("NVIDIA H100 PCIe", "H100-80GB"),
        ("NVIDIA H200", "H200-141GB"),
        ("NVIDIA H200 NVL", "H200-141GB"),
        ("H200-141GB", "H200-141GB"),
        ("A100", None),  # 40GB or 80GB: ambiguous
        ("H100", None),  # 80GB, 94GB or 96GB: ambiguous
        ("NVIDIA H100 NVL", None),  # 94GB: other profiles, not covered
        ("NVIDIA GH200 144G HBM3e", None),
        ("V100-32GB", None),
        ("L40S", None),
        ("T4", None),
        ("", None),
    ],
)
def test_mig_model(gpu_type, model):
    assert mig_model(gpu_type) == model


def test_profiles_for():
    assert profiles_for("NVIDIA A100-SXM4-80GB") == MIG_MODELS["A100-80GB"]
    with pytest.raises(
        MigError, match=r"'V100-32GB' does not support MIG.*A100-40GB, A100-80GB, H100-80GB, H200-141GB"
    ):
        profiles_for("V100-32GB")


def test_profile_lookup_and_unknown_profile():
    assert profile("H100-80GB", "3g.40gb").name == "3g.40gb"
    assert profile("H100-80GB", "MIG 3g.40gb") is profile("H100-80GB", "mig-3G.40GB")
    with pytest.raises(MigError) as err:
        profile("A100-80GB", "1g.5gb")
    assert "'1g.5gb'" in str(err.value) and "A100-80GB" in str(err.value)
    assert "1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb" in str(err.value)
    with pytest.raises(MigError, match="does not support MIG"):
        profile("T4", "1g.5gb")


# --------------------------------------------------------------------------- validate_layout


def test_seven_small_instances_are_valid():
    names = ["1g.10gb"] * 7
    got = layout_from_names("A100-80GB", names)
    assert got == tuple(layout(*((s, "1g.10gb") for s in range(7))))
    validate_layout("A100-80GB", got)
    assert free_slices("A100-80GB", got) == 1


def test_eight_small_instances_raise():
    with pytest.raises(MigError, match=r"1g\.10gb.*at most 7"):
        layout_from_names("A100-80GB", ["1g.10gb"] * 8)
    with pytest.raises(MigError, match=r"1g\.10gb"):
        validate_layout("A100-80GB", layout(*((s, "1g.10gb") for s in range(7)), (6, "1g.10gb")))


def test_four_plus_three():
    got = layout_from_names("H100-80GB", ["3g.40gb", "4g.40gb"])
    assert got == (MigInstance(0, "4g.40gb"), MigInstance(4, "3g.40gb"))
    validate_layout("H100-80GB", got)
    assert free_slices("H100-80GB", got) == 0


def test_two_four_g_raise():
    with pytest.raises(MigError, match=r"4g\.40gb.*at most 1"):
        layout_from_names("A100-80GB", ["4g.40gb", "4g.40gb"])
    with pytest.raises(MigError, match=r"4g\.40gb"):
        validate_layout("A100-80GB", layout((0, "4g.40gb"), (0, "4g.40gb")))


def test_bad_start_raises():
    with pytest.raises(MigError, match=r"3g\.40gb cannot start at memory slice 2.*\{0,4\}:4"):
        validate_layout("H100-80GB", layout((2, "3g.40gb")))
    with pytest.raises(MigError, match=r"1g\.10gb cannot start at memory slice 7"):
        validate_layout("A100-80GB", layout((7, "1g.10gb")))


def test_overlap_raises():
    with pytest.raises(MigError, match="overlaps"):
        validate_layout("A100-40GB", layout((0, "3g.20gb"), (2, "2g.10gb")))
    with pytest.raises(MigError, match="overlaps"):
        validate_layout("A100-40GB", layout((0, "1g.5gb"), (0, "1g.5gb+me")))
    validate_layout("A100-40GB", layout((0, "3g.20gb"), (4, "2g.10gb"), (6, "1g.5gb+me")))


def test_compute_slices_over_seven_raise():
    # The placements alone already keep compute at 7 or less, so validate_layout meets the
    # overlap first here; layout_from_names checks compute before it searches placements.
    with pytest.raises(MigError, match="overlaps"):
        validate_layout("A100-80GB", layout(*((s, "1g.10gb") for s in range(7)), (6, "1g.10gb+me")))
    with pytest.raises(MigError, match=r"8 of 7 compute slices"):
        layout_from_names("A100-80GB", ["1g.10gb"] * 7 + ["1g.10gb+me"])


def test_unknown_profile_in_layout_raises():
    with pytest.raises(MigError, match=r"unknown MIG profile '2g\.10gb'"):
        validate_layout("A100-80GB", layout((0, "2g.10gb")))
    with pytest.raises(MigError, match="unknown MIG profile"):
        layout_from_names("A100-80GB", ["3g.40gb", "9g.99gb"])
    with pytest.raises(MigError, match="does not support MIG"):
        validate_layout("V100-32GB", [])


def test_empty_layout():
    validate_layout("A100-40GB", [])
    assert layout_from_names("A100-40GB", []) == ()
    assert pack_layout("A100-40GB", []) == ((), ())
    assert free_slices("A100-40GB", []) == 8


# --------------------------------------------------------------------------- placement


def test_layout_from_names_places_larger_first_at_lowest_start():
    got = layout_from_names("A100-40GB", ["1g.5gb", "2g.10gb", "4g.20gb"])
    assert got == tuple(layout((0, "4g.20gb"), (4, "2g.10gb"), (6, "1g.5gb")))


def test_layout_from_names_moves_a_profile_up_when_the_lowest_start_blocks_the_rest():
    # 3g at 0 would leave slices 4..7, where 2g + 1g + 1g cannot go (no 1g starts at 7).
    got = layout_from_names("A100-80GB", ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"])
    assert got == tuple(layout((0, "2g.20gb"), (2, "1g.10gb"), (3, "1g.10gb"), (4, "3g.40gb")))
    validate_layout("A100-80GB", got)


def test_layout_from_names_is_order_independent():
    names = ["1g.18gb", "3g.71gb", "1g.35gb", "1g.18gb+me"]
    assert layout_from_names("NVIDIA H200", names) == layout_from_names("H200-141GB", list(reversed(names)))


def test_pack_layout_returns_left_out_names():
    got, left = pack_layout("A100-80GB", ["3g.40gb", "3g.40gb", "4g.40gb", "1g.10gb"])
    assert got == tuple(layout((0, "4g.40gb"), (4, "3g.40gb")))
    assert left == ("3g.40gb", "1g.10gb")
    got, left = pack_layout("A100-40GB", ["2g.10gb"] * 5)
    assert got == tuple(layout((0, "2g.10gb"), (2, "2g.10gb"), (4, "2g.10gb")))
    assert left == ("2g.10gb", "2g.10gb")
    assert free_slices("A100-40GB", got) == 2


def test_pack_layout_fills_around_big_profile():
    # 3g at 0 would leave room for three 1g only; at 4 it leaves room for four.
    got, left = pack_layout("H100-80GB", ["1g.10gb"] * 5 + ["3g.40gb"])
    assert got == tuple(layout(*((s, "1g.10gb") for s in range(4)), (4, "3g.40gb")))
    assert left == ("1g.10gb",)


# --------------------------------------------------------------------------- properties


@cache
def valid_multisets(model: str) -> frozenset[tuple[str, ...]]:
    """Every profile multiset that has a valid layout on ``model``, by brute force."""
    table = MIG_MODELS[model]
    spots = [(p, s) for p in table.values() for s in p.starts]
    found: set[tuple[str, ...]] = set()

    def walk(i: int, used: int, chosen: tuple) -> None:
        if i == len(spots):
            counts = Counter(p.name for p in chosen)
            if all(counts[n] <= table[n].max_count for n in counts) and sum(p.compute_slices for p in chosen) <= 7:
                found.add(tuple(sorted(p.name for p in chosen)))
            return
        walk(i + 1, used, chosen)
        p, s = spots[i]
        mask = ((1 << p.size) - 1) << s
        if not used & mask:
            walk(i + 1, used | mask, (*chosen, p))

    walk(0, 0, ())
    return frozenset(found)


@st.composite
def model_and_names(draw, max_size=12):
    model = draw(st.sampled_from(sorted(MIG_MODELS)))
    names = draw(st.lists(st.sampled_from(list(MIG_MODELS[model])), max_size=max_size))
    return model, names


def assert_no_overlap(model, instances):
    seen = set()
    for inst in instances:
        p = MIG_MODELS[model][inst.profile]
        cells = set(range(inst.start, inst.start + p.size))
        assert not cells & seen and cells <= set(range(8))
        seen |= cells


@settings(max_examples=400, **PROFILE)
@given(model_and_names())
def test_pack_layout_is_always_valid(case):
    model, wanted = case
    got, left = pack_layout(model, wanted)
    validate_layout(model, got)
    assert_no_overlap(model, got)
    assert list(got) == sorted(got)
    assert len(got) + len(left) == len(wanted)
    assert Counter(i.profile for i in got) + Counter(left) == Counter(wanted)
    assert tuple(sorted(i.profile for i in got)) in valid_multisets(model)
    for name in set(left):  # nothing left out could still be added
        assert tuple(sorted([*(i.profile for i in got), name])) not in valid_multisets(model)
    assert free_slices(model, got) == 8 - sum(MIG_MODELS[model][i.profile].size for i in got)
    assert pack_layout(model, list(reversed(wanted))) == (got, left)


@settings(max_examples=400, **PROFILE)
@given(model_and_names(max_size=9))
def test_layout_from_names_valid_or_raises(case):
    model, names = case
    feasible = tuple(sorted(names)) in valid_multisets(model)
    try:
        got = layout_from_names(model, names)
    except MigError as err:
        assert not feasible, f"{names} has a valid layout on {model}"
        assert pack_layout(model, names)[1], "pack_layout placed everything"
        assert "does not fit" in str(err)
        return
    assert feasible
    validate_layout(model, got)
    assert_no_overlap(model, got)
    assert sorted(i.profile for i in got) == sorted(names)
    assert pack_layout(model, names) == (got, ())


def test_every_valid_multiset_is_placed():
    for model in MIG_MODELS:
        for names in valid_multisets(model):
            validate_layout(model, layout_from_names(model, list(names)))
