"""``shepherd server`` and its client commands, with the habits of Slurm users:
``submit`` (sbatch), ``queue`` (squeue), ``show`` (scontrol show job), ``cancel``
(scancel), ``logs``, ``why``, ``nodes`` (sinfo), ``usage`` (sshare).

Client commands talk HTTP to ``--server`` (default ``$SHEPHERD_SERVER`` or
http://127.0.0.1:8765), with ``--token`` (default ``$SHEPHERD_TOKEN``) once the
server has tokens (``shepherd token create``); without either, to the server's local
Unix socket when one is found (``local_socket``; no token: the kernel names the user).
A refused request (bad field, unknown job) prints one ``error:`` line and exits 2; an
unreachable server exits 1.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table
from rich.text import Text

from gpushepherd.daemon.jobquery import JOB_NAME_RULE
from gpushepherd.durations import MAX_SECONDS, UNLIMITED_WORDS, Bare, parse_duration

DEFAULT_PORT = 8765
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "REJECTED"}
#: the longest time limit, seconds (10 years, as the API: ``gpushepherd.daemon.api.MAX_SECONDS``)
MAX_TIME_S = MAX_SECONDS
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


def server_refusal(value: str) -> str | None:
    """Why ``value`` (``--server``, ``$SHEPHERD_SERVER``) names no server; ``None``: it may.

    Refused (before, each read "no gpushepherd server at ..." as if one were down, or
    gave a traceback):
    * a space or a control character anywhere;
    * ``unix:`` with no file name (``unix:``, ``unix:/``, ``unix://``, ``unix:.``, a path
      ending in ``/``: ``Path("")`` is ``.``, so a folder was tried as a socket), or a
      path that is a folder;
    * anything else that is not an ``http://`` or ``https://`` URL (any case) with a host
      a resolver takes (IDNA) and a port in 1-65535 if one is given, and no query or
      fragment (``''``, ``localhost:8765``, ``ftp://x``, ``http://a..b``, ``http://h:0``);
    * an ``@`` anywhere but in a ``unix:`` path (``http://ana:secret@h``, ``ana:pw@h``, a
      password with ``/``): the API takes a token (``--token``, ``$SHEPHERD_TOKEN``), and
      this is checked first, so no refusal shows what comes before the last ``@``
      (before, the password was shown in every error line)."""
    if "@" in value and not value.startswith("unix:"):
        head, _at, host = value.rpartition("@")
        scheme = head.partition("://")[0] + "://" if "://" in head else ""
        return (f"a user or password in the URL is not allowed ({scheme + '...@' + host!r}): the server takes "
                "an API token, --token or $SHEPHERD_TOKEN (shepherd token create)")
    allowed = (f"{value!r} is not allowed: unix:PATH with the path of the server's socket "
               f"(unix:{DEFAULT_SOCKETS[0]}), or a URL like http://127.0.0.1:{DEFAULT_PORT}")
    if any(c.isspace() or not c.isprintable() for c in value):  # a space or a control character anywhere
        return allowed
    if value.startswith("unix:"):
        path = value[len("unix:"):]
        if path.endswith("/") or path.rpartition("/")[2] in ("", ".", ".."):
            return allowed
        return f"{value!r} is not allowed: {path!r} is a folder; unix:PATH names the server's socket" \
            if Path(path).is_dir() else None
    from urllib.parse import urlsplit

    try:
        url = urlsplit(value)
        port = url.port  # raises ValueError on a port that is not a number in 0-65535
        (url.hostname or "").encode("idna")  # raises UnicodeError on a host no resolver takes (a..b)
    except (ValueError, UnicodeError):
        return allowed
    # a query or fragment would go with every request: the server's paths follow the URL
    if url.scheme not in ("http", "https") or not url.hostname or port == 0 or "?" in value or "#" in value:
        return allowed
    return None


def server_param(value: Any) -> str:
    """A typer ``parser=`` for ``--server``: ``server_refusal``.

    Raises (from the parser):
        typer.BadParameter: naming the value and what is allowed (click adds the option).
    """
    why = server_refusal(str(value))
    if why is not None:
        raise typer.BadParameter(why)
    return str(value)


ServerOpt = Annotated[Optional[str], typer.Option("--server", parser=server_param, help="Server URL, or unix:PATH "
                                                  "for a local socket (default $SHEPHERD_SERVER; without a token, "
                                                  "the local socket when there is one; else "
                                                  f"http://127.0.0.1:{DEFAULT_PORT}).")]

TokenOpt = Annotated[Optional[str], typer.Option("--token", envvar="SHEPHERD_TOKEN", show_envvar=True,
                                                 help="API token (shepherd token create).")]

#: where the CLI looks for the server's local socket without --server or a token, after
#: ``$SHEPHERD_SOCKET`` (``''``: never): the default --data-dir, then the systemd unit's (deploy/systemd)
DEFAULT_SOCKETS = ("shepherd-data/shepherd.sock", "/run/gpushepherd/shepherd.sock")


def _url(server: str | None) -> str:
    return (server or os.environ.get("SHEPHERD_SERVER") or f"http://127.0.0.1:{DEFAULT_PORT}").rstrip("/")


def local_socket(server: str | None, token: str | None) -> Path | None:
    """The Unix socket a client command talks to (note 025): ``--server unix:PATH`` (or
    ``$SHEPHERD_SERVER``); else, with no server and no token, ``$SHEPHERD_SOCKET`` (set:
    that path, a socket or not; ``''``: none) or the first of ``DEFAULT_SOCKETS`` that is a
    socket; else ``None`` (HTTP).

    Raises:
        typer.Exit: ``unix:`` with no path (``server_refusal``): one ``error:`` line
            naming ``--server`` or ``$SHEPHERD_SERVER``, exit 2.
    """
    from gpushepherd.daemon.unixsock import is_socket

    env_value = os.environ.get("SHEPHERD_SERVER") or None  # set to '': not set
    named = env_value if server is None else server  # sbatch's own --server '' too: refused, not the default
    if named is not None:
        why = server_refusal(named)
        if why is not None:  # $SHEPHERD_SERVER, or sbatch's own --server (not ServerOpt's parser)
            from gpushepherd.cli.main import err
            # (sbatch and policy check pass the variable on as their server: named as what it is)
            env = server is None or server == env_value
            err.print(f"error: {'$SHEPHERD_SERVER' if env else '--server'}: {why}", soft_wrap=True, markup=False)
            raise typer.Exit(2)
        return Path(named[len("unix:"):]) if named.startswith("unix:") else None
    if token:
        return None
    env = os.environ.get("SHEPHERD_SOCKET")
    if env:
        return Path(env)  # asked for: used (a missing one is named by the error), never passed over for HTTP
    if env is not None:
        return None  # '': never a socket
    for path in DEFAULT_SOCKETS:
        if is_socket(Path(path)):
            return Path(path)
    return None


class ServerUnreachable(Exception):
    """No server answered at ``url`` (``_request(..., raise_unreachable=True)``)."""

    def __init__(self, url: str, exc: Exception):
        super().__init__(f"no gpushepherd server at {url} ({exc})")
        self.url = url


#: a submission's API fields that are seconds, as the flag the user typed names them:
#: a refusal says ``--grace: 600 s is not allowed: ...``, not the API's field name
SUBMIT_FLAGS = {"grace_period_s": "--grace", "time_limit_s": "--time"}
#: a share's API fields, as the flag that set them (``--share`` the others): a refusal of
#: ``share.mem_mib`` says ``--gpu-mem: 0 is not allowed for a time_slice share: ...``
SHARE_FLAGS = {"mem_mib": "--gpu-mem"}


def _as_flag(d: dict, flags: dict[str, str]) -> dict:
    """A FastAPI error entry about a field of ``flags`` (seconds) rewritten to name the
    flag and the unit of its value (``--grace: 600 s is not allowed: ...``); with
    ``flags``, one about a share's field names its flag (``SHARE_FLAGS``, else
    ``--share: share.slots: ...``)."""
    loc = d.get("loc", [])
    if flags and len(loc) == 3 and loc[1] == "share":  # share.slots: --share, share.mem_mib: --gpu-mem
        flag = SHARE_FLAGS.get(str(loc[2]))
        msg = re.sub(rf"^share\.{re.escape(str(loc[2]))}: ", "", str(d.get("msg"))) if flag else str(d.get("msg"))
        return {**d, "loc": [loc[0], flag or "--share"], "msg": msg}
    if len(loc) != 2 or loc[1] not in flags:
        return d
    msg = re.sub(rf"^{re.escape(str(loc[1]))}: ", "", str(d.get("msg")))
    m = re.match(r"(-?[0-9.e+]+) is not allowed", msg)
    if m:
        msg = f"{float(m.group(1)):g} s{msg[len(m.group(1)):]}"
    return {**d, "loc": [loc[0], flags[loc[1]]], "msg": msg}


def _request(server: str | None, method: str, path: str, token: str | None = None, *,
             raise_unreachable: bool = False, flags: dict[str, str] | None = None,
             extra_headers: dict[str, str] | None = None, unconfirmed_hint: str = "", **kw: Any):
    """``method path`` on the server (its Unix socket or HTTP), the response; a refusal
    (>= 400) is one ``error:`` line (entries about ``flags``' fields name the flag,
    ``_as_flag``; a 503 is followed by ``unconfirmed_hint`` when given) and exit 2.
    ``extra_headers`` go with the request (an ``Idempotency-Key``).

    Raises:
        typer.Exit: refused (2), or no server (1) unless ``raise_unreachable``.
        ServerUnreachable: no server, with ``raise_unreachable``.
    """
    import httpx

    from gpushepherd.cli.main import err
    unix = local_socket(server, token)
    url = f"unix:{unix}" if unix is not None else _url(server)
    headers = {"Authorization": f"Bearer {token}"} if token and unix is None else {}
    headers.update(extra_headers or {})
    try:
        if unix is not None:  # the kernel names the caller: no token is sent
            from gpushepherd.daemon.unixsock import short_path

            with short_path(unix) as where, httpx.Client(transport=httpx.HTTPTransport(uds=where)) as client:
                r = client.request(method, "http://shepherd" + path, timeout=60.0, headers=headers, **kw)
        else:
            r = httpx.request(method, url + path, timeout=60.0, headers=headers, **kw)
    except httpx.InvalidURL as exc:
        named = "--server" if server else "$SHEPHERD_SERVER"
        err.print(f"error: {named}: {url!r} is not allowed: {exc} (a URL like http://127.0.0.1:{DEFAULT_PORT})",
                  soft_wrap=True)
        raise typer.Exit(2) from None
    except (httpx.TransportError, OSError) as exc:
        if raise_unreachable:  # the caller waits for it to come back (shepherd run)
            raise ServerUnreachable(url, exc) from None
        err.print(f"error: no gpushepherd server at {url} ({exc}); start one with `shepherd server`", soft_wrap=True)
        raise typer.Exit(1) from None
    if r.status_code >= 400:
        try:
            detail = r.json().get("detail")
        except ValueError:
            detail = r.text
        if isinstance(detail, list):
            detail = "; ".join(_located(_as_flag(d, flags or {}) if isinstance(d, dict) else d) for d in detail)
        err.print(f"error: {_safe(detail)}", soft_wrap=True, markup=False)
        if r.status_code == 503 and unconfirmed_hint:
            err.print(unconfirmed_hint, soft_wrap=True, markup=False)
        raise typer.Exit(2)
    return r


def _shown(j: dict, key: str) -> Any:
    """Field ``key`` of job view ``j`` as ``show`` prints it (scontrol's style, no
    Python reprs): ``-`` for no value (and no project or name), the command as a shell
    would read it, a list joined with commas, a word for a field the server hid
    (another team's job, note 023)."""
    if key in j.get("hidden", ()):
        return f"(hidden: a job of team {j.get('team')}, seen by its members and admins)"
    v = j.get(key)
    if v is None or (v == "" and key in ("project", "name")) or v == []:
        return "-"
    if isinstance(v, list):
        return shlex.join(map(str, v)) if key == "command" else ",".join(map(str, v))
    if isinstance(v, bool):
        return "yes" if v else "no"
    return v


def _num(v: Any) -> str:
    return "-" if v is None else str(v)


def _points(v: float) -> str:
    """Priority score points as sprio prints them: whole points, else two decimals."""
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.2f}"


