"""Tail figures per size class and fairness across users (gpushepherd.tails, note 030)."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushepherd.tails import SIZE_CLASSES, jain_index, size_class, slowdown, tail_figures, tail_rows

NAN = float("nan")


@pytest.mark.parametrize("gpus, label", [(0.25, "1"), (1, "1"), (2, "2-4"), (4, "2-4"), (5, "5-8"), (8, "5-8"),
                                         (9, "9-15"), (15, "9-15"), (16, "16+"), (1024, "16+")])
def test_size_class_bounds(gpus, label):
    assert size_class(gpus) == label


@given(st.integers(min_value=1, max_value=10_000), st.integers(min_value=1, max_value=10_000))
def test_size_classes_cover_every_count_in_order(a, b):
    # every count is in one class, and a larger job is never in a smaller class
    lo, hi = sorted((a, b))
    assert SIZE_CLASSES.index(size_class(lo)) <= SIZE_CLASSES.index(size_class(hi))


@pytest.mark.parametrize("bad", [0, -1, NAN, float("inf"), "8"])
def test_size_class_refuses_what_is_not_a_gpu_count(bad):
    with pytest.raises(ValueError, match="gpus: .* is not allowed: a number of GPUs > 0"):
        size_class(bad)


def test_bounded_slowdown():
    assert slowdown(3600, 1800) == 2.0
    assert slowdown(60, 1) == 6.0  # a 1 s job that waited 59 s: against 10 s, not 60x
    assert slowdown(5, 5) == 1.0  # never below 1


def test_jain_index():
    assert jain_index([2.0, 2.0, 2.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert jain_index([1.0, 3.0]) == pytest.approx(16 / 20)
    assert jain_index([]) is None


def test_tail_figures_per_size_class():
    gpus = [1, 1, 1, 8, 8, 32]
    wait = [0.0, 100.0, NAN, 3600.0, 7200.0, 50.0]
    slow = [1.0, 3.0, NAN, 2.0, NAN, 1.5]
    fig = tail_figures(gpus, wait, slow, ["a"] * 6)
    sizes = fig["size_classes"]
    assert list(sizes) == list(SIZE_CLASSES)
    one = sizes["1"]
    assert (one["jobs"], one["started"], one["not_started"], one["ended"]) == (3, 2, 1, 2)
    assert one["wait_s"] == {"mean": 50.0, "p90": pytest.approx(90.0), "p99": pytest.approx(99.0), "max": 100.0}
    assert one["slowdown"]["max"] == 3.0
    assert sizes["5-8"]["wait_s"]["max"] == 7200.0 and sizes["5-8"]["ended"] == 1
    assert sizes["2-4"] == {"jobs": 0, "started": 0, "not_started": 0, "ended": 0,
                            "wait_s": {"mean": None, "p90": None, "p99": None, "max": None},
                            "slowdown": {"mean": None, "p90": None, "p99": None, "max": None}}
    assert [r["size_gpus"] for r in tail_rows(fig)] == ["1", "5-8", "16+"]


def test_p90_wait_shows_the_tenth_of_a_class_that_waits_long():
    """Issue 17 point 4: nine 8-GPU jobs start at once and one waits 100 h: the mean says
    10 h, the p90 the linear interpolation between the 9th and 10th waits (0 h and 100 h,
    at 0.9 x 9 = 8.1 of the way: 10 h); eleven 1-GPU jobs waiting 0, 1, ..., 10 h: p90 at
    position 0.9 x 10 = 9, exactly 9 h; their slowdowns 1..11: p90 10."""
    H = 3600.0
    gpus = [8] * 10 + [1] * 11
    wait = [0.0] * 9 + [100 * H] + [i * H for i in range(11)]
    slow = [1.0] * 10 + [float(i + 1) for i in range(11)]
    sizes = tail_figures(gpus, wait, slow, ["u"] * 21)["size_classes"]
    assert sizes["5-8"]["wait_s"]["p90"] == pytest.approx(10 * H)
    assert sizes["5-8"]["wait_s"]["mean"] == pytest.approx(10 * H)
    assert sizes["1"]["wait_s"]["p90"] == pytest.approx(9 * H)
    assert sizes["1"]["slowdown"]["p90"] == pytest.approx(10.0)
    rows = {r["size_gpus"]: r for r in tail_rows(tail_figures(gpus, wait, slow, ["u"] * 21))}
    assert rows["5-8"]["wait_p90_s"] == pytest.approx(10 * H) and rows["1"]["slowdown_p90"] == pytest.approx(10.0)


def test_fairness_counts_users_with_enough_ended_jobs():
    users = ["a"] * 5 + ["b"] * 5 + ["c"] * 4  # c: too few ended jobs to count
    slow = [1.0] * 5 + [3.0] * 4 + [NAN] + [50.0] * 4
    f = tail_figures([1] * 14, [0.0] * 14, slow, users)["fairness"]
    assert f["users"] == 1 and f["value"] == 1.0 and f["worst_user"] == "a"  # b has 4 ended jobs
    f = tail_figures([1] * 15, [0.0] * 15, slow + [3.0], users + ["b"])["fairness"]
    assert f["users"] == 2 and f["worst_user"] == "b" and f["worst_mean_slowdown"] == 3.0
    assert f["value"] == pytest.approx(16 / 20)


def test_tail_figures_refuses_mismatched_or_bad_input():
    with pytest.raises(ValueError, match="one of each per job"):
        tail_figures([1, 2], [0.0], [1.0], ["a"])
    with pytest.raises(ValueError, match="gpus: 0.0 is not allowed"):
        tail_figures([0], [0.0], [1.0], ["a"])
    assert tail_figures([], [], [], [])["fairness"]["value"] is None
    assert not math.isnan(tail_figures([1], [NAN], [NAN], ["a"])["size_classes"]["1"]["not_started"])
