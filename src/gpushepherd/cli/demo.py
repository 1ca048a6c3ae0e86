"""``shepherd demo``: the seed's mixed workload on a real server with real processes
(see ``gpushepherd.daemon.demo``), with a live queue and the per-team usage table."""

from __future__ import annotations

import shutil
from collections import defaultdict
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from gpushepherd.cli.daemon import path_param

_STYLE = {"RUNNING": "green", "PENDING": "yellow", "PREEMPTING": "magenta", "STOPPING": "magenta",
          "COMPLETED": "blue", "FAILED": "red", "CANCELLED": "dim", "TIMEOUT": "red"}


#: the queue table's width with every column (at the demo's longest names, classes,
#: placements and reasons); narrower consoles get it without CLASS and TEAM, which the
#: submission lines above it name
FULL_WIDTH = 104


def _queue_table(t: float, jobs: list[dict], nodes: list[dict], names: dict[str, str], width: int = 160) -> Group:
    wide = width >= FULL_WIDTH
    heads = ["JOB", "NAME", *(["CLASS", "TEAM"] if wide else []), "GPUS", "STATE", "REASON / PLACEMENT", "RUNS"]
    table = Table(*heads, title=f"queue at {t:5.1f} s", title_justify="left", box=None)
    for v in jobs:
        if "_" in v["id"]:
            continue  # array children are summed up in their array's line
        state = v["state"]
        detail = v.get("reason") if state in ("PENDING",) or "tasks" in v else v.get("placement") or ""
        table.add_row(v["id"], names.get(v["id"], ""), *([v["class"], v["team"]] if wide else []), str(v["gpus"]),
                      Text(state, style=_STYLE.get(state, "")), detail or "", str(v.get("runs", "")))
    gpus = Text("GPUs  ")
    for n in nodes:
        for g in n["gpu"]:
            holder = ",".join(g["jobs"]) or "."
            gpus.append(f"[{g['index']}:{holder:>3}] ", style="green" if g["jobs"] else "dim")
    return Group(table, gpus)


def usage_table(result) -> Table:
    """Per team: jobs, GPU-seconds held, preemptions, mean queueing delay, and the
    server's decayed usage and fair-share factor."""
    rows: dict[str, dict] = defaultdict(lambda: {"jobs": 0, "gpu_s": 0.0, "preempt": 0, "waits": []})
    for v in result.jobs:
        if "tasks" in v:
            continue  # an array: its children are counted
        r = rows[v["team"]]
        r["jobs"] += 1
        r["gpu_s"] += v["gpu_s"]
        r["preempt"] += v.get("preemptions", 0)
        if v.get("first_start") is not None:
            r["waits"].append(v["first_start"] - v["submit_time"])
    fair = {u["team"]: u for u in result.usage}
    table = Table("TEAM", "JOBS", "GPU-S", "PREEMPTIONS", "MEAN WAIT S", "DECAYED GPU-S", "FAIR-SHARE",
                  title="usage per team", title_justify="left", box=None, pad_edge=False)  # 80 columns
    for team in sorted(set(rows) | set(fair)):
        r, u = rows[team], fair.get(team, {})
        wait = sum(r["waits"]) / len(r["waits"]) if r["waits"] else 0.0
        table.add_row(team, str(r["jobs"]), f"{r['gpu_s']:.0f}", str(r["preempt"]), f"{wait:.1f}",
                      f"{u.get('decayed_usage_gpu_s', 0.0):.0f}", f"{u.get('fair_share_factor', 0.0):.3f}")
    return table


def header(data_dir: Path, policy_name: str, backend: str = "local") -> list[Text]:
    """The demo's first lines, one thought each, every one under 80 columns (but for a
    long data directory): what runs, where its data is, what the times mean."""
    lines = [Text.assemble(("shepherd demo", "bold"), ": a server under the small-team policy on one 8-GPU node")]
    if backend == "slurm":
        lines.append(Text("  jobs run on a fake Slurm cluster that the demo starts and stops"))
    return lines + [Text(f"  policy: {policy_name}"), Text(f"  server data: {data_dir}"),
                    Text("  times: seconds since the server answered, when the demo saw each change"),
                    Text("  (every 0.5 s); the checks at the end use the server's own times")]