def _located(d: dict) -> str:
    """``field: message`` of one FastAPI error entry (a message that already names its
    field, as the policy's do, is kept as it is)."""
    where = ".".join(str(x) for x in d.get("loc", [])[1:]) or "body"
    msg = str(d.get("msg"))
    return msg if msg.startswith(f"{where}: ") else f"{where}: {msg}"


def duration_param(bare: Bare = "seconds", *, lo: float = 0.0, hi: float = MAX_TIME_S, zero: bool = False,
                   instead: str = "") -> Callable[[Any], float]:
    """A typer ``parser=`` for a duration option: ``gpushepherd.durations.parse_duration``
    with ``bare`` (what a number without a unit means: ``"minutes"`` for ``-t/--time`` as
    in Slurm, ``"seconds"`` for the options that always took seconds, ``None``: a unit is
    needed), then seconds from ``lo`` to ``hi`` (> 0 unless ``zero``). ``instead``:
    what to say after a refused ``UNLIMITED``. A number (an option's default) is seconds.

    Raises (from the parser):
        typer.BadParameter: naming the value and the allowed forms (click adds the option).
    """
    def duration(value: Any) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        try:
            seconds = parse_duration(value, bare=bare, zero=zero, maximum=hi)
        except ValueError as exc:
            hint = f"; {instead}" if instead and str(value).strip().lower() in UNLIMITED_WORDS else ""
            raise typer.BadParameter(f"{exc}{hint}") from None
        if seconds < lo:
            raise typer.BadParameter(f"{value!r} is not allowed: at least {lo:g} s")
        return seconds
    return duration


def path_param(value: Any) -> Path:
    """A typer ``parser=`` for every path option and argument: the text as a ``Path``,
    refusing an empty one. ``Path("")`` is ``.``, so an unset shell variable
    (``--data-dir "$DIR"``) silently named the current folder: a server kept its data
    there, and errors named ``'.'``, not what was given.

    Raises (from the parser):
        typer.BadParameter: ``'' is not allowed`` (click adds the option's name).
    """
    if isinstance(value, Path):
        return value
    if str(value) == "":
        raise typer.BadParameter("'' is not allowed: a path (an empty one would mean the current "
                                 "folder; if a shell variable gave it, it is unset)")
    return Path(value)


DEPENDENCY_HELP = ("Run after other jobs (Slurm's --dependency): afterok:ID[:ID...] (they COMPLETED), "
                   "afternotok:ID (they ended otherwise), afterany:ID (they ended), singleton (no other job of "
                   "this name and user runs); a comma list must all hold.")
BEGIN_HELP = ("Not before TIME (Slurm's --begin): now+COUNT[seconds|minutes|hours|days|weeks] (now+90 is "
              "seconds; now+30m, now+2hours), HH:MM[:SS] (the next such time), an ISO time "
              "2025-06-01T10:00[Z|+02:00], today, tomorrow, midnight, noon, or epoch seconds; without a zone: "
              "the server's local time.")
#: ``submit -t/--time``: a bare number is minutes, as Slurm's ``--time``
TIME_LIMIT = duration_param("minutes", instead="leave --time out for the class's default limit "
                            "(default_time_limit_s, else max_runtime_s, else none)")
TIME_HELP = ("Time limit, as Slurm's --time: MINUTES (a bare number is minutes), MM:SS, HH:MM:SS, D-HH, D-HH:MM, "
             "D-HH:MM:SS, or with a unit: 30s, 10m, 2h, 1d.")
#: ``submit --estimate``: the forms of ``--time`` (a bare number is minutes)
ESTIMATE = duration_param("minutes")
#: what ``--help`` of a duration option whose bare number is seconds says of its forms
SECONDS_FORMS = "seconds, or with a unit: 30s, 10m, 2h; or MM:SS, HH:MM:SS"
#: ``submit --grace``: a bare number is seconds (Kubernetes' terminationGracePeriodSeconds), 0 allowed
GRACE = duration_param("seconds", zero=True)


def time_point(value: Any) -> float:
    """A typer ``parser=`` for a point in time (``--deadline``): Slurm's forms or ISO 8601
    (``gpushepherd.timepoints``), read against this machine's clock and zone; a number (a
    default) is epoch seconds.

    Raises:
        typer.BadParameter: naming the value and the forms.
    """
    from gpushepherd.timepoints import parse_time_point

    if isinstance(value, (int, float)):
        return float(value)
    try:
        return parse_time_point(value, time.time())
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def selector_items(items: list[str], option: str = "--constraint") -> list[str]:
    """``-C/--constraint`` values as the API's ``node_selector`` list: each ``LABEL=VALUE``
    or ``LABEL`` (a Slurm feature), several joined by ``&`` (Slurm's AND) or repeated.

    Raises:
        typer.BadParameter: ``|`` (Slurm's OR: the core has no OR), ``[...]``, ``*N``, or an
            empty item.
    """
    out = []
    for item in items:
        if any(c in item for c in "|[]*,"):
            raise typer.BadParameter(f"{item!r} is not allowed: LABEL=VALUE or LABEL, several joined by & (AND) "
                                     "or repeated; gpushepherd has no OR (|), counts (*N) or brackets",
                                     param_hint=option)
        for part in item.split("&"):
            if not part.strip():
                raise typer.BadParameter(f"{item!r} is not allowed: an empty label", param_hint=option)
            out.append(part.strip())
    return out


def constraint_fields(*, constraint: list[str] = (), tolerations: list[str] = (), min_driver: str = "",
                      cache_key: str = "", cache_required: bool = False, deadline: float | None = None,
                      estimate_s: float | None = None, gpus_per_pod: int | None = None,
                      same_node: bool = False, grace_s: float | None = None,
                      require_island: bool | None = None) -> dict[str, Any]:
    """The ``POST /jobs`` fields of a job's placement constraints, deadline (epoch seconds),
    runtime estimate, grace period (seconds) and NVLink island requirement (notes 022,
    027, 037), each left out when not given (a server from before them refuses them)."""
    fields: dict[str, Any] = {"node_selector": selector_items(list(constraint)), "tolerations": list(tolerations),
                              "min_driver": min_driver, "cache_key": cache_key, "cache_required": cache_required,
                              "deadline": deadline, "runtime_estimate_s": estimate_s, "gpus_per_pod": gpus_per_pod,
                              "same_node": same_node}
    out = {k: v for k, v in fields.items() if v not in (None, "", [], False)}
    if grace_s is not None:
        out["grace_period_s"] = grace_s  # 0 is a grace asked for (none)
    if require_island is not None:
        out["require_island"] = require_island  # false overrides a class that requires one
    return out


def job_body(*, cls: str, team: str, user: str | None, token: str | None, gpus: int, gpu_type: list[str],
             command: list[str], shell: bool, chdir: Path, time_limit_s: float | None = None, project: str = "",
             array: str | None = None, max_retries: int = 2, name: str = "", dependency: str = "",
             begin: str | None = None, hold: bool = False, server: str | None = None) -> dict[str, Any]:
    """The ``POST /jobs`` body of ``submit`` and ``sbatch``: ``user`` ``None`` is the token's
    user with a token or the socket's user on the local socket (``server``: as
    ``local_socket`` reads it), else ``$USER`` (or the account this runs as); ``shell``:
    ``command`` is joined into one ``/bin/sh -c`` line; ``time_limit_s`` seconds; fields
    left out when empty (a server from before them refuses them)."""
    if user is None:
        if token or local_socket(server, token) is not None:
            user = ""
        else:  # $USER, else the account this runs as (a shell without USER, a container)
            import getpass
            try:
                user = os.environ.get("USER") or getpass.getuser()
            except (KeyError, OSError):
                user = ""
    body: dict[str, Any] = {"class": cls, "team": team, "user": user, "gpus": gpus, "gpu_type": gpu_type,
                            "command": [" ".join(command)] if shell else command, "shell": shell,
                            "cwd": str(chdir.resolve())}
    if time_limit_s is not None:
        body["time_limit_s"] = time_limit_s
    if project:
        body["project"] = project
    if name:
        body["name"] = name
    if array is not None:
        body["array"], body["max_retries"] = array, max_retries
    if dependency:  # kept by the server until they allow (note 021)
        body["dependency"] = dependency
    if begin is not None:
        body["begin"] = begin
    if hold:
        body["hold"] = True
    return body


def script_not_command(cmd: list[str], chdir: Path, shell: bool) -> None:
    """Refuse ``submit job.sh``: a file in the job's directory named as the command, which is
    no command on ``$PATH`` (it would fail at launch with exit 127); and ``submit
    /tmp/x/job.sh`` or ``submit ./job.sh``: a path (relative to the job's directory) to a
    file this user may not execute (it would fail at launch with exit 126). A path to no
    file here is left to the server (it may run elsewhere).

    Raises:
        typer.Exit: one ``error:`` line naming ``shepherd sbatch FILE`` (and ``-- ./FILE``
        or ``chmod +x``), exit 2.
    """
    import shutil

    from gpushepherd.cli.main import err
    first = cmd[0] if cmd else ""
    if not shell and "/" in first and (chdir / first).is_file() and not os.access(chdir / first, os.X_OK):
        err.print(f"error: COMMAND: {first!r} is not allowed: it is a file that is not executable (it would fail "
                  f"with exit 126); submit a batch script with `shepherd sbatch {first}` (reads its #SBATCH lines) "
                  f"or make it executable (`chmod +x {first}`)", soft_wrap=True, markup=False)
        raise typer.Exit(2)
    if shell or not first or "/" in first or shutil.which(first) or not (chdir / first).is_file():
        return
    err.print(f"error: COMMAND: {first!r} is not allowed: it is a file, not a command on $PATH (it would fail "
              f"with exit 127); submit a batch script with `shepherd sbatch {first}` (reads its #SBATCH lines) or "
              f"run it as `-- ./{first}`", soft_wrap=True, markup=False)
    raise typer.Exit(2)


