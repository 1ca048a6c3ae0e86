"""``shepherd demo``'s first lines on an 80-column terminal: each line is one thought
and none is wrapped (a newcomer reported the first sentence wrapping mid-sentence)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from typer.testing import CliRunner

from gpushepherd.cli.main import app
from gpushepherd.daemon.demo import DemoResult


@pytest.mark.parametrize("backend", ["local", "slurm"])
def test_demo_header_fits_80_columns_unwrapped(tmp_path, monkeypatch, backend):
    screen = io.StringIO()
    console = Console(file=screen, width=80, markup=True, emoji=False, highlight=False)
    monkeypatch.setattr("gpushepherd.cli.main._console", lambda stderr=False, markup=False: console)
    monkeypatch.setattr("gpushepherd.backends.fakeslurm.unavailable", lambda: None)
    ran = []

    def fake_run(data_dir, **kw):  # the header is printed before the server starts
        ran.append(kw["backend"])
        return DemoResult(jobs=[], checks=[("x", True, "")], wall_s=1.0)

    monkeypatch.setattr("gpushepherd.daemon.demo.run_demo", fake_run)
    data = tmp_path / "d"
    r = CliRunner().invoke(app, ["demo", "--data-dir", str(data), "--keep", "--backend", backend])
    assert r.exit_code == 0, r.output
    assert ran == [backend]
    lines = screen.getvalue().splitlines()
    first = ["shepherd demo: a server under the small-team policy on one 8-GPU node"]
    if backend == "slurm":
        first.append("  jobs run on a fake Slurm cluster that the demo starts and stops")
    first += ["  policy: demo-server-policy.yaml", f"  server data: {data}",
              "  times: seconds since the server answered, when the demo saw each change",
              "  (every 0.5 s); the checks at the end use the server's own times"]
    assert [x.rstrip() for x in lines[:len(first)]] == first


JOBS = [
    {"id": "1", "class": "production-inference", "team": "ml-platform", "gpus": 2, "state": "RUNNING",
     "placement": "gpu-server-1:0,1", "runs": 1},
    {"id": "2", "class": "training", "team": "research", "gpus": 4, "state": "PREEMPTING",
     "placement": "gpu-server-1:4,5,6,7", "runs": 1},
    {"id": "3", "class": "sandbox", "team": "research", "gpus": 1, "state": "PENDING", "reason": "Resources", "runs": 0},
    {"id": "4", "class": "batch", "team": "data", "gpus": 1, "state": "RUNNING", "reason": "3/6 done, 1 running",
     "tasks": 6, "runs": 5},
    {"id": "4_3.2", "class": "batch", "team": "data", "gpus": 1, "state": "RUNNING", "placement": "gpu-server-1:3"},
    {"id": "7", "class": "production-inference", "team": "ml-platform", "gpus": 4, "state": "PENDING",
     "reason": "HeldForPreemptor(7)", "runs": 0},
]
NODES = [{"gpu": [{"index": i, "jobs": [["1"], ["1"], [], ["4_3.2"], ["2"], ["2"], ["2"], ["2"]][i]}
                  for i in range(8)]}]
NAMES = {"1": "inference-api", "2": "train-llm", "3": "notebook", "4": "embed-batch", "7": "inference-burst"}


def _render(renderable, width: int) -> list[str]:
    screen = io.StringIO()
    Console(file=screen, width=width, emoji=False, highlight=False).print(renderable)
    return [x.rstrip() for x in screen.getvalue().splitlines()]


@pytest.mark.parametrize("width", [80, 103, 104, 160])
def test_demo_tables_neither_cut_nor_wrap_a_cell(width):
    from gpushepherd.cli.demo import FULL_WIDTH, _queue_table, usage_table

    lines = _render(_queue_table(12.0, JOBS, NODES, NAMES, width), width)
    assert not any("…" in x for x in lines), lines
    assert len(lines) == 1 + 1 + 5 + 1, lines  # title, header, one line per job (not the array's child), GPU map
    assert ("CLASS" in lines[1] and "TEAM" in lines[1]) == (width >= FULL_WIDTH)
    assert "inference-burst" in lines[-2] and "HeldForPreemptor(7)" in lines[-2] and "[3:4_3.2]" in lines[-1]
    result = DemoResult(jobs=[{**v, "gpu_s": 10.0, "submit_time": 0.0, "first_start": 1.0} for v in JOBS],
                        usage=[{"team": t, "decayed_usage_gpu_s": 12345.0, "fair_share_factor": 0.5}
                               for t in ("data", "ml-platform", "research")])
    lines = _render(usage_table(result), width)
    assert not any("…" in x for x in lines) and len(lines) == 1 + 1 + 3, lines


def test_event_and_check_lines_wrap_under_their_text():
    from gpushepherd.cli.demo import hanging
    from rich.text import Text

    text = "submitted inference-burst (job 7): production-inference, team ml-platform, 4 GPU(s)"
    lines = _render(hanging(Text("   8.5 s "), text), 80)
    assert lines == ["   8.5 s  submitted inference-burst (job 7): production-inference, team",
                     "          ml-platform, 4 GPU(s)"], lines
    assert _render(hanging(Text("   8.5 s "), "embed-batch[3.2] (job 4_3.2): new -> RUNNING"), 160) == [
        "   8.5 s  embed-batch[3.2] (job 4_3.2): new -> RUNNING"]  # as is: no markup read in job names
