"""A window boundary matters for a job that may use several GPU types when it may start
on *one* of them there: ``expire.window_matters`` judges each type a job at rest may take
on its own (``expire._boundary_may_start``). ``decide`` on the unbound job gives the verdict
of the type closest to starting, so a strict FIFO order (rule 4) or another class's
reservation on one type hid a windowed limit on another: no wake-up was asked, yet a Tick
at the edge started the job (found by the review of note 081; the reservation case is
older). Both cores. The cluster: a1 an A100 with MPS (4 clients), l1 an L40S with MPS (2),
m1 an H100 cut into MIG slices; team t has per-type ``max_gpus`` (one variant per type);
batch queues strict FIFO, ``max_gpus`` 1, 3 from 01:00 to 04:00 (the edge is t=3600);
training reserves 1 GPU. R (MPS on l1) and R2 (a MIG slice) use batch's room.
"""

from __future__ import annotations

import json

import pytest
from builders import job, policy
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.decisions import Start
from gpushepherd.model.events import JobSubmitted, Tick
from gpushepherd.model.job import GpuShare

EDGE = 3600.0


def _rules():
    return policy(
        nodes=[{"name": "a1", "gpus": 1, "gpu_type": "A100-80GB", "gpu_mem_mib": 81920,
                "sharing": {"mps": {"max_clients": 4}}},
               {"name": "l1", "gpus": 1, "gpu_type": "L40S", "gpu_mem_mib": 46068,
                "sharing": {"mps": {"max_clients": 2}}},
               {"name": "m1", "gpus": 1, "gpu_type": "H100-80GB", "gpu_mem_mib": 81920,
                "mig": {"g0": {"layout": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]}}}],
        teams={"t": {"max_gpus": {"A100-80GB": 4, "L40S": 4, "H100-80GB": 4},
                     "classes": {"batch": {"queueing": "strict_fifo"}}}},
        classes={"training": {"reserved_gpus": 1},
                 "batch": {"max_gpus": 1, "windows": [{"from": "01:00", "to": "04:00", "max_gpus": 3}]}})


def _mps(jid: str, t: float, *types: str) -> JobSubmitted:
    kw = {"gpu_types": types} if types else {}
    return JobSubmitted(t, job(jid, 1, "batch", "t", t, share=GpuShare("mps"), **kw))


def _run(reference: bool, later: list[JobSubmitted]) -> Scheduler:
    s = Scheduler(_rules(), reference=reference)
    s.handle([_mps("R", 0.0, "L40S"),
              JobSubmitted(0.0, job("R2", 1, "batch", "t", 0, share=GpuShare("mig", profile="1g.10gb")))])
    for e in later:
        s.handle([e])
    return s


def _edge_starts(s: Scheduler, jid: str, reference: bool) -> None:
    assert s.next_wakeup() is not None and s.next_wakeup() <= EDGE
    restored = Scheduler.restore(_rules(), json.loads(json.dumps(s.snapshot())), reference=reference)
    for core in (s, restored):
        assert jid in [d.job_id for d in core.handle([Tick(EDGE)]) if isinstance(d, Start)]


@pytest.mark.parametrize("reference", [False, True])
def test_a_follower_behind_its_head_on_one_type_wakes_for_a_window_on_another(reference):
    # H (A100 only) would open the free A100 that training's reservation keeps; F (any
    # type) is behind H on the A100, over batch's max_gpus on the L40S (its MPS charge is
    # half a GPU there) - where H is no head of it. The window lets F join R's card at 3600.
    s = _run(reference, [_mps("H", 1.0, "A100-80GB"), _mps("F", 2.0)])
    _edge_starts(s, "F", reference)


@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("with_follower", [False, True])
def test_a_head_held_by_a_reservation_on_one_type_wakes_for_a_window_on_another(reference, with_follower):
    # A (any type) is kept off the A100 by training's reservation and over the window's
    # limit on the L40S; B (A100 only) waits behind A. The window lets A start on l1.
    later = [_mps("A", 1.0)] + ([_mps("B", 2.0, "A100-80GB")] if with_follower else [])
    s = _run(reference, later)
    _edge_starts(s, "A", reference)