def with_key(argv: list[str], key: str) -> list[str]:
    """``argv`` (``shepherd submit|sbatch ...``) with ``--idempotency-key KEY`` right
    after the command's name, in place of any it had before the job's command (``--``)."""
    out, i = [], 2
    while i < len(argv):
        a = argv[i]
        if a == "--":
            break
        if a == "--idempotency-key":
            i += 2
            continue
        if not a.startswith("--idempotency-key="):
            out.append(a)
        i += 1
    return [*argv[:2], "--idempotency-key", key, *out, *argv[i:]]


#: the pending reason of a job that no placement or limit in force lets start
NEVER_AS_IS = "ExceedsCapacity"


def post_job(server: str | None, token: str | None, body: dict, announce: bool = True,
             to_stderr: bool = False, idempotency_key: str | None = None, retry_argv: list[str] | None = None) -> dict:
    """``POST /jobs`` of a submission ``body`` and its one line: ``Submitted job N`` (or
    ``array N``) on stdout (``to_stderr``: on stderr; not ``announce``: none), or, when
    the server rejected it (no node could ever hold it), only ``rejected: REASON (job N)``
    on stderr and exit ``EXIT_REJECTED`` (3). Returns the server's view of the job.
    ``idempotency_key``: sent as ``Idempotency-Key``; when the server could not confirm
    the submission in time (503) the key and the command to retry safely with it
    (``retry_argv``: the command line, ``shepherd submit ...``) follow the error.

    Raises:
        typer.Exit: rejected (3); refused (2) or no server (1), from ``_request``.
    """
    from gpushepherd.cli.main import _console, err

    hint = ""
    if idempotency_key is not None:
        again = shlex.join(with_key(retry_argv, idempotency_key)) if retry_argv else (
            f"the same command with --idempotency-key {shlex.quote(idempotency_key)}")
        hint = (f"this submission's Idempotency-Key is {idempotency_key}: retry it with that key and the server "
                f"submits it at most once: {again}")
    job = _request(server, "POST", "/jobs", token=token, json=body, flags=SUBMIT_FLAGS, unconfirmed_hint=hint,
                   extra_headers={"Idempotency-Key": idempotency_key} if idempotency_key is not None else None).json()
    if job.get("state") == "REJECTED":
        err.print(f"rejected: {_safe(job.get('reason') or 'no node could ever hold it')} (job {_safe(job['id'])})",
                  soft_wrap=True, markup=False)
        raise typer.Exit(EXIT_REJECTED)
    if announce:
        (err if to_stderr else _console()).print(f"Submitted {'array' if body.get('array') is not None else 'job'} "
                                                 f"{job['id']}", markup=False)
    # the server's never_fits (a kept job's, an array's too); a server from before it: the reason
    never = job.get("never_fits") or (job.get("reason") if str(job.get("reason") or "").startswith(NEVER_AS_IS)
                                      else None)
    if never:
        # accepted and kept pending, as Slurm keeps a job over a QOS limit (without
        # DenyOnLimit) and Kueue an inadmissible workload - but said at once, not found later
        jid = _safe(job["id"])
        what, waits, it = ((f"array {jid} (tasks {_safe(body['array'])})", "its tasks wait", "them")
                           if body.get("array") is not None else (f"job {jid}", "it waits", "it"))
        err.print(f"warning: {what} cannot start under the policy and cluster as they are: {_safe(never)}; "
                  f"{waits} until they change (shepherd cancel {jid} drops {it})", soft_wrap=True, markup=False)
    return job


def resource_fields(*, share: str | None, gpu_mem: int, env: list[str], mem: str | None,
                    cpus: float | None) -> dict[str, Any]:
    """The ``POST /jobs`` fields of ``--share``/``--gpu-mem``, ``--env``, ``--mem`` and
    ``--cpus`` (``submit`` and ``run``); those not given left out.

    Raises:
        typer.BadParameter: a share, an env pair or a memory size that is not allowed.
    """
    out: dict[str, Any] = {}
    try:
        if share:
            out["share"] = parse_share(share, gpu_mem)
        else:
            out["gpu_mem_mib"] = gpu_mem
    except typer.BadParameter as exc:
        raise typer.BadParameter(str(exc), param_hint="--share") from None
    out["env"] = env_pairs(env)
    if mem is not None:
        out["mem_mib"] = mem_mib(mem)
    if cpus is not None:
        out["cpus"] = cpus
    return out


def parse_share(text: str, mem_mib: int) -> dict:
    """``fraction:0.25``, ``mig:1g.10gb``, ``time_slice[:N]``,
    ``mps:REPLICAS[:PERCENT[:PROCESSES]]`` (PERCENT of the SMs per replica, empty: 100 /
    the node's ``max_clients``; note 037) or ``mem`` (memory only, with ``--gpu-mem``) as
    the API's share body.

    Raises:
        typer.BadParameter: naming the value and what is allowed.
    """
    kind, _, arg = text.partition(":")
    try:
        if kind == "fraction":
            f = float(arg)
            if not 0 < f <= 1 or abs(f * 1000 - round(f * 1000)) > 1e-6:
                raise typer.BadParameter(f"{text!r} is not allowed: fraction:F with 0 < F <= 1, a multiple of "
                                         "0.001 GPU (as a scenario's gpu_fraction)")
            return {"kind": "fraction", "milli": round(f * 1000), "mem_mib": mem_mib}
        if kind == "mem":
            if mem_mib <= 0:
                raise typer.BadParameter(f"{text!r} is not allowed without --gpu-mem MiB (> 0)")
            return {"kind": "fraction", "milli": 0, "mem_mib": mem_mib}
        if kind == "mig" and arg:
            return {"kind": "mig", "profile": arg}
        if kind == "time_slice":
            if int(arg or 1) < 1:
                raise typer.BadParameter(f"{text!r} is not allowed: time_slice:N with N >= 1 replicas")
            return {"kind": "time_slice", "slots": int(arg or 1), "mem_mib": mem_mib}
        if kind == "mps":  # N replicas, PERCENT of the SMs each (default: the node's share), PROCS processes
            n, _, rest = arg.partition(":")
            pct, _, procs = rest.partition(":")
            if int(n or 1) < 1 or int(procs or 1) < 1:
                raise typer.BadParameter(f"{text!r} is not allowed: mps:N[:PERCENT[:PROCESSES]] with N >= 1 "
                                         "replicas and PROCESSES >= 1")
            if pct and (not 0 < float(pct) <= 100 or abs(float(pct) * 10 - round(float(pct) * 10)) > 1e-6):
                raise typer.BadParameter(f"{text!r} is not allowed: mps:N:PERCENT with 0 < PERCENT <= 100, "
                                         "a multiple of 0.1")
            return {"kind": "mps", "slots": int(n or 1), "milli": round(float(pct or 0) * 10), "mem_mib": mem_mib,
                    "procs": int(procs or 1)}
    except ValueError:
        pass
    raise typer.BadParameter(f"{text!r} is not allowed: fraction:F, mem, mig:PROFILE, time_slice[:N] or "
                             "mps:REPLICAS[:PERCENT[:PROCESSES]]")


_MEM = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)
_MEM_UNIT = {"k": 1 / 1024, "": 1, "m": 1, "g": 1024, "t": 1024 * 1024}


def mem_mib(text: str) -> int:
    """``--mem``: a size as Slurm writes it, ``100M``, ``4G``, ``1.5G``, ``512MiB``, a bare
    number being MiB, as MiB (rounded up).

    Raises:
        typer.BadParameter: another form, or zero.
    """
    import math

    m = _MEM.fullmatch(text.strip())
    mib = math.ceil(float(m[1]) * _MEM_UNIT[m[2].lower()]) if m else 0
    if mib <= 0:
        raise typer.BadParameter(f"{text!r} is not allowed: a size such as 100M, 4G, 1.5G or 512 (MiB), more "
                                 "than 0", param_hint="--mem")
    return mib


def since_epoch(text: str) -> float:
    """``audit --since``: a duration back from now (``report --since``'s forms: 1h, 7d) or
    a time (``report --from``'s: an ISO date or date-time, local time, or epoch seconds),
    as epoch seconds.

    Raises:
        typer.BadParameter: neither, naming both forms.
    """
    from gpushepherd.cli.report import parse_since, parse_when

    try:
        return time.time() - parse_since(text)
    except ValueError:
        pass
    try:
        return parse_when(text, "--since", None)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not allowed: a duration back from now (1h, 7d, 90m) or a time "
                                 "(2026-11-30, 2026-11-30T08:00, epoch seconds)", param_hint="--since") from None


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


def _fmt_t(t: float | None, zone: bool = True) -> str:
    """Epoch seconds ``t`` in this machine's local time, ``2026-12-07T09:20:00 UTC``: the
    zone's abbreviation named (``zone``; a queue column names it once, in its header:
    ``queue_header``); ``-`` for ``None``."""
    if t is None:
        return "-"
    local = time.localtime(t)
    return time.strftime("%Y-%m-%dT%H:%M:%S" + (" %Z" if zone else ""), local)


