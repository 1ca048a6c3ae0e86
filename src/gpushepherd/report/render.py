"""The report as terminal tables, CSV files and one self-contained HTML page."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

import pandas as pd
from rich.table import Table

from gpushepherd.report.figures import Report

TITLES = {
    "usage_by_team": "GPU-hours per team",
    "usage_by_team_with_children": "GPU-hours per team, child teams (projects) included",
    "usage_by_user": "GPU-hours per user",
    "usage_by_class": "GPU-hours per workload class",
    "usage_by_project": "GPU-hours per project (-: no project)",
    "cost_by_team_and_gpu_type": "Cost per team and GPU type",
    "waits_by_class": "Jobs submitted in the range and their queueing delay, per class (submitted = started + "
                      "rejected + cancelled_before_start + still_pending; still_pending: never started, pending "
                      "at the end; requeued_pending: started, then requeued and pending at the end, counted in "
                      "started)",
    "tails_by_size": "Jobs submitted in the range per size class (GPUs): wait (s) and bounded slowdown "
                     "(JCT / time held, at least 1; note 030)",
    "fairness_across_users": "Fairness across users: Jain's index over each user's mean slowdown (1 = alike)",
    "top_pending_reasons": "Top pending reasons (job-hours spent waiting for each)",
    "idle_gaps": "Idle gaps",
    "usage_against_quota": "GPU-hours per team against its quota over the range",
}


def _cell(v) -> str:
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:,.2f}"
    return str(v)


def rich_tables(rep: Report) -> list[Table]:
    """One rich ``Table`` per report table (money in the policy's currency)."""
    out = []
    for name, df in rep.tables.items():
        title = TITLES.get(name, name) + (f" ({rep.currency})" if "cost" in df.columns and rep.currency else "")
        table = Table(title=title, title_justify="left")
        for col in df.columns:
            table.add_column(col, justify="right" if pd.api.types.is_numeric_dtype(df[col]) else "left")
        for row in df.itertuples(index=False):
            table.add_row(*(_cell(v) for v in row))
        if df.empty:
            table.add_row(*(["(none)"] + [""] * (len(df.columns) - 1)))
        out.append(table)
    return out


def write_csv(rep: Report, folder: Path) -> list[Path]:
    """One CSV per table (``<name>.csv``) plus the step series
    (``utilisation.csv``, ``queue_by_class.csv``) in ``folder``; returns the paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    frames = dict(rep.tables)
    frames["utilisation"] = rep.utilisation
    frames["queue_by_class"] = rep.queue
    for name, df in frames.items():
        path = folder / f"{name}.csv"
        df.to_csv(path, index=False, lineterminator="\n")
        paths.append(path)
    return paths


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


DAY_S = 86400.0


def time_axis(rep: Report, ts) -> tuple[list, str]:
    """The x values of times ``ts`` (the report's axis) and the axis label: days from the
    start of the trace (``rep.time_axis == "days"``), else datetimes in the policy's
    zone, labelled with it."""
    if rep.time_axis == "days":
        return [t / DAY_S for t in ts], "days from the start of the trace"
    return [rep.local(t) for t in ts], f"time ({zone_name(rep)})"


def zone_name(rep: Report) -> str:
    """The policy's zone (``Europe/Berlin``), or ``local time`` without a clock."""
    return getattr(rep.local(rep.t_start).tzinfo, "key", None) or "local time"


def when(rep: Report, t: float) -> str:
    """``t`` as a page writes it: ``day 45.20``, or ``2026-11-30 08:00`` in the policy's zone."""
    return f"day {t / DAY_S:,.2f}" if rep.time_axis == "days" else rep.local(t).strftime("%Y-%m-%d %H:%M")


def _label_time(ax, rep: Report, xs: list, label: str) -> None:
    """A readable time axis over ``xs``: concise dates in the policy's zone (no
    14:21.800000), or days; the range's own limits (an empty plot showed 1970)."""
    import matplotlib.dates as mdates

    ax.set_xlabel(label)
    if len(xs) >= 2 and xs[0] != xs[-1]:
        ax.set_xlim(xs[0], xs[-1])
    if rep.time_axis != "days":
        tz = rep.local(rep.t_start).tzinfo
        locator = mdates.AutoDateLocator(tz=tz, minticks=3, maxticks=8)
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=tz))


def plots(rep: Report) -> dict[str, str]:
    """The three plots as base64 PNGs: ``utilisation``, ``queue``, ``quota``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = {}
    times, xlabel = time_axis(rep, list(rep.utilisation["t"]) + [rep.t_end])

    def steps(values) -> list[float]:  # the last value holds to the end of the range
        values = list(values)
        return values + values[-1:] if values else [0.0]

    fig, ax = plt.subplots(figsize=(10, 3))
    ax.step(times, steps(rep.utilisation["utilisation"] * 100), where="post")
    ax.set_ylabel("GPUs held, % of capacity")
    ax.set_ylim(0, 105)
    ax.set_title("Utilisation over time")
    _label_time(ax, rep, times, xlabel)
    out["utilisation"] = _png(fig)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(10, 3))
    for cls in [c for c in rep.queue.columns if c != "t"]:
        ax.step(times, steps(rep.queue[cls]), where="post", label=cls)
    if len(rep.queue.columns) > 1:
        ax.legend(loc="upper right", fontsize="small")
    ax.set_ylabel("pending jobs")
    ax.set_title("Queue length by workload class")
    _label_time(ax, rep, times, xlabel)
    out["queue"] = _png(fig)
    plt.close(fig)

    q = rep.quota
    fig, ax = plt.subplots(figsize=(10, 3))
    xs = range(len(q))
    ax.bar(xs, q["gpu_hours"], label="GPU-hours held")
    for col, style, label in (("nominal_gpu_hours", "_", "nominal GPUs x hours"), ("max_gpu_hours", "v", "max GPUs x hours")):
        vals = q[col].astype(float)
        if vals.notna().any():
            ax.scatter(list(xs), vals, marker=style, s=400 if style == "_" else 60, color="black" if style == "_" else "red",
                       label=label, zorder=3)
    ax.set_xticks(list(xs), list(q["team"]))
    ax.set_ylabel("GPU-hours")
    ax.set_title("Usage per team against quota")
    ax.legend(loc="upper right", fontsize="small")
    out["quota"] = _png(fig)
    plt.close(fig)
    return out


def html_page(rep: Report) -> str:
    """One self-contained page: the interactive plots (plotly, its JavaScript inlined;
    note 040) and the tables."""
    from gpushepherd.report.interactive import page, report_figures

    head = (f"<h1>{html.escape(rep.title or 'gpushepherd report')}</h1><p>From "
            f"{when(rep, rep.t_from)} to {when(rep, rep.t_to)}"
            + (" (days from the start of the trace)" if rep.time_axis == "days" else
               f" ({html.escape(zone_name(rep))})")
            + (f"; money in {html.escape(rep.currency)}" if rep.currency else "") + ".</p>"
            + (f"<p>{html.escape(rep.clipped)}.</p>" if rep.clipped else ""))
    tables = []
    for name, df in rep.tables.items():
        tables.append(f"<h2>{html.escape(TITLES.get(name, name))}</h2>")
        tables.append(df.to_html(index=False, na_rep="-", float_format=lambda v: f"{v:,.2f}", border=0,
                                 classes="t") if len(df) else "<p>(none)</p>")
    return page(rep.title or "report", head, report_figures(rep), tables)
