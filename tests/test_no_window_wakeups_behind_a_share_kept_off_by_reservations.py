"""A window boundary cannot start a job that waits in its strict FIFO queue behind a
share other classes' ``reserved_gpus`` keep off a fresh GPU: the head waits for a card
a job of a reserved class opens (a submission or a finish, never a boundary), and the
job behind it only for the head. ``expire.window_matters`` skipped the head (note 015's
CLASS_HOLD, static) but asked for every boundary for the job behind it, forever: the
simulation never ended (oracle seed 437809, property ``g_live``; note 081). Both cores.
"""

from __future__ import annotations

import pytest
from builders import job, policy
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.events import JobSubmitted
from gpushepherd.model.job import GpuShare


@pytest.mark.parametrize("reference", [False, True])
def test_no_window_wakeups_for_a_job_behind_a_share_kept_off_by_reservations(reference):
    # n1: 1 GPU taking MPS; n2: 1 MIG-partitioned GPU (no whole GPU, no MPS). Training
    # reserves 1 GPU: n1's, the only whole one. Batch has a window (22:00-01:00
    # max 3, else 1) and team t queues batch in strict FIFO. H (an MPS quarter) may not
    # open n1's card (ReservedFor: it waits for a training job to open it); B (an MPS
    # half, another signature) waits behind H (Priority(H)). No boundary can change
    # either: next_wakeup() is None, not the next window boundary (and the next, ... for ever).
    rules = policy(nodes=[{"name": "n1", "gpus": 1, "gpu_type": "L40S", "gpu_mem_mib": 46068,
                           "sharing": {"mps": {"max_clients": 3}}},
                          {"name": "n2", "gpus": 1, "gpu_type": "A100-80GB", "gpu_mem_mib": 81920,
                           "mig": {"g0": {"layout": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]}}}],
                   teams={"t": {"classes": {"batch": {"queueing": "strict_fifo"}}}},
                   classes={"training": {"reserved_gpus": 1},
                            "batch": {"max_gpus": 1, "windows": [{"from": "22:00", "to": "01:00", "max_gpus": 3}]}})
    s = Scheduler(rules, reference=reference)
    out = s.handle([JobSubmitted(1.0, job("H", 1, "batch", "t", 0, share=GpuShare("mps", milli=250))),
                    JobSubmitted(1.0, job("B", 1, "batch", "t", 1, share=GpuShare("mps", milli=500)))])
    assert out == []
    assert str(s.pending_reason("H")) == "ReservedFor(classes.training.reserved_gpus)"
    assert str(s.pending_reason("B")) == "Priority(H)"
    assert s.next_wakeup() is None