def policy_zone(raw: dict | None):
    """The time zone of a policy (parsed YAML): its ``clock.timezone``, UTC when it has
    none (or names one this machine does not know)."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    clock = (raw or {}).get("clock") if isinstance(raw, dict) else None
    name = (clock.get("timezone") if isinstance(clock, dict) else None) or "UTC"
    try:
        return ZoneInfo(str(name))
    except (ZoneInfoNotFoundError, ValueError):
        return ZoneInfo("UTC")


def fmt_zoned(t: float | None, tz) -> str:
    """Epoch seconds ``t`` as ``2026-12-06 09:30:00 CET`` in zone ``tz`` (its abbreviation
    labels it); ``-`` for ``None``."""
    from datetime import datetime

    return "-" if t is None else datetime.fromtimestamp(t, tz).strftime("%Y-%m-%d %H:%M:%S %Z")


#: keys of an audit row's ``detail`` that hold epoch seconds (shown as times)
AUDIT_TIME_KEYS = ("expires", "created", "begin", "deadline")


def constraints_text(j: dict) -> str:
    """A job view's placement constraints on one line (``-``: none; note 022):
    ``node_selector=zone=a,nvlink tolerations=dedicated=infer min_driver=535.104
    cache=llama(required) gpus_per_pod=2 same_node grace=30s``."""
    parts = []
    for key in ("node_selector", "tolerations"):
        if j.get(key):
            parts.append(f"{key}={','.join(j[key])}")
    if j.get("min_driver"):
        parts.append(f"min_driver={j['min_driver']}")
    if j.get("cache_key"):
        parts.append(f"cache={j['cache_key']}" + ("(required)" if j.get("cache_required") else "(preferred)"))
    if j.get("gpus_per_pod"):
        parts.append(f"gpus_per_pod={j['gpus_per_pod']}")
    if j.get("same_node"):
        parts.append("same_node")
    if j.get("require_island") is not None:
        parts.append(f"require_island={'yes' if j['require_island'] else 'no'}")
    if j.get("grace_period_s") is not None:
        parts.append(f"grace={j['grace_period_s']:g}s")
    return " ".join(parts) or "-"


def deadline_text(j: dict) -> str:
    """A job view's deadline, and ``AT RISK`` with the core's latest flag: the stage
    (submit, start) and the earliest end then (``-``: no deadline)."""
    if j.get("deadline") is None:
        return "-"
    flags = j.get("deadline_at_risk") or []
    if not flags:
        return _fmt_t(j["deadline"])
    _t, stage, end = flags[-1]
    return f"{_fmt_t(j['deadline'])}  AT RISK (at {stage}: ends {_fmt_t(end)} at the earliest)"


def _fmt_est(j: dict, zone: bool = True) -> str:
    """A planned start as a person should read it: ``<= T`` when it rests on time limits
    (jobs usually end before them: by T unless jobs that rank higher arrive or backfill
    first; note 043 measures how often),
    ``~ T`` when on runtime estimates, ``-`` when none can be planned."""
    t = j.get("estimated_start")
    if t is None:
        return "-"
    mark = "<=" if j.get("estimated_start_basis") == "time limits" else "~"
    return f"{mark} {_fmt_t(t, zone)}"


DataDirOpt = Annotated[Path, typer.Option("--data-dir", help="Logs, checkpoints and the SQLite database.", parser=path_param)]
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


def start_failure(data_dir: Path, db: str | None, policy: Path | None, unix: Path | None,
                  host: str) -> str | None:
    """Why ``shepherd server`` must refuse to start, found before it writes anything
    (note 084): a new data dir (no ``shepherd.db``, no ``--db``) without ``--policy`` or
    on a public address (it has no token yet); a ``--socket`` whose folder is missing,
    not a folder or not writable, or whose path is something other than a socket.
    ``None``: nothing found (the bind itself may still refuse, before the policy is
    logged). The policy file's validity is checked by the caller, with the loader."""
    from gpushepherd.daemon.auth import is_loopback
    from gpushepherd.daemon.unixsock import is_socket

    new = db is None and not (data_dir / "shepherd.db").exists()
    if new and policy is None:
        return f"no policy: pass --policy FILE (the data dir {str(data_dir)!r} has no database yet)"
    if new and not is_loopback(host):
        return (f"--host {host}: only a loopback address (127.0.0.1, ::1) while the database has no API token; "
                "create one first with `shepherd token create --user U --team T`")
    if unix is None:
        return None
    if unix.is_symlink() or (unix.exists() and not is_socket(unix)):
        return (f"--socket {unix}: cannot listen there: it exists and is not a socket: remove it or choose "
                "another --socket")
    folder = unix.parent
    if folder.resolve() == data_dir.resolve() and not folder.exists():
        return None  # the data dir the start makes (data_dir_failure checked it); both sides resolved
    if not folder.exists():
        return f"--socket {unix}: cannot listen there: {folder} does not exist"
    if not folder.is_dir():
        return f"--socket {unix}: cannot listen there: {folder} is not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"--socket {unix}: cannot listen there: {folder} is not writable by this user"
    return None


def missing_dirs(data_dir: Path) -> list[Path]:
    """The folders a start on ``data_dir`` would create: ``data_dir`` and its missing
    parents, deepest first (empty when it exists)."""
    made: list[Path] = []
    at = data_dir.absolute()
    while not at.exists() and at != at.parent:
        made.append(at)
        at = at.parent
    return made


#: what a start writes in a new data dir before it may still be refused (the database,
#: its SQLite companions and open lock, the data dir's lock, the socket)
START_FILES = ("shepherd.db", "shepherd.db-wal", "shepherd.db-shm", "shepherd.db-journal",
               "shepherd.db.open-lock", "server.lock", "shepherd.sock")


def unmake(made: list[Path]) -> None:
    """Undo a refused start in the data dir it created (``made``, from ``missing_dirs``):
    remove the files a start writes there (``START_FILES``) and the empty folders, then
    the folders it made, deepest first. A folder that existed before is never touched,
    nor anything else found in a made one (it then stays)."""
    if not made:
        return
    data_dir = made[0]
    for name in START_FILES:
        with contextlib.suppress(OSError):
            (data_dir / name).unlink()
    with contextlib.suppress(OSError):
        for sub in sorted(data_dir.rglob("*"), key=lambda q: len(q.parts), reverse=True):
            if sub.is_dir() and not sub.is_symlink():
                with contextlib.suppress(OSError):
                    sub.rmdir()  # empty only
    for folder in made:
        try:
            folder.rmdir()
        except OSError:
            return


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


def _tls_files(cert: Path | None, key: Path | None, host: str, insecure_http: bool) -> dict:
    """uvicorn's TLS options of ``--tls-cert`` / ``--tls-key`` (empty: plain HTTP), the
    pair loaded once here so that a bad file is one ``error:`` line before anything
    starts; plain HTTP on an address that is not loopback only with ``--insecure-http``
    (note 025).

    Raises:
        typer.Exit: one of the pair without the other, a file that does not load as a
            PEM certificate and its key, or a public address without TLS: exit 2.
    """
    import ssl

    from gpushepherd.cli.main import err
    from gpushepherd.daemon.auth import is_loopback

    if (cert is None) != (key is None):
        err.print(f"error: {'--tls-key' if key is None else '--tls-cert'}: missing: --tls-cert and --tls-key go "
                  "together", soft_wrap=True)
        raise typer.Exit(2)
    if cert is None:
        if not is_loopback(host) and not insecure_http:
            err.print(f"error: --host {host}: plain HTTP is not allowed on an address other than loopback (tokens "
                      "would cross the network in clear text): give --tls-cert FILE --tls-key FILE, or "
                      "--insecure-http behind a TLS-terminating proxy", soft_wrap=True)
            raise typer.Exit(2)
        if not is_loopback(host):
            err.print(f"warning: --host {host} --insecure-http: plain HTTP on a network address; tokens cross "
                      "the network in clear text unless a TLS-terminating proxy is in front", soft_wrap=True)
        return {}
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        err.print(f"error: --tls-cert {cert} --tls-key {key}: cannot be loaded as a PEM certificate and its "
                  f"private key: {getattr(exc, 'strerror', None) or exc}", soft_wrap=True)
        raise typer.Exit(2) from None
    return {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}


