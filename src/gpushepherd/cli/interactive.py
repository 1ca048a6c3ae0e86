"""``shepherd run``: interactive work, as Slurm's ``srun`` (issue 18, point 5; design notes
028 and 041). It submits, waits for the job's GPUs saying why it waits, streams the job's
output while it runs and exits with its exit code; the session ending (Ctrl-C, hang-up,
SIGTERM) cancels the job.

Without ``--pty`` no terminal is attached (note 028): the job's stdin is not the user's
and ``isatty()`` is false in it. With ``--pty`` (note 041, ``gpushepherd.cli.attach``)
the job runs on a pseudo-terminal the server relays, and the user's terminal is attached
to it: keys, Ctrl-C, window size; the job ends when the session does.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from gpushepherd.cli.daemon import (
    ESTIMATE,
    JOB_NAME_RULE,
    TERMINAL,
    TIME_HELP,
    TIME_LIMIT,
    ServerOpt,
    ServerUnreachable,
    TokenOpt,
    _fmt_est,
    _job_path,
    _request,
    _safe,
    constraint_fields,
    job_body,
    path_param,
    post_job,
    resource_fields,
    script_not_command,
)

#: the classes ``run`` submits to without ``--class``: the first of these the policy has
INTERACTIVE_CLASSES = ("interactive", "notebook", "sandbox")
#: seconds between two looks at the job and its logs
POLL_S = 0.5
#: seconds ``run`` waits for a server that stopped answering (a restart: the job lives on)
RECONNECT_S = 120.0
#: the signals that end the session (and so the job): Ctrl-C, a closed terminal, a kill
SESSION_SIGNALS = (signal.SIGINT, signal.SIGHUP, signal.SIGTERM)


class SessionEnded(Exception):
    """The terminal session ended by ``signum`` while the job was live."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exit_status(job: dict) -> int:
    """The exit status ``run`` ends with for an ended job view: 0 when it COMPLETED; the
    job's exit code when it FAILED (killed by signal S: ``128 + S``, as a shell reports
    it); 1 for any other end (CANCELLED, TIMEOUT, REJECTED) or no exit code recorded."""
    code = job.get("exit_code")
    if job["state"] == "COMPLETED":
        return 0
    if job["state"] != "FAILED" or not code:
        return 1
    return 128 - code if code < 0 else code


def pick_class(policy: dict) -> str:
    """The class ``run`` uses without ``--class``: the first of ``INTERACTIVE_CLASSES`` that
    ``policy`` (the parsed policy of ``GET /policy``) has.

    Raises:
        ValueError: it has none of them, naming its classes.
    """
    classes = list(policy.get("classes") or {})
    for name in INTERACTIVE_CLASSES:
        if name in classes:
            return name
    raise ValueError(f"--class: not given, and the server's policy has no class for interactive work "
                     f"({', '.join(INTERACTIVE_CLASSES)}): give one of {', '.join(classes) or '(none)'}")


def pick_team(whoami: dict, policy: dict) -> str:
    """The team ``run`` uses without ``--team``: the token's only team, else the policy's
    only team.

    Raises:
        ValueError: neither is a single team, naming the candidates.
    """
    mine = list(whoami.get("teams") or [])
    if len(mine) == 1:
        return mine[0]
    teams = mine or list(policy.get("teams") or {})
    if len(teams) == 1:
        return teams[0]
    raise ValueError(f"--team: not given and not one team to pick: give one of {', '.join(teams) or '(none)'}")


