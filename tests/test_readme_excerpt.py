"""What the README says of the bundled Philly excerpt is what the file holds (a
newcomer read "two busy days" and saw 19 % utilisation): jobs, days, GPU-hours, the
peak of the demand, the cluster it is replayed on."""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "src" / "gpushepherd" / "data"


def test_readme_describes_the_excerpt_as_it_is():
    with gzip.open(DATA / "philly-excerpt.csv.gz", "rt") as f:
        rows = [r for r in csv.reader(f) if not r[0].startswith("#")]
    arrival = [float(r[1]) for r in rows]
    gpus = [int(r[4]) for r in rows]
    dur = [float(r[5]) for r in rows]
    day = 86400.0
    assert len(rows) == 1966 and int(min(arrival) // day) == 45 and max(arrival) < 47 * day
    assert round(sum(g * d for g, d in zip(gpus, dur)) / 3600, -3) == 86000
    events = sorted([(a, g) for a, g in zip(arrival, gpus)] + [(a + d, -g) for a, g, d in zip(arrival, gpus, dur)])
    peak = now = 0
    for _t, g in events:
        now += g
        peak = max(peak, now)
    nodes = yaml.safe_load((DATA / "demo-policy.yaml").read_text())["cluster"]["nodes"]
    text = " ".join((ROOT / "README.md").read_text().split())
    assert "1,966 jobs submitted in days [45, 47)" in text and "86,000 GPU-hours" in text
    assert f"demand peaks at {peak} GPUs" in text
    assert "96 nodes x 8 GPUs" in text and sum(n.get("count", 1) * n["gpus"] for n in nodes) == 768
    assert "two busy days" not in text
