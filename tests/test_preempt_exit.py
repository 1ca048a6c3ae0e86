"""A job the scheduler preempts is requeued whatever its exit code (design note 048),
through the daemon with real processes: one that catches SIGTERM and exits 0 (a shell's
``trap 'exit 0' TERM``, a Python handler that returns) is requeued and runs again, as
Slurm's ``PreemptMode=REQUEUE`` and Kueue do; one that had exited on its own before the
signal was sent completes. Jobs wait for flag files, not for time."""

from __future__ import annotations

import sys

import pytest

from builders import in_process_api
from test_daemon import wait_for

POLICY = """\
name: preempt-exit
cluster:
  nodes:
    - {name: local, gpus: 2, gpu_type: FAKE, gpu_mem_mib: 16384}
classes:
  batch: {grace_period_s: 30}
teams:
  ml: {}
preemption: {enabled: true}
"""


def submit(client, command: list[str], cls: str = "batch", gpus: int = 2) -> str:
    r = client.post("/jobs", json={"class": cls, "team": "ml", "user": "ana", "gpus": gpus, "command": command,
                                   "cwd": str(client.daemon.data_dir)})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def ended(client, job_id: str) -> dict:
    return wait_for(f"job {job_id} to end", lambda: (j := client.get(f"/jobs/{job_id}").json())["state"] in
                    ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") and j)


# run 1 waits (the preemption's SIGTERM ends it with exit 0); run 2 prints and exits 0
TRAP_SH = ("if [ \"$SHEPHERD_RUN\" = 1 ]; then trap 'echo caught TERM; exit 0' TERM; touch \"$FLAG\"; "
           "i=0; while [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done; fi; echo run $SHEPHERD_RUN")
HANDLER_PY = ("import os, signal, sys, time\n"
              "if os.environ['SHEPHERD_RUN'] == '1':\n"
              "    stop = []\n"
              "    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))\n"
              "    open(os.environ['FLAG'], 'w').close()\n"
              "    t0 = time.time()\n"
              "    while not stop and time.time() - t0 < 120:\n"
              "        time.sleep(0.05)\n"
              "    print('caught TERM', flush=True)\n"
              "    sys.exit(0)\n"
              "print('run', os.environ['SHEPHERD_RUN'])\n")


@pytest.mark.parametrize("command", [["sh", "-c", TRAP_SH], [sys.executable, "-c", HANDLER_PY]],
                         ids=["trap-exit-0", "python-handler-returns"])
def test_a_preempted_job_that_exits_0_on_sigterm_is_requeued_and_runs_again(tmp_path, monkeypatch, command):
    flag = tmp_path / "started"
    monkeypatch.setenv("FLAG", str(flag))
    with in_process_api(tmp_path, POLICY) as client:
        victim = submit(client, command)
        wait_for("the victim's first run to wait for its signal", flag.exists)
        urgent = submit(client, [sys.executable, "-c", "print('serving')"], cls="production-inference")
        assert ended(client, urgent)["state"] == "COMPLETED"
        job = ended(client, victim)
        assert job["state"] == "COMPLETED" and job["runs"] == 2 and job["preemptions"] == 1, job
        steps = [(h["to"], h["reason"]) for h in job["history"]]
        assert [s for s, _r in steps] == ["PENDING", "RUNNING", "PREEMPTING", "PENDING", "RUNNING", "COMPLETED"]
        assert steps[3][1] == "preempted"  # requeued for its preemption, not "exit 0"
        data = client.daemon.data_dir / "runs" / victim
        assert "caught TERM" in (data / "1" / "stdout").read_text()  # run 1 got the SIGTERM and exited 0
        assert (data / "1" / "exit").read_text() == '{"code": 0}'
        assert "run 2" in (data / "2" / "stdout").read_text()


def test_a_job_that_exited_on_its_own_before_the_preemption_signal_completes(tmp_path, monkeypatch):
    """The race: the victim exits 0 after the step that preempts it read the exits, before
    its signal is sent - it finished on its own and ends ``COMPLETED``, not requeued."""
    go = tmp_path / "go"
    with in_process_api(tmp_path, POLICY) as client:
        d = client.daemon
        victim = submit(client, [sys.executable, "-c", f"import os, time\nt0 = time.time()\nwhile not os.path.exists("
                                 f"{str(go)!r}) and time.time() - t0 < 120:\n    time.sleep(0.05)\nprint('done')"])
        wait_for("the victim to run", lambda: client.get(f"/jobs/{victim}").json()["state"] == "RUNNING")
        real, hold = d.backend.exits, [True]
        monkeypatch.setattr(d.backend, "exits", lambda: [] if hold[0] else real())  # the daemon does not see it yet
        go.touch()
        exit_file = d.data_dir / "runs" / victim / "1" / "exit"
        wait_for("the victim to exit on its own", exit_file.exists)
        urgent = submit(client, [sys.executable, "-c", "print('serving')"], cls="production-inference")
        wait_for("the core to preempt the victim", lambda: client.get(f"/jobs/{victim}").json()["state"] ==
                 "PREEMPTING")
        hold[0] = False
        job = ended(client, victim)
        assert job["state"] == "COMPLETED" and job["runs"] == 1, job
        assert [h["to"] for h in job["history"]] == ["PENDING", "RUNNING", "PREEMPTING", "COMPLETED"]
        assert job["history"][-1]["reason"] == "exit 0"
        assert ended(client, urgent)["state"] == "COMPLETED"
