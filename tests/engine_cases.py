"""Test cases shared by the engine backends' tests (`test_slurm.py`, `test_ray.py`):
each drives a real `shepherd server --backend X` and asserts from the jobs' own output;
the engine-specific parts come in as callables."""

from __future__ import annotations

import subprocess
import sys

from test_daemon import Server, free_port, wait_for, wait_for_file

#: a checkpointable job: saves its step on SIGTERM and exits 85 (checkpointed, requeue
#: me); a later run prints where it resumed from
CHECKPOINTING = (
    "import os, signal, sys, time\nd = os.environ['SHEPHERD_CHECKPOINT_DIR']; p = os.path.join(d, 'step')\n"
    "if os.path.exists(p):\n    print('resumed from', open(p).read(), 'run', os.environ['SHEPHERD_RUN'],"
    " flush=True); sys.exit(0)\n"
    "def save(*_):\n    open(p, 'w').write('41'); print('checkpointed', flush=True); sys.exit(85)\n"
    "signal.signal(signal.SIGTERM, save)\nprint('ready', flush=True)\ntime.sleep(120)\n")


def preemption_case(server, urgent_code: str, ready: int, all_free, exit_code: int = 85) -> None:
    """A 16-GPU checkpointable job preempted by an 8-GPU urgent one resumes from its
    checkpoint in run 2 (``ready``: how many 'ready' lines its run prints); its handler
    exits ``exit_code`` - 0 too: a preempted job is requeued whatever its code (note 048)."""
    victim = server.submit(CHECKPOINTING.replace("sys.exit(85)", f"sys.exit({exit_code})"), gpus=16, cls="batch")
    server.wait_state(victim, "RUNNING")
    wait_for("the victim's handler", lambda: server.logs(victim).count("ready") >= ready)
    urgent = server.submit(urgent_code, gpus=8, cls="urgent")
    assert server.wait_state(urgent, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    job = server.wait_state(victim, "COMPLETED", "FAILED")
    assert job["state"] == "COMPLETED" and job["runs"] == 2 and job["preemptions"] == 1
    assert [h["to"] for h in job["history"]][:4] == ["PENDING", "RUNNING", "PREEMPTING", "PENDING"]
    assert "checkpointed" in server.logs(victim, run=1)
    assert "resumed from 41 run 2" in server.logs(victim)
    assert wait_for("the GPUs back", lambda: all_free(server))


def quota_case(server, tmp_path, in_engine, all_free) -> None:
    """A team's ``max_gpus: 10`` holds across both nodes: the second 6-GPU job is not
    handed to the engine (``in_engine(job)``) while the first runs; the jobs' own clocks
    show no overlap."""
    flag = tmp_path / "go"
    stamp = tmp_path / "stamps"
    code = (f"import os, time\nopen({str(stamp)!r}, 'a').write(f\"start {{os.environ['SHEPHERD_JOB_ID']}} "
            f"{{time.time()}}\\n\")\n" + wait_for_file(flag) + "\n"
            f"open({str(stamp)!r}, 'a').write(f\"end {{os.environ['SHEPHERD_JOB_ID']}} {{time.time()}}\\n\")")
    a = server.submit(code, gpus=6, team="capped")
    server.wait_state(a, "RUNNING")
    b = server.submit(code, gpus=6, team="capped")  # a node has 8 free, but the team's 10 would be 12
    reason = wait_for("b's quota reason", lambda: server.job(b)["reason"])
    assert server.job(b)["state"] == "PENDING" and "max_gpus" in reason
    assert not in_engine(b)  # never handed to the engine yet
    flag.touch()
    assert server.wait_state(b, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    rows = {(w[0], w[1]): float(w[2]) for w in (line.split() for line in stamp.read_text().splitlines())}
    assert rows[("start", b)] >= rows[("end", a)]  # from the jobs' own clocks: never both at once
    assert wait_for("the GPUs back", lambda: all_free(server))


def refused_case(policy: str, tmp_path, extra: tuple[str, ...]) -> None:
    """A policy naming a node the engine lacks: the server refuses to start naming both."""
    s = Server(tmp_path)
    s.policy.write_text(policy.replace("name: fake2, gpus: 8", "name: fake3, gpus: 8"))
    p = subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", "server", "--data-dir", str(s.data),
                        "--policy", str(s.policy), "--port", str(free_port()), *extra],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert "node 'fake3' of the policy is not in the engine (its nodes: fake1, fake2)" in p.stderr


def logged_start(log, flag) -> str:
    """A job's code: append '<job> run <run>' to ``log``, then wait for ``flag``."""
    return (f"import os\nopen({str(log)!r}, 'a').write(os.environ['SHEPHERD_JOB_ID'] + ' run ' "
            f"+ os.environ['SHEPHERD_RUN'] + '\\n')\n" + wait_for_file(flag))


def engine_policy(name: str) -> str:
    """The engine tests' policy: two 8-GPU A100 nodes ``fake1``, ``fake2``; a
    checkpointable, preemptible ``batch`` class and an ``urgent`` one; team ``capped``
    with ``max_gpus: 10``."""
    return f"name: {name}\n" + """\
cluster:
  nodes:
    - {name: fake1, gpus: 8, gpu_type: A100, gpu_mem_mib: 81920}
    - {name: fake2, gpus: 8, gpu_type: A100, gpu_mem_mib: 81920}
classes:
  batch: {priority: 100, preemptible: true, checkpointable: true, grace_period_s: 20}
  urgent: {priority: 900}
teams:
  ml: {}
  capped: {max_gpus: 10}
preemption: {enabled: true}
"""


def placed_node_case(server, tmp_path, second_code: str, node_of_word, all_free) -> None:
    """With one node full, a second job runs on the other: the engine ran it where
    gpushepherd placed it (``node_of_word``: the policy node of the second word the job
    printed)."""
    flag = tmp_path / "go"
    first = server.submit(wait_for_file(flag), gpus=8)  # fills one node
    server.wait_state(first, "RUNNING")
    second = server.submit(second_code, gpus=2)
    job = server.wait_state(second, "COMPLETED", "FAILED")
    placed_first = server.job(first)["placement"].split(":")[0]
    assert node_of_word(server.logs(second).split()[1]) == ({"fake1", "fake2"} - {placed_first}).pop()
    assert job["state"] == "COMPLETED"
    flag.touch()
    assert server.wait_state(first, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    assert wait_for("the GPUs back", lambda: all_free(server))


def cancel_case(server, tmp_path, running_in_engine, all_free) -> None:
    """A cancel of a running job ends it in the engine (``running_in_engine(job)``)
    before it prints anything."""
    import httpx

    job_id = server.submit(wait_for_file(tmp_path / "never"), gpus=4)
    server.wait_state(job_id, "RUNNING")
    wait_for("it running in the engine", lambda: running_in_engine(job_id))
    r = httpx.post(f"{server.url}/jobs/{job_id}/cancel", timeout=60)
    assert r.status_code == 200 and r.json()["state"] == "CANCELLED"
    wait_for("it ended in the engine", lambda: not running_in_engine(job_id))
    assert "done" not in server.logs(job_id)
    assert wait_for("the GPUs back", lambda: all_free(server))


def restart_case(policy: str, db: str | None, tmp_path, extra: tuple[str, ...], a_ended, live, all_free,
                 then=None) -> None:
    """On a server of its own (``db``: ``None`` for SQLite, else a database URL), a
    ``kill -9`` of the server while two 8-GPU jobs run: ``a`` ends meanwhile
    (``a_ended(a)``: the engine shows it ended), ``b`` still runs. The restarted server
    completes ``a`` from its exit file and re-attaches ``b`` (``live()``: the jobs the
    engine runs, only ``b``'s then); each started once. ``then(a, b)``: more checks."""
    server = Server(tmp_path, "restart", db)
    server.policy.write_text(policy)
    server.start(extra=extra)
    try:
        _restart(server, tmp_path, extra, a_ended, live, all_free, then)
    finally:
        server.stop()


def _restart(server, tmp_path, extra, a_ended, live, all_free, then) -> None:
    log = tmp_path / "starts"
    flags = {k: tmp_path / k for k in ("a", "b")}
    a = server.submit(logged_start(log, flags["a"]), gpus=8)
    b = server.submit(logged_start(log, flags["b"]), gpus=8)
    server.wait_state(a, "RUNNING")
    server.wait_state(b, "RUNNING")
    wait_for("both started", lambda: log.exists() and len(log.read_text().splitlines()) == 2)
    server.kill9()
    assert live() == sorted([a, b])  # the engine's runs outlive the controller
    flags["a"].touch()  # a ends while no controller runs
    wait_for("a to end in the engine", lambda: a_ended(a))
    server.start(policy=False, extra=extra)
    assert server.wait_state(a, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    assert server.job(b)["state"] == "RUNNING"  # re-attached, not relaunched
    assert wait_for("only b in the engine", lambda: live() == [b])
    flags["b"].touch()
    jb = server.wait_state(b, "COMPLETED", "FAILED")
    assert jb["state"] == "COMPLETED" and jb["runs"] == 1 and server.job(a)["runs"] == 1
    assert sorted(log.read_text().splitlines()) == sorted([f"{a} run 1", f"{b} run 1"])
    assert "done" in server.logs(a) and "done" in server.logs(b)
    assert wait_for("the GPUs back", lambda: all_free(server))
    if then is not None:
        then(a, b)
