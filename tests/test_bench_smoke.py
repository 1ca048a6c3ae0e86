"""The API bench still runs end to end against the product (a tiny run, no figures
asserted: speed is a benchmark, not a test). It injects its own stub backend, so an
interface change that breaks it must fail here, not in the next benchmark run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_api_submit_bench_runs_and_every_job_starts():
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "api_submit.py"), "--jobs", "40", "--warmup", "8"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "cannot start" not in out and "Traceback" not in out, out
    assert "not started by the end:         0" in out, out
