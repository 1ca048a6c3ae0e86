"""The bundled default order (issue 17 point 2, design note 045): every bundled policy
carries the same ``priority`` section (``gpushepherd.policy.schema.DEFAULT_ORDER``),
the policy reference shows it, and ``bench/compare.py``'s ``week`` preset replays the
synthetic weeks under small-team.yaml for gpushepherd and a baseline alike. The order
itself (the top-class tier, time limit, age) is checked by the scenarios
``examples/scenarios/I17-02-*.yaml`` and by the oracle, which draws the tier."""

import importlib.util
from importlib import resources
from pathlib import Path

import pytest

from gpushepherd.policy import policy_from_dict, read_policy_dict
from gpushepherd.policy.reference import EXAMPLES
from gpushepherd.policy.schema import DEFAULT_ORDER, PrioritySpec
from gpushepherd.sim.synthetic import WEEK_START, week_workload, weeks_workload

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = sorted((ROOT / "examples" / "policies").glob("*.yaml")) + [
    Path(str(resources.files("gpushepherd.data") / name)) for name in ("demo-policy.yaml", "demo-server-policy.yaml")]


@pytest.mark.parametrize("path", BUNDLED, ids=[p.name for p in BUNDLED])
def test_every_bundled_policy_carries_the_default_order(path):
    raw = read_policy_dict(str(path))
    assert PrioritySpec.model_validate(raw.get("priority")) == PrioritySpec.model_validate(DEFAULT_ORDER)
    prio = policy_from_dict(raw, str(path)).rules.priority
    assert prio.top_class_tier and prio.class_weight == 0
    assert (prio.time_limit_weight, prio.age_weight, prio.max_age_s, prio.recalc_s) == (1e6, 1e5, 172800, 3600)


def test_the_default_order_is_not_the_schema_default():
    """Without a ``priority`` section the order stays class alone (the hand-computed
    scenarios rely on it; note 045 says why)."""
    default = PrioritySpec()
    assert not default.top_class_tier and default.weights.class_ == 1e6 and default.weights.time_limit == 0


def test_the_reference_shows_the_default_order_in_the_r4_example():
    r4 = next(policy for title, _what, policy in EXAMPLES if title.startswith("Requirement R4"))
    assert r4["priority"] == DEFAULT_ORDER


def test_weeks_back_to_back():
    one = weeks_workload(0, 1)
    assert one == week_workload(0)
    jobs = weeks_workload(3, 2)
    first, second = jobs[:len(week_workload(3))], jobs[len(week_workload(3)):]
    ids = [j.spec.id for j in jobs]
    assert len(set(ids)) == len(ids) and all(i.startswith(("w0-", "w1-")) for i in ids)
    # week 1 is seed 4, shifted by exactly 7 days (no DST change in that fortnight)
    assert [j.spec.id for j in second] == ["w1-" + j.spec.id for j in week_workload(4)]
    assert [j.spec.submit_time for j in second] == [j.spec.submit_time + 7 * 86400 for j in week_workload(4)]
    assert [j.duration for j in first] == [j.duration for j in week_workload(3)]
    with pytest.raises(ValueError, match="weeks: 0 is not allowed"):
        weeks_workload(0, 0)


def test_weeks_across_a_dst_change_start_on_local_mondays():
    # 2027-03-22 is the Monday after Europe's DST change (2027-03-28 is the Sunday): week 1
    # starts 7 days less an hour later
    jobs = weeks_workload(0, 2, "2027-03-22T00:00:00")
    second = [j for j in jobs if j.spec.id.startswith("w1-")]
    assert second[0].spec.id == "w1-" + week_workload(1, "2027-03-29T00:00:00")[0].spec.id
    assert second[0].spec.submit_time == 7 * 86400 - 3600 + week_workload(1, "2027-03-29T00:00:00")[0].spec.submit_time


def test_compare_week_preset_runs_gpushepherd_and_a_baseline():
    spec = importlib.util.spec_from_file_location("bench_compare", ROOT / "bench" / "compare.py")
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    base = dict(compare._preset("week", "192x8", "1:2"), policy=str(compare.WEEK_POLICY), seed=0, map=None,
                skip_bad_rows=False, load=1.0, bf_depth=None, estimates="limit")
    assert base["cluster"] is None and base["days"] is None  # the week is its own cluster and span
    rows = {name: compare.one(dict(base, scheduler=name)) for name in ("gpushepherd", "fifo")}
    n = len(weeks_workload(0, compare.WEEKS, WEEK_START))
    assert all(r["jobs"] == n and r["unfinished"] == 0 for r in rows.values())
    assert rows["gpushepherd"]["preemptions"] > 0 == rows["fifo"]["preemptions"]  # fifo keeps no preemption