def _serve(config, sock, local_config, listener) -> list[int]:
    """Serve ``config`` on the TCP socket ``sock`` and, when given, ``local_config`` on
    the Unix socket of ``listener`` (a ``UnixListener``): two ``uvicorn.Server`` in one
    event loop (one server applies one TLS context to all its sockets, and the Unix
    socket has none). The TCP server takes the signals; the local one stops when it does,
    and the socket's file is removed (note 025). Returns the signals that stopped it:
    uvicorn would raise them again as it returns, which with the default SIGTERM action
    ended the process before the caller's ``Daemon.stop`` (stop snapshot, lock) ran - the
    caller raises them once it has stopped."""
    import asyncio
    import contextlib

    import uvicorn

    stopped_by: list[int] = []

    class Main(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            with super().capture_signals():
                try:
                    yield
                finally:
                    if listener is not None:
                        listener.unlink()
                    stopped_by.extend(self._captured_signals)
                    self._captured_signals.clear()  # raised by the caller, after its cleanup

    class Local(uvicorn.Server):
        def capture_signals(self):  # the TCP server's handlers stop both
            return contextlib.nullcontext()

    main = Main(config)
    if listener is None:
        main.run(sockets=[sock])
        return stopped_by
    other = Local(local_config)

    async def both() -> None:
        task = asyncio.create_task(other.serve(sockets=[listener.sock]))
        try:
            await main.serve(sockets=[sock])
        finally:
            other.should_exit = True
            await task

    asyncio.run(both())
    return stopped_by


def register(app: typer.Typer) -> None:
    """Add the server, client and token commands to ``app``."""
    from gpushepherd.cli.main import _console, _errors, err

    out = _console()
    token_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                            help="API tokens of the server (works on its database directly).")
    app.add_typer(token_app, name="token")

    @token_app.command("create")
    def token_create(user: Annotated[str, typer.Option("--user", "-u", help="The Unix user the token acts as.")],
                     team: Annotated[list[str], typer.Option("--team", "-A", help="A team whose jobs it may "
                                                             "submit, cancel and read logs of (repeat).")] = [],
                     admin: Annotated[bool, typer.Option("--admin", help="Any team and any user.")] = False,
                     expires: Annotated[Optional[float], typer.Option(
                         "--expires", metavar="DURATION", parser=duration_param(None), help="Refused (401, saying "
                         "when) after this long: 30d, 12h, 2w, or Slurm's D-HH:MM (default: never).")] = None,
                     scope: Annotated[str, typer.Option("--scope", help="api: the API as its user and teams; "
                                                        "metrics: GET /metrics only (a Prometheus scraper; no "
                                                        "--team).")] = "api",
                     data_dir: DataDirOpt = Path("shepherd-data"), db: DbOpt = None) -> None:
        """Create a token and print it once (stdout; the database keeps only its hash)."""
        from gpushepherd.daemon.auth import SCOPES, unix_user_exists

        if scope not in SCOPES:
            err.print(f"error: --scope: {scope!r} is not allowed: {' or '.join(SCOPES)}", soft_wrap=True)
            raise typer.Exit(2)
        if scope == "metrics" and (team or admin):
            err.print(f"error: --scope metrics: not allowed with {'--admin' if admin else '--team'}: a scrape token "
                      "reads /metrics only", soft_wrap=True)
            raise typer.Exit(2)
        if scope == "api" and not team and not admin:
            err.print("error: --team: give at least one team (or --admin, or --scope metrics)", soft_wrap=True)
            raise typer.Exit(2)
        from gpushepherd.policy.schema import user_name_refusal

        why = user_name_refusal(user)  # as a job's user and teams.X.members take it
        if why is not None:
            err.print(f"error: --user: {why}", soft_wrap=True)
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
        until = None if expires is None else time.time() + expires
        token_id, token = store.create_token(user, team, admin, expires=until, scope=scope)
        err.print(f"token {token_id}: user {user}, teams {', '.join(team) or '-'}{', admin' if admin else ''}"
                  f"{', scope metrics' if scope == 'metrics' else ''}, "
                  f"{'expires ' + fmt_zoned(until, policy_zone(logged)) if until is not None else 'never expires'} "
                  f"(database {store.engine.url.render_as_string(hide_password=True)}); it is shown once, "
                  "only its SHA-256 is stored", soft_wrap=True)
        if scope == "api" and not admin and not unix_user_exists(user):
            err.print(f"note: {user!r} is not a Unix user on this machine: the token acts as that name (a policy's "
                      "teams.X.members and the socket know Unix users only)", soft_wrap=True)
        print(token)

    @token_app.command("rotate")
    def token_rotate(token_id: Annotated[int, typer.Argument(metavar="ID")],
                     data_dir: DataDirOpt = Path("shepherd-data"), db: DbOpt = None) -> None:
        """Replace a token by a new secret (printed once) with the same user, teams, admin flag, scope and
        lifetime (counted from now); the old one is revoked at once."""
        store = _store(data_dir, db)
        out_ = store.rotate_token(token_id)
        tz = policy_zone(store.last_policy())
        if out_ is None:
            err.print(f"error: token {token_id}: no such token, or already revoked (see `shepherd token list`)",
                      soft_wrap=True)
            raise typer.Exit(2)
        new_id, token, row = out_
        err.print(f"token {token_id}: revoked; token {new_id} replaces it: user {row['user']}, teams "
                  f"{', '.join(row['teams']) or '-'}{', admin' if row['admin'] else ''}, "
                  f"{'expires ' + fmt_zoned(row['expires'], tz) if row['expires'] is not None else 'never expires'}; "
                  "it is shown once", soft_wrap=True)
        print(token)

    @token_app.command("list")
    def token_list(data_dir: DataDirOpt = Path("shepherd-data"), db: DbOpt = None) -> None:
        """Tokens: id, user, teams, admin, scope, created, expires, revoked (times in the zone of the
        policy the database ran last, clock.timezone; UTC without one)."""
        store = _store(data_dir, db)
        tz = policy_zone(store.last_policy())
        table = SafeTable("ID", "USER", "TEAMS", "ADMIN", "SCOPE", f"CREATED ({tz.key})", f"EXPIRES ({tz.key})",
                          f"REVOKED ({tz.key})", box=None)
        now = time.time()
        for t in store.tokens():
            expires = fmt_zoned(t["expires"], tz) + (" (expired)" if t["expires"] is not None and t["expires"] <= now
                                                     else "")
            table.add_row(str(t["id"]), t["user"], ",".join(t["teams"]) or "-", "yes" if t["admin"] else "no",
                          t["scope"], fmt_zoned(t["created"], tz), expires, fmt_zoned(t["revoked"], tz))
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
                                                              "last one this database ran).", parser=path_param)] = None,
               host: Annotated[str, typer.Option("--host", help="Address to listen on; other than loopback "
                                                 "only with tokens.")] = "127.0.0.1",
               port: Annotated[int, typer.Option("--port", min=1, max=65535)] = DEFAULT_PORT,
               auth: Annotated[str, typer.Option("--auth", help="auto: tokens required once one exists; "
                                                 "required: always.")] = "auto",
               inventory: Annotated[str, typer.Option("--inventory", help="GPUs from auto (NVML when it finds a "
                                                      "GPU, else static), nvml or static (the policy's node, "
                                                      "samples scripted by <data-dir>/gpu-samples.json).")] = "auto",
               sample_every: Annotated[float, typer.Option("--sample-every", metavar="DURATION", parser=duration_param(
                   lo=0.1, hi=86400), help=f"Time between GPU samples: {SECONDS_FORMS}.")] = 10.0,
               node: Annotated[Optional[str], typer.Option("--node", help="The policy's node this server is "
                                                           "(default: the policy's only node).")] = None,
               idle_threshold_pct: Annotated[float, typer.Option(
                   "--idle-threshold-pct", min=0, max=100, help="/metrics: a job's GPUs are allocated-but-idle when "
                   "its utilisation stays below this percent (classes without idle_stop).")] = 5.0,
               idle_after: Annotated[float, typer.Option(
                   "--idle-after", metavar="DURATION", parser=duration_param(), help="/metrics: ... for this long (classes without "
                   f"idle_stop): {SECONDS_FORMS}.")] = 600.0,
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
               requeue_backoff: Annotated[float, typer.Option("--requeue-backoff", metavar="DURATION", parser=duration_param(
                   zero=True, hi=300), help="Time before a lost run is requeued, doubled for each further one: "
                   f"{SECONDS_FORMS}.")] = 2.0,
               db_busy_timeout: Annotated[float, typer.Option("--db-busy-timeout", metavar="DURATION", parser=duration_param(
                   lo=0.1, hi=3600), help=f"SQLite: how long a write waits for another writer's lock: "
                   f"{SECONDS_FORMS}.")] = 30.0,
               scrape_allow: Annotated[Optional[list[str]], typer.Option("--scrape-allow", help="A network (CIDR) "
                                                                         "or host a service's --metrics-url may "
                                                                         "name besides loopback and its replicas' "
                                                                         "nodes (repeatable).")] = None,
               header_timeout: Annotated[float, typer.Option("--header-timeout", metavar="DURATION", parser=duration_param(
                   lo=0.1, hi=3600), help="How long a client has to send a request's headers (then closed; 30 s "
                   f"at most for its body): {SECONDS_FORMS}.")] = 10.0,
               max_connections: Annotated[int, typer.Option("--max-connections", min=1, max=1_000_000, help="Open "
                                                            "HTTP connections at most (never more than the "
                                                            "descriptor limit less 128).")] = 1000,
               ready_max_step_age: Annotated[float, typer.Option(
                   "--ready-max-step-age", min=0.1, max=86400, help="/readyz answers 503 once the scheduling loop "
                   "has completed no step for this many seconds.")] = 30.0,
               dcgm_names: Annotated[bool, typer.Option(
                   "--dcgm-names", help="/metrics: also export GPU samples under DCGM-exporter's names "
                   "(DCGM_FI_DEV_*); off by default, so a node running dcgm-exporter gets no duplicate "
                   "series.")] = False,
               tls_cert: Annotated[Optional[Path], typer.Option(
                   "--tls-cert", help="Serve HTTPS with this certificate (PEM, chain after it); with "
                   "--tls-key.", parser=path_param)] = None,
               tls_key: Annotated[Optional[Path], typer.Option(
                   "--tls-key", help="The private key (PEM) of --tls-cert.", parser=path_param)] = None,
               insecure_http: Annotated[bool, typer.Option(
                   "--insecure-http", help="Allow plain HTTP on an address other than loopback (tokens cross "
                   "the network in clear text: only behind a TLS-terminating proxy).")] = False,
               socket_path: Annotated[Optional[str], typer.Option(
                   "--socket", metavar="PATH", help="The local Unix socket (no token: the kernel names the "
                   "caller's user); default <data-dir>/shepherd.sock; '' for none.")] = None) -> None:
        """Run the scheduler daemon on this server: the HTTP(S) API (loopback only until tokens exist - where
        a root server takes no action from a tokenless request, note 084 - HTTPS
        or --insecure-http elsewhere) and a local Unix socket, <data-dir>/shepherd.sock, where the caller
        is the Unix user the kernel names (design note 025)."""
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
        from gpushepherd.backends import BACKENDS
        if backend not in BACKENDS:
            err.print(f"error: --backend: {backend!r} is not allowed: {', '.join(BACKENDS[:-1])} or {BACKENDS[-1]}",
                      soft_wrap=True)
            raise typer.Exit(2)
        k8s = dict(kubeconfig=kubeconfig, scheduler_name=k8s_scheduler_name, node_selector=k8s_node_selector,
                   namespace=k8s_namespace, image=k8s_image)
        from sqlalchemy.exc import SQLAlchemyError

        from gpushepherd.daemon.migrate import SchemaError
        from gpushepherd.daemon.unixsock import SOCKET_NAME, UnixListener, peer_protocol

        # everything that can refuse the start is checked before anything is written (note 084):
        # the data dir, the policy file, the socket's place, the port; a refused start leaves no trace
        unix = None if socket_path == "" else Path(socket_path) if socket_path else \
            data_dir.resolve() / SOCKET_NAME
        why = data_dir_failure(data_dir)
        if why:
            err.print(f"error: {why}", soft_wrap=True)
            raise typer.Exit(2)
        tls = _tls_files(tls_cert, tls_key, host, insecure_http)
        why = start_failure(data_dir, db, policy, unix, host)
        if why:
            err.print(f"error: {why}", soft_wrap=True)
            raise typer.Exit(2)
        if policy is not None:
            from gpushepherd.policy.load import policy_from_dict, read_policy_dict
            with _errors():  # the server's loader, as the start will run it (an invalid file: one error line)
                policy_from_dict(read_policy_dict(policy), source=str(policy))
        from gpushepherd.daemon.connlimit import guarded_protocol, listen_socket
        try:  # bound before the data dir is touched: a port in use creates no database or lock file
            sock, listen = listen_socket(host, port)
        except OSError as exc:
            err.print(f"error: --host {host} --port {port}: cannot listen there: {exc.strerror or exc}",
                      soft_wrap=True)
            raise typer.Exit(2) from None
        made = missing_dirs(data_dir) if db is None else []  # a refused start removes what it made (note 084)
        try:
            daemon = Daemon(data_dir, db, policy, inventory=inventory, sample_every=sample_every, node=node,
                            idle_threshold_pct=idle_threshold_pct, idle_after_s=idle_after,
                            backend=backend, slurm_partition=slurm_partition, ray_address=ray_address, k8s=k8s,
                            max_requeues=max_requeues, requeue_backoff_s=requeue_backoff,
                            busy_timeout_s=db_busy_timeout, scrape_allow=scrape_allow,
                            ready_max_step_age_s=ready_max_step_age, dcgm_names=dcgm_names)
        except (SchemaError, ValueError) as exc:  # ValueError: SHEPHERD_RUN_AS, SHEPHERD_CGROUP (note 023)
            sock.close()
            unmake(made)
            err.print(f"error: {exc}", soft_wrap=True)
            raise typer.Exit(2) from None
        except (SQLAlchemyError, OSError) as exc:
            sock.close()
            unmake(made)
            err.print(f"error: {db_failure(data_dir, db, exc)}", soft_wrap=True)
            raise typer.Exit(2) from None
        if not is_loopback(host):
            if not daemon.store.active_tokens():
                sock.close()
                err.print(f"error: --host {host}: only a loopback address (127.0.0.1, ::1) while the database has "
                          "no API token; create one first with `shepherd token create --user U --team T`",
                          soft_wrap=True)
                raise typer.Exit(2)
            auth = "required"  # reachable from other machines: never open, even if every token is revoked
        if tls:
            listen = "https" + listen[len("http"):]
        bound: list = []  # the Unix socket's listener, once bound

        def bind_socket() -> None:
            """Bind the Unix socket once the data dir's lock is held (a stale file is
            removed, never a live one) and before the policy is taken: a socket that
            cannot be bound refuses the start with nothing logged (note 084)."""
            try:
                bound.append(UnixListener(unix))
            except OSError as exc:
                raise DaemonError(f"--socket {unix}: cannot listen there: {exc.strerror or exc}") from None

        with _errors():
            try:
                daemon.start(listen=listen + (f"; local socket {unix}" if unix else ""),
                             prepare=bind_socket if unix is not None else None)
            except BaseException as exc:
                sock.close()
                for listener in bound:
                    listener.close()
                if made and not isinstance(exc, LockHeld):  # LockHeld: a server that raced into it owns it
                    daemon.store.close()
                    unmake(made)
                if isinstance(exc, (LockHeld, DaemonError, BackendError)):
                    err.print(f"error: {exc}", soft_wrap=True)
                    raise typer.Exit(2) from None
                if isinstance(exc, SQLAlchemyError):
                    err.print(f"error: {db_failure(data_dir, db, exc)}", soft_wrap=True)
                    raise typer.Exit(2) from None
                raise
        listener = bound[0] if bound else None
        try:
            app_ = make_app(daemon, auth_required=auth == "required")
            from gpushepherd.daemon.tuning import tune_server_process

            tune_server_process()  # the garbage collector's settings (note 032)
            guarded = guarded_protocol(header_timeout, max(30.0, header_timeout), max_connections)
            # WebSockets (a pty job's terminal, note 041) by the websockets package, sans-I/O
            from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

            # no proxy headers: a client's address is its socket's (a local user naming another's
            # port in X-Forwarded-For was traced as that user, note 087; the audit shows the real one)
            config = uvicorn.Config(app_, host=host, port=port, log_level="warning", timeout_keep_alive=5,
                                    http=guarded, ws=WebSocketsSansIOProtocol, proxy_headers=False, **tls)
            local = None
            if listener is not None:  # a WebSocket's protocol reads the peer of its connection too
                local = uvicorn.Config(app_, log_level="warning", timeout_keep_alive=5, lifespan="off",
                                       proxy_headers=False, http=peer_protocol(guarded),
                                       ws=peer_protocol(WebSocketsSansIOProtocol))
            stopped_by = _serve(config, sock, local, listener)
        finally:
            sock.close()
            if listener is not None:
                listener.close()
            daemon.stop()
        for sig in reversed(stopped_by):  # as uvicorn would have: the exit a service manager expects
            if sig == signal.SIGINT:
                raise typer.Exit(130)
            signal.raise_signal(sig)

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
                                                            "mem, mig:1g.10gb, time_slice[:N], "
                                                            "mps:N[:PCT[:PROCS]].")] = None,
               gpu_type: Annotated[list[str], typer.Option("--gpu-type", help="Allowed GPU type (repeat).")] = [],
               gpu_mem: Annotated[int, typer.Option("--gpu-mem", min=0, help="GPU memory, MiB.")] = 0,
               time_limit: Annotated[Optional[float], typer.Option("--time", "-t", metavar="DURATION", parser=TIME_LIMIT,
                                                                   help=TIME_HELP)] = None,
               preemptible: Annotated[Optional[bool], typer.Option("--preemptible/--no-preemptible")] = None,
               checkpointable: Annotated[Optional[bool], typer.Option("--checkpointable/--no-checkpointable")] = None,
               env: Annotated[list[str], typer.Option("--env", help="KEY=VALUE for the job (repeat).")] = [],
               chdir: Annotated[Path, typer.Option("--chdir", "-D", parser=path_param)] = Path("."),
               shell: Annotated[bool, typer.Option("--shell", help="Run COMMAND with /bin/sh -c.")] = False,
               array: Annotated[Optional[str], typer.Option("--array", "-a", help="Job array: 0-99%8 (indices "
                                                            "0..99, at most 8 at once), 1,3,5-7; each task gets "
                                                            "$SHEPHERD_ARRAY_TASK_ID.")] = None,
               max_retries: Annotated[int, typer.Option("--max-retries", min=0, help="Array: runs of a "
                                                        "FAILED chunk again.")] = 2,
               name: Annotated[str, typer.Option("--name", "-J", help=f"Job name: {JOB_NAME_RULE}.")] = "",
               dependency: Annotated[str, typer.Option("--dependency", "-d", help=DEPENDENCY_HELP)] = "",
               begin: Annotated[Optional[str], typer.Option("--begin", "-b", metavar="TIME", help=BEGIN_HELP)] = None,
               hold: Annotated[bool, typer.Option("--hold", "-H", help="Submit held: not scheduled until "
                                                  "`shepherd release JOB`.")] = False,
               # placement constraints, deadline, estimate (note 022)
               constraint: Annotated[list[str], typer.Option("--constraint", "--node-selector", "-C",
                                                             metavar="LABEL[=VALUE]", help="A node label the job "
                                                             "needs (repeat, or join with &: zone=a&nvlink); a "
                                                             "bare LABEL is a Slurm feature.")] = [],
               toleration: Annotated[list[str], typer.Option("--toleration", metavar="TAINT", help="A node taint "
                                                             "the job tolerates (repeat): KEY=VALUE, KEY (any "
                                                             "value) or KEY=VALUE:EFFECT, as the policy's "
                                                             "taints.")] = [],
               min_driver: Annotated[str, typer.Option("--min-driver", metavar="VERSION", help="Lowest NVIDIA "
                                                       "driver version (535.104).")] = "",
               cache_key: Annotated[str, typer.Option("--cache-key", metavar="KEY", help="A model or dataset "
                                                      "the job reads: nodes that hold it (policy: cached) "
                                                      "are preferred.")] = "",
               cache_required: Annotated[bool, typer.Option("--cache-required", help="Only nodes that hold "
                                                            "--cache-key.")] = False,
               deadline: Annotated[Optional[float], typer.Option("--deadline", metavar="TIME", parser=time_point,
                                                                 help="When the job must be done (Slurm's "
                                                                 "--deadline): 2025-06-01T18:00, 18:00, "
                                                                 "now+2hours, tomorrow; local time unless Z or "
                                                                 "+HH:MM. Flagged AT RISK (shepherd show) when "
                                                                 "it cannot end by it.")] = None,
               estimate: Annotated[Optional[float], typer.Option("--estimate", metavar="DURATION",
                                                                 parser=ESTIMATE, help="Expected run time, for "
                                                                 "planning and backfill (default: the time "
                                                                 "limit); the forms of --time, a bare number is "
                                                                 "minutes.")] = None,
               gpus_per_task: Annotated[Optional[int], typer.Option("--gpus-per-task", min=1, help="A gang: GPUs "
                                                                    "of each task (pod), --gpus being the total; "
                                                                    "each task on one node, tasks may share "
                                                                    "one (Slurm's --gpus-per-task).")] = None,
               same_node: Annotated[bool, typer.Option("--same-node", help="All GPUs on one node (Slurm's "
                                                       "-N 1).")] = False,
               require_island: Annotated[Optional[bool], typer.Option(
                   "--require-island/--no-require-island", help="All GPUs inside one NVLink island of one node: "
                   "the job waits rather than span islands (default: its class's require_island).")] = None,
               grace: Annotated[Optional[float], typer.Option("--grace", metavar="DURATION", parser=GRACE,
                                                              help="The grace period its stops get (preemption, "
                                                              "time limit): at most its class's, which is the "
                                                              "default; only a job that checkpoints gets one. "
                                                              + SECONDS_FORMS + ".")] = None,
               mem: Annotated[Optional[str], typer.Option("--mem", metavar="SIZE", help="Host memory limit of the "
                                                          "job's processes together (its cgroup's memory.max): "
                                                          "100M, 4G, 1.5G, a bare number is MiB; past it the job "
                                                          "ends OUT_OF_MEMORY. A limit, not scheduled on.")]
               = None,
               cpus: Annotated[Optional[float], typer.Option("--cpus", min=0.01, help="CPU limit of the job's "
                                                             "processes together, in CPUs (its cgroup's "
                                                             "cpu.max).")] = None,
               idempotency_key: Annotated[Optional[str], typer.Option(
                   "--idempotency-key", metavar="KEY", help="Submit at most once under KEY (the Idempotency-Key "
                   "header): a retry with the same KEY and job returns the job first made. Default: a new random "
                   "key, printed when the server cannot confirm the submission in time.")] = None,
               server: ServerOpt = None, token: TokenOpt = None) -> None:
        """Submit a job: `shepherd submit --class batch --team ml --gpus 1 -- python train.py` (a batch
        script with #SBATCH lines: `shepherd sbatch FILE`)."""
        script_not_command(cmd, chdir, shell)
        body = job_body(cls=cls, team=team, user=user, token=token, gpus=gpus, gpu_type=gpu_type, command=cmd,
                        shell=shell, chdir=chdir, time_limit_s=time_limit, project=project, array=array,
                        max_retries=max_retries, name=name, dependency=dependency, begin=begin, hold=hold,
                        server=server)
        body.update(preemptible=preemptible, checkpointable=checkpointable)
        body.update(constraint_fields(constraint=constraint, tolerations=toleration, min_driver=min_driver,
                                      cache_key=cache_key, cache_required=cache_required, deadline=deadline,
                                      estimate_s=estimate, gpus_per_pod=gpus_per_task, same_node=same_node,
                                      grace_s=grace, require_island=require_island))
        body.update(resource_fields(share=share, gpu_mem=gpu_mem, env=env, mem=mem, cpus=cpus))
        import uuid

        key = idempotency_key if idempotency_key is not None else f"shepherd-submit-{uuid.uuid4()}"
        argv = sys.argv[1:]  # the command line as typed, for the retry it prints (not under a test's runner)
        post_job(server, token, body, idempotency_key=key,
                 retry_argv=["shepherd", *argv] if argv[:1] == ["submit"] else None)

    @app.command("queue", help=QUEUE_HELP)
    def queue(state: Annotated[Optional[str], typer.Option("--state", "-t", help="Only these states, a comma "
                                                           "list: ours or Slurm's (PD, R, CG, CD, F, CA, TO), "
                                                           "'all'.")] = None,
              all_: Annotated[bool, typer.Option("--all", "-a", help="Also ended jobs.")] = False,
              user: Annotated[Optional[str], typer.Option("--user", "-u", help="Only these users' jobs "
                                                          "(a comma list).")] = None,
              me: Annotated[bool, typer.Option("--me", help="Only my jobs: the token's user (GET /whoami), "
                                               "$USER without tokens.")] = False,
              team: Annotated[Optional[str], typer.Option("--account", "--team", "-A", help="Only these teams' "
                                                          "jobs (a comma list).")] = None,
              name: Annotated[Optional[str], typer.Option("--name", "-n", help="Only jobs of these names "
                                                          "(a comma list).")] = None,
              fmt: Annotated[Optional[str], typer.Option("--format", "-o", metavar="FIELDS", help="Columns, a "
                                                         "comma list of the fields below.")] = None,
              as_json: Annotated[bool, typer.Option("--json", help="A JSON list of objects, one per job, keyed "
                                                    "by field name (raw values: epoch seconds, null).")] = False,
              start: Annotated[bool, typer.Option("--start", help="Pending jobs with their estimated start, "
                                                  "earliest first (squeue --start).")] = False,
              server: ServerOpt = None, token: TokenOpt = None) -> None:
        _queue(out, err, server, token, state=state, all_=all_, user=user, me=me, team=team, name=name, fmt=fmt,
               as_json=as_json, start=start)

    @app.command("show")
    def show(job_id: Annotated[str, typer.Argument(metavar="JOB")], server: ServerOpt = None,
             token: TokenOpt = None) -> None:
        """One job: fields, its history of transitions and why it waits now."""
        j = _request(server, "GET", _job_path(job_id), token=token).json()
        if j.get("array"):
            for key in ("id", "name", "array", "state", "class", "team", "user", "project", "gpus", "share", "throttle",
                        "max_retries", "retries_used", "running", "pending", "failed_indices", "cancelled_indices",
                        "command", "cwd"):
                out.print(_safe(f"{key}: {_shown(j, key)}"), markup=False)
            out.print(f"progress: {j['done']}/{j['tasks']} done")
            out.print(_safe(f"constraints: {constraints_text(j)}"), markup=False)
            out.print(_safe(f"deadline: {deadline_text(j)}"), markup=False)
            out.print(f"submit_time: {_fmt_t(j['submit_time'])}")
            out.print("children (index: attempts):")
            for index, ids in j["children"].items():
                out.print(f"  {index}: {' '.join(ids)}")
            return
        for key in ("id", "name", "state", "reason", "class", "team", "user", "project", "gpus", "share", "placement",
                    "time_limit_s", "priority", "nice", "runs", "preemptions", "lost_runs", "failure", "exit_code", "launch_error", "command",
                    "cwd", "stdout", "stderr", "checkpoint_dir"):
            out.print(_safe(f"{key}: {_shown(j, key)}"), markup=False)
        if j.get("dependency") or j.get("begin_time") is not None or j.get("held"):  # kept (note 021)
            out.print(_safe(f"dependency: {j.get('dependency') or '-'}  begin_time: {_fmt_t(j.get('begin_time'))}  "
                            f"held: {'yes' if j.get('held') else 'no'}"), markup=False)
        if j.get("sampled_at") is not None or j.get("peak_gpu_mem_mib"):
            util = "-" if j.get("gpu_util_pct") is None else f"{j['gpu_util_pct']:.0f}%"
            over = "  OVER DECLARED" if j.get("over_declared_mem") else ""
            out.print(f"gpu: util {util}, memory {_num(j.get('gpu_mem_mib'))} MiB, peak "
                      f"{_num(j.get('peak_gpu_mem_mib'))} of {_num(j.get('declared_gpu_mem_mib') or None)} MiB "
                      f"declared{over} (sampled {_fmt_t(j.get('sampled_at'))})")
        out.print(_safe(f"constraints: {constraints_text(j)}"), markup=False)
        out.print(_safe(f"deadline: {deadline_text(j)}"), markup=False)
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
            factors = j.get("priority_factors")
            if factors:  # sprio's columns, NICE included (note 039)
                out.print("priority " + _points(factors["priority"]) + " = " + (" + ".join(
                    f"{k} {_points(v)}" for k, v in factors.items() if k not in ("priority", "nice") and v) or "0")
                    + (f" - nice {_points(factors['nice'])}" if factors.get("nice") else ""), markup=False)
        elif j["placement"]:  # a preempted one says for whom (Preempted(by job 7, class ...))
            why = f": {j['reason']}" if j.get("reason") else ""
            out.print(_safe(f"job {j['id']} is {j['state']} on {j['placement']}{why}"), markup=False)
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

    def _act(kind: str, job_ids: list[str], server, token, **body) -> None:
        for job_id in job_ids:
            if kind == "update":
                r = _request(server, "PATCH", _job_path(job_id), token=token, json=body).json()
            else:
                r = _request(server, "POST", _job_path(job_id, f"/{kind}"), token=token).json()
            out.print(_safe(f"job {r['id']}: {r['state']}" + (f" ({r['reason']})" if r.get("reason") else "")),
                      markup=False)

    @app.command("hold")
    def hold(job_ids: Annotated[list[str], typer.Argument(metavar="JOB...")], server: ServerOpt = None,
             token: TokenOpt = None) -> None:
        """Hold pending jobs (scontrol hold): not scheduled until released (reason JobHeldUser).
        Jobs waiting for a dependency or begin time, or submitted with --hold; one already queued in
        the scheduler is refused (design note 021)."""
        _act("hold", job_ids, server, token)

    @app.command("release")
    def release(job_ids: Annotated[list[str], typer.Argument(metavar="JOB...")], server: ServerOpt = None,
                token: TokenOpt = None) -> None:
        """Release held jobs (scontrol release)."""
        _act("release", job_ids, server, token)

    @app.command("requeue")
    def requeue(job_ids: Annotated[list[str], typer.Argument(metavar="JOB...")], server: ServerOpt = None,
                token: TokenOpt = None) -> None:
        """Requeue running jobs (scontrol requeue): stopped (stop signal, grace period) and queued
        again with their id and submit time."""
        _act("requeue", job_ids, server, token)

    @app.command("update")
    def update(job_ids: Annotated[list[str], typer.Argument(metavar="JOB...")],
               time_limit: Annotated[Optional[float], typer.Option("--time", "-t", metavar="DURATION",
                                                                   parser=TIME_LIMIT, help=TIME_HELP)] = None,
               name: Annotated[Optional[str], typer.Option("--name", "-J", help=f"Job name: {JOB_NAME_RULE}.")]
               = None,
               begin: Annotated[Optional[str], typer.Option("--begin", "-b", metavar="TIME", help=BEGIN_HELP)]
               = None,
               nice: Annotated[Optional[int], typer.Option(
                   "--nice", metavar="N", help="Priority adjustment (Slurm's nice): N score points off the job's "
                   "priority; only an admin may lower it (a negative N moves the job up).")] = None,
               server: ServerOpt = None, token: TokenOpt = None) -> None:
        """Change jobs (scontrol update). Time limit (--time) and nice (--nice) of pending and
        running jobs: a user may lower the limit and raise the nice, an admin also the reverse (the
        limit up to the class's max runtime; design note 039). Name and begin time of jobs held or
        waiting for a dependency or begin time (design note 021)."""
        body = {k: v for k, v in (("time_limit_s", time_limit), ("nice", nice), ("name", name), ("begin", begin))
                if v is not None}
        if not body:
            raise typer.BadParameter("nothing to change: give --time, --nice, --name or --begin")
        _act("update", job_ids, server, token, **body)

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
        listed = _request(server, "GET", "/nodes", token=token).json()
        for n in listed:
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
        for detail, run_as in dict.fromkeys((n["containment"]["detail"], n["containment"]["run_as"])
                                            for n in listed if n.get("containment")):
            out.print(_safe(f"containment: {detail}"), markup=False, soft_wrap=True)
            out.print(_safe(f"jobs: {run_as}"), markup=False, soft_wrap=True)

    @app.command("audit")
    def audit(since: Annotated[Optional[str], typer.Option("--since", metavar="WHEN", help="Only entries since "
                                                           "then: a duration back from now (1h, 7d, 90m) or a "
                                                           "time (2026-11-30, 2026-11-30T08:00, epoch "
                                                           "seconds).")] = None,
              user: Annotated[Optional[str], typer.Option("--user", "-u", help="Only these users' entries (who "
                                                          "acted), a comma list.")] = None,
              action: Annotated[Optional[str], typer.Option("--action", help="Only these actions, a comma list "
                                                            "(submit, cancel, policy-apply, token-create, "
                                                            "token-use, ...).")] = None,
              limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=100_000, help="The newest this "
                                                 "many.")] = 1000,
              as_json: Annotated[bool, typer.Option("--json", help="A JSON list of the entries (raw values: "
                                                    "epoch seconds).")] = False,
              server: ServerOpt = None, token: TokenOpt = None) -> None:
        """The audit log: who (user, uid, address) did what (submit, cancel, policy apply, token create and use),
        and how it ended. An admin token sees every entry, a team token its teams' (design note 023)."""
        import json

        params: dict[str, Any] = {"limit": limit}
        if since is not None:
            params["since"] = since_epoch(since)
        if user is not None:
            params["user"] = user
        if action is not None:
            params["action"] = action
        entries = _request(server, "GET", "/audit", token=token, params=params).json()
        if as_json:
            sys.stdout.write(json.dumps(entries, indent=2) + "\n")
            return
        # times in the policy's zone (clock.timezone), named in the header and each cell
        tz = policy_zone(_request(server, "GET", "/policy", token=token).json().get("policy"))
        table = SafeTable(f"TIME ({tz.key})", "ACTION", "OUTCOME", "USER", "UID", "FROM", "TEAM", "TARGET", "DETAIL",
                          box=None)
        for e in entries:
            detail = " ".join(f"{k}={fmt_zoned(v, tz) if k in AUDIT_TIME_KEYS and isinstance(v, (int, float)) else v}"
                              for k, v in e["detail"].items())
            table.add_row(fmt_zoned(e["t"], tz), e["action"], e["outcome"], e["user"] or "-", _num(e["uid"]),
                          e["address"] or "-", e["team"] or "-", e["target"] or "-", detail or "-")
        out.print(table)

    @app.command("usage")
    def usage(server: ServerOpt = None, token: TokenOpt = None) -> None:
        """Per team: GPUs in use, decayed usage and fair-share factor (sshare)."""
        table = SafeTable("TEAM", "GPUS IN USE", "DECAYED GPU-H", "FAIR-SHARE", box=None)
        for t in _request(server, "GET", "/usage", token=token).json()["teams"]:
            table.add_row(t["team"], f"{t['gpus_in_use']:g}", f"{t['decayed_usage_gpu_s'] / 3600:.2f}",
                          f"{t['fair_share_factor']:.3f}")
        out.print(table)


