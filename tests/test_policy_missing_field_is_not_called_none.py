"""A field a policy file leaves out is named as missing, not as the value None: a
policy without `cluster` said "cluster: None is not allowed: a value is required here",
as if the file had written `cluster: null` (which still says None, being what it
wrote)."""

import pytest

from gpushepherd.policy.load import PolicyError, load_policy


@pytest.mark.parametrize("text, line", [
    ("teams: {}\n", "cluster: a value is required here"),
    ("cluster: {}\n", "cluster.nodes: a value is required here"),
    ("cluster:\n  nodes:\n    - {gpus: 4}\n", "cluster.nodes[0].name: a value is required here"),
    ("cluster: {nodes: [{name: n1, gpus: 4}]}\nclasses: {gold: {}}\n",
     "classes.gold.priority: a priority (integer) for a class that is not one of the standard ones: "),
])
def test_a_missing_field_is_named_as_missing(tmp_path, text, line):
    p = tmp_path / "p.yaml"
    p.write_text(text)
    with pytest.raises(PolicyError) as info:
        load_policy(p)
    assert str(info.value).startswith(f"{p}: {line}")
    assert "None" not in str(info.value)


def test_an_explicit_null_is_still_quoted(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("cluster:\n  nodes: null\n")
    with pytest.raises(PolicyError, match=r"cluster\.nodes: None is not allowed: input should be a valid list"):
        load_policy(p)
