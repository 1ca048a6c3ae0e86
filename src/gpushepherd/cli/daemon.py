"""``shepherd server`` and its client commands, with the habits of Slurm users:
``submit`` (sbatch), ``queue`` (squeue), ``show`` (scontrol show job), ``cancel``
(scancel), ``logs``, ``why``, ``nodes`` (sinfo), ``usage`` (sshare).

Client commands talk HTTP to ``--server`` (default ``$SHEPHERD_SERVER`` or
http://127.0.0.1:8765), with ``--token`` (default ``$SHEPHERD_TOKEN``) once the
server has tokens (``shepherd token create``). A refused request (bad field, unknown job) prints one
``error:`` line and exits 2; an unreachable server exits 1.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table
from rich.text import Text

DEFAULT_PORT = 8765
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "REJECTED"}
#: the longest time limit, seconds (10 years, as the API: ``gpushepherd.daemon.api.MAX_SECONDS``)
MAX_TIME_S = 10 * 365 * 86400.0
#: exit status of ``submit`` when the server rejected the job (no node could ever hold it)
EXIT_REJECTED = 3
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_JOB_ID = re.compile(r"[A-Za-z0-9_.-]+")


def _safe(v: Any) -> str:
    """``str(v)`` with control characters escaped (``\\x1b``): a value from the server
    cannot move the cursor or clear the terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", str(v))


class SafeTable(Table):
    """A rich ``Table`` whose cells are plain text with control characters escaped
    (``_safe``): no value from the server is read as rich markup or a terminal escape."""

    def add_row(self, *cells: Any, **kw: Any) -> None:
        super().add_row(*(Text(_safe(c)) for c in cells), **kw)


def _job_path(job_id: str, suffix: str = "") -> str:
    """``/jobs/<id><suffix>`` with the id quoted (an id with ``/`` or ``?`` cannot reach
    another route).

    Raises:
        typer.Exit: an empty id, or one no job can have (``../x``, ``a/b``): one
            ``error:`` line, exit 2, without asking the server.
    """
    from urllib.parse import quote

    from gpushepherd.cli.main import err
    if not job_id.strip():
        err.print(f"error: JOB: {job_id!r} is not allowed: a job id (see `shepherd queue`)", soft_wrap=True)
        raise typer.Exit(2)
    if not _JOB_ID.fullmatch(job_id) or job_id.strip(".") == "":
        err.print(f"error: no such job {_safe(repr(job_id))}", soft_wrap=True, markup=False)
        raise typer.Exit(2)
    return f"/jobs/{quote(job_id, safe='')}{suffix}"


ServerOpt = Annotated[Optional[str], typer.Option("--server", help="Server URL (default $SHEPHERD_SERVER or "
                                                  f"http://127.0.0.1:{DEFAULT_PORT}).")]

TokenOpt = Annotated[Optional[str], typer.Option("--token", envvar="SHEPHERD_TOKEN", show_envvar=True,
                                                 help="API token (shepherd token create).")]


def _url(server: str | None) -> str:
    return (server or os.environ.get("SHEPHERD_SERVER") or f"http://127.0.0.1:{DEFAULT_PORT}").rstrip("/")


def _request(server: str | None, method: str, path: str, token: str | None = None, **kw: Any):
    import httpx

    from gpushepherd.cli.main import err
    url = _url(server)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        r = httpx.request(method, url + path, timeout=60.0, headers=headers, **kw)
    except httpx.InvalidURL as exc:
        err.print(f"error: --server: {url!r} is not allowed: {exc} (a URL like http://127.0.0.1:{DEFAULT_PORT})",
                  soft_wrap=True)
        raise typer.Exit(2) from None
    except httpx.TransportError as exc:
        err.print(f"error: no gpushepherd server at {url} ({exc}); start one with `shepherd server`", soft_wrap=True)
        raise typer.Exit(1) from None
    if r.status_code >= 400:
        try:
            detail = r.json().get("detail")
        except ValueError:
            detail = r.text
        if isinstance(detail, list):
            detail = "; ".join(_located(d) for d in detail)
        err.print(f"error: {_safe(detail)}", soft_wrap=True, markup=False)
        raise typer.Exit(2)
    return r


def _num(v: Any) -> str:
    return "-" if v is None else str(v)


def _located(d: dict) -> str:
    """``field: message`` of one FastAPI error entry (a message that already names its
    field, as the policy's do, is kept as it is)."""
    where = ".".join(str(x) for x in d.get("loc", [])[1:]) or "body"
    msg = str(d.get("msg"))
    return msg if msg.startswith(f"{where}: ") else f"{where}: {msg}"


