"""``shepherd policy check`` says how the class priorities it prints enter the order (a
newcomer read priorities 400/300/... there and "class weight 0" in the README): the
top class's tier, the score's weights, and what class priorities decide besides."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpushepherd.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = [*sorted((ROOT / "examples" / "policies").glob("*.yaml")),
           ROOT / "src/gpushepherd/data/demo-policy.yaml", ROOT / "src/gpushepherd/data/demo-server-policy.yaml"]


def check_lines(path: Path) -> list[str]:
    r = CliRunner().invoke(app, ["policy", "check", str(path)])
    assert r.exit_code == 0, r.output
    return [ln.strip() for ln in r.output.splitlines()]


@pytest.mark.parametrize("path", BUNDLED, ids=lambda p: p.name)
def test_bundled_policies_say_the_default_order_next_to_the_class_priorities(path):
    lines = check_lines(path)
    assert "order: 1. jobs of production-inference (the top class priority, 400), a hard tier (top_class_tier)" \
        in lines, lines
    assert "order: 2. the rest by score: weights class=0, time_limit=1000000, age=100000 (over 172800 s); ties by " \
        "submit time, job id; recomputed every 3600 s" in lines, lines
    preempt = "no preemption (preemption.enabled is false)" if path.name == "philly.yaml" else \
        "who may preempt whom (a job may preempt preemptible jobs of a lower class priority)"
    said = f"class priorities: pick the top tier and decide {preempt}; class weight 0: they do not order the other classes"
    assert said in lines, lines
    assert lines.index(said) < lines.index(next(x for x in lines if x.startswith("class production-inference:")))

def test_a_policy_without_priority_is_ordered_by_class(tmp_path):
    policy = tmp_path / "plain.yaml"
    policy.write_text("name: plain\ncluster: {nodes: [{name: n1, gpus: 8}]}\n")
    lines = check_lines(policy)
    assert "order: by score: weights class=1000000; ties by submit time, job id" in lines, lines
    assert "class priorities: decide who may preempt whom (a job may preempt preemptible jobs of a lower class " \
        "priority); class weight 1000000: they order the queue" in lines, lines


def test_aged_tier_fair_share_and_no_preemption_are_said(tmp_path):
    policy = tmp_path / "aged.yaml"
    policy.write_text("name: aged\ncluster: {nodes: [{name: n1, gpus: 8}]}\npreemption: {enabled: false}\n"
                      "priority: {top_class_tier: true, age_tier_s: 86400, age_tier_jobs: 2,\n"
                      "           weights: {class: 0, fair_share: 5000}}\n")
    lines = check_lines(policy)
    assert "order: 2. the 2 oldest jobs that have waited 86400 s, oldest first (age_tier_s)" in lines, lines
    assert any(x.startswith("order: 3. the rest by score: weights class=0, fair_share=5000;") for x in lines), lines
    assert "class priorities: pick the top tier and decide no preemption (preemption.enabled is false); class " \
        "weight 0: they do not order the other classes" in lines, lines


def _class_line(tmp_path, text: str) -> tuple[list[str], str]:
    policy = tmp_path / "p.yaml"
    policy.write_text("cluster: {nodes: [{name: n1, gpus: 8}]}\n" + text)
    lines = check_lines(policy)
    return lines, next(x for x in lines if x.startswith("class priorities:"))


def test_within_team_preemption_is_said_with_preemption_off(tmp_path):
    # preemption.enabled false, but the core preempts lower classes within team ml's limit (note 035)
    _lines, said = _class_line(tmp_path, "name: within\npreemption: {enabled: false}\n"
                               "teams:\n  ml: {max_gpus: 4, preemption: {within_team: lower_priority}}\n")
    assert "no preemption" not in said, said
    assert "decide preemption only within teams ml" in said, said


def test_cohort_reclaim_of_any_class_is_said(tmp_path):
    # reclaim: any evicts borrowers of any class (core/preemption.py candidates), not only lower ones
    _lines, said = _class_line(tmp_path, "name: cohort\nteams:\n  cv: {nominal_gpus: 4}\n  nlp: {nominal_gpus: 4}\n"
                               "cohorts:\n  labs: {members: [cv, nlp], reclaim: any}\n")
    assert "cohort reclaim (reclaim: any in labs) also evicts borrowers of any class" in said, said
    _lines, said = _class_line(tmp_path, "name: cohort\nteams:\n  cv: {nominal_gpus: 4}\n  nlp: {nominal_gpus: 4}\n"
                               "cohorts:\n  labs: {members: [cv, nlp], reclaim: lower_priority}\n")
    assert "reclaim" not in said, said


def test_class_weight_0_with_a_deadline_weight_says_the_top_class_is_lifted(tmp_path):
    # core/priority.py: the top class's jobs always get the full deadline weight
    _lines, said = _class_line(tmp_path, "name: deadline\npriority: {weights: {class: 0, deadline: 1000}}\n")
    assert "do not order the queue" not in said, said
    assert said.endswith("class weight 0; the top class's jobs get the full deadline weight (1000)"), said


def test_top_class_tier_with_every_class_at_priority_0_holds_no_job(tmp_path):
    # max_prio is 0 or 1: no class reaches it, so no job is in the hard tier
    classes = "".join(f"  {c}: {{priority: 0}}\n" for c in
                      ("production-inference", "training", "research-training", "batch", "sandbox"))
    lines, said = _class_line(tmp_path, "name: zero\nclasses:\n" + classes
                              + "priority: {top_class_tier: true, weights: {class: 0, age: 1}}\n")
    assert not any("hard tier" in x for x in lines), lines
    assert "pick the top tier" not in said and said.endswith("class weight 0: they do not order the queue"), said
    assert "top_class_tier: no class has a priority above 0, so no job is in the tier" in lines, lines


def test_a_negative_class_priority_is_refused(tmp_path):
    # the core divides by the top priority: negative ones would reverse the class order
    policy = tmp_path / "neg.yaml"
    policy.write_text("name: neg\ncluster: {nodes: [{name: n1, gpus: 8}]}\nclasses:\n  sandbox: {priority: -5}\n")
    r = CliRunner().invoke(app, ["policy", "check", str(policy)])
    assert r.exit_code == 2, r.output
    said = r.output
    assert "classes.sandbox.priority" in said and "-5" in said and "greater than or equal to 0" in said, said
