"""One-line builders for tests, in the style of Kueue's ``MakeWorkload`` wrappers.

    job("j1", gpus=4, cls="training", team="ml", submit=10, checkpointable=True)
    policy(nodes=[("n1", 8), node("n2", 4, pool="inf")], teams={"ml": {"max_gpus": 8}})

Everything has a default, so a test states only what it is about.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from typing import Any

from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.events import JobSubmitted
from gpushepherd.model.job import JobSpec
from gpushepherd.model.rules import Rules
from gpushepherd.policy import policy_from_dict
from gpushepherd.sim.engine import SimJob, SimResult, Simulator

STANDARD_CLASSES = ("production-inference", "training", "research-training", "batch", "sandbox")


def job(id: str, gpus: int = 1, cls: str = "batch", team: str = "t", submit: float = 0.0, **kw: Any) -> JobSpec:
    """A job spec; ``kw`` are any other ``JobSpec`` fields (user, gpus_per_pod, ...)."""
    return JobSpec(id=id, team=team, workload_class=cls, gpus=gpus, submit_time=float(submit), **kw)


def node(name: str, gpus: int = 8, gpu_type: str = "A100-80GB", gpu_mem_mib: int = 81920,
         pool: str = "default", count: int = 1, **kw: Any) -> dict:
    """A ``cluster.nodes[]`` entry of a policy (a node group when ``count`` > 1)."""
    return {"name": name, "count": count, "gpus": gpus, "gpu_type": gpu_type,
            "gpu_mem_mib": gpu_mem_mib, "pool": pool, **kw}


def _node_entry(n: Any) -> dict:
    if isinstance(n, dict):
        return n
    if isinstance(n, str):
        return node(n)
    return node(*n)


def policy_dict(nodes: Sequence[Any] = (("n1", 8),), teams: dict | None = None, classes: dict | None = None,
                preemption: bool | dict = True, backfill: bool | int | dict = True, **extra: Any) -> dict:
    """The policy mapping ``policy`` compiles (for tests that change it further).

    ``nodes``: ``(name, gpus[, gpu_type ...])`` tuples, names, or ``node(...)`` dicts.
    ``preemption``: on/off or the whole section. ``backfill``: on/off, the number of
    reservations, or the whole section. ``teams=None`` declares no teams (any team name
    is then accepted).
    """
    raw: dict[str, Any] = {"cluster": {"nodes": [_node_entry(n) for n in nodes]}}
    if teams:
        raw["teams"] = teams
    if classes:
        raw["classes"] = classes
    raw["preemption"] = preemption if isinstance(preemption, dict) else {"enabled": bool(preemption)}
    if isinstance(backfill, dict):
        raw["backfill"] = backfill
    elif isinstance(backfill, bool):
        raw["backfill"] = {"enabled": backfill}
    else:
        raw["backfill"] = {"enabled": True, "reservations": int(backfill)}
    raw.update(extra)
    return raw


def policy(nodes: Sequence[Any] = (("n1", 8),), teams: dict | None = None, classes: dict | None = None,
           preemption: bool | dict = True, backfill: bool | int | dict = True, **extra: Any) -> Rules:
    """Compiled ``Rules`` of a small policy; see ``policy_dict``."""
    return policy_from_dict(policy_dict(nodes, teams, classes, preemption, backfill, **extra)).rules


def submit(*specs: JobSpec, t: float | None = None) -> list[JobSubmitted]:
    """``JobSubmitted`` events at each spec's submit time (or at ``t``)."""
    return [JobSubmitted(spec.submit_time if t is None else t, spec) for spec in specs]


def scheduler(rules: Rules, *specs: JobSpec) -> tuple[Scheduler, list]:
    """A scheduler that has been handed ``specs``; returns it and the decisions."""
    sched = Scheduler(rules)
    out = sched.handle(submit(*specs)) if specs else []
    return sched, out


def simulate(rules: Rules, jobs: Iterable[tuple[JobSpec, float | None]], events: Iterable = (),
             **kw: Any) -> SimResult:
    """Run the simulator with invariant checks on; ``jobs`` are ``(spec, duration)``."""
    kw.setdefault("check_invariants", True)
    return Simulator(rules, [SimJob(s, d) for s, d in jobs], list(events), **kw).run()


def placed(decision) -> dict[str, tuple[int, ...]]:
    """A ``Start`` decision's placement as ``{node: gpu indices}``."""
    return {name: tuple(gpus) for name, gpus in decision.placement.parts}


