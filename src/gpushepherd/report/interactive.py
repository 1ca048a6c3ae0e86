"""Interactive plots of the report and the what-if (issue 18 point 10, design note 040):
plotly figures on one self-contained HTML page - plotly.js is inlined once (about
4.8 MB), nothing is fetched at view time (no CDN, no fonts, no map tiles).

Times are written as a person reads them: a simulator run in days from the start of
the trace (``Report.time_axis == "days"``), the daemon's log as wall-clock times in the
policy's zone, named on the axis (plotly.js has no time zones: the times are given as
local wall-clock strings). Every axis names its unit; legends name the teams, classes
or runs. plotly is imported here only, and this module only when a page is written.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence

import pandas as pd

from gpushepherd.report.figures import Report

DAY_S = 86400.0
#: plotly's config for every figure: no "edit in Chart Studio" link, no logo
CONFIG = {"displaylogo": False, "showSendToCloud": False, "responsive": True}
HELP = ("Interactive plots: hover for values, drag to zoom, double-click to zoom out, click a legend entry to "
        "hide or show it.")
STYLE = ("body{font-family:sans-serif;max-width:1100px;margin:auto;padding:0 8px}table.t{border-collapse:collapse}"
         "table.t td,table.t th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right}"
         "table.t th{vertical-align:bottom}div.wide{overflow-x:auto}figure{margin:1em 0}"
         "p.help{color:#555;font-size:90%}")


def times(rep: Report, ts: Iterable[float]) -> tuple[list, str]:
    """The x values of times ``ts`` (seconds on the report's axis) and the axis title:
    days from the start of the trace (floats), or ``YYYY-MM-DD HH:MM:SS`` wall-clock
    strings in the policy's zone, titled ``time (Europe/Berlin)``."""
    if rep.time_axis == "days":
        return [t / DAY_S for t in ts], "days from the start of the trace"
    from gpushepherd.report.render import zone_name

    return [rep.local(t).strftime("%Y-%m-%d %H:%M:%S") for t in ts], f"time ({zone_name(rep)})"


def _layout(fig, title: str, x_title: str, y_title: str, legend: str | None = None, time: bool = False) -> None:
    fig.update_layout(title=title, template="plotly_white", height=380, margin={"l": 60, "r": 20, "t": 50, "b": 50},
                      legend_title_text=legend, hovermode="x unified" if time else "closest",
                      showlegend=True)  # also for one series: the legend names its team, class or run
    fig.update_xaxes(title_text=x_title)
    fig.update_yaxes(title_text=y_title, rangemode="tozero")


def step_xy(rep: Report, t: Sequence[float], values: Sequence[float]) -> tuple[list, list]:
    """A step series (each value holds from its ``t`` to the next) as x, y for plotly's
    ``line_shape="hv"``: the last value is repeated at the end of the range."""
    xs, _ = times(rep, list(t) + [rep.t_end])
    ys = [float(v) for v in values]
    return xs, ys + ys[-1:] if ys else [0.0]


def report_figures(rep: Report) -> dict[str, object]:
    """The report's figures (plotly ``Figure``s) by div id: ``plot-held`` (GPUs held per
    team over time, stacked, against the capacity), ``plot-queue`` (pending jobs per
    class over time), ``plot-quota`` (GPU-hours per team against nominal / max GPUs x
    hours over the range)."""
    import plotly.graph_objects as go

    ts = list(rep.utilisation["t"])
    _, x_title = times(rep, [])
    out = {}
    fig = go.Figure()
    held = rep.held_by_team if rep.held_by_team is not None else pd.DataFrame()
    for team in held.columns:
        xs, ys = step_xy(rep, ts, held[team])
        fig.add_trace(go.Scatter(x=xs, y=ys, name=str(team), mode="lines", line_shape="hv", stackgroup="held"))
    total = rep.capacity_gpus
    if total and ts:
        xs, _ = times(rep, [ts[0], rep.t_end])
        fig.add_trace(go.Scatter(x=xs, y=[total, total], name=f"capacity ({total:g} GPUs)", mode="lines",
                                 line={"dash": "dash", "color": "black"}))
    _layout(fig, "GPUs held per team over time", x_title, "GPUs held", "team", time=True)
    out["plot-held"] = fig

    fig = go.Figure()
    for cls in [c for c in rep.queue.columns if c != "t"]:
        xs, ys = step_xy(rep, ts, rep.queue[cls])
        fig.add_trace(go.Scatter(x=xs, y=ys, name=str(cls), mode="lines", line_shape="hv"))
    _layout(fig, "Pending jobs per workload class over time", x_title, "pending jobs", "class", time=True)
    out["plot-queue"] = fig

    q = rep.quota
    fig = go.Figure()
    teams = [str(t) for t in q["team"]]
    fig.add_trace(go.Bar(x=teams, y=q["gpu_hours"].astype(float).tolist(), name="GPU-hours held"))
    for col, symbol, label in (("nominal_gpu_hours", "line-ew-open", "nominal GPUs x hours"),
                               ("max_gpu_hours", "triangle-down", "max GPUs x hours")):
        vals = q[col].astype(float)
        if vals.notna().any():
            fig.add_trace(go.Scatter(x=teams, y=[None if pd.isna(v) else float(v) for v in vals], name=label,
                                     mode="markers", marker={"symbol": symbol, "size": 14,
                                                             "line": {"width": 3}}))
    _layout(fig, "GPU-hours per team against its quota over the range", "team", "GPU-hours", None)
    out["plot-quota"] = fig
    return out


def page(title: str, intro: str, figures: dict[str, object], sections: Sequence[str]) -> str:
    """One self-contained HTML page: ``intro`` (HTML), the figures (div id -> plotly
    ``Figure``; plotly.js inlined in the first one, none fetched) and ``sections``
    (HTML) after them."""
    import plotly.io as pio

    body = [intro, f'<p class="help">{html.escape(HELP)}</p>']
    for i, (div_id, fig) in enumerate(figures.items()):
        body.append("<figure>" + pio.to_html(fig, full_html=False, include_plotlyjs=i == 0, div_id=div_id,
                                             config=CONFIG) + "</figure>")
    body.extend(sections)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{''.join(body)}</body></html>\n")


#: how the what-if page names its three runs (``whatif.RUNS``)
RUN_NAMES = {"measured": "measured (the event log)", "current": "baseline: current policy, simulated",
             "proposed": "proposed policy, simulated"}
#: the table's column heads of the runs
RUN_HEADS = {"measured": "measured", "current": "baseline", "proposed": "proposed", "change": "change"}
#: the what-if's figures: column prefix -> (title, y axis title, divisor to that unit)
WHATIF_FIGURES = {
    "wait_mean_s": ("Mean wait (first start - submit)", "hours", 3600.0),
    "wait_p95_s": ("95th percentile of the wait", "hours", 3600.0),
    "jct_mean_s": ("Mean job completion time (end - submit, jobs that ran to their end)", "hours", 3600.0),
    "gpu_hours": ("GPU-hours held", "GPU-hours", 1.0),
}


def whatif_reports(wi) -> dict[str, Report]:
    """The report of each run of ``wi`` (a ``WhatIf``) over its range, keyed by
    ``whatif.RUNS``: the log's over ``[from, to)`` (clipped to the log), each simulated
    run's up to its own end (the jobs of the range run on past ``to``)."""
    from gpushepherd.report.figures import build_report

    out = {}
    for run in RUN_NAMES:
        hist = wi.history(run)
        end = wi.t_to if run == "measured" else max(wi.t_to, hist.t_last + 1.0)
        out[run] = build_report(hist, wi.t_from, end, title=RUN_NAMES[run])
    return out


def whatif_figures(wi, reports: dict[str, Report]) -> dict[str, object]:
    """The what-if's figures by div id: ``plot-<metric>`` per figure of
    ``WHATIF_FIGURES`` (grouped bars per team and class, one series per run), and
    ``plot-whatif-held`` / ``plot-whatif-pending`` (GPUs held and jobs pending over time,
    one line per run)."""
    import plotly.graph_objects as go

    t = wi.table
    groups = [f"{by} {group}" for by, group in zip(t["by"], t["group"])]
    out = {}
    for col, (title, unit, div) in WHATIF_FIGURES.items():
        fig = go.Figure()
        for run, name in RUN_NAMES.items():
            fig.add_trace(go.Bar(x=groups, y=[None if pd.isna(v) else float(v) / div for v in t[f"{col}_{run}"]],
                                 name=name))
        _layout(fig, title, "team / workload class", unit, "run")
        fig.update_layout(barmode="group")
        out[f"plot-{col}"] = fig
    ref = reports["measured"]
    _, x_title = times(ref, [])
    for div_id, title, unit, series in (
            ("plot-whatif-held", "GPUs held over time", "GPUs held", lambda r: r.utilisation["gpus_held"]),
            ("plot-whatif-pending", "Jobs pending over time", "pending jobs",
             lambda r: r.queue.drop(columns="t").sum(axis=1))):
        fig = go.Figure()
        for run, name in RUN_NAMES.items():
            rep = reports[run]
            xs, ys = step_xy(rep, list(rep.utilisation["t"]), series(rep))
            fig.add_trace(go.Scatter(x=xs, y=ys, name=name, mode="lines", line_shape="hv"))
        _layout(fig, title, x_title, unit, "run", time=True)
        out[div_id] = fig
    return out


def whatif_table_html(table: pd.DataFrame) -> str:
    """The side-by-side table as HTML: per group its jobs, then rejected jobs and each
    figure (waits and JCT in hours) measured / baseline / proposed (/ change)."""
    cols, rows = [("", "group"), ("", "jobs")], []
    for run in ("measured", "current", "proposed"):
        cols.append(("rejected jobs", RUN_HEADS[run]))
    for col, (title, unit, _div) in WHATIF_FIGURES.items():
        for run in RUN_HEADS:
            cols.append((f"{title} ({unit})", RUN_HEADS[run]))
    for r in table.to_dict("records"):
        row = [f"{r['by']} {r['group']}", str(r["jobs"])] + [str(r[f"rejected_{x}"])
                                                             for x in ("measured", "current", "proposed")]
        for col, (_t, _u, div) in WHATIF_FIGURES.items():
            for run in RUN_HEADS:
                v = r[f"{col}_{run}"]
                row.append("-" if v is None or pd.isna(v) else f"{float(v) / div:,.2f}")
        rows.append(row)
    df = pd.DataFrame(rows, columns=pd.MultiIndex.from_tuples(cols))
    return df.to_html(index=False, border=0, classes="t")


def whatif_page(wi, title: str = "gpushepherd what-if") -> str:
    """The what-if as one self-contained page (note 040): what the log measured beside
    the baseline (the same jobs simulated under the policy they ran under) beside the
    proposed policy, as a table and plots, so a reader can see how well the simulator
    reproduces the log before trusting the proposed figures; then the jobs a run
    rejected and those left out of both runs."""
    from gpushepherd.report.render import when, zone_name

    reports = whatif_reports(wi)
    ref = reports["measured"]
    intro = (f"<h1>{html.escape(title)}</h1><p>Jobs submitted from {when(ref, wi.t_from)} to {when(ref, wi.t_to)} "
             f"({html.escape(zone_name(ref))}), {int(len(wi.measured.jobs))} jobs compared.</p>"
             "<p><b>measured</b>: what the event log shows for these jobs; <b>baseline</b>: the same jobs "
             "simulated under the policy the log last ran under; <b>proposed</b>: simulated under the proposed "
             "policy. Read the proposed column against the baseline; the baseline against the measured column "
             "says how well the simulator reproduces this log (it starts from an empty cluster, so jobs running "
             "before the range are missing; note 010). A run still going at the end of the log is cut there in "
             "all three.</p>")
    sections = ["<h2>Per team and workload class: measured, baseline, proposed</h2>",
                f'<div class="wide">{whatif_table_html(wi.table)}</div>']
    rejected = wi.rejected
    if rejected is not None and not rejected.empty:
        sections.append("<h2>Jobs a run rejected (they could never run under that policy)</h2>")
        sections.append(rejected.to_html(index=False, border=0, classes="t"))
    if wi.not_replayed:
        sections.append("<h2>Jobs left out of both runs</h2>")
        sections.append(pd.DataFrame(wi.not_replayed, columns=["job_id", "why"]).to_html(index=False, border=0,
                                                                                          classes="t"))
    return page(title, intro, whatif_figures(wi, reports), sections)
