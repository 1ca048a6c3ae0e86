"""``shepherd sbatch FILE [ARGS]``: a Slurm batch script submitted as it is (issue 18
point 2, design note 018).

Its ``#SBATCH`` lines (those before the first command, as sbatch reads them) and the
options before FILE on the command line (which win) are read by one parser into
``submit``'s request; a directive gpushepherd has no feature for, or does not know, is
refused naming it - never ignored. The script runs with its own ``#!`` interpreter, as
sbatch requires one.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
from pathlib import Path

import typer

from gpushepherd.durations import parse_duration

#: directives of features the server does not have (yet): ``--name`` -> what is missing
UNSUPPORTED = {
    "--nodelist": "node lists (the core selects nodes by label: -C)",
    "-w": "node lists", "--exclude": "excluded nodes", "-x": "excluded nodes", "--exclusive": "exclusive nodes",
    "--signal": "signals before the time limit", "--requeue": "requeue requests (lost runs are requeued "
    "already, --max-requeues of the server)", "--no-requeue": "requeue requests", "--mail-type": "mail",
    "--mail-user": "mail", "--qos": "QOS (the class is -p)",
    "--cpus-per-task": "CPU scheduling (GPUs only)", "-c": "CPU scheduling (GPUs only; -c is --cpus-per-task)",
    "--mem": "host memory scheduling (GPUs only)", "--mem-per-cpu": "host memory scheduling (GPUs only)",
    "--mem-per-gpu": "host memory scheduling (GPUs only; GPU memory is submit --gpu-mem)",
    "--ntasks-per-node": "tasks per node (tasks may share a node: -n with --gpus-per-task)",
}
#: directives that take a value: long and short name -> the key they set
VALUED = {"--gres": "gres", "--gpus": "gpus", "-G": "gpus", "--gpus-per-node": "gpus", "--time": "time",
          "-t": "time", "--job-name": "name", "-J": "name", "--account": "team", "-A": "team",
          "--partition": "class", "-p": "class", "--output": "stdout", "-o": "stdout", "--error": "stderr",
          "-e": "stderr", "--array": "array", "-a": "array", "--chdir": "chdir", "-D": "chdir", "--wckey": "project",
          "--nodes": "nodes", "-N": "nodes", "--ntasks": "ntasks", "-n": "ntasks",
          "--dependency": "dependency", "-d": "dependency", "--begin": "begin", "-b": "begin",
          # constraints and deadline (note 022)
          "--constraint": "constraint", "-C": "constraint", "--deadline": "deadline",
          "--gpus-per-task": "gpus_per_task",
          # the command line only (a script cannot name its server)
          "--server": "server", "--token": "token", "--idempotency-key": "idempotency_key"}
CLI_ONLY = {"server", "token", "idempotency_key"}
#: directives without a value: name -> the key they set to True
FLAGS = {"--hold": "hold", "-H": "hold"}
_NAME = re.compile(r"[A-Za-z0-9_.-]+")
#: a count: ASCII digits only (``str.isdigit`` takes ``²`` and other scripts' digits)
_COUNT = re.compile(r"[0-9]+")
#: a GPU type (``gpu:TYPE:N``, ``-G TYPE:N``): a name starting with a letter or digit
#: (MIG types such as ``1g.10gb`` start with a digit) that is no number (``-1``, ``1.5``
#: are a bad count, not a type)
_GPU_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
#: %-patterns of -o / -e: the shell expression of each (the job's environment, note 008)
_PATTERNS = {"j": '"${SHEPHERD_JOB_ID}"', "A": '"${SHEPHERD_ARRAY_ID:-$SHEPHERD_JOB_ID}"',
             "a": '"${SHEPHERD_ARRAY_TASK_ID:-4294967294}"', "%": "%"}


class SbatchError(ValueError):
    """A directive or option that cannot be submitted: ``where`` (``job.sh:3`` or
    ``command line``), the directive, the value and what is allowed."""


def script_directives(path: Path) -> list[tuple[str, list[str]]]:
    """The ``#SBATCH`` lines of a script as ``(where, tokens)``, ``where`` being
    ``FILE:LINE``: those after the ``#!`` line and before the first command (blank lines and
    comments may come between them), as sbatch reads them.

    Raises:
        SbatchError: a line shlex cannot split (an open quote).
    """
    out = []
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        s = line.strip()
        if n == 1 and s.startswith("#!"):
            continue
        if s.startswith("#SBATCH"):
            where = f"{path.name}:{n}"
            try:
                tokens = shlex.split(s[len("#SBATCH"):], comments=True)
            except ValueError as exc:
                raise SbatchError(f"{where}: {s!r} is not allowed: {exc}") from None
            out.append((where, tokens))
        elif s and not s.startswith("#"):
            break  # the first command: sbatch reads no directive after it
    return out


def parse_options(tokens: list[str], where: str, *, positional: bool = False) -> tuple[dict, list[str]]:
    """``sbatch`` options as ``submit`` fields: ``gpus``, ``gpu_type`` (list), ``time_limit_s``,
    ``name``, ``team``, ``class``, ``project``, ``stdout``, ``stderr``, ``array``, ``chdir``,
    ``node_selector`` (list), ``deadline`` (epoch seconds), ``same_node``, ``ntasks``,
    ``gpus_per_task`` (and ``server``, ``token`` from the command line). ``positional``: stop at the first
    token that is not an option (the command line's FILE) and return it and the rest.

    Raises:
        SbatchError: naming ``where``, the directive and why (a feature gpushepherd does not
            have, an unknown directive, a bad value).
    """
    opts: dict = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if positional and (not tok.startswith("-") or tok == "-"):
            return opts, tokens[i:]
        if tok == "--" and positional:
            return opts, tokens[i + 1:]
        name, eq, value = tok.partition("=") if tok.startswith("--") else (tok[:2], "", tok[2:])
        has_value = bool(eq) or bool(value)
        if name in UNSUPPORTED:
            raise SbatchError(f"{where}: {tok} is not allowed: gpushepherd has no {UNSUPPORTED[name]} yet; remove it")
        if name in FLAGS:
            if has_value:
                raise SbatchError(f"{where}: {tok} is not allowed: {name} takes no value")
            opts[FLAGS[name]] = True
            i += 1
            continue
        if name not in VALUED:
            raise SbatchError(f"{where}: {tok} is not allowed: an sbatch option gpushepherd does not know; it takes "
                              f"{', '.join(sorted(k for k in VALUED if k.startswith('--')))} and their short forms")
        key = VALUED[name]
        if key in CLI_ONLY and where != "command line":
            raise SbatchError(f"{where}: {tok} is not allowed in a script: on the command line only")
        if not has_value:
            i += 1
            if i >= len(tokens):
                raise SbatchError(f"{where}: {name} is not allowed without a value")
            value = tokens[i]
        _set(opts, key, name, value, where)
        i += 1
    return opts, []


def _gpu_request(key: str, value: str, said: str) -> tuple[str | None, int]:
    """``(GPU type or None, count >= 1)`` of ``--gres gpu[:TYPE][:N]`` (``key`` ``gres``)
    or ``-G/--gpus [TYPE:]N``. A part that looks like a number is a count, never a type:
    ``gpu:-1``, ``gpu:1.5`` and ``gpu:0`` get the same refusal; a TYPE is never empty
    (``gpu::2``, ``-G :2``).

    Raises:
        SbatchError: ``said``, and what is allowed.
    """
    parts = value.split(":")
    forms = "N or TYPE:N"
    if key == "gres":
        if parts[0] != "gpu" or len(parts) > 3 or not all(_NAME.fullmatch(x) or x == "" for x in parts):
            raise SbatchError(f"{said} is not allowed: gpu, gpu:N or gpu:TYPE:N (the only resource "
                              "gpushepherd schedules is GPUs)")
        forms = "gpu, gpu:N or gpu:TYPE:N"
        parts = parts[1:] or ["1"]
        if len(parts) == 1 and parts[0] and not _NUMBER.fullmatch(parts[0]):
            parts.append("1")  # gpu:TYPE: one of them
    if len(parts) > 2:
        raise SbatchError(f"{said} is not allowed: a GPU count N or TYPE:N")
    gpu_type, count = (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0])
    if gpu_type is not None and (not _GPU_TYPE.fullmatch(gpu_type) or _NUMBER.fullmatch(gpu_type)):
        raise SbatchError(f"{said} is not allowed: the GPU TYPE {gpu_type!r} is no type name (letters, digits, "
                          f"'_', '.', '-', starting with a letter or digit, not a number): {forms}")
    if not _COUNT.fullmatch(count) or int(count) < 1:
        raise SbatchError(f"{said} is not allowed: a GPU count >= 1 ({forms})")
    return gpu_type, int(count)


def _set(opts: dict, key: str, name: str, value: str, where: str) -> None:
    """One directive's value into ``opts`` (``_fields`` of the request)."""
    said = f"{where}: {name} {value}"
    if key in ("chdir", "stdout", "stderr") and value == "":
        # as every path option (cli.daemon.path_param): '' would mean the current folder, or
        # no file (-o '' was dropped), where an unset shell variable was meant
        raise SbatchError(f"{where}: {name} '' is not allowed: a path (an empty one would mean the current folder; "
                          "if a shell variable gave it, it is unset)")
    if key in ("gres", "gpus"):
        gpu_type, count = _gpu_request(key, value, said)
        opts["gpus"] = count
        opts["gpu_type"] = [gpu_type] if gpu_type is not None else []
    elif key == "time":
        try:
            opts["time_limit_s"] = parse_duration(value, bare="minutes")
        except ValueError as exc:
            raise SbatchError(f"{where}: {name}: {exc}") from None
    elif key == "dependency":
        from gpushepherd.daemon.deps import parse_dependency
        try:
            parse_dependency(value)
        except ValueError as exc:
            raise SbatchError(f"{where}: {name}: {exc}") from None
        opts[key] = value
    elif key == "begin":
        from gpushepherd.daemon.deps import parse_begin
        try:
            parse_begin(value, time.time())  # the syntax; the server resolves it at its own time (note 021)
        except ValueError as exc:
            raise SbatchError(f"{where}: {name}: {exc}") from None
        opts[key] = value
    elif key == "nodes":
        if value != "1":
            raise SbatchError(f"{said} is not allowed: 1 (all GPUs on one node; without -N they may span nodes, "
                              "-n with --gpus-per-task makes a gang)")
        opts["same_node"] = True  # Slurm's -N 1: one node
    elif key in ("ntasks", "gpus_per_task"):
        if not _COUNT.fullmatch(value) or int(value) < 1:
            raise SbatchError(f"{said} is not allowed: a count >= 1")
        opts[key] = (int(value), said)  # checked together once all are read (_gang)
    elif key == "constraint":
        from gpushepherd.cli.daemon import selector_items
        try:
            opts["node_selector"] = selector_items([value])  # the last -C wins, as every sbatch option
        except typer.BadParameter as exc:
            raise SbatchError(f"{said} is not allowed: {exc.message.split(' is not allowed: ', 1)[-1]}") from None
    elif key == "deadline":
        from gpushepherd.timepoints import parse_time_point
        try:
            opts["deadline"] = parse_time_point(value, time.time())
        except ValueError as exc:
            raise SbatchError(f"{where}: {name}: {exc}") from None
    elif key in ("stdout", "stderr"):
        for m in re.finditer(r"%(.)", value.replace("%%", "")):
            if m[1] not in _PATTERNS:
                raise SbatchError(f"{said} is not allowed: the patterns are %j, %A, %a and %% (not %{m[1]})")
        opts[key] = value
    elif key == "name":
        opts["name"] = value  # the server's job names (issue 18 point 3)
    else:
        opts[key] = value


def output_path(pattern: str) -> str:
    """A shell word for an ``-o`` / ``-e`` file: ``%j`` the job id, ``%A`` the array's id,
    ``%a`` the task index (Slurm's 4294967294 outside an array), ``%%`` a ``%``."""
    parts = re.split(r"(%.)", pattern)
    return "".join(_PATTERNS[p[1]] if len(p) == 2 and p[0] == "%" else shlex.quote(p) for p in parts if p)


def interpreter(path: Path) -> list[str]:
    """The argv that runs a script (``#!/bin/bash -l`` -> ``["/bin/bash", "-l"]``), as the kernel
    would read its first line.

    Raises:
        SbatchError: no ``#!`` line (sbatch refuses such a file too).
    """
    with open(path, "rb") as f:
        first = f.readline(4096).decode(errors="replace").strip()
    if not first.startswith("#!") or not first[2:].strip():
        raise SbatchError(f"{path.name}: its first line is not allowed: a batch script starts with #! and its "
                          "interpreter (#!/bin/bash), as sbatch requires")
    prog, _, arg = first[2:].strip().partition(" ")
    return [prog, arg.strip()] if arg.strip() else [prog]


def job_argv(path: Path, args: list[str], stdout: str | None, stderr: str | None) -> tuple[list[str], bool]:
    """The job's argv for script ``path`` with ``args``, and whether it is a shell line:
    the interpreter and the script's absolute path; with ``-o`` / ``-e``, wrapped in
    ``/bin/sh -c 'exec ... >OUT 2>ERR'`` (``-o`` alone takes stderr too, as Slurm's)."""
    argv = [*interpreter(path), str(path.resolve()), *args]
    if stdout is None and stderr is None:
        return argv, False
    redirect = ""
    if stdout is not None:
        redirect += f" >{output_path(stdout)}"
    redirect += f" 2>{output_path(stderr)}" if stderr is not None else " 2>&1" if stdout is not None else ""
    line = "exec " + " ".join(shlex.quote(a) for a in argv) + redirect
    return [line], True


def submission(tokens: list[str], env: dict[str, str] | None = None) -> tuple[dict, Path, list[str]]:
    """The command line of ``shepherd sbatch`` (options, FILE, its ARGS) as ``(options,
    script, args)``: the script's directives, then the command line's options over them.

    Raises:
        SbatchError: no FILE, an unreadable one, or a directive ``parse_options`` refuses.
    """
    cli, rest = parse_options(tokens, "command line", positional=True)
    if not rest:
        raise SbatchError("FILE is not allowed to be missing: shepherd sbatch [OPTIONS] FILE [ARGS...]")
    path = Path(rest[0])
    if not path.is_file():
        raise SbatchError(f"FILE: {rest[0]!r} is not allowed: a batch script (a readable file)")
    opts: dict = {}
    for where, line in script_directives(path):
        opts.update(parse_options(line, where)[0])
    opts.update(cli)
    _gang(opts)
    env = os.environ if env is None else env
    opts.setdefault("server", env.get("SHEPHERD_SERVER") or None)  # set to '': not set
    opts.setdefault("token", env.get("SHEPHERD_TOKEN"))
    return opts, path, rest[1:]


def _gang(opts: dict) -> None:
    """``-n/--ntasks N --gpus-per-task G`` as a gang: ``gpus`` N x G, ``gpus_per_pod`` G
    (tasks are the core's pods: each on one node, several may share one).

    Raises:
        SbatchError: ``-n`` above 1 without ``--gpus-per-task``, or a ``--gpus`` that is
            not N x G.
    """
    (n, n_said), (per, per_said) = opts.pop("ntasks", (1, "")), opts.pop("gpus_per_task", (None, ""))
    if per is None:
        if n != 1:
            raise SbatchError(f"{n_said} is not allowed without --gpus-per-task: a job is one task unless each "
                              "task's GPUs are given (-n N --gpus-per-task G: N x G GPUs)")
        return
    if "gpus" in opts and opts["gpus"] != n * per:
        raise SbatchError(f"{per_said} is not allowed with --gpus {opts['gpus']} and -n {n}: --gpus {n * per} "
                          "(tasks x GPUs per task), or leave --gpus out")
    opts["gpus"] = n * per
    opts["gpus_per_pod"] = per if n > 1 else None


SBATCH_HELP = """Submit a Slurm batch script: `shepherd sbatch [OPTIONS] FILE [ARGS...]`.

Reads its #SBATCH lines (before its first command) and OPTIONS (which win):
--gres=gpu[:TYPE]:N, -G/--gpus [TYPE:]N, -t/--time (Slurm's: a bare number is
minutes), -J/--job-name, -A/--account (the team), -p/--partition (the workload
class), -o/--output and -e/--error (%j job id, %A array id, %a task index; -o alone
takes stderr too; without them `shepherd logs`), -a/--array, -D/--chdir, --wckey
(the project), -C/--constraint LABEL[=VALUE][&...] (node labels), --deadline TIME
(2025-06-01T18:00, now+2hours), -N 1 (one node), -n N --gpus-per-task G (a gang of N
tasks), -d/--dependency, -b/--begin TIME, -H/--hold (note 021); --server, --token and
--idempotency-key KEY (submit at most once under KEY; default a random one, printed when
the server cannot confirm in time) on the command line only. Any other directive is refused naming it (--exclusive, --mem,
...).
The script runs with its #! interpreter."""


def register(app) -> None:
    """Add ``shepherd sbatch`` to ``app``."""
    from gpushepherd.cli.daemon import constraint_fields, job_body, post_job
    from gpushepherd.cli.main import err

    @app.command("sbatch", help=SBATCH_HELP, context_settings={
        "allow_interspersed_args": False, "ignore_unknown_options": True, "allow_extra_args": True})
    def sbatch(ctx: typer.Context) -> None:
        try:
            opts, path, args = submission(list(ctx.args))
            for key, what in (("class", "-p/--partition CLASS"), ("team", "-A/--account TEAM")):
                if not opts.get(key):
                    raise SbatchError(f"{what} is not allowed to be missing: give it as #SBATCH {what.split('/')[0]} "
                                      "in the script or on the command line")
            command, shell = job_argv(path, args, opts.get("stdout"), opts.get("stderr"))
        except (SbatchError, OSError) as exc:
            err.print(f"error: {exc}", soft_wrap=True, markup=False)
            raise typer.Exit(2) from None
        body = job_body(cls=opts["class"], team=opts["team"], user=None, token=opts["token"],
                        gpus=opts.get("gpus", 1), gpu_type=opts.get("gpu_type", []), command=command, shell=shell,
                        chdir=Path(opts.get("chdir") or "."), time_limit_s=opts.get("time_limit_s"),
                        project=opts.get("project", ""), array=opts.get("array"), name=opts.get("name", ""),
                        dependency=opts.get("dependency", ""), begin=opts.get("begin"), hold=opts.get("hold", False),
                        server=opts["server"])
        body.update(constraint_fields(constraint=opts.get("node_selector", []), deadline=opts.get("deadline"),
                                      gpus_per_pod=opts.get("gpus_per_pod"), same_node=opts.get("same_node", False)))
        import uuid

        key = opts.get("idempotency_key") or f"shepherd-sbatch-{uuid.uuid4()}"
        argv = sys.argv[1:]  # the command line as typed, for the retry it prints (not under a test's runner)
        post_job(opts["server"], opts["token"], body, idempotency_key=key,
                 retry_argv=["shepherd", *argv] if argv[:1] == ["sbatch"] else None)
