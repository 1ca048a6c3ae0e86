"""Progress on long work (issue 18 point 11, design note 020): the simulator's progress
callbacks, the rich bar of `simulate` (and none with --no-progress), and an interrupted
`simulate` that summarises and writes what it ran."""

from __future__ import annotations

import io
import json

import pytest
from builders import job, policy
from rich.console import Console
from typer.testing import CliRunner

from gpushepherd.sim import engine
from gpushepherd.sim.engine import SimInterrupted, SimJob, Simulator


def workload(n: int = 60) -> list[SimJob]:
    """``n`` one-GPU jobs on 4 GPUs, one every 10 s, each 100 s: a queue builds and drains."""
    return [SimJob(job(f"j{i}", submit=10 * i), 100.0) for i in range(n)]


RULES = policy(nodes=(("n1", 4),))


def test_the_callbacks_are_called_with_increasing_counts_and_decide_nothing():
    seen, pairs = [], []
    res = Simulator(RULES, workload(), on_progress=seen.append, progress=lambda d, t: pairs.append((d, t)),
                    progress_every_s=0).run()
    plain = Simulator(RULES, workload()).run()
    assert len(seen) > 10 and len(pairs) == len(seen)
    for a, b in zip(seen, seen[1:]):
        assert a.t <= b.t and a.submitted <= b.submitted and a.finished <= b.finished and a.done <= b.done
    assert seen[0].submitted < 60 and seen[0].finished < 60  # it moved during the run, not only at the end
    last = seen[-1]
    assert (last.submitted, last.finished, last.total, last.done) == (60, 60, 60, 120)
    assert pairs[-1] == (60, 60) and last.t_last_submit == 590.0 and last.t_first == 0.0
    assert {k: (r.starts, r.end) for k, r in res.records.items()} == \
        {k: (r.starts, r.end) for k, r in plain.records.items()}


def test_a_keyboard_interrupt_from_the_callback_leaves_the_partial_result():
    calls = []

    def stop(p):
        calls.append(p)
        if len(calls) == 12:
            raise KeyboardInterrupt

    with pytest.raises(SimInterrupted) as caught:
        Simulator(RULES, workload(), on_progress=stop, progress_every_s=0).run()
    exc = caught.value
    assert isinstance(exc, KeyboardInterrupt)
    ended = [r for r in exc.result.records.values() if r.end is not None]
    assert 0 < len(ended) == exc.progress.finished < 60
    assert exc.result.t_last <= exc.progress.t and exc.result.busy_gpu_s > 0
    assert all(r.state in ("PENDING", "RUNNING") for r in exc.result.records.values() if r.end is None)


@pytest.fixture
def terminal(monkeypatch):
    """`shepherd`'s stderr as a terminal, captured: where the bar is drawn."""
    import gpushepherd.cli.main as cli

    buf = io.StringIO()
    monkeypatch.setattr(cli, "err", Console(file=buf, force_terminal=True, width=120))
    return buf


def simulate(*args):
    from gpushepherd.cli.main import app

    return CliRunner().invoke(app, ["simulate", "--days", "45:45.5", *args])


def test_simulate_shows_the_trace_read_and_the_replay_as_tasks(terminal, tmp_path):
    res = simulate("--json", str(tmp_path / "s.json"))
    assert res.exit_code == 0, res.output
    drawn = terminal.getvalue()
    assert "reading philly-excerpt.csv.gz" in drawn and "simulating" in drawn and "ETA" in drawn
    assert "/s)" in drawn  # the rate


def test_no_progress_draws_no_bar(terminal, tmp_path):
    res = simulate("--no-progress", "--json", str(tmp_path / "s.json"))
    assert res.exit_code == 0, res.output
    drawn = terminal.getvalue()
    assert "simulating" not in drawn and "reading" not in drawn and "ETA" not in drawn
    assert "figures:" in drawn


def test_an_interrupted_simulate_writes_and_says_what_it_has(terminal, tmp_path, monkeypatch):
    import gpushepherd.cli.main as cli

    monkeypatch.setattr(engine, "PROGRESS_EVERY_S", 0.0)  # a call after every instant
    replay = cli.SimBar.replay

    def interrupting(self, what, jobs):
        update, calls = replay(self, what, jobs), []

        def stop(p):  # Ctrl-C, as the callback sees it, once some jobs have ended
            update(p)
            calls.append(p)
            if p.finished >= 50:
                raise KeyboardInterrupt
        return stop
    monkeypatch.setattr(cli.SimBar, "replay", interrupting)
    res = simulate("--json", str(tmp_path / "s.json"), "--out", str(tmp_path / "jobs.csv"))
    assert res.exit_code == 130, res.output
    drawn = terminal.getvalue()
    assert "interrupted: simulated up to" in drawn and "PARTIAL" in drawn
    figures = json.loads((tmp_path / "s.json").read_text())
    total = figures["jobs"]
    assert figures["interrupted"]["jobs"] == total and 50 <= figures["interrupted"]["jobs_ended"] < total
    assert figures["overall"]["finished"] == figures["interrupted"]["jobs_ended"]
    rows = (tmp_path / "jobs.csv").read_text().splitlines()
    assert len(rows) == total + 1  # every job, ended or not
    assert "PARTIAL (interrupted)" in res.stdout


def test_report_and_whatif_show_the_log_read_and_each_replay(terminal, tmp_path):
    import yaml
    from test_report import POLICY, drive, week_jobs

    from gpushepherd.cli.main import app
    from gpushepherd.daemon.store import Store

    store = Store(Store.sqlite_url(tmp_path))
    drive(store, POLICY, week_jobs())
    store.close()
    res = CliRunner().invoke(app, ["report", "--data-dir", str(tmp_path), "--week"])
    assert res.exit_code == 0, res.output
    assert "reading the event log (batches)" in terminal.getvalue()
    (tmp_path / "new.yaml").write_text(yaml.safe_dump(POLICY))
    res = CliRunner().invoke(app, ["whatif", "--policy", str(tmp_path / "new.yaml"), "--data-dir", str(tmp_path),
                                   "--since", "7d"])
    assert res.exit_code == 0, res.output
    drawn = terminal.getvalue()
    assert "current policy" in drawn and "proposed policy" in drawn
    terminal.seek(0)
    terminal.truncate()
    res = CliRunner().invoke(app, ["whatif", "--no-progress", "--policy", str(tmp_path / "new.yaml"),
                                   "--data-dir", str(tmp_path), "--since", "7d"])
    assert res.exit_code == 0 and "policy" not in terminal.getvalue() and "event log" not in terminal.getvalue()
