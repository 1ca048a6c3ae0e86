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
              "  times: seconds since the start, when the demo saw each change (every 0.5 s);",
              "  the checks at the end use the server's own times"]
    assert [x.rstrip() for x in lines[:len(first)]] == first
