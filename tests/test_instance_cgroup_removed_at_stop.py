"""A server's own cgroup (``<parent>/gpushepherd/<instance>``) is removed when it stops
with no run left in it, and kept while a run is alive (a restart re-attaches to it).
Before, every server ever started left an empty directory per data dir behind (a
newcomer counted 109 on this host). Needs a writable cgroup v2 (skipped elsewhere,
saying why)."""

from __future__ import annotations

import pytest

from gpushepherd.daemon import cgroups
import test_daemon
from test_daemon import wait_for, wait_for_file
from test_multitenant import why_not_cgroups

db, fresh = test_daemon.db, test_daemon.fresh

pytestmark = pytest.mark.skipif(why_not_cgroups() is not None, reason=str(why_not_cgroups()))


def test_the_instance_cgroup_goes_at_stop_unless_a_run_is_alive(fresh, tmp_path):
    s = fresh()
    s.start()
    done = s.submit("print('ok')")
    s.wait_state(done, "COMPLETED")
    base = cgroups.instance_dir(s.data)
    assert base is not None and base.is_dir()
    alive = s.submit(wait_for_file(tmp_path / "go"))
    s.wait_state(alive, "RUNNING")
    s.stop()
    assert base.is_dir()  # the live run's cgroup is in it
    s.start(policy=False)
    (tmp_path / "go").write_text("")
    s.wait_state(alive, "COMPLETED")
    wait_for("its GPU handed back (its run's cgroup gone)", lambda: s.free_gpus() == 4)
    s.stop()
    assert not base.exists()
