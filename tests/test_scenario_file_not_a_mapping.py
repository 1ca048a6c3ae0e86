"""A scenario file that is not a YAML mapping says what it is in words a user wrote:
an empty file said "the file is not allowed to be NoneType", a list "... to be list"
(Python's type names)."""

import pytest

from gpushepherd.sim.scenario import ScenarioError, load_scenario

ALLOWED = "is not allowed: a YAML mapping with scenario, policy, jobs and expect"


@pytest.mark.parametrize("text, what", [
    ("", "an empty file (or comments only)"),
    ("# nothing yet\n", "an empty file (or comments only)"),
    ("- a\n- b\n", "a YAML list"),
    ("hello\n", "a lone YAML value ('hello')"),
])
def test_a_file_that_is_not_a_mapping_is_named_in_yaml_words(tmp_path, text, what):
    p = tmp_path / "s.yaml"
    p.write_text(text)
    with pytest.raises(ScenarioError) as info:
        load_scenario(p)
    assert str(info.value) == f"{p}: {what} {ALLOWED}"