def parse_time(text: str) -> float:
    """A Slurm-style time limit in seconds: ``SECONDS``, ``MM:SS``, ``HH:MM:SS`` or
    ``D-HH[:MM[:SS]]``.

    Raises:
        typer.BadParameter: anything else.
    """
    m = re.fullmatch(r"(?:(\d+)-)?(\d+(?:\.\d+)?)(?::(\d+))?(?::(\d+))?", text.strip())
    if not m:
        raise typer.BadParameter(f"{text!r} is not allowed: seconds, MM:SS, HH:MM:SS or D-HH:MM:SS")
    days, a, b, c = m.groups()
    if any(len(x) > 12 for x in m.groups() if x is not None):
        raise typer.BadParameter(f"{text!r} is not allowed: at most {MAX_TIME_S / 86400 / 365:.0f} years")
    if days is not None:
        parts = [float(a), float(b or 0), float(c or 0)]  # D-HH[:MM[:SS]]
        if parts[0] >= 24 or parts[1] >= 60 or parts[2] >= 60:
            raise typer.BadParameter(f"{text!r} is not allowed: D-HH:MM:SS with hours < 24, minutes and seconds < 60")
        total = int(days) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]
    else:
        nums = [float(x) for x in (a, b, c) if x is not None]
        if any(n >= 60 for n in nums[1:]):
            raise typer.BadParameter(f"{text!r} is not allowed: minutes and seconds after the first field < 60")
        total = 0.0
        for n in nums:
            total = total * 60 + n
    if total > MAX_TIME_S:
        raise typer.BadParameter(f"{text!r} is not allowed: at most {MAX_TIME_S / 86400 / 365:.0f} years")
    return total


