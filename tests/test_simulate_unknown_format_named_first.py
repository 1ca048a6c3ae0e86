"""`shepherd simulate --format X` with an X that is no format is refused as such, even
with --map: "--format CSV --map ..." said "--map is not allowed with --format CSV: only
with --format csv", which blames --map for a misspelt format (and a format that does not
exist reads as one that does not take a mapping)."""

import subprocess
import sys

import pytest

MAP = "submit=t,gpus=n,duration=d"


@pytest.mark.parametrize("fmt", ["CSV", "parquet"])
def test_an_unknown_format_is_named_before_map(tmp_path, fmt):
    (tmp_path / "t.csv").write_text("t,n,d\n0,1,10\n")
    proc = subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", "simulate", "--no-progress", "--trace",
                           str(tmp_path / "t.csv"), "--format", fmt, "--map", MAP], capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: --format: {fmt!r} is not allowed: philly, itp or csv"]


def test_map_with_a_known_format_that_takes_none_is_still_refused(tmp_path):
    (tmp_path / "t.csv").write_text("t,n,d\n0,1,10\n")
    proc = subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", "simulate", "--no-progress", "--trace",
                           str(tmp_path / "t.csv"), "--format", "itp", "--map", MAP], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: --map is not allowed with --format itp: only with --format csv"
