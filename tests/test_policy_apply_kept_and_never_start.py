"""A policy applied on a running server reads the jobs the daemon keeps from the core
(held, waiting for a dependency or a begin time; note 021) as it reads the queued ones,
and says which waiting jobs no node of the new cluster could ever hold.

Found by a newcomer's test: `policy apply` changing the node's GPU type was accepted
while a held job asked for the old type, and `release` then rejected the job with no
word at the apply. A kept job the new policy would refuse at submit (its class removed)
is a conflict, as for a queued job; one no node could hold makes the apply say so (the
policy is applied: Slurm and Kubernetes keep such a job pending too, and a queued job
then reads ``ExceedsCapacity``)."""

from __future__ import annotations

import json

import httpx

from gpushepherd.core.scheduler import Scheduler
from gpushepherd.daemon.policy_change import conflicts, never_start
from gpushepherd.model.events import JobSubmitted
from gpushepherd.model.job import JobSpec
from gpushepherd.policy.load import parse_policy
import test_daemon
from test_daemon import wait_for_file
from test_policy_apply import V1, post_policy, version

db, fresh = test_daemon.db, test_daemon.fresh

OTHER_TYPE = V1.replace("gpu_type: FAKE", "gpu_type: OTHER")
NO_EXP = V1.replace("  exp: {priority: 150, preemptible: true}\n", "")


def _spec(i: str, cls: str = "exp", **kw) -> JobSpec:
    return JobSpec(id=i, team="ml", workload_class=cls, gpus=1, **kw)


def test_a_kept_job_of_a_removed_class_is_a_conflict_in_id_order_with_the_queued_ones():
    old = parse_policy(V1).rules
    sched = Scheduler(old)
    out = sched.handle([JobSubmitted(0.0, _spec("10"))])
    placements = {d.job_id: d.placement for d in out}
    found = conflicts(sched, old, parse_policy(NO_EXP).rules, placements, kept=(_spec("3"), _spec("20", cls="batch")))
    assert [(c.job, c.field) for c in found] == [("3", "class"), ("10", "class")]
    assert "job '3' (PENDING, kept from the scheduler until released) has not ended" in found[0].msg


def test_jobs_no_node_of_the_new_cluster_could_hold_are_named_queued_and_kept():
    old = parse_policy(V1).rules
    sched = Scheduler(old)
    sched.handle([JobSubmitted(0.0, _spec(str(i), cls="batch", gpu_types=("FAKE",))) for i in (1, 2)])
    sched.handle([JobSubmitted(1.0, _spec("5", cls="batch", gpu_types=("FAKE",))),
                  JobSubmitted(1.0, _spec("6", cls="batch"))])  # 5 and 6 wait: team ml's max_gpus 2 is taken
    new = Scheduler.restore(parse_policy(OTHER_TYPE).rules, json.loads(json.dumps(sched.snapshot())))
    found = never_start(new, kept=(_spec("11", cls="batch", gpu_types=("FAKE",)), _spec("12", cls="batch")))
    assert [j for j, _why in found] == ["5", "11"]
    assert "FAKE" in found[0][1] and found[1][1].endswith("(kept from the scheduler: rejected when released)")
    assert never_start(Scheduler.restore(old, json.loads(json.dumps(sched.snapshot())))) == []


def test_apply_names_a_held_job_it_strands_and_refuses_removing_its_class(fresh, tmp_path):
    s = fresh()
    s.policy.write_text(V1)
    s.start()
    held = s.submit(wait_for_file(tmp_path / "never"), gpus=1, cls="exp", hold=True, gpu_type=["FAKE"])
    assert s.job(held)["reason"] == "JobHeldUser"
    r = post_policy(s, NO_EXP)
    assert r.status_code == 422, r.text
    d, = r.json()["detail"]
    assert d["job"] == held and d["field"] == "class" and "kept from the scheduler until released" in d["msg"]
    assert version(s) == 1
    r = post_policy(s, OTHER_TYPE, dry_run="true")  # `policy check --server`: says it before the apply
    assert r.status_code == 200 and r.json()["would_apply"], r.text
    assert f"could be applied now as version 2; 1 job can never start under it: job '{held}'" in r.json()["message"]
    assert version(s) == 1
    r = post_policy(s, OTHER_TYPE)
    assert r.status_code == 200 and r.json()["version"] == 2, r.text
    assert f"1 job can never start under it: job '{held}'" in r.json()["message"]
    assert "rejected when released" in r.json()["message"]
    assert httpx.post(f"{s.url}/jobs/{held}/cancel", headers=s.headers, timeout=60).status_code == 200
    s.stop()
