"""The what-if page (issue 18 point 10, note 040): measured (the event log) beside the
baseline (the same jobs simulated under the policy they ran under) beside the proposed
policy, in a table and interactive plots, on a hand-made log the baseline cannot
reproduce (a job running before the range holds the one GPU).

The log, one H100, policy zone Europe/Berlin (MON 00:00 UTC = 01:00 CET):

* ``pre`` (team a) submitted at 0 h, runs 0-4 h (before the range: not compared);
* ``j1`` (team a) submitted at 1 h, 2 h of work: waits for ``pre``, runs 4-6 h;
* ``j2`` (team b) submitted at 2 h, 1 h of work: runs 6-7 h.

The range is [1 h, 1 day). Per job wait / JCT / GPU-hours, by hand:

=====  ==================  ==================================  ==============================
job    measured            baseline (1 GPU, empty at 1 h)      proposed (2 GPUs)
=====  ==================  ==================================  ==============================
j1     3 h / 5 h / 2       0 / 2 h / 2 (runs 1-3 h)            0 / 2 h / 2
j2     4 h / 5 h / 1       1 h / 2 h / 1 (runs 3-4 h)          0 / 1 h / 1 (runs 2-3 h)
=====  ==================  ==================================  ==============================

class training: wait mean 3.5 / 0.5 / 0 h, p95 3.95 / 0.95 / 0 h (numpy linear over two
jobs: a + 0.95 (b - a)), JCT mean 5 / 2 / 1.5 h, GPU-hours 3 / 3 / 3.
"""

from __future__ import annotations

from datetime import datetime, timezone
from html.parser import HTMLParser

import pytest
import yaml
from typer.testing import CliRunner

from gpushepherd.cli.main import app
from gpushepherd.daemon.store import Store
from gpushepherd.model.job import JobSpec
from plotly_html import assert_self_contained, axis_title, drawn_in_chromium, figures
from test_report import drive

H = 3600.0
MON = datetime(2026, 11, 30, tzinfo=timezone.utc).timestamp()
H100 = ("H100-80GB",)
POLICY = {
    "clock": {"timezone": "Europe/Berlin"},
    "cluster": {"nodes": [{"name": "n", "gpus": 1, "gpu_type": "H100-80GB", "gpu_mem_mib": 81920}]},
    "classes": {"training": {}},
    "teams": {"a": {}, "b": {}},
}
GROUPS = ["class training", "team a", "team b"]
#: per figure, per run: the values of GROUPS (hours, or GPU-hours), by hand (module docstring)
EXPECT = {
    "wait_mean_s": {"measured": [3.5, 3, 4], "current": [0.5, 0, 1], "proposed": [0, 0, 0]},
    "wait_p95_s": {"measured": [3.95, 3, 4], "current": [0.95, 0, 1], "proposed": [0, 0, 0]},
    "jct_mean_s": {"measured": [5, 5, 5], "current": [2, 2, 2], "proposed": [1.5, 2, 1]},
    "gpu_hours": {"measured": [3, 2, 1], "current": [3, 2, 1], "proposed": [3, 2, 1]},
}
RUN_NAMES = {"measured": "measured (the event log)", "current": "baseline: current policy, simulated",
             "proposed": "proposed policy, simulated"}


@pytest.fixture()
def logged(tmp_path):
    jobs = [(JobSpec("pre", "a", "training", 1, gpu_types=H100, submit_time=MON), 4 * H),
            (JobSpec("j1", "a", "training", 1, gpu_types=H100, submit_time=MON + H), 2 * H),
            (JobSpec("j2", "b", "training", 1, gpu_types=H100, submit_time=MON + 2 * H), 1 * H)]
    store = Store(Store.sqlite_url(tmp_path))
    drive(store, POLICY, jobs)
    store.close()
    two = {**POLICY, "cluster": {"nodes": [{**POLICY["cluster"]["nodes"][0], "gpus": 2}]}}
    (tmp_path / "two.yaml").write_text(yaml.safe_dump(two))
    return tmp_path


def _whatif(logged, *extra):
    res = CliRunner().invoke(app, ["whatif", "--policy", str(logged / "two.yaml"), "--data-dir", str(logged),
                                   "--from", "2026-11-30T02:00", "--to", "2026-12-01T01:00", "--no-progress",
                                   *extra], terminal_width=200)
    assert res.exit_code == 0, res.output
    return res


def test_the_table_has_measured_beside_baseline_beside_proposed(logged, tmp_path):
    import pandas as pd

    _whatif(logged, "--csv", str(tmp_path / "csv"))
    t = pd.read_csv(tmp_path / "csv" / "whatif.csv")
    t.index = [f"{by} {g}" for by, g in zip(t["by"], t["group"])]
    assert list(t.index) == GROUPS and list(t["jobs"]) == [2, 1, 1]  # pre, before the range, is not compared
    for col, runs in EXPECT.items():
        div = 1.0 if col == "gpu_hours" else H
        for run, values in runs.items():
            assert (t[f"{col}_{run}"] / div).tolist() == pytest.approx(values), (col, run)
        assert (t[f"{col}_change"] / div).tolist() == pytest.approx(
            [p - c for p, c in zip(runs["proposed"], runs["current"])]), col