def write_file(tmp_path, name: str, text: str):
    """Write ``text`` to ``tmp_path / name``, gzip'd when the name ends in ``.gz``."""
    import gzip

    p = tmp_path / name
    if name.endswith(".gz"):
        with gzip.open(p, "wt") as f:
            f.write(text)
    else:
        p.write_text(text)
    return p


@contextmanager
def in_process_api(tmp_path, policy_text: str, **daemon_kw: Any):
    """An in-process server (``Daemon`` + ``make_app`` under Starlette's test client)
    on SQLite in ``tmp_path/data`` with the policy ``policy_text``; yields the client,
    whose ``daemon`` is the server."""
    from fastapi.testclient import TestClient

    from gpushepherd.daemon.api import make_app
    from gpushepherd.daemon.server import Daemon

    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_text)
    d = Daemon(tmp_path / "data", policy_path=policy, poll_s=0.05, **daemon_kw)
    d.start()
    try:
        with TestClient(make_app(d)) as client:
            client.daemon = d
            yield client
    finally:
        d.stop()


def route_cli_to(client, monkeypatch):
    """Send the CLI's HTTP requests (``httpx.request``) to ``client``, a FastAPI
    ``TestClient``: the CLI under typer's runner talks to an in-process server (the
    client has no timeout argument, so it is dropped). Returns
    ``cli(*args, env=None) -> (exit code, stdout, stderr)``, the CLI run that way."""
    import httpx
    from typer.testing import CliRunner

    from gpushepherd.cli.main import app

    monkeypatch.setattr(httpx, "request", lambda method, url, **kw: client.request(
        method, url, **{k: v for k, v in kw.items() if k != "timeout"}))

    def cli(*args, env=None):
        r = CliRunner().invoke(app, list(args), env=env)
        return r.exit_code, r.stdout, r.stderr
    return cli


def remove_unix_users(names: Iterable[str], group: str, home: bool = False) -> None:
    """Remove test-made Unix users and their group (``userdel``, ``-r`` with ``home``),
    trying each again for 5 s while a process of theirs still exits (``userdel`` refuses
    then); a user still there is named.

    Raises:
        AssertionError: a user could not be removed.
    """
    import subprocess
    import time

    left = []
    for name in names:
        for _ in range(50):
            done = subprocess.run(["userdel", *(["-r"] if home else []), name], check=False, capture_output=True)
            if done.returncode in (0, 6):  # removed, or not there
                break
            time.sleep(0.1)
        else:
            left.append(name)
    subprocess.run(["groupdel", group], check=False, capture_output=True)
    assert not left, f"test users not removed: {left} (userdel them)"


#: a newcomer's Kueue setup translated (a cohort per ResourceFlavor/pool, a class per
#: WorkloadPriorityClass x flavor), as they wrote it: test_kueue_export, test_preemption_cycles
KUEUE_TRANSLATION = """\
name: kueue-translation
cluster:
  pools: [{name: h100}, {name: a100}]
  nodes:
  - {name: h100-node, gpus: 8, gpu_type: H100-80GB, gpu_mem_mib: 81920, pool: h100}
  - {name: a100-node, count: 2, gpus: 8, gpu_type: A100-80GB, gpu_mem_mib: 81920, pool: a100}
classes:
  high-h100: {priority: 1000, pools: [h100], preemptible: true, checkpointable: true}
  low-h100:  {priority: 100,  pools: [h100], preemptible: true, checkpointable: true}
  high-a100: {priority: 1000, pools: [a100], preemptible: true, checkpointable: true}
  low-a100:  {priority: 100,  pools: [a100], preemptible: true, checkpointable: true}
teams:
  team-a:
    nominal_gpus: 12
    preemption: {within_team: lower_priority}
    classes:
      high-h100: {queueing: strict_fifo}
      low-h100: {queueing: strict_fifo}
      high-a100: {queueing: strict_fifo}
      low-a100: {queueing: strict_fifo}
  team-b:
    nominal_gpus: 12
cohorts:
  research-h100:
    pool: h100
    reclaim: any
    members:
    - {team: team-a, nominal_gpus: 4, borrowing_limit: 4, lending_limit: 2}
    - {team: team-b, nominal_gpus: 4}
  research-a100:
    pool: a100
    reclaim: any
    members:
    - {team: team-a, nominal_gpus: 8, borrowing_limit: 0}
    - {team: team-b, nominal_gpus: 8, borrowing_limit: 8}
preemption: {enabled: true, min_runtime_s: 0}
"""