# ---------------------------------------------------------------- shepherd queue (note 020)
#: ``queue``'s fields whose cells are times: the zone is named once, in the header, when
#: every time of the column is in the same one (``queue_header``)
QUEUE_TIMES = {"start": lambda j: _fmt_est(j, zone=False), "submit": lambda j: _fmt_t(j.get("submit_time"), False)}
#: Slurm's compact state codes (squeue's %t) of our states
SHORT_STATE = {"PENDING": "PD", "RUNNING": "R", "PREEMPTING": "CG", "STOPPING": "CG", "COMPLETED": "CD",
               "FAILED": "F", "CANCELLED": "CA", "TIMEOUT": "TO", "REJECTED": "RJ"}


def _prio(j: dict) -> str:
    return "-" if j.get("priority") is None else f"{j['priority']:.3f}"


#: ``queue``'s fields: name -> (header, raw value for --json, text for the table, what it is)
QUEUE_FIELDS: dict[str, tuple[str, Any, Any, str]] = {
    "id": ("JOBID", lambda j: j["id"], lambda j: f"{j['id']}_[{j['array']}]" if j.get("array") else j["id"],
           "job id (an array: ID_[INDICES])"),
    "name": ("NAME", lambda j: j.get("name") or "", lambda j: j.get("name") or "-", "job name (submit -J)"),
    "array": ("ARRAY", lambda j: j.get("array"), lambda j: j.get("array") or "-", "an array's indices (0-99%8)"),
    "class": ("CLASS", lambda j: j["class"], lambda j: j["class"], "workload class (Slurm's partition)"),
    "team": ("TEAM", lambda j: j["team"], lambda j: j["team"], "team (Slurm's account)"),
    "user": ("USER", lambda j: j["user"], lambda j: j["user"] or "-", "user"),
    "project": ("PROJECT", lambda j: j.get("project") or "", lambda j: j.get("project") or "-",
                "showback project (Slurm's wckey)"),
    "gpus": ("GPUS", lambda j: j["gpus"], lambda j: j["share"] or str(j["gpus"]), "whole GPUs, or the share"),
    "share": ("SHARE", lambda j: j.get("share"), lambda j: j.get("share") or "-", "part of one GPU"),
    "state": ("STATE", lambda j: j["state"], lambda j: j["state"], "state (PENDING, RUNNING, ...)"),
    "st": ("ST", lambda j: SHORT_STATE.get(j["state"], j["state"]), lambda j: SHORT_STATE.get(j["state"], j["state"]),
           "Slurm's state code (PD, R, CG, CD, F, CA, TO; RJ: rejected)"),
    "reason": ("REASON / PLACEMENT", lambda j: j.get("reason") or j.get("placement"),
               lambda j: j.get("reason") or j.get("placement") or "",
               "why it waits, or where it runs (squeue's NODELIST(REASON)); never cut"),
    "placement": ("PLACEMENT", lambda j: j.get("placement"), lambda j: j.get("placement") or "-",
                  "node:GPUs it holds"),
    "start": ("EST. START", lambda j: j.get("estimated_start"), _fmt_est,
              "estimated start: <= T on time limits (by T unless jobs that rank higher arrive or backfill first), "
              "~ T on estimates"),
    "start_basis": ("START BASIS", lambda j: j.get("estimated_start_basis"),
                    lambda j: j.get("estimated_start_basis") or "-", "what the estimate rests on"),
    "submit": ("SUBMIT", lambda j: j.get("submit_time"), lambda j: _fmt_t(j.get("submit_time")), "submit time"),
    "priority": ("PRIORITY", lambda j: j.get("priority"), _prio, "priority (multifactor)"),
    "runs": ("RUNS", lambda j: j.get("runs"), lambda j: _num(j.get("runs")), "runs started"),
}
#: other names a Slurm user types (squeue --Format) -> ours
QUEUE_ALIASES = {"jobid": "id", "jobname": "name", "partition": "class", "account": "team", "wckey": "project",
                 "statecompact": "st", "statelong": "state", "nodelist": "placement", "start_time": "start",
                 "starttime": "start", "submit_time": "submit", "submittime": "submit", "gres": "gpus",
                 "tres": "gpus"}