def test_the_page_is_self_contained_with_three_series_per_figure(logged, tmp_path):
    out = tmp_path / "whatif.html"
    _whatif(logged, "--html", str(out))
    page = out.read_text()
    assert_self_contained(page)
    figs = figures(page)
    assert set(figs) == {f"plot-{c}" for c in EXPECT} | {"plot-whatif-held", "plot-whatif-pending"}
    for col, runs in EXPECT.items():
        fig = figs[f"plot-{col}"]
        assert [t["name"] for t in fig["data"]] == list(RUN_NAMES.values()), col
        for trace, run in zip(fig["data"], runs):
            assert trace["x"] == GROUPS and trace["y"] == pytest.approx(runs[run]), (col, run)
        assert axis_title(fig["layout"], "yaxis") == ("GPU-hours" if col == "gpu_hours" else "hours")
        assert axis_title(fig["layout"], "xaxis") == "team / workload class"
    held = figs["plot-whatif-held"]
    assert axis_title(held["layout"], "xaxis") == "time (Europe/Berlin)"
    assert axis_title(held["layout"], "yaxis") == "GPUs held"
    measured, baseline, proposed = held["data"]
    # wall-clock in the policy's zone (01:00 UTC is 02:00 in Berlin); measured: the GPU is pre's until 05:00
    assert measured["x"][0] == baseline["x"][0] == "2026-11-30 02:00:00"
    assert measured["x"][-1] == "2026-11-30 08:00:00"  # the log's last event (j2's exit): never the future
    hours = ["02:30", "04:30", "05:30", "06:30", "07:30"]
    assert [at(measured, f"2026-11-30 {h}:00") for h in hours] == [0, 0, 1, 1, 1]
    # each simulated run ends with its last job: the baseline's j1 02-04, j2 04-05; the proposed both from 03
    assert [at(baseline, f"2026-11-30 {h}:00") for h in hours] == [1, 1, None, None, None]
    assert [at(proposed, f"2026-11-30 {h}:00") for h in hours] == [1, None, None, None, None]
    assert at(proposed, "2026-11-30 03:30:00") == 2  # both at once on two GPUs
    pending = figs["plot-whatif-pending"]
    assert axis_title(pending["layout"], "yaxis") == "pending jobs"
    assert max(pending["data"][0]["y"]) == 2 and max(pending["data"][2]["y"]) == 0


def at(trace: dict, x: str) -> float:
    """The value of a step trace (``line_shape="hv"``) at ``x`` (the last point at or
    before it); ``None`` past its last point (the series ends there)."""
    assert trace["line"]["shape"] == "hv"
    if x > trace["x"][-1]:
        return None
    return [y for t, y in zip(trace["x"], trace["y"]) if t <= x][-1]


class _Cells(HTMLParser):
    """The text of each row of the page's first ``table.t`` (header rows included)."""

    def __init__(self):
        super().__init__()
        self.rows, self.depth, self.done = [], 0, False

    def handle_starttag(self, tag, attrs):
        if tag == "table" and not self.done:
            self.depth += 1
        elif tag == "tr" and self.depth:
            self.rows.append([])
        elif tag in ("td", "th") and self.depth:
            self.rows[-1].append("")

    def handle_endtag(self, tag):
        if tag == "table" and self.depth:
            self.depth, self.done = 0, True

    def handle_data(self, data):
        if self.depth and self.rows and self.rows[-1]:
            self.rows[-1][-1] += data.strip()


def test_the_page_table_reads_measured_baseline_proposed_in_hours(logged, tmp_path):
    out = tmp_path / "whatif.html"
    _whatif(logged, "--html", str(out))
    page = out.read_text()
    assert "measured</b>: what the event log shows" in page and "From 2026-11-30 02:00" not in page
    parser = _Cells()
    parser.feed(page)
    heads, runs = parser.rows[0], parser.rows[1]
    assert "Mean wait (first start - submit) (hours)" in heads
    assert runs[2:8] == ["measured", "baseline", "proposed", "measured", "baseline", "proposed"]
    row = next(r for r in parser.rows if r and r[0] == "team b")
    # group, jobs, rejected x 3, then wait mean measured / baseline / proposed / change (hours)
    assert row[:9] == ["team b", "1", "0", "0", "0", "4.00", "1.00", "0.00", "-1.00"]


def test_the_terminal_shows_the_baseline_against_the_log(logged):
    out = _whatif(logged).output
    table = out[out.index("Baseline against the log: measured | simulated under the current policy"):]
    cells = {r[0]: r[1:] for r in ([c.strip() for c in ln.split("│")[1:-1]] for ln in table.splitlines()
                                   if ln.startswith("│"))}
    assert cells["team b"] == ["4.0h | 60.0m", "4.0h | 60.0m", "5.0h | 2.0h", "1.0 | 1.0"]
    assert cells["class training"][0] == "3.5h | 30.0m"


def test_the_proposed_and_baseline_report_pages_are_still_written(logged, tmp_path):
    _whatif(logged, "--html-proposed", str(tmp_path / "p.html"), "--html-current", str(tmp_path / "c.html"))
    for name in ("p.html", "c.html"):
        page = (tmp_path / name).read_text()
        assert_self_contained(page)
        assert set(figures(page)) == {"plot-held", "plot-queue", "plot-quota"}


@pytest.mark.browser
def test_the_page_renders_in_chromium_from_the_file_alone(logged, tmp_path, capsys):
    """The page draws its six figures in a real (headless) Chromium from the file alone
    (plotly.js inlined), each legend naming the three runs."""
    out = tmp_path / "whatif.html"
    _whatif(logged, "--html", str(out))
    figs = drawn_in_chromium(out, capsys, "whatif.png")
    assert [f[0] for f in figs] == [f"plot-{c}" for c in EXPECT] + ["plot-whatif-held", "plot-whatif-pending"]
    assert all(f[3] == list(RUN_NAMES.values()) and f[1] > 300 and f[2] > 200 for f in figs), figs
