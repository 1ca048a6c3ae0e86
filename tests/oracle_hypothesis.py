"""What the oracle's Hypothesis generator tests share (tests/test_hold_pins.py and the
notes' class tests after it): their settings and the check of one drawn workload."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase

from oracle_checks import Report, check
from oracle_workloads import Workload

#: derandomized, no example database, no deadline; shrinking a failing workload costs
#: minutes, so only when asked (SHEPHERD_ORACLE_SHRINK=1), as in test_oracle.py
PROFILE = {"derandomize": True, "database": None, "deadline": None, "print_blob": True,
           "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
           "phases": tuple(Phase) if os.environ.get("SHEPHERD_ORACLE_SHRINK") else (
               Phase.explicit, Phase.reuse, Phase.generate)}


def assert_clean(wl: Workload, ran: str = "a_equal") -> Report:
    """Run the whole oracle (``oracle_checks.check``) on ``wl``; fail naming each failure
    and the workload. ``ran``: a property whose count proves the checks ran."""
    rep = check(wl)
    assert rep.counts[ran], f"{ran} was never checked"
    assert not rep.failures, "\n".join(map(str, rep.failures)) + f"\n{wl!r}"
    return rep