QUEUE_DEFAULT = ("id", "class", "team", "user", "name", "gpus", "state", "reason", "start", "priority")
QUEUE_START = ("id", "class", "name", "user", "team", "st", "start", "gpus", "reason")
#: columns dropped first, in this order, when the table is wider than the terminal
QUEUE_DROP_ORDER = ("priority", "project", "runs", "start_basis", "submit", "share", "array", "start", "class",
                    "name", "placement", "gpus", "team", "user", "st")
#: the reason column keeps at least this many characters (or its longest text) before it wraps
QUEUE_REASON_MIN = 20

QUEUE_HELP = ("Jobs, as squeue: id, class, team, user, name, GPUs, state, reason (or placement), estimated "
              "start, priority. Ended jobs only with --all or --state. The reason is never cut: on a narrow "
              "terminal it wraps, and other columns are dropped first (named on stderr).\n\n"
              "Fields of -o/--format and --json (Slurm's names too: jobid, partition, account, wckey, "
              "nodelist, start_time, submit_time, statecompact, gres):\n\n\b\n"
              + "\n".join(f"  {k:<12} {v[3]}" for k, v in QUEUE_FIELDS.items()))


def parse_fields(text: str) -> list[str]:
    """The field names of ``-o/--format`` (a comma list, any case, Slurm aliases allowed).

    Raises:
        typer.BadParameter: an empty list or an unknown field, naming it and listing the allowed ones.
    """
    out = []
    for word in text.split(","):
        key = word.strip().lower()
        key = QUEUE_ALIASES.get(key, key)
        if key not in QUEUE_FIELDS:
            raise typer.BadParameter(f"{word.strip()!r} is not allowed: a comma list of {', '.join(QUEUE_FIELDS)}",
                                     param_hint="'--format' / '-o'")
        if key not in out:
            out.append(key)
    return out