def hanging(left: Text, text: str) -> Table:
    """``left``, a space, then ``text`` (as is, no markup), whose wrapped lines start
    under its first: a narrow terminal keeps the times and check marks in their column."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column()
    grid.add_row(left, Text(text))
    return grid


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(data_dir: Annotated[Optional[Path], typer.Option("--data-dir", help="Where the demo server keeps its "
                                                              "database, logs and checkpoints (default: a new "
                                                              "temporary directory, removed at the end).", parser=path_param)] = None,
             keep: Annotated[bool, typer.Option("--keep", help="Keep the data directory.")] = False,
             backend: Annotated[str, typer.Option("--backend", help="Where the jobs run: local (processes here) or "
                                                  "slurm (a fake Slurm cluster of one 8-GPU node that the demo "
                                                  "starts and stops; root and slurm-wlm; SLURM_CONF is not "
                                                  "used).")] = "local") -> None:
        """Run a server with the small-team policy on one 8-GPU node and the seed's mixed workload as real
        processes: an inference service, a checkpointing training job preempted by an inference burst and
        resumed, a chunked batch job with a failing chunk retried, an idle notebook; live queue, then usage."""
        from gpushepherd.backends import BackendError
        from gpushepherd.backends.fakeslurm import unavailable
        from gpushepherd.daemon.demo import BACKENDS, demo_policy_path, run_demo, temp_data_dir

        from gpushepherd.cli.main import _console
        console = _console(markup=True)  # 160 columns when piped, as every other command
        if data_dir is not None and (data_dir.exists() and (not data_dir.is_dir() or any(data_dir.iterdir()))):
            from gpushepherd.cli.main import err
            err.print(f"error: --data-dir: {str(data_dir)!r} is not allowed: a new or empty directory (the demo "
                      "runs its own server there; it never writes into an existing server's data)", soft_wrap=True,
                      markup=False)
            raise typer.Exit(2)
        if backend not in BACKENDS:
            raise typer.BadParameter(f"{backend!r} is not allowed: {' or '.join(BACKENDS)}", param_hint="--backend")
        if backend == "slurm" and unavailable():
            console.print(f"[red]--backend slurm[/red]: {unavailable()}")
            raise typer.Exit(2)
        own_dir = data_dir is None
        data_dir = temp_data_dir() if own_dir else data_dir
        for line in header(data_dir, demo_policy_path().name, backend):
            console.print(line)
        names: dict[str, str] = {}
        live = Live(Text("starting the server..."), console=console, refresh_per_second=4, transient=False)

        def on_event(t: float, text: str) -> None:
            if text.startswith("submitted "):
                name, job_id = text.split()[1], text.split("(job ")[1].split(")")[0]
                names[job_id] = name
            live.console.print(hanging(Text(f"{t:6.1f} s ", style="dim"), text))

        snapshot = []  # not a terminal (a pipe, CI): one frame during the burst, as text

        def on_tick(t: float, jobs: list[dict], nodes: list[dict]) -> None:
            frame = _queue_table(t, jobs, nodes, names, console.width)
            live.update(frame)
            if not console.is_terminal and not snapshot and t >= 12:
                snapshot.append(t)
                live.console.print(frame)

        result = None
        try:
            with live:
                result = run_demo(data_dir, on_tick=on_tick, on_event=on_event, backend=backend)
        except BackendError as exc:
            console.print(f"[red]--backend {backend}[/red]: {exc}")
            raise typer.Exit(2) from None
        finally:
            # kept when asked, and when something went wrong: the server's log and the jobs' output are there
            keep = keep or not own_dir or result is None or not result.ok
            if not keep:
                shutil.rmtree(data_dir, ignore_errors=True)
            elif result is None:
                console.print(f"the demo stopped; its data directory is kept in {data_dir}")
        console.print()
        console.print(usage_table(result))
        for name, ok, detail in result.checks:
            mark = Text("n/a ", "yellow") if ok is None else Text("ok  ", "green") if ok else Text("FAIL", "red")
            console.print(hanging(mark, f"{name}: {detail}"))
        kept = f"kept in {data_dir}" if keep else "removed"
        console.print(f"done in {result.wall_s:.0f} s; data directory {kept}")
        if not result.ok:
            raise typer.Exit(1)
