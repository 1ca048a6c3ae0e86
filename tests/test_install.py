"""The lean install (issue 18, point 15; design note 028): the base install has no
pandas, pyarrow or matplotlib; the CLI starts without them and without the core; a
command that needs an extra says which one to install. The missing modules are
simulated by a meta-path blocker in a subprocess; the start's CPU time is measured by
``bench/cli_startup.py``, not here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from gpushepherd.extras import EXTRAS, MissingExtra, require

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
HEAVY = ("pandas", "pyarrow", "matplotlib", "numpy", "plotly")

#: runs ``shepherd ARGS`` with the modules of $BLOCK (comma list) not importable, as if
#: they were not installed
BLOCKED_CLI = """
import os, sys
from importlib.abc import MetaPathFinder

BLOCK = set(filter(None, os.environ["BLOCK"].split(",")))

class Blocker(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCK:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Blocker())
sys.argv = ["shepherd", *sys.argv[1:]]
from gpushepherd.cli.main import run
run()
"""


def shepherd_without(block: tuple[str, ...], *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC), "BLOCK": ",".join(block), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-c", BLOCKED_CLI, *args], check=False, capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


def test_the_cli_imports_neither_the_heavy_libraries_nor_the_core():
    probe = ("import sys, gpushepherd.cli.main; "
             "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
             f"{HEAVY + ('fastapi', 'uvicorn', 'sqlalchemy')!r} or m.startswith(('gpushepherd.core', "
             "'gpushepherd.sim', 'gpushepherd.policy', 'gpushepherd.report', 'gpushepherd.baselines.')))))")
    r = subprocess.run([sys.executable, "-c", probe], check=False, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(SRC)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == []


def test_the_server_imports_no_pandas_pyarrow_or_matplotlib():
    probe = ("import sys, gpushepherd.daemon.api, gpushepherd.daemon.server, gpushepherd.daemon.ui; "
             f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", probe], check=False, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(SRC)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == []


def test_pyproject_extras_match_the_modules_the_code_checks():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(reqs: list[str]) -> set[str]:
        return {re.match(r"[A-Za-z0-9_.-]+(\[[^]]*\])?", r).group(0).lower() for r in reqs}

    base = names(meta["dependencies"])
    assert not base & set(HEAVY), f"the base install pulls {sorted(base & set(HEAVY))}"
    extras = meta["optional-dependencies"]
    for extra, modules in EXTRAS.items():
        assert names(extras[extra]) == set(modules), extra  # here distribution and module names agree
    # the README's `pip install -e '.[test]'` (and .ci/run) installs what the suite needs
    assert "gpushepherd[sim,report]" in names(extras["test"])
    assert ".[test]" in (ROOT / "README.md").read_text().split("```bash", 1)[1].split("```", 1)[0]


def test_require_names_the_extra_and_the_pip_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # None: `import matplotlib` raises ImportError
    with pytest.raises(MissingExtra) as caught:
        require("report", "shepherd report")
    msg = str(caught.value)
    assert "shepherd report needs the 'report' extra" in msg
    assert "matplotlib" in msg and "pandas" not in msg  # only what is missing is named
    assert msg.endswith("pip install 'gpushepherd[report]'")
    require("sim", "shepherd simulate")  # installed here: nothing raised


def test_simulate_without_the_sim_extra_says_what_to_install(tmp_path):
    r = shepherd_without(("pandas", "pyarrow"), "simulate", "--days", "1", cwd=tmp_path)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "error: shepherd simulate needs the 'sim' extra" in r.stderr
    assert "pip install 'gpushepherd[sim]'" in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_simulate_html_without_plotly_fails_before_simulating(tmp_path):
    out = tmp_path / "jobs.csv"
    r = shepherd_without(("plotly",), "simulate", "--days", "1", "--out", str(out), "--html",
                         str(tmp_path / "page.html"), cwd=tmp_path)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "error: shepherd simulate --html needs the 'report' extra (plotly:" in r.stderr
    assert "pip install 'gpushepherd[report]'" in r.stderr
    assert r.stdout == "" and not out.exists()  # refused before any work


def test_html_pages_need_plotly_and_the_tables_do_not(tmp_path):
    """Note 040: plotly is checked (and imported) only where a page is written."""
    from test_report import POLICY, drive, week_jobs

    from gpushepherd.daemon.store import Store

    store = Store(Store.sqlite_url(tmp_path))
    drive(store, POLICY, week_jobs())
    store.close()
    r = shepherd_without(("plotly", "matplotlib"), "report", "--data-dir", str(tmp_path), "--no-progress",
                         cwd=tmp_path)
    assert r.returncode == 0 and "GPU-hours per team" in r.stdout, (r.stdout, r.stderr)
    for args, what in ((("report",), "shepherd report --html"),
                       (("whatif", "--policy", str(ROOT / "examples" / "policies" / "small-team.yaml")),
                        "shepherd whatif --html")):
        r = shepherd_without(("plotly",), *args, "--data-dir", str(tmp_path), "--html", str(tmp_path / "p.html"),
                             cwd=tmp_path)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert f"error: {what} needs the 'report' extra (plotly: No module named 'plotly')" in r.stderr
        assert "pip install 'gpushepherd[report]'" in r.stderr and not (tmp_path / "p.html").exists()


def test_the_report_modules_do_not_import_plotly_until_a_page_is_written():
    probe = ("import sys; from gpushepherd.report import render, whatif; import gpushepherd.cli.report; "
             "print('plotly' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", probe], check=False, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(SRC)})
    assert r.returncode == 0 and r.stdout.strip() == "False", (r.stdout, r.stderr)


def test_report_and_whatif_without_the_report_extra(tmp_path):
    policy = ROOT / "examples" / "policies" / "small-team.yaml"
    for args, what in ((("report", "--data-dir", str(tmp_path)), "shepherd report"),
                       (("whatif", "--policy", str(policy), "--data-dir", str(tmp_path)), "shepherd whatif")):
        r = shepherd_without(("pandas", "matplotlib"), *args, cwd=tmp_path)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert f"error: {what} needs the 'report' extra" in r.stderr
        assert "pip install 'gpushepherd[report]'" in r.stderr


def test_the_base_install_still_runs_scenarios_help_and_client_commands(tmp_path):
    scenario = ROOT / "examples" / "scenarios" / "I13-10-rejected-at-submit.yaml"
    r = shepherd_without(HEAVY, "scenario", "run", "-q", str(scenario), cwd=tmp_path)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "PASS" in r.stdout and "FAIL" not in r.stdout
    r = shepherd_without(HEAVY, "simulate", "--help", cwd=tmp_path)
    assert r.returncode == 0 and "tiresias" in r.stdout  # the baselines named without importing them
    r = shepherd_without(HEAVY, "queue", "--server", "http://127.0.0.1:9", cwd=tmp_path)
    assert r.returncode == 1 and "no gpushepherd server at http://127.0.0.1:9" in r.stderr


def test_ui_plots_without_the_report_extra_answer_503_naming_it(monkeypatch):
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from gpushepherd.daemon.ui import mount_ui

    app = FastAPI()
    cache = mount_ui(app, batches=list)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    client = TestClient(app)
    r = client.get("/ui/plots/queue.png")
    assert r.status_code == 503
    assert "needs the 'report' extra" in r.json()["detail"]
    assert "pip install 'gpushepherd[report]'" in r.json()["detail"]
    assert cache.builds == 0
    assert client.get("/ui/plots/nope.png").status_code == 404  # a bad name is still 404