def queue_header(field: str, jobs: list[dict] = ()) -> str:
    """The header of ``queue``'s ``field``; a time column's names the zone of its cells
    (``SUBMIT (CET)``: this machine's local time) when every time in ``jobs`` is in that
    one zone - else (a column with no time, or times on both sides of a DST change) the
    plain header, and each cell names its own (``time_cells``)."""
    head = QUEUE_FIELDS[field][0]
    zones = _column_zones(field, jobs)
    return f"{head} ({zones.pop()})" if len(zones) == 1 else head


def _column_zones(field: str, jobs) -> set[str]:
    """The local zone abbreviations of the times of ``field`` (a ``QUEUE_TIMES`` one) in ``jobs``."""
    if field not in QUEUE_TIMES:
        return set()
    raw = QUEUE_FIELDS[field][1]
    return {time.strftime("%Z", time.localtime(t)) for t in map(raw, jobs) if t is not None}


def time_cells(field: str, jobs: list[dict]) -> list[str]:
    """The cells of ``field`` for ``jobs``: a time column whose times share one zone
    leaves it out (its header names it, ``queue_header``); otherwise as ``QUEUE_FIELDS``."""
    plain = len(_column_zones(field, jobs)) == 1
    text = QUEUE_TIMES[field] if plain else QUEUE_FIELDS[field][2]
    return [text(j) for j in jobs]


def queue_table(jobs: list[dict], fields: list[str], width: int) -> tuple[SafeTable, list[str]]:
    """The queue as a table that fits ``width`` columns, and the fields left out for it.

    The reason column folds (never an ellipsis); when the other columns' widths plus
    ``QUEUE_REASON_MIN`` for the reason do not fit, fields are dropped in
    ``QUEUE_DROP_ORDER`` (id, state and reason are never dropped)."""
    texts = {f: [_safe(t) for t in (time_cells(f, jobs) if f in QUEUE_TIMES else map(QUEUE_FIELDS[f][2], jobs))]
             for f in fields}
    heads = {f: queue_header(f, jobs) for f in fields}
    widths = {f: max([len(heads[f])] + [len(t) for t in texts[f]]) for f in fields}
    if "reason" in widths:
        widths["reason"] = min(widths["reason"], max(QUEUE_REASON_MIN, len(QUEUE_FIELDS["reason"][0])))
    shown, dropped = list(fields), []

    def need() -> int:  # each column padded 1 each side, none at the table's edges
        return sum(widths[f] for f in shown) + 2 * (len(shown) - 1)

    for f in QUEUE_DROP_ORDER:
        if need() <= width:
            break
        if f in shown and len(shown) > 1:
            shown.remove(f)
            dropped.append(f)
    table = SafeTable(box=None, pad_edge=False)
    for f in shown:
        if f == "reason":
            table.add_column(heads[f], overflow="fold", min_width=min(widths[f], width))
        else:
            table.add_column(heads[f], no_wrap=True, overflow="fold")
    for i in range(len(jobs)):
        table.add_row(*(texts[f][i] for f in shown))
    return table, dropped


#: jobs per page ``shepherd queue`` asks for (``GET /jobs?limit=``, note 029)
QUEUE_PAGE = 5000


def _job_pages(server: str | None, token: str | None, params: dict[str, str]) -> list[dict]:
    """Every job ``GET /jobs`` answers for ``params``, page by page (note 029: a page
    costs the server its jobs' views only); a server without pages answers the whole
    list at once, which is taken as it is."""
    jobs: list[dict] = []
    cursor = None
    while True:
        page = _request(server, "GET", "/jobs", token=token,
                        params={**params, "limit": str(QUEUE_PAGE), **({"cursor": cursor} if cursor else {})}).json()
        if isinstance(page, list):  # a server from before pages: the list
            return page
        jobs += page["jobs"]
        cursor = page["next"]
        if cursor is None:
            return jobs


def _queue(out, err, server: str | None, token: str | None, *, state: str | None, all_: bool, user: str | None,
           me: bool, team: str | None, name: str | None, fmt: str | None, as_json: bool, start: bool) -> None:
    """``shepherd queue``: filters sent to ``GET /jobs`` (checked here first, naming the
    option), then a table, or JSON."""
    import json

    from gpushepherd.daemon.jobquery import QueryError, parse_states, split_list
    if start and state is not None:
        err.print("error: --state: not allowed with --start (it lists pending jobs)", soft_wrap=True)
        raise typer.Exit(2)
    fields = parse_fields(fmt) if fmt is not None else list(QUEUE_START if start else QUEUE_DEFAULT)
    params: dict[str, str] = {}
    users: list[str] = []
    try:
        if state is not None:
            parse_states(state)
            params["state"] = state
        if start:
            params["state"] = "PENDING"
        for option, key, value in (("--user", "user", user), ("--account", "team", team), ("--name", "name", name)):
            if value is not None:
                items = split_list(key, value)
                if key == "user":
                    users = items
                else:
                    params[key] = ",".join(items)
    except QueryError as exc:
        shown = {"state": "--state", "user": "--user", "team": "--account", "name": "--name"}[exc.field]
        err.print(f"error: {shown}: {str(exc).split(': ', 1)[1]}", soft_wrap=True, markup=False)
        raise typer.Exit(2) from None
    if me:
        who = _request(server, "GET", "/whoami", token=token).json()
        mine = who.get("user")
        if mine is None:  # a server without tokens: submit's default user
            import getpass
            try:
                mine = os.environ.get("USER") or getpass.getuser()
            except (KeyError, OSError):
                mine = ""
        users.append(mine)
    if users:
        params["user"] = ",".join(dict.fromkeys(users))
    jobs = _job_pages(server, token, params)
    if not (all_ or "state" in params):
        jobs = [j for j in jobs if j["state"] not in TERMINAL]
    if start:
        jobs.sort(key=lambda j: (j.get("estimated_start") is None, j.get("estimated_start") or 0.0))
    if as_json:
        sys.stdout.write(json.dumps([{f: QUEUE_FIELDS[f][1](j) for f in fields} for j in jobs], indent=2) + "\n")
        return
    width = _columns(out)
    table, dropped = queue_table(jobs, fields, width)
    out.print(table, width=width)
    if dropped:
        err.print(f"(left out for the terminal's {width} columns: {', '.join(dropped)}; choose with -o)",
                  soft_wrap=True)


def _columns(console) -> int:
    """The width to lay a table out for: ``$COLUMNS`` when it is a number (a pipe too,
    as ``COLUMNS=80 shepherd queue | less``), else the console's (a terminal's width, 160
    for a pipe)."""
    text = os.environ.get("COLUMNS", "")
    return int(text) if text.isdigit() and 20 <= int(text) <= 10000 else console.width
