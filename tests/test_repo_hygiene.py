"""The repository itself: no merge-conflict markers left in any tracked text file (a
README once carried some into main)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_tracked_file_holds_merge_conflict_markers():
    try:
        files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True,
                               timeout=60).stdout.split()
    except (OSError, subprocess.SubprocessError):
        files = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts]
    bad = []
    for name in files:
        path = ROOT / name
        if not path.is_file() or path.suffix in (".gz", ".png", ".parquet"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for n, line in enumerate(text.splitlines(), start=1):
            if line.startswith(("<<<<<<< ", ">>>>>>> ")) or line == "=======" and name.endswith((".py", ".toml")):
                bad.append(f"{name}:{n}: {line[:40]}")
    assert not bad, "merge-conflict markers:\n" + "\n".join(bad)