def parse_duration(text: str) -> float:
    """Seconds > 0 from ``30s``, ``10m``, ``2h``, ``1d`` or ``parse_time``'s forms.

    Raises:
        typer.BadParameter: anything else, or zero.
    """
    why = f"{text!r} is not allowed: a duration > 0 (30s, 10m, 2h, 1d, seconds, MM:SS, HH:MM:SS)"
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    try:
        seconds = float(m[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m[2]] if m else parse_time(text)
    except typer.BadParameter:
        raise typer.BadParameter(why) from None
    if seconds <= 0:
        raise typer.BadParameter(why)
    return seconds


def parse_share(text: str, mem_mib: int) -> dict:
    """``fraction:0.25``, ``mig:1g.10gb``, ``time_slice[:N]``, ``mps:N[:PERCENT]`` or
    ``mem`` (memory only, with ``--gpu-mem``) as the API's share body.

    Raises:
        typer.BadParameter: naming the value and what is allowed.
    """
    kind, _, arg = text.partition(":")
    try:
        if kind == "fraction":
            f = float(arg)
            if not 0 < f <= 1:
                raise typer.BadParameter(f"{text!r} is not allowed: fraction:F with 0 < F <= 1")
            return {"kind": "fraction", "milli": round(f * 1000), "mem_mib": mem_mib}
        if kind == "mem":
            if mem_mib <= 0:
                raise typer.BadParameter(f"{text!r} is not allowed without --gpu-mem MiB (> 0)")
            return {"kind": "fraction", "milli": 0, "mem_mib": mem_mib}
        if kind == "mig" and arg:
            return {"kind": "mig", "profile": arg}
        if kind == "time_slice":
            return {"kind": "time_slice", "slots": int(arg or 1), "mem_mib": mem_mib}
        if kind == "mps":
            n, _, pct = arg.partition(":")
            if not 0 < float(pct or 100) <= 100:
                raise typer.BadParameter(f"{text!r} is not allowed: mps:N:PERCENT with 0 < PERCENT <= 100")
            return {"kind": "mps", "slots": int(n or 1), "milli": round(float(pct or 100) * 10), "mem_mib": mem_mib}
    except ValueError:
        pass
    raise typer.BadParameter(f"{text!r} is not allowed: fraction:F, mem, mig:PROFILE, time_slice[:N] or "
                             "mps:N[:PERCENT]")


def env_pairs(items: list[str]) -> dict[str, str]:
    """``--env KEY=VALUE`` options as a dict.

    Raises:
        typer.BadParameter: an item without ``=`` or a key.
    """
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{item!r} is not allowed: KEY=VALUE", param_hint="--env")
        pairs[key] = value
    return pairs


def _fmt_t(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def _fmt_est(j: dict) -> str:
    """A planned start as a person should read it: ``<= T`` when it rests on time limits
    (jobs usually end before them: an upper bound unless higher-priority work arrives),
    ``~ T`` when on runtime estimates, ``-`` when none can be planned."""
    t = j.get("estimated_start")
    if t is None:
        return "-"
    mark = "<=" if j.get("estimated_start_basis") == "time limits" else "~"
    return f"{mark} {_fmt_t(t)}"


DataDirOpt = Annotated[Path, typer.Option("--data-dir", help="Logs, checkpoints and the SQLite database.")]
DbOpt = Annotated[Optional[str], typer.Option("--db", help="SQLAlchemy URL (default: SQLite in --data-dir).")]


def db_failure(data_dir: Path, db: str | None, exc: Exception) -> str:
    """One line for a database that cannot be opened (an unknown ``--db`` dialect, an
    unreachable PostgreSQL, a ``--data-dir`` that is a file): the ``error:`` text the
    commands that open the daemon's database print."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    first = (str(exc).strip().splitlines() or [""])[0]
    if db is not None:
        try:
            shown = make_url(db).render_as_string(hide_password=True)
        except ArgumentError:
            shown = db
        return f"--db: {shown!r} cannot be read: {type(exc).__name__}: {first}"
    return f"--data-dir: {str(data_dir)!r} cannot be used: {type(exc).__name__}: {first}"


def data_dir_failure(data_dir: Path) -> str | None:
    """Why ``data_dir`` cannot be a data directory (it exists and is not a folder), or ``None``."""
    if data_dir.exists() and not data_dir.is_dir():
        return f"--data-dir: {str(data_dir)!r} is not allowed: it is a file; a folder (new or the server's)"
    return None


def _store(data_dir: Path, db: str | None, create: bool = False):
    """The store of ``--db`` or ``--data-dir``, upgraded to this code's schema. Without
    ``create`` a ``--data-dir`` must already hold the server's ``shepherd.db`` (the
    folder and database are never made as a side effect). A data dir that is a file,
    no database there, a database that cannot be opened or a schema it cannot use is
    one ``error:`` line, exit 2."""
    from sqlalchemy.exc import SQLAlchemyError

    from gpushepherd.cli.main import err
    from gpushepherd.cli.report import open_store
    from gpushepherd.daemon.migrate import SchemaError
    from gpushepherd.daemon.store import Store

    why = data_dir_failure(data_dir) if db is None else None
    if why:
        err.print(f"error: {why}", soft_wrap=True)
        raise typer.Exit(2)
    try:
        if create and db is None:
            data_dir.mkdir(parents=True, exist_ok=True)
            return Store(Store.sqlite_url(data_dir))
        return open_store(data_dir, db)
    except (SchemaError, ValueError) as exc:
        err.print(f"error: {exc}", soft_wrap=True)
        raise typer.Exit(2) from None
    except (SQLAlchemyError, OSError) as exc:
        err.print(f"error: {db_failure(data_dir, db, exc)}", soft_wrap=True)
        raise typer.Exit(2) from None


def register(app: typer.Typer) -> None:
    """Add the server, client and token commands to ``app``."""
    from gpushepherd.cli.main import _console, _errors, err

    out = _console()
    token_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                            help="API tokens of the server (works on its database directly).")
    app.add_typer(token_app, name="token")

    @token_app.command("create")
    def token_create(user: Annotated[str, typer.Option("--user", "-u", help="The user the token acts as.")],
                     team: Annotated[list[str], typer.Option("--team", "-A", help="A team whose jobs it may "
                                                             "submit, cancel and read logs of (repeat).")] = [],
                     admin: Annotated[bool, typer.Option("--admin", help="Any team and any user.")] = False,
                     data_dir: DataDirOpt = Path("shepherd-data"), db: DbOpt = None) -> None:
        """Create a token and print it once (stdout; the database keeps only its hash)."""
        if not team and not admin:
            err.print("error: --team: give at least one team (or --admin)", soft_wrap=True)
            raise typer.Exit(2)
        if not user.strip():
            err.print(f"error: --user: {user!r} is not allowed: a user name", soft_wrap=True)
            raise typer.Exit(2)
        store = _store(data_dir, db)
        logged = store.last_policy()
        if logged is not None and team:
            from gpushepherd.policy.load import policy_from_dict
            teams = policy_from_dict(logged, source="policy in the event log", intake=False).rules.teams
            unknown = [t for t in team if teams and t not in teams]
            if unknown:
                err.print(f"error: --team: {unknown[0]!r} is not allowed: a team of the policy in force "
                          f"({', '.join(sorted(teams))})", soft_wrap=True)
                raise typer.Exit(2)
        token_id, token = store.create_token(user, team, admin)
        err.print(f"token {token_id}: user {user}, teams {', '.join(team) or '-'}{', admin' if admin else ''} "
                  f"(database {store.engine.url.render_as_string(hide_password=True)}); it is shown once, "
                  "only its SHA-256 is stored", soft_wrap=True)
        print(token)

    @token_app.command("list")
    def token_list(data_dir: DataDirOpt = Path("shepherd-data"), db: DbOpt = None) -> None:
        """Tokens: id, user, teams, admin, created, revoked."""
        table = SafeTable("ID", "USER", "TEAMS", "ADMIN", "CREATED", "REVOKED", box=None)
        for t in _store(data_dir, db).tokens():
            table.add_row(str(t["id"]), t["user"], ",".join(t["teams"]) or "-", "yes" if t["admin"] else "no",
                          _fmt_t(t["created"]), _fmt_t(t["revoked"]))
        out.print(table)

    @token_app.command("revoke")
    def token_revoke(token_id: Annotated[int, typer.Argument(metavar="ID")],
                     data_dir: DataDirOpt = Path("shepherd-data"), db: DbOpt = None) -> None:
        """Revoke a token: requests with it get 401 from then on."""
        if not _store(data_dir, db).revoke_token(token_id):
            err.print(f"error: token {token_id}: no such token, or already revoked (see `shepherd token list`)",
                      soft_wrap=True)
            raise typer.Exit(2)
        out.print(f"token {token_id}: revoked")

    @app.command("server")
    def server(data_dir: DataDirOpt = Path("shepherd-data"), db: DbOpt = None,
               policy: Annotated[Optional[Path], typer.Option("--policy", help="Policy YAML (default: the "
                                                              "last one this database ran).")] = None,
               host: Annotated[str, typer.Option("--host", help="Address to listen on; other than loopback "
                                                 "only with tokens.")] = "127.0.0.1",
               port: Annotated[int, typer.Option("--port", min=1, max=65535)] = DEFAULT_PORT,
               auth: Annotated[str, typer.Option("--auth", help="auto: tokens required once one exists; "
                                                 "required: always.")] = "auto",
               inventory: Annotated[str, typer.Option("--inventory", help="GPUs from auto (NVML when it finds a "
                                                      "GPU, else static), nvml or static (the policy's node, "
                                                      "samples scripted by <data-dir>/gpu-samples.json).")] = "auto",
               sample_every: Annotated[float, typer.Option("--sample-every", min=0.1, max=86400,
                                                           help="Seconds between GPU samples.")] = 10.0,
               node: Annotated[Optional[str], typer.Option("--node", help="The policy's node this server is "
                                                           "(default: the policy's only node).")] = None,
               idle_threshold_pct: Annotated[float, typer.Option(
                   "--idle-threshold-pct", min=0, max=100, help="/metrics: a job's GPUs are allocated-but-idle when "
                   "its utilisation stays below this percent (classes without idle_stop).")] = 5.0,
               idle_after: Annotated[str, typer.Option(
                   "--idle-after", help="/metrics: ... for this long: 600, 10m, 1h, 10:00 (classes without "
                   "idle_stop).")] = "10m",
               backend: Annotated[str, typer.Option("--backend", help="Where jobs run: local (processes on this "
                                                    "server), slurm (sbatch; the Slurm commands read "
                                                    "$SLURM_CONF), ray (actors; needs gpushepherd[ray]) or "
                                                    "kubernetes (binds pods; needs gpushepherd[kubernetes]).")]
               = "local",
               slurm_partition: Annotated[str, typer.Option("--slurm-partition", help="The Slurm partition "
                                                            "gpushepherd owns (nothing else submits to it).")]
               = "shepherd",
               ray_address: Annotated[str, typer.Option("--ray-address", help="The Ray cluster (--backend ray): "
                                                        "auto ($RAY_ADDRESS or the one on this machine), "
                                                        "HOST:PORT or ray://HOST:PORT.")] = "auto",
               kubeconfig: Annotated[Optional[str], typer.Option(
                   "--kubeconfig", help="--backend kubernetes: the kubeconfig (default $KUBECONFIG, ~/.kube/config, "
                   "else the in-cluster service account).")] = None,
               k8s_scheduler_name: Annotated[str, typer.Option(
                   "--k8s-scheduler-name", help="--backend kubernetes: the spec.schedulerName of the pods this "
                   "server schedules.")] = "gpushepherd",
               k8s_node_selector: Annotated[str, typer.Option(
                   "--k8s-node-selector", help="--backend kubernetes: a label selector of the nodes it manages "
                   "(default: all).")] = "",
               k8s_namespace: Annotated[str, typer.Option(
                   "--k8s-namespace", help="--backend kubernetes: the namespace of the pods of jobs submitted "
                   "to this server.")] = "default",
               k8s_image: Annotated[str, typer.Option(
                   "--k8s-image", help="--backend kubernetes: the container image of those pods.")]
               = "busybox:stable",
               max_requeues: Annotated[int, typer.Option("--max-requeues", min=0, max=100, help="Lost runs (ended "
                                                         "without an exit code) requeued per job; the next one "
                                                         "fails it (Slurm's requeue limit).")] = 3,
               requeue_backoff: Annotated[float, typer.Option("--requeue-backoff", min=0, max=300, help="Seconds "
                                                              "before a lost run is requeued, doubled for each "
                                                              "further one.")] = 2.0,
               db_busy_timeout: Annotated[float, typer.Option("--db-busy-timeout", min=0.1, max=3600, help="SQLite: "
                                                              "seconds a write waits for another writer's lock.")]
               = 30.0,
               scrape_allow: Annotated[Optional[list[str]], typer.Option("--scrape-allow", help="A network (CIDR) "
                                                                         "or host a service's --metrics-url may "
                                                                         "name besides loopback and its replicas' "
                                                                         "nodes (repeatable).")] = None,
               header_timeout: Annotated[float, typer.Option("--header-timeout", min=0.1, max=3600, help="Seconds a "
                                                             "client has to send a request's headers (then "
                                                             "closed); 30 s at most for its body.")] = 10.0,
               max_connections: Annotated[int, typer.Option("--max-connections", min=1, max=1_000_000, help="Open "
                                                            "HTTP connections at most (never more than the "
                                                            "descriptor limit less 128).")] = 1000,
               ready_max_step_age: Annotated[float, typer.Option(
                   "--ready-max-step-age", min=0.1, max=86400, help="/readyz answers 503 once the scheduling loop "
                   "has completed no step for this many seconds.")] = 30.0,
               dcgm_names: Annotated[bool, typer.Option(
                   "--dcgm-names", help="/metrics: also export GPU samples under DCGM-exporter's names "
                   "(DCGM_FI_DEV_*); off by default, so a node running dcgm-exporter gets no duplicate "
                   "series.")] = False) -> None:
        """Run the scheduler daemon on this server (HTTP API; loopback only until tokens exist)."""
        import logging

        import uvicorn

        from gpushepherd.daemon.api import make_app
        from gpushepherd.daemon.server import Daemon, DaemonError
        from gpushepherd.daemon.store import LockHeld
        from gpushepherd.backends import BackendError
        from gpushepherd.cli.main import err

        from gpushepherd.daemon.auth import is_loopback

        if auth not in ("auto", "required"):
            err.print(f"error: --auth: {auth!r} is not allowed: auto or required", soft_wrap=True)
            raise typer.Exit(2)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        if inventory not in ("auto", "nvml", "static"):
            err.print(f"error: --inventory: {inventory!r} is not allowed: auto, nvml or static", soft_wrap=True)
            raise typer.Exit(2)
        try:
            idle_after_s = parse_duration(idle_after)
        except typer.BadParameter as exc:
            err.print(f"error: --idle-after: {exc}", soft_wrap=True)
            raise typer.Exit(2) from None
        from gpushepherd.backends import BACKENDS
        if backend not in BACKENDS:
            err.print(f"error: --backend: {backend!r} is not allowed: {', '.join(BACKENDS[:-1])} or {BACKENDS[-1]}",
                      soft_wrap=True)
            raise typer.Exit(2)
        k8s = dict(kubeconfig=kubeconfig, scheduler_name=k8s_scheduler_name, node_selector=k8s_node_selector,
                   namespace=k8s_namespace, image=k8s_image)
        from sqlalchemy.exc import SQLAlchemyError

        from gpushepherd.daemon.migrate import SchemaError
        why = data_dir_failure(data_dir)
        if why:
            err.print(f"error: {why}", soft_wrap=True)
            raise typer.Exit(2)
        try:
            daemon = Daemon(data_dir, db, policy, inventory=inventory, sample_every=sample_every, node=node,
                            idle_threshold_pct=idle_threshold_pct, idle_after_s=idle_after_s,
                            backend=backend, slurm_partition=slurm_partition, ray_address=ray_address, k8s=k8s,
                            max_requeues=max_requeues, requeue_backoff_s=requeue_backoff,
                            busy_timeout_s=db_busy_timeout, scrape_allow=scrape_allow,
                            ready_max_step_age_s=ready_max_step_age, dcgm_names=dcgm_names)
        except SchemaError as exc:
            err.print(f"error: {exc}", soft_wrap=True)
            raise typer.Exit(2) from None
        except (SQLAlchemyError, OSError) as exc:
            err.print(f"error: {db_failure(data_dir, db, exc)}", soft_wrap=True)
            raise typer.Exit(2) from None
        if not is_loopback(host):
            if not daemon.store.active_tokens():
                err.print(f"error: --host {host}: only a loopback address (127.0.0.1, ::1) while the database has "
                          "no API token; create one first with `shepherd token create --user U --team T`",
                          soft_wrap=True)
                raise typer.Exit(2)
            auth = "required"  # reachable from other machines: never open, even if every token is revoked
        from gpushepherd.daemon.connlimit import guarded_protocol, listen_socket

        try:  # bound before the daemon starts: a port in use takes nothing, and the first log line says where
            sock, listen = listen_socket(host, port)
        except OSError as exc:
            err.print(f"error: --host {host} --port {port}: cannot listen there: {exc.strerror or exc}",
                      soft_wrap=True)
            raise typer.Exit(2) from None
        with _errors():
            try:
                daemon.start(listen=listen)
            except (LockHeld, DaemonError, BackendError) as exc:
                err.print(f"error: {exc}", soft_wrap=True)
                raise typer.Exit(2) from None
            except SQLAlchemyError as exc:
                err.print(f"error: {db_failure(data_dir, db, exc)}", soft_wrap=True)
                raise typer.Exit(2) from None
        try:
            config = uvicorn.Config(make_app(daemon, auth_required=auth == "required"), host=host, port=port,
                                    log_level="warning", timeout_keep_alive=5,
                                    http=guarded_protocol(header_timeout, max(30.0, header_timeout), max_connections))
            uvicorn.Server(config).run(sockets=[sock])
        finally:
            sock.close()
            daemon.stop()

    @app.command("submit", context_settings={"allow_interspersed_args": False})
    def submit(cmd: Annotated[list[str], typer.Argument(metavar="-- COMMAND [ARGS...]", help="The job's argv.")],
               cls: Annotated[str, typer.Option("--class", "-c", help="Workload class.")],
               team: Annotated[str, typer.Option("--team", "-A", help="Team (account).")],
               user: Annotated[Optional[str], typer.Option("--user", "-u", help="Default: the token's user, "
                                                           "or $USER without a token.")] = None,
               project: Annotated[str, typer.Option("--project", "-P", help="Project its GPU-hours are "
                                                    "reported under (Slurm's --wckey; never affects "
                                                    "scheduling).")] = "",
               gpus: Annotated[int, typer.Option("--gpus", "-G", min=1)] = 1,
               share: Annotated[Optional[str], typer.Option("--share", help="Part of one GPU: fraction:0.25, "
                                                            "mem, mig:1g.10gb, time_slice[:N], mps:N[:PCT].")] = None,
               gpu_type: Annotated[list[str], typer.Option("--gpu-type", help="Allowed GPU type (repeat).")] = [],
               gpu_mem: Annotated[int, typer.Option("--gpu-mem", min=0, help="GPU memory, MiB.")] = 0,
               time_limit: Annotated[Optional[str], typer.Option("--time", "-t", help="Time limit: seconds, "
                                                                 "HH:MM:SS or D-HH:MM:SS.")] = None,
               preemptible: Annotated[Optional[bool], typer.Option("--preemptible/--no-preemptible")] = None,
               checkpointable: Annotated[Optional[bool], typer.Option("--checkpointable/--no-checkpointable")] = None,
               env: Annotated[list[str], typer.Option("--env", help="KEY=VALUE for the job (repeat).")] = [],
               chdir: Annotated[Path, typer.Option("--chdir", "-D")] = Path("."),
               shell: Annotated[bool, typer.Option("--shell", help="Run COMMAND with /bin/sh -c.")] = False,
               array: Annotated[Optional[str], typer.Option("--array", "-a", help="Job array: 0-99%8 (indices "
                                                            "0..99, at most 8 at once), 1,3,5-7; each task gets "
                                                            "$SHEPHERD_ARRAY_TASK_ID.")] = None,
               max_retries: Annotated[int, typer.Option("--max-retries", min=0, help="Array: runs of a "
                                                        "FAILED chunk again.")] = 2,
               server: ServerOpt = None, token: TokenOpt = None) -> None:
        """Submit a job: `shepherd submit --class batch --team ml --gpus 1 -- python train.py`."""
        if user is None:
            if token:
                user = ""
            else:  # $USER, else the account this runs as (a shell without USER, a container)
                import getpass
                try:
                    user = os.environ.get("USER") or getpass.getuser()
                except (KeyError, OSError):
                    user = ""
        body: dict[str, Any] = {"class": cls, "team": team, "user": user, "gpus": gpus, "gpu_type": gpu_type,
                                "command": [" ".join(cmd)] if shell else cmd, "shell": shell,
                                "cwd": str(chdir.resolve()), "preemptible": preemptible,
                                "checkpointable": checkpointable}
        try:
            if share:
                body["share"] = parse_share(share, gpu_mem)
            else:
                body["gpu_mem_mib"] = gpu_mem
        except typer.BadParameter as exc:
            raise typer.BadParameter(str(exc), param_hint="--share") from None
        if time_limit:
            try:
                body["time_limit_s"] = parse_time(time_limit)
            except typer.BadParameter as exc:
                raise typer.BadParameter(str(exc), param_hint="'--time' / '-t'") from None
        body["env"] = env_pairs(env)
        if project:  # left out when empty: a server from before projects refuses the field
            body["project"] = project
        if array is not None:
            body["array"], body["max_retries"] = array, max_retries
        job = _request(server, "POST", "/jobs", token=token, json=body).json()
        out.print(f"Submitted {'array' if array is not None else 'job'} {job['id']}")
        if job.get("state") == "REJECTED":
            err.print(f"rejected: {_safe(job.get('reason') or 'no node could ever hold it')}", soft_wrap=True,
                      markup=False)
            raise typer.Exit(EXIT_REJECTED)

    @app.command("queue")
    def queue(state: Annotated[Optional[str], typer.Option("--state", "-t")] = None,
              all_: Annotated[bool, typer.Option("--all", "-a", help="Also ended jobs.")] = False,
              server: ServerOpt = None, token: TokenOpt = None) -> None:
        """Jobs: state, reason (or placement), estimated start, priority (squeue)."""
        params = {"state": state} if state else {}
        jobs = _request(server, "GET", "/jobs", token=token, params=params).json()
        table = SafeTable("JOBID", "CLASS", "TEAM", "USER", "GPUS", "STATE", "REASON / PLACEMENT", "EST. START",
                      "PRIORITY", box=None)
        for j in jobs:
            if not (all_ or state) and j["state"] in TERMINAL:
                continue
            prio = "-" if j["priority"] is None else f"{j['priority']:.3f}"
            jid = f"{j['id']}_[{j['array']}]" if j.get("array") else j["id"]
            table.add_row(jid, j["class"], j["team"], j["user"], j["share"] or str(j["gpus"]), j["state"],
                          j["reason"] or j["placement"] or "", _fmt_est(j), prio)
        out.print(table)

    @app.command("show")
    def show(job_id: Annotated[str, typer.Argument(metavar="JOB")], server: ServerOpt = None,
             token: TokenOpt = None) -> None:
        """One job: fields, its history of transitions and why it waits now."""
        j = _request(server, "GET", _job_path(job_id), token=token).json()
        if j.get("array"):
            for key in ("id", "array", "state", "class", "team", "user", "project", "gpus", "share", "throttle",
                        "max_retries", "retries_used", "running", "pending", "failed_indices", "command", "cwd"):
                value = (j.get(key) or "-") if key == "project" else j.get(key)
                out.print(_safe(f"{key}: {value}"), markup=False)
            out.print(f"progress: {j['done']}/{j['tasks']} done")
            out.print(f"submit_time: {_fmt_t(j['submit_time'])}")
            out.print("children (index: attempts):")
            for index, ids in j["children"].items():
                out.print(f"  {index}: {' '.join(ids)}")
            return
        for key in ("id", "state", "reason", "class", "team", "user", "project", "gpus", "share", "placement",
                    "priority", "runs", "preemptions", "lost_runs", "failure", "exit_code", "launch_error", "command",
                    "cwd", "stdout", "stderr", "checkpoint_dir"):
            value = (j.get(key) or "-") if key == "project" else j.get(key)
            out.print(_safe(f"{key}: {value}"), markup=False)
        if j.get("sampled_at") is not None or j.get("peak_gpu_mem_mib"):
            util = "-" if j.get("gpu_util_pct") is None else f"{j['gpu_util_pct']:.0f}%"
            over = "  OVER DECLARED" if j.get("over_declared_mem") else ""
            out.print(f"gpu: util {util}, memory {_num(j.get('gpu_mem_mib'))} MiB, peak "
                      f"{_num(j.get('peak_gpu_mem_mib'))} of {_num(j.get('declared_gpu_mem_mib') or None)} MiB "
                      f"declared{over} (sampled {_fmt_t(j.get('sampled_at'))})")
        out.print(f"submit_time: {_fmt_t(j['submit_time'])}  estimated_start: {_fmt_est(j)}")
        out.print("history:")
        for h in j["history"]:
            out.print(f"  {_fmt_t(h['t'])}  {h['from'] or '-'} -> {h['to']}  {h['reason']}")

    @app.command("why")
    def why(job_id: Annotated[str, typer.Argument(metavar="JOB")], server: ServerOpt = None,
            token: TokenOpt = None) -> None:
        """Why a job is in its state now."""
        j = _request(server, "GET", _job_path(job_id), token=token).json()
        if j.get("array"):
            out.print(f"array {j['id']} is {j['state']}: {j['reason']}")
        elif j["state"] == "PENDING":
            est = f"; estimated start {_fmt_est(j)}" if j["estimated_start"] else ""
            out.print(f"job {j['id']} is PENDING: {j['reason']}{est}")
        elif j["placement"]:
            out.print(f"job {j['id']} is {j['state']} on {j['placement']}")
        else:
            last = j.get("failure") or j.get("reason") or (j["history"][-1]["reason"] if j["history"] else "")
            if j.get("launch_error"):
                last = f"{last}; {j['launch_error']}" if last else j["launch_error"]
            out.print(_safe(f"job {j['id']} is {j['state']}: {last}"), markup=False)

    @app.command("cancel")
    def cancel(job_ids: Annotated[list[str], typer.Argument(metavar="JOB...")], server: ServerOpt = None,
               token: TokenOpt = None) -> None:
        """Cancel jobs (scancel); their GPUs are free at once."""
        for job_id in job_ids:
            r = _request(server, "POST", _job_path(job_id, "/cancel"), token=token).json()
            out.print(f"job {r['id']}: {r['state']}")

    @app.command("logs")
    def logs(job_id: Annotated[str, typer.Argument(metavar="JOB")],
             stderr: Annotated[bool, typer.Option("--stderr", help="Show stderr instead of stdout.")] = False,
             follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")] = False,
             server: ServerOpt = None, token: TokenOpt = None) -> None:
        """A job's output (its last run)."""
        offset, run = 0, None
        stream = "stderr" if stderr else "stdout"
        while True:
            j = _request(server, "GET", _job_path(job_id), token=token).json()
            if run != j["runs"]:
                run, offset = j["runs"], 0
            while True:  # the server answers a chunk at a time (at most 1 MiB): read to the end
                r = _request(server, "GET", _job_path(job_id, "/logs"), token=token,
                             params={"stream": stream, "offset": offset, **({"run": run} if run else {})})
                sys.stdout.write(r.text)
                sys.stdout.flush()
                before, offset = offset, int(r.headers.get("X-Next-Offset", offset))
                if offset == before or offset >= int(r.headers.get("X-Log-Size", offset)):
                    break
            if not follow or j["state"] in TERMINAL:
                return
            time.sleep(1.0)

    @app.command("nodes")
    def nodes(server: ServerOpt = None, token: TokenOpt = None) -> None:
        """Nodes and their GPUs: free, and which job holds each (sinfo); under an engine
        (Slurm) also its state and labels per node."""
        table = SafeTable("NODE", "GPU TYPE", "GPUS", "FREE", "JOBS BY GPU", box=None)
        engine = SafeTable("NODE", "ENGINE", "STATE", "GRES", "MEMORY MiB", "LABELS", box=None)
        gpus = SafeTable("NODE", "GPU", "UTIL", "MEMORY MiB", "TEMP", "POWER", "JOBS", "UNMANAGED BY", box=None)
        for n in _request(server, "GET", "/nodes", token=token).json():
            held = " ".join(f"{g['index']}:{','.join(g['jobs'])}" for g in n["gpu"] if g["jobs"])
            table.add_row(n["name"], n["gpu_type"], str(n["gpus"]), str(n["free"]), held or "-")
            if "engine" in n:
                e = n["engine"]
                if e is None:
                    engine.add_row(n["name"], "-", n.get("engine_error") or "not in the engine", "-", "-", "-")
                else:
                    engine.add_row(n["name"], e["kind"], e["state"], f"gpu:{e['gpu_type']}:{e['gpus']}",
                                   _num(e["memory_mib"]), ",".join(e["labels"]) or "-")
            if not n.get("inventory"):
                continue
            for g in n["gpu"]:
                foreign = " ".join(f"pid {p['pid']} ({p['owner'] or '?'}: {p['command'] or '?'})"
                                   for p in g["unmanaged_processes"])
                gpus.add_row(n["name"], str(g["index"]), "-" if g["util_pct"] is None else f"{g['util_pct']:.0f}%",
                             f"{_num(g['mem_used_mib'])}/{_num(g['mem_total_mib'])}",
                             "-" if g["temperature_c"] is None else f"{g['temperature_c']:.0f}C",
                             "-" if g["power_w"] is None else f"{g['power_w']:.0f}W", ",".join(g["jobs"]) or "-",
                             foreign or ("yes" if g["unmanaged"] else "-"))
        out.print(table)
        if engine.row_count:
            out.print(engine)
        if gpus.row_count:
            out.print(gpus)

    @app.command("usage")
    def usage(server: ServerOpt = None, token: TokenOpt = None) -> None:
        """Per team: GPUs in use, decayed usage and fair-share factor (sshare)."""
        table = SafeTable("TEAM", "GPUS IN USE", "DECAYED GPU-H", "FAIR-SHARE", box=None)
        for t in _request(server, "GET", "/usage", token=token).json()["teams"]:
            table.add_row(t["team"], f"{t['gpus_in_use']:g}", f"{t['decayed_usage_gpu_s'] / 3600:.2f}",
                          f"{t['fair_share_factor']:.3f}")
        out.print(table)
