"""CPU seconds for each CLI command to start (issue 18, point 15; design note 028).

    .venv/bin/python bench/cli_startup.py [--repeat N] [--python PYTHON]

Runs each command ``--repeat`` times (default 7), each in a fresh process, and prints
the least CPU time (user + system of the child, from ``os.wait4``) beside baselines
measured in the same run: ``python -c pass`` (the interpreter), ``import typer`` and
a one-command typer app's ``--help`` (the floor of any typer CLI), and the 0.5 s goal.
Client commands run against a server address where nothing listens
(``http://127.0.0.1:9``): they start, make their one request and fail, which is the
start a user waits for. Not part of the test suite (timed assertions are flaky on a
shared machine); the outcome half - which modules ``gpushepherd.cli.main`` imports -
is ``tests/test_install.py``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

GOAL_S = 0.5

TYPER_APP = """
import typer
app = typer.Typer()
@app.command()
def hello(name: str = "x") -> None:
    print(name)
app()
"""

COMMANDS = [
    ("shepherd --help", ["--help"]),
    ("shepherd version", ["version"]),
    ("shepherd queue --help", ["queue", "--help"]),
    ("shepherd submit --help", ["submit", "--help"]),
    ("shepherd simulate --help", ["simulate", "--help"]),
    ("shepherd run --help", ["run", "--help"]),
    ("shepherd server --help", ["server", "--help"]),
    ("shepherd report --help", ["report", "--help"]),
    ("shepherd queue (no server)", ["queue"]),
    ("shepherd show 1 (no server)", ["show", "1"]),
    ("shepherd submit (no server)", ["submit", "-c", "batch", "-A", "ml", "--gpus", "1", "--", "true"]),
]


def cpu_seconds(argv: list[str], env: dict[str, str]) -> tuple[float, int]:
    """User + system CPU seconds of one run of ``argv`` (its children included) and its
    exit code."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _pid, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime, proc.returncode


def best(argv: list[str], env: dict[str, str], repeat: int) -> tuple[float, int]:
    runs = [cpu_seconds(argv, env) for _ in range(repeat)]
    return min(t for t, _ in runs), runs[-1][1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7, help="runs per command; the least CPU time is shown")
    ap.add_argument("--python", default=sys.executable, help="the interpreter of the install to measure")
    args = ap.parse_args()
    env = {**os.environ, "SHEPHERD_SERVER": "http://127.0.0.1:9", "COLUMNS": "100"}
    env.pop("SHEPHERD_SOCKET", None)
    py = args.python
    rows = [("baseline: python -c pass", [py, "-c", "pass"]),
            ("baseline: python -c 'import typer'", [py, "-c", "import typer"]),
            ("baseline: a one-command typer app --help", [py, "-c", TYPER_APP, "--help"])]
    rows += [(name, [py, "-m", "gpushepherd.cli.main", *argv]) for name, argv in COMMANDS]
    print(f"CPU seconds to start (least of {args.repeat} runs each), goal < {GOAL_S} s per command")
    print(f"{'command':<44} {'CPU s':>7}  {'exit':>4}  goal")
    worst = 0.0
    for name, argv in rows:
        t, code = best(argv, env, args.repeat)
        is_cmd = not name.startswith("baseline")
        if is_cmd:
            worst = max(worst, t)
        mark = ("ok" if t < GOAL_S else "OVER") if is_cmd else ""
        print(f"{name:<44} {t:>7.3f}  {code:>4}  {mark}", flush=True)
    print(f"slowest command: {worst:.3f} s CPU ({'under' if worst < GOAL_S else 'OVER'} the {GOAL_S} s goal)")
    return 0 if worst < GOAL_S else 1


if __name__ == "__main__":
    sys.exit(main())