class Session:
    """One job followed from submission to its end: waiting lines and the job's output,
    through the API only (``GET /jobs/ID``, ``GET /jobs/ID/logs``)."""

    def __init__(self, job_id: str | None, server: str | None, token: str | None, quiet: bool):
        self.job_id, self.server, self.token, self.quiet = job_id, server, token, quiet
        self.run = 0  # the run whose output is streamed
        self.offsets = {"stdout": 0, "stderr": 0}
        self.said: tuple | None = None

    def note(self, text: str) -> None:
        if not self.quiet:
            from gpushepherd.cli.main import err

            err.print(f"shepherd run: {text}", soft_wrap=True, markup=False)

    def call(self, method: str, path: str, **kw: Any):
        """``_request``, waiting up to ``RECONNECT_S`` for a server that does not answer
        (restarted, or its host briefly unreachable: the job runs on meanwhile).

        Raises:
            typer.Exit: 1, the server did not come back in time (the job may still run:
                the line says how to cancel it).
        """
        deadline = None
        while True:
            try:
                r = _request(self.server, method, path, token=self.token, raise_unreachable=True, **kw)
            except ServerUnreachable as exc:
                now = time.monotonic()
                if deadline is None:
                    deadline = now + RECONNECT_S
                    self.note(f"{exc}: waiting up to {RECONNECT_S:g} s for it to come back")
                elif now >= deadline:
                    from gpushepherd.cli.main import err

                    err.print(f"error: {exc} for {RECONNECT_S:g} s; job {self.job_id} may still run: "
                              f"`shepherd cancel {self.job_id}` once the server is back", soft_wrap=True,
                              markup=False)
                    raise typer.Exit(1) from None
                time.sleep(POLL_S)
                continue
            if deadline is not None:
                self.note("the server answers again")
            return r

    def look(self) -> dict:
        return self.call("GET", _job_path(self.job_id)).json()

    def show_state(self, j: dict) -> None:
        """A line on stderr when what the job waits for, or where it runs, changes."""
        if j["state"] == "PENDING":
            said = ("PENDING", j.get("reason"))  # an estimate that moves is not news enough for a line
            if said != self.said:
                est = _fmt_est(j)
                self.note(f"job {j['id']} waiting: {_safe(j.get('reason') or 'to be scheduled')}"
                          + ("" if est == "-" else f" (estimated start {est})"))
        elif j["state"] in TERMINAL:
            said = (j["state"],)
        else:
            said = (j["state"], j.get("placement"), j.get("runs"))
            if said != self.said:
                self.note(f"job {j['id']} {j['state']}" + (f" on {_safe(j['placement'])}" if j.get("placement")
                                                            else "") + (f" (run {j['runs']})" if j.get("runs", 0) > 1
                                                                        else ""))
        self.said = said

    def stream(self, j: dict) -> None:
        """Write what the job's runs added to their stdout and stderr since the last look:
        the rest of the run streamed so far, then each later run from its beginning (a
        requeue between two looks loses no output)."""
        runs = j.get("runs") or 0
        if not runs:
            return
        self.run = self.run or 1
        while True:
            self._drain()
            if self.run >= runs:
                return
            self.run, self.offsets = self.run + 1, {"stdout": 0, "stderr": 0}

    def _drain(self) -> None:
        for stream, sink in (("stdout", sys.stdout), ("stderr", sys.stderr)):
            while True:  # at most one chunk (1 MiB) an answer: read to the end
                r = self.call("GET", _job_path(self.job_id, "/logs"),
                              params={"stream": stream, "offset": self.offsets[stream], "run": self.run})
                if r.text:
                    sink.write(r.text)
                    sink.flush()
                before = self.offsets[stream]
                self.offsets[stream] = int(r.headers.get("X-Next-Offset", before))
                if self.offsets[stream] == before or self.offsets[stream] >= int(r.headers.get("X-Log-Size", 0)):
                    break

    def follow(self) -> dict:
        """Look, show and stream until the job ends; returns its last view."""
        while True:
            j = self.look()
            self.show_state(j)
            self.stream(j)
            if j["state"] in TERMINAL:
                return j
            time.sleep(POLL_S)

    def follow_attached(self) -> dict:
        """``follow`` for a pty job (note 041): wait for it to run, attach this terminal
        to its terminal until that ends, then wait for the job's end; returns its last
        view. A job whose terminal ended before the attach (it ran briefly) has its output
        printed from its log, as ``follow`` does; a requeued job's next run is attached to
        in turn.

        Raises:
            typer.Exit: 2, the server refused the attach (403: not the job's user).
        """
        from gpushepherd.cli.attach import Attached, AttachRefused

        shown = False  # a terminal was attached: its output is shown, the log is not printed again
        while True:
            j = self.look()
            self.show_state(j)
            if j["state"] in TERMINAL:
                return j if shown else self.follow()  # ended before any attach: its output from its log
            if j["state"] == "RUNNING":
                attached = Attached(self.server, self.token, self.job_id)
                try:
                    attached.open(0)
                except AttachRefused as exc:
                    if exc.status != 409:
                        refused(exc)
                    time.sleep(POLL_S)  # not running any more (or its run just ended): look again
                    continue
                except OSError as exc:
                    self.note(f"cannot attach to job {self.job_id}'s terminal: {exc}; trying again")
                    time.sleep(POLL_S)
                    continue
                shown = True
                try:
                    clean = attached.run()
                except AttachRefused as exc:  # a reconnect refused (403 after a token was revoked)
                    refused(exc)
                if not clean:
                    self.note(f"the connection to job {self.job_id}'s terminal was lost: the server cancels the job "
                              "once no client is attached for a few seconds")
                    return self.wait_end()
                continue  # its terminal ended: the job ends, or (requeued) runs again with a new one
            time.sleep(POLL_S)

    def wait_end(self) -> dict:
        """Look until the job ends (its output was shown already); returns its last view."""
        while True:
            j = self.look()
            if j["state"] in TERMINAL:
                return j
            time.sleep(POLL_S / 5)

    def cancel(self) -> None:
        self.call("POST", _job_path(self.job_id, "/cancel"))


