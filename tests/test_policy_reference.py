"""The generated policy reference (issue 13, design note 026): ``docs/policy.md`` is what
``shepherd policy reference`` prints from the pydantic schema, every field of the schema
is documented (meaning, example), every example is valid, and the README links it."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field
from typer.testing import CliRunner

from gpushepherd.cli.main import app
from gpushepherd.policy import policy_from_dict
from gpushepherd.policy.reference import COMMAND, EXAMPLES, doc_problems, reference, sections

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "policy.md"
#: examples that need other fields than their section's other examples (a UUID per GPU)
APART = {("NodeGroupSpec", "gpu_uuids"): {"name": "n", "gpus": 1}}


def test_docs_policy_md_is_current():
    assert DOC.exists() and DOC.read_text(encoding="utf-8") == reference(), (
        f"docs/policy.md is stale (the policy schema changed): run `{COMMAND}`")


def test_the_cli_prints_the_reference():
    res = CliRunner().invoke(app, ["policy", "reference"])
    assert res.exit_code == 0 and res.output == reference()


def test_every_field_has_a_description_and_an_example():
    assert doc_problems() == [], "document these fields with schema.doc(description, example, unit): " + "; ".join(
        doc_problems())


def test_a_field_without_a_description_is_found():
    class Inner(BaseModel):
        model_config = ConfigDict(extra="forbid")
        n: int = Field(1, description="a count", examples=[2])
        bare: int = 0

    class Outer(BaseModel):
        inner: dict[str, Inner] = Field(default_factory=dict, description="x", examples=[{}])

    assert doc_problems(Outer) == ["inner.<key>.bare (Inner.bare): no description", "inner.<key>.bare (Inner.bare): no example"]


@pytest.mark.parametrize("model", [m for m, _ in sections()], ids=lambda m: m.__name__)
def test_every_example_is_valid(model):
    """A section's examples together are one valid entry of it (those in APART apart)."""
    fields = model.model_fields
    together = {f.alias or n: f.examples[0] for n, f in fields.items() if (model.__name__, n) not in APART}
    model.model_validate(together)
    for (name, field), base in APART.items():
        if name == model.__name__:
            model.model_validate({**base, field: fields[field].examples[0]})


@pytest.mark.parametrize("title, what, policy", EXAMPLES, ids=[t for t, _w, _p in EXAMPLES])
def test_every_worked_example_is_a_valid_policy(title, what, policy):
    policy_from_dict(policy, title)


def test_the_reference_covers_what_users_bring_from_kueue_and_slurm():
    text = reference()
    for path in ("`cohorts.<cohort>`", "`cohorts.<cohort>.members[]`", "`classes.<class>.windows[]`, "
                 "`teams.<team>.windows[]`", "`classes.<class>`", "`teams.<team>`", "`preemption`", "`backfill`",
                 "`cluster.nodes[].sharing.time_slicing`", "`cluster.nodes[].sharing.mps`",
                 "`cluster.nodes[].mig.<gpu>`", "`cluster.pools[]`"):
        assert f"## {path}" in text, path
    for words in ("| `taints` |", "| `lending_limit` |", "| `reclaim` |", "| `grace_period_s` |", "| seconds |",
                  "| MiB |", "| GPUs |", "Kueue ClusterQueue `nominalQuota`", "### Cohorts", "| `sandbox` | 100 |"):
        assert words in text, words


def test_the_readme_links_the_reference():
    assert "docs/policy.md" in (ROOT / "README.md").read_text(encoding="utf-8")
