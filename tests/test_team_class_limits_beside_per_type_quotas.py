"""A team's class limits (``teams.T.classes.C.max_gpus`` / ``max_running_jobs``) hold
whatever the form of the team's ``max_gpus``. With a per-GPU-type ``max_gpus`` (note 038)
the policy compiler left them out without a word: a 4-GPU training job started under
``classes.training.max_gpus: 3`` (a newcomer's find: the reason named neither limit).
Now they are compiled in both forms, and a job that no GPU type could ever admit names
a limit of every type first - it refuses the job on every type - before a per-type one."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from builders import job, node, policy
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.decisions import Start
from gpushepherd.model.events import JobFinished, JobSubmitted

NODES = [node("n1", 4, "A100-80GB"), node("n3", 4, "L40S")]


def _rules(max_gpus, **classes):
    return policy(nodes=NODES, teams={"a": {"max_gpus": max_gpus, "classes": classes}, "b": {}})


def _started(out) -> list[str]:
    return sorted(d.job_id for d in out if isinstance(d, Start))


def test_a_class_limit_holds_beside_a_per_type_team_quota():
    s = Scheduler(_rules({"A100-80GB": 2, "L40S": 8}, training={"max_gpus": 3}))
    out = s.handle([JobSubmitted(0, job("big", 4, "training", "a"))])
    assert _started(out) == []  # started on L40S before: 4 > 3
    assert str(s.pending_reason("big")) == "ExceedsCapacity(teams.a.classes.training.max_gpus=3)"
    out = s.handle([JobSubmitted(1, job("t3", 3, "training", "a", 1))])
    out += s.handle([JobSubmitted(2, job("t1", 1, "training", "a", 2)), JobSubmitted(2, job("s1", 1, "sandbox", "a", 2))])
    assert _started(out) == ["s1", "t3"]  # the class holds 3; another class is not counted in it
    assert str(s.pending_reason("t1")) == "QuotaExceeded(teams.a.classes.training.max_gpus=3, in use 3)"
    out = s.handle([JobFinished(5, "t3")])
    assert _started(out) == ["t1"]


def test_a_class_running_jobs_limit_holds_beside_a_per_type_team_quota():
    s = Scheduler(_rules({"A100-80GB": 4, "L40S": 4}, batch={"max_running_jobs": 1}))
    out = s.handle([JobSubmitted(0, job("b1", 1, "batch", "a")), JobSubmitted(0, job("b2", 1, "batch", "a"))])
    assert _started(out) == ["b1"]
    assert str(s.pending_reason("b2")) == "QuotaExceeded(teams.a.classes.batch.max_running_jobs=1, in use 1)"


def test_a_job_no_type_admits_names_a_limit_of_every_type():
    # both per-type limits (2) refuse 4 GPUs, and so does the class's 3: the class's names it
    s = Scheduler(_rules({"A100-80GB": 2, "L40S": 2}, training={"max_gpus": 3}))
    s.handle([JobSubmitted(0, job("big", 4, "training", "a"))])
    assert str(s.pending_reason("big")) == "ExceedsCapacity(teams.a.classes.training.max_gpus=3)"
    # without a class limit the per-type one is what refuses it
    s = Scheduler(_rules({"A100-80GB": 2, "L40S": 2}))
    s.handle([JobSubmitted(0, job("big", 4, "training", "a"))])
    assert str(s.pending_reason("big")) == "ExceedsCapacity(teams.a.max_gpus[A100-80GB]=2)"


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(per_type=st.booleans(), gpus=st.integers(1, 8),
       limits=st.dictionaries(st.sampled_from(["training", "batch", "sandbox"]),
                              st.fixed_dictionaries({}, optional={"max_gpus": st.integers(0, 8),
                                                                  "max_running_jobs": st.integers(1, 4)}),
                              max_size=3))
def test_every_class_limit_a_team_sets_is_compiled(per_type, gpus, limits):
    rules = _rules({"A100-80GB": gpus, "L40S": gpus} if per_type else gpus, **limits)
    paths = {lim.path: lim.max for lim in rules.limits}
    for cname, lim in limits.items():
        for field, value in lim.items():
            assert paths.get(f"teams.a.classes.{cname}.{field}") == value, (cname, field, sorted(paths))
