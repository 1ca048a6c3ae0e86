"""``shepherd service create/list/show/delete/signal``: inference services that
autoscale on their own signals (R12, design note 014), through the server's API."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from gpushepherd.cli.daemon import SECONDS_FORMS, ServerOpt, TokenOpt, _fmt_t, _request, duration_param, env_pairs, path_param


def register(app: typer.Typer) -> None:
    """Add ``shepherd service ...`` to ``app``."""
    from gpushepherd.cli.main import _console

    out = _console()
    svc_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                          help="Inference services: replicas scaled on the service's own signal.")
    app.add_typer(svc_app, name="service")

    @svc_app.command("create")  # options after NAME; the replicas' command after `--`
    def create(name: Annotated[str, typer.Argument(metavar="NAME")],
               cmd: Annotated[list[str], typer.Argument(metavar="-- COMMAND [ARGS...]", help="Each replica's argv.")],
               cls: Annotated[str, typer.Option("--class", "-c", help="Workload class.")] = "production-inference",
               team: Annotated[str, typer.Option("--team", "-A", help="Team (account).")] = "",
               user: Annotated[Optional[str], typer.Option("--user", "-u")] = None,
               project: Annotated[str, typer.Option("--project", "-P", help="Project the replicas' "
                                                    "GPU-hours are reported under.")] = "",
               gpus: Annotated[int, typer.Option("--gpus", "-G", min=1, help="GPUs per replica.")] = 1,
               min_replicas: Annotated[int, typer.Option("--min", min=0)] = 1,
               max_replicas: Annotated[int, typer.Option("--max", min=1)] = 1,
               metrics_url: Annotated[Optional[str], typer.Option("--metrics-url", help="The service's Prometheus "
                                                                  "endpoint (none: signals are pushed).")] = None,
               metric: Annotated[str, typer.Option("--metric", help="queue_length, a p95 latency, tokens_total "
                                                   "(a counter: its rate), or name{label=\"v\"}.")] = "queue_length",
               up: Annotated[float, typer.Option("--scale-up-above")] = ...,
               down: Annotated[float, typer.Option("--scale-down-below")] = ...,
               cooldown: Annotated[float, typer.Option("--cooldown", metavar="DURATION", parser=duration_param(), help="Below this "
                                                       f"long before a scale-down: {SECONDS_FORMS}.")] = 300.0,
               scrape_every: Annotated[float, typer.Option("--scrape-every", metavar="DURATION", parser=duration_param(), help="Time "
                                                           f"between scrapes: {SECONDS_FORMS}.")] = 15.0,
               stabilize: Annotated[int, typer.Option("--stabilize", min=1, help="Samples above before a "
                                                      "scale-up.")] = 3,
               env: Annotated[list[str], typer.Option("--env", help="KEY=VALUE for each replica (repeat).")] = [],
               chdir: Annotated[Path, typer.Option("--chdir", "-D", parser=path_param)] = Path("."),
               server: ServerOpt = None, token: TokenOpt = None) -> None:
        """Create a service: `shepherd service create web --team ml --min 1 --max 4 --metrics-url
        http://127.0.0.1:9000/metrics --scale-up-above 10 --scale-down-below 2 --cooldown 60s -- python serve.py`."""
        if user is None:
            user = "" if token else os.environ.get("USER", "")
        body: dict[str, Any] = {
            "name": name, "class": cls, "team": team, "user": user, "gpus": gpus, "command": cmd,
            "cwd": str(chdir.resolve()), "env": env_pairs(env), "min_replicas": min_replicas,
            "max_replicas": max_replicas, "metric": metric, "metrics_url": metrics_url, "scale_up_above": up,
            "scale_down_below": down, "cooldown_s": cooldown,
            "scrape_every_s": scrape_every, "stabilize": stabilize}
        if project:
            body["project"] = project
        v = _request(server, "POST", "/services", token=token, json=body).json()
        out.print(f"Created service {v['name']}: {v['min_replicas']}-{v['max_replicas']} replicas on {v['metric']}")

    @svc_app.command("list")
    def list_(server: ServerOpt = None, token: TokenOpt = None) -> None:
        """Services: replicas running / desired / range, the signal and its last value."""
        table = Table("SERVICE", "CLASS", "TEAM", "REPLICAS", "RANGE", "SIGNAL", "LAST", "LAST DECISION / ERROR", box=None)
        for v in _request(server, "GET", "/services", token=token).json():
            last = v["last_signal"]
            table.add_row(v["name"], v["class"], v["team"], f"{v['running']}/{v['desired']}",
                          f"{v['min_replicas']}-{v['max_replicas']}", v["metric"],
                          "-" if last is None else f"{last['value']:g}",
                          v["error"] or (v["last_decision"] or {}).get("reason", ""))
        out.print(table)

    @svc_app.command("show")
    def show(name: Annotated[str, typer.Argument(metavar="NAME")], server: ServerOpt = None,
             token: TokenOpt = None) -> None:
        """One service: settings, replicas (state, placement or why pending), the last
        signal, and every scaling decision with its reason."""
        v = _request(server, "GET", f"/services/{name}", token=token).json()
        for key in ("name", "state", "class", "team", "gpus", "min_replicas", "max_replicas", "desired", "running",
                    "metric", "metrics_url", "scale_up_above", "scale_down_below", "cooldown_s", "scrape_every_s",
                    "stabilize", "command"):
            out.print(f"{key}: {'(hidden: another team)' if key in v.get('hidden', ()) else v.get(key)}")
        last = v["last_signal"]
        out.print("last signal: " + ("-" if last is None else f"{last['value']:g} ({last['source']}, "
                                      f"{_fmt_t(last['t'])})") + (f"  error: {v['error']}" if v["error"] else ""))
        out.print("replicas:")
        for r in v["replicas"]:
            out.print(f"  {r['id']}  {r['state']}  {r['placement'] or r['reason'] or ''}")
        out.print("decisions:")
        for d in v["decisions"]:
            out.print(f"  {_fmt_t(d['t'])}  {d['reason']}")

    @svc_app.command("delete")
    def delete(name: Annotated[str, typer.Argument(metavar="NAME")], server: ServerOpt = None,
               token: TokenOpt = None) -> None:
        """Delete a service; its replicas are cancelled."""
        _request(server, "DELETE", f"/services/{name}", token=token)
        out.print(f"Deleted service {name}")

    @svc_app.command("signal")
    def signal(name: Annotated[str, typer.Argument(metavar="NAME")],
               values: Annotated[list[str], typer.Argument(metavar="METRIC=VALUE...")],
               server: ServerOpt = None, token: TokenOpt = None) -> None:
        """Push a sample of a service's signal: `shepherd service signal web queue_length=12`."""
        body = {}
        for k, raw in env_pairs(values).items():
            try:
                body[k] = float(raw)
            except ValueError:
                raise typer.BadParameter(f"{raw!r} is not allowed: a number", param_hint=k) from None
        v = _request(server, "POST", f"/services/{name}/signals", token=token, json=body).json()
        out.print(f"service {name}: {v['running']}/{v['desired']} replicas; last decision: "
                  f"{v['decisions'][-1]['reason'] if v['decisions'] else '-'}")