def refused(exc: Exception) -> None:
    """The server refused an attach (403, 404): its word on stderr, exit 2 (the job is
    left to the server: a pty job without a client is cancelled)."""
    from gpushepherd.cli.main import err

    err.print(f"error: {_safe(str(exc))}", soft_wrap=True, markup=False)
    raise typer.Exit(2) from None


def _raise_session_ended(signum: int, _frame: Any) -> None:
    raise SessionEnded(signum)


def register(app: typer.Typer) -> None:
    """Add ``run`` to ``app``."""

    @app.command("run", context_settings={"allow_interspersed_args": False})
    def run(cmd: Annotated[list[str], typer.Argument(metavar="-- COMMAND [ARGS...]", help="The job's argv.")],
            cls: Annotated[Optional[str], typer.Option("--class", "-c", help="Workload class (default: the "
                                                       "policy's interactive, notebook or sandbox class, the "
                                                       "first it has).")] = None,
            team: Annotated[Optional[str], typer.Option("--team", "-A", help="Team (account); default: the "
                                                        "token's team, or the policy's, when there is one "
                                                        "only.")] = None,
            user: Annotated[Optional[str], typer.Option("--user", "-u", help="Default: the token's user, or "
                                                        "$USER without a token.")] = None,
            gpus: Annotated[int, typer.Option("--gpus", "-G", min=1)] = 1,
            share: Annotated[Optional[str], typer.Option("--share", help="Part of one GPU: fraction:0.25, "
                                                         "mem, mig:1g.10gb, time_slice[:N], "
                                                         "mps:N[:PCT[:PROCS]].")] = None,
            gpu_type: Annotated[list[str], typer.Option("--gpu-type", help="Allowed GPU type (repeat).")] = [],
            gpu_mem: Annotated[int, typer.Option("--gpu-mem", min=0, help="GPU memory, MiB.")] = 0,
            time_limit: Annotated[Optional[float], typer.Option("--time", "-t", metavar="DURATION",
                                                                parser=TIME_LIMIT, help=TIME_HELP)] = None,
            estimate: Annotated[Optional[float], typer.Option("--estimate", metavar="DURATION", parser=ESTIMATE,
                                                              help="Expected run time (the forms of --time).")]
            = None,
            env: Annotated[list[str], typer.Option("--env", help="KEY=VALUE for the job (repeat).")] = [],
            chdir: Annotated[Path, typer.Option("--chdir", "-D", parser=path_param)] = Path("."),
            shell: Annotated[bool, typer.Option("--shell", help="Run COMMAND with /bin/sh -c.")] = False,
            name: Annotated[str, typer.Option("--name", "-J", help=f"Job name: {JOB_NAME_RULE}.")] = "",
            mem: Annotated[Optional[str], typer.Option("--mem", metavar="SIZE", help="Host memory limit of the "
                                                       "job's processes (100M, 4G; a bare number is MiB).")]
            = None,
            cpus: Annotated[Optional[float], typer.Option("--cpus", min=0.01, help="CPU limit, in CPUs.")] = None,
            pty: Annotated[bool, typer.Option("--pty", help="Attach this terminal to the job's, as srun --pty: "
                                              "a pseudo-terminal for the job (python, a shell, a debugger), your "
                                              "keys, Ctrl-C and window size go to it. The local backend only.")]
            = False,
            quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No lines of run's own on stderr (submitted, "
                                                "waiting, running): only the job's output.")] = False,
            server: ServerOpt = None, token: TokenOpt = None) -> None:
        """Run a command as a job and stay with it, as srun: `shepherd run --gpus 1 -- python train.py`.
        Submits, waits for the GPUs (printing why it waits on stderr), streams the job's stdout
        and stderr while it runs and exits with its exit code (killed by signal S: 128+S; any other
        end - cancelled, timeout - 1). Ctrl-C, a closed terminal or SIGTERM cancels the job (exit
        128+signal). Without --pty stdin and a terminal are not attached (the job's isatty() is
        false; a bare `python` exits at once, as with < /dev/null). With --pty
        (`shepherd run --gpus 1 --pty -- python`) your terminal is the job's: keys go to it, Ctrl-C
        interrupts the job's foreground process (not run), and closing the terminal or the
        connection ends the job."""
        from gpushepherd.cli.main import UsageError, _errors

        script_not_command(cmd, chdir, shell)
        with _errors():
            if pty and "TERM" in os.environ and not any(e.startswith("TERM=") for e in env):
                env = [*env, f"TERM={os.environ['TERM']}"]  # the job's terminal is of the user's type
            if cls is None or team is None:
                policy = _request(server, "GET", "/policy", token=token).json().get("policy") or {}
                try:
                    cls = cls or pick_class(policy)
                    team = team or pick_team(_request(server, "GET", "/whoami", token=token).json(), policy)
                except ValueError as exc:
                    raise UsageError(str(exc)) from None
            body = job_body(cls=cls, team=team, user=user, token=token, gpus=gpus, gpu_type=gpu_type, command=cmd,
                            shell=shell, chdir=chdir, time_limit_s=time_limit, name=name, server=server)
            body.update(constraint_fields(estimate_s=estimate))
            body.update(resource_fields(share=share, gpu_mem=gpu_mem, env=env, mem=mem, cpus=cpus))
            if pty:
                body["pty"] = True
        session = Session(None, server, token, quiet)
        previous = {s: signal.getsignal(s) for s in SESSION_SIGNALS}
        for s in SESSION_SIGNALS:
            signal.signal(s, _raise_session_ended)
        try:
            session.job_id = post_job(server, token, body, announce=not quiet, to_stderr=True)["id"]
            ended = session.follow_attached() if pty else session.follow()
        except SessionEnded as exc:
            for s in SESSION_SIGNALS:  # a second Ctrl-C while cancelling does not stop the cancel
                signal.signal(s, signal.SIG_IGN)
            if session.job_id is not None:
                try:
                    session.cancel()
                    session.note(f"job {session.job_id} cancelled: the session ended ({exc})")
                except typer.Exit:  # it ended meanwhile (the server said so on stderr)
                    pass
            raise typer.Exit(128 + exc.signum) from None
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        code = exit_status(ended)
        if ended["state"] != "COMPLETED":
            why = ended.get("reason") or ended.get("launch_error")
            session.note(f"job {session.job_id} ended {ended['state']}"
                         + (f" (exit code {ended['exit_code']})" if ended.get("exit_code") is not None else "")
                         + (f": {_safe(why)}" if why else ""))
        raise typer.Exit(code)
