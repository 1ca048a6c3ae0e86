"""An unknown key in a policy is refused with the fields allowed there as a policy file
writes them: the alias where the schema has one (``priority.weights.class``, a window's
``from``), never the Python name (``class_``, ``from_``) that the file cannot use - a
newcomer who misspelt ``class`` was told to write ``class_``, itself refused."""

from __future__ import annotations

import pytest
from gpushepherd.policy import policy_from_dict
from gpushepherd.policy.load import PolicyError


def _refusal(raw: dict) -> str:
    with pytest.raises(PolicyError) as err:
        policy_from_dict(raw)
    return str(err.value)


NODES = {"nodes": [{"name": "n1", "gpus": 8}]}


def test_a_misspelt_class_weight_is_told_class_not_class_():
    msg = _refusal({"cluster": NODES, "priority": {"weights": {"clas": 1}}})
    assert "priority.weights.clas" in msg and "(did you mean 'class'?)" in msg
    assert "allowed fields here: age, class, deadline," in msg and "class_" not in msg


def test_a_misspelt_window_edge_is_told_from_not_from_():
    msg = _refusal({"cluster": NODES, "classes": {"batch": {"windows": [{"frm": "22:00", "to": "06:00", "max_gpus": 2}]}}})
    assert "classes.batch.windows[0].frm" in msg and "(did you mean 'from'?)" in msg
    assert "from_" not in msg and "days, from, max_gpus" in msg

