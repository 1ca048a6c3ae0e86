"""Job arrays (R9, Slurm's ``--array``; design note 008, "Job arrays").

An array is a parent record (table ``arrays``); the daemon submits its chunks as
ordinary child jobs ``<array>_<index>`` (a retry: ``<array>_<index>.<attempt>``), at
most ``%N`` of them not yet ended at a time, in index order. Which children exist is
read back from the jobs table at a restart, their states from the replayed core, so
nothing about an array's progress is stored twice.
"""

from __future__ import annotations

import heapq
import itertools
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

#: at most this many tasks in one array (and the largest throttle ``%N``)
MAX_TASKS = 100_000
#: the largest task index (Slurm's own bound is smaller: MaxArraySize - 1)
MAX_INDEX = 2**31 - 1
#: the most times a FAILED chunk may be run again
MAX_RETRIES = 100
#: lazy expansion (note 017): at most this many tasks of one array not ended at a time,
#: whatever its ``%N`` (Slurm keeps an array one record until its tasks start) ...
MAX_LIVE_TASKS = 1000
#: ... and at most this many new tasks submitted per loop step, over all arrays
MAX_TASKS_PER_STEP = 500

_RUNNING = ("RUNNING", "PREEMPTING", "STOPPING")
#: how a chunk that surely ran ends (a CANCELLED one ran if it started: ``started``)
_RAN = ("COMPLETED", "FAILED", "TIMEOUT")


def _started_by_state(state_of: Callable[[str], str | None]) -> Callable[[str], bool]:
    """``started`` when the caller knows no starts: a chunk ran if it ended in ``_RAN``."""
    return lambda job_id: (state_of(job_id) or "PENDING") in _RAN

_PART = re.compile(r"(\d+)(?:-(\d+)(?::(\d+))?)?")
_CHILD = re.compile(r"(\d+)_(\d+)(?:\.(\d+))?")


def parse_array(text: str) -> tuple[list[int], int]:
    """``0-99%8``, ``1,3,5-7``, ``0-15:4`` -> (sorted distinct indices, throttle; the
    task count when no ``%N``).

    Raises:
        ValueError: naming the value and what is allowed.
    """
    allowed = ("allowed: INDEXES[%N], INDEXES a comma list of I, I-J or I-J:STEP with 0 <= I <= J <= "
               f"{MAX_INDEX}, at most {MAX_TASKS:,} tasks, 1 <= N <= {MAX_TASKS}")
    text = text.strip()
    spec, pct, throttle_text = text.partition("%")
    if not spec:
        raise ValueError(f"{text!r} is not allowed: no indexes; {allowed}")
    indices: set[int] = set()
    for part in spec.split(","):
        m = _PART.fullmatch(part.strip())
        if not m:
            raise ValueError(f"{text!r} is not allowed: {part!r} is no index or range; {allowed}")
        if any(g is not None and len(g) > 10 for g in m.groups()):  # int() of 5,000 digits is slow
            raise ValueError(f"{text!r} is not allowed: a number in {part!r} is above {MAX_INDEX}; {allowed}")
        lo, hi, step = int(m[1]), int(m[2] if m[2] is not None else m[1]), int(m[3] or 1)
        if hi > MAX_INDEX or step > MAX_INDEX:
            raise ValueError(f"{text!r} is not allowed: a number in {part!r} is above {MAX_INDEX}; {allowed}")
        if hi < lo:
            raise ValueError(f"{text!r} is not allowed: the range {part!r} is reversed; {allowed}")
        if step < 1:
            raise ValueError(f"{text!r} is not allowed: step {step} in {part!r}; {allowed}")
        if (hi - lo) // step + 1 + len(indices) > MAX_TASKS:
            raise ValueError(f"{text!r} is not allowed: more than {MAX_TASKS:,} tasks; {allowed}")
        indices.update(range(lo, hi + 1, step))
    if pct:
        if not throttle_text.isdigit() or len(throttle_text) > 10 or not 1 <= int(throttle_text) <= MAX_TASKS:
            raise ValueError(f"{text!r} is not allowed: the throttle %{throttle_text} is outside 1..{MAX_TASKS}; "
                             f"{allowed}")
        throttle = int(throttle_text)
    else:
        throttle = len(indices)
    return sorted(indices), throttle


def check_array(text: str, indices: list[int], throttle: int, max_retries: int) -> None:
    """Check an array's parts as ``Daemon.submit`` takes them (the API parsed them with
    ``parse_array``; an embedding program may not have), so that no value the database
    cannot hold reaches a batch (one bad row would fail the whole batch's commit).

    Raises:
        ValueError: naming the part, the value and what is allowed.
    """
    if not indices or len(indices) > MAX_TASKS or any(not 0 <= i <= MAX_INDEX for i in indices):
        raise ValueError(f"array: {text!r} is not allowed: 1 to {MAX_TASKS:,} indexes in 0..{MAX_INDEX}")
    if not 1 <= throttle <= MAX_TASKS:
        raise ValueError(f"array: the throttle %{throttle} of {text!r} is not allowed: 1..{MAX_TASKS}")
    if not 0 <= max_retries <= MAX_RETRIES:
        raise ValueError(f"max_retries: {max_retries!r} is not allowed: 0..{MAX_RETRIES}")


def child_id(array_id: str, index: int, attempt: int) -> str:
    """The id of one attempt of one chunk: ``7_3``, then ``7_3.2``, ``7_3.3`` for retries."""
    return f"{array_id}_{index}" if attempt == 1 else f"{array_id}_{index}.{attempt}"


def parse_child_id(job_id: str) -> tuple[str, int, int] | None:
    """``(array, index, attempt)`` of a child's id; ``None`` for a plain job."""
    m = _CHILD.fullmatch(job_id)
    return (m[1], int(m[2]), int(m[3] or 1)) if m else None


@dataclass
class ArrayRec:
    """An array: its row, and the ids of each chunk's attempts (oldest first)."""

    id: str
    num: int
    text: str
    indices: list[int]
    throttle: int
    max_retries: int
    submit_time: float
    spec: dict
    argv: list
    shell: bool
    env: dict
    cwd: str
    cancelled: float | None = None
    attempts: dict[int, list[str]] = field(default_factory=dict)
    ended: bool = False  # every chunk ended (set once seen; an array never restarts)
    # incremental progress (note 017: a step costs O(live children), not O(tasks))
    todo: deque = field(default_factory=deque)  # indices never submitted, ascending
    retry: list = field(default_factory=list)  # heap of indices to submit again (FAILED, retries left)
    live: dict[str, int] = field(default_factory=dict)  # child id -> index, submitted and not ended
    done: int = 0
    failed: list[int] = field(default_factory=list)  # failed for good (after retries; TIMEOUT, REJECTED, ...)
    cancelled_idx: list[int] = field(default_factory=list)  # a chunk whose last attempt was CANCELLED
    retries: int = 0  # attempts after the first, over all chunks
    ran: bool = False  # a chunk that ended had started (``started`` of a last attempt seen ending)

    def rebuild(self, state_of: Callable[[str], str | None], started: Callable[[str], bool] | None = None) -> None:
        """Recompute the incremental progress from ``attempts`` and each last attempt's
        state (``state_of(child id)``; ``None``: unknown, counted as pending). Once, at
        a start: O(tasks). ``started``: as ``update``."""
        self.todo, self.retry, self.live, self.done, self.failed, self.cancelled_idx = deque(), [], {}, 0, [], []
        self.ran = False
        self.retries = sum(len(ids) - 1 for ids in self.attempts.values())
        for i in self.indices:
            ids = self.attempts.get(i)
            if not ids:
                self.todo.append(i)
            else:
                self.live[ids[-1]] = i
        self.update(state_of, started)

    def update(self, state_of: Callable[[str], str | None], started: Callable[[str], bool] | None = None) -> None:
        """Move the live children that ended to done / retry / failed. O(live).
        ``started(child id)``: whether that child ever started (the server's first start
        or runs; default: it ended COMPLETED, FAILED or TIMEOUT) - a chunk cancelled after
        it ran has run (``counts``' between chunks)."""
        started = started or _started_by_state(state_of)
        for job_id, i in list(self.live.items()):
            st = state_of(job_id) or "PENDING"
            if st == "PENDING" or st in _RUNNING:
                continue
            del self.live[job_id]
            self.ran = self.ran or st in _RAN or started(job_id)
            if st == "COMPLETED":
                self.done += 1
            elif st == "FAILED" and len(self.attempts.get(i, ())) <= self.max_retries and self.cancelled is None:
                heapq.heappush(self.retry, i)
            elif st == "CANCELLED":
                self.cancelled_idx.append(i)
            else:
                self.failed.append(i)
        if self.cancelled is not None:  # nothing more is submitted or retried (a FAILED chunk stays failed)
            self.failed.extend(self.retry)
            self.retry = []

    def take(self, room: int) -> list[tuple[int, int]]:
        """Up to ``room`` chunks to submit now, in index order (retries and never
        submitted ones merged): ``(index, attempt)``. The caller records each child in
        ``attempts`` and ``live`` once its batch is committed (``submitted``)."""
        out: list[tuple[int, int]] = []
        retry, todo = list(self.retry), list(itertools.islice(self.todo, room))
        heapq.heapify(retry)
        ti = 0
        while len(out) < room and (retry or ti < len(todo)):
            if retry and (ti >= len(todo) or retry[0] < todo[ti]):
                i = heapq.heappop(retry)
            else:
                i = todo[ti]
                ti += 1
            out.append((i, len(self.attempts.get(i, ())) + 1))
        return out

    def submitted(self, index: int, job_id: str) -> None:
        """Record a child whose submission was committed."""
        self.attempts.setdefault(index, []).append(job_id)
        self.retries += len(self.attempts[index]) > 1
        self.live[job_id] = index
        if self.todo and self.todo[0] == index:
            self.todo.popleft()
        elif index in self.retry:
            self.retry.remove(index)
            heapq.heapify(self.retry)

    def counts(self, state_of: Callable[[str], str | None]) -> dict:
        """What ``progress`` says, from the incremental state: O(live)."""
        running = sum(1 for j in self.live if (state_of(j) or "PENDING") in _RUNNING)
        submitted_pending = len(self.live) - running
        total = len(self.indices)
        failed, cancelled = sorted(self.failed), sorted(self.cancelled_idx)
        between = (self.cancelled is None and not self.live and bool(self.todo or self.retry)
                   and (self.ran or self.retries > 0))
        state = _state(self.cancelled is not None and not self.live, self.done, len(failed), len(cancelled), total,
                       running, between)
        return {"state": state, "between": between, "total": total, "done": self.done, "failed": failed,
                "cancelled": cancelled, "running": running,
                "pending": submitted_pending + len(self.todo) + len(self.retry),
                "submitted_pending": submitted_pending, "live": len(self.live),
                "retries_used": self.retries}


def _state(cancelled: bool, done: int, failed: int, cancelled_chunks: int, total: int, running: int,
           between: bool) -> str:
    """An array's state: ``CANCELLED`` (the array cancelled, no chunk left live); once every
    chunk ended, the worst of its chunks' ends: ``FAILED`` when one failed for good
    (FAILED after its retries, TIMEOUT, REJECTED), else ``CANCELLED`` when one was
    cancelled (``shepherd cancel 7_3``), else ``COMPLETED``; before that ``RUNNING`` (a
    chunk holds GPUs, or ``between`` chunks), else ``PENDING`` (a submitted chunk waits in
    the core, or none has run yet). A cancelled chunk is never a failure and does not stop
    the others (Slurm: ``scancel 7_3`` ends that task alone, and ``afterok:7`` holds only
    when every task COMPLETED - so an array with a cancelled task never reads COMPLETED).

    ``between``: a chunk has run, none is live (submitted and not ended) and more are to
    be submitted (never submitted, or FAILED with retries left), not cancelled. The server
    submits the next chunk only at its next step (``Daemon._array_children`` reads the
    core's states before the step's exits are applied), so without this an array read
    ``RUNNING -> PENDING -> RUNNING`` between two chunks, a requeue that never happened.
    If the next chunk then waits in the core, the array is ``PENDING``: a real wait."""
    if cancelled:
        return "CANCELLED"
    if done + failed + cancelled_chunks == total:
        return "FAILED" if failed else "CANCELLED" if cancelled_chunks else "COMPLETED"
    return "RUNNING" if running or between else "PENDING"


def progress(rec: ArrayRec, states: dict[str, str], started: Callable[[str], bool] | None = None) -> dict:
    """Chunks done / failed for good / cancelled / running / pending / not submitted, retries used,
    and the array's state, from each child's core state (``states``: id -> state;
    ``started``: as ``ArrayRec.update``). ``between``: as ``ArrayRec.counts``."""
    started = started or _started_by_state(states.get)
    done, failed, cancelled, running, pending, waiting, retryable = [], [], [], [], [], [], []
    retries = 0
    for i in rec.indices:
        ids = rec.attempts.get(i, [])
        retries += max(0, len(ids) - 1)
        if not ids:
            waiting.append(i)
            continue
        st = states.get(ids[-1], "PENDING")
        if st == "COMPLETED":
            done.append(i)
        elif st in ("PENDING",):
            pending.append(i)
        elif st in ("RUNNING", "PREEMPTING", "STOPPING"):
            running.append(i)
        elif st == "FAILED" and len(ids) <= rec.max_retries and rec.cancelled is None:
            retryable.append(i)
        elif st == "CANCELLED":
            cancelled.append(i)
        else:  # FAILED after its retries, TIMEOUT, REJECTED
            failed.append(i)
    total = len(rec.indices)
    active = running or pending
    ran = bool(done or retryable or retries) or any(started(rec.attempts[i][-1]) for i in failed + cancelled)
    between = rec.cancelled is None and not active and bool(waiting or retryable) and ran
    state = _state(rec.cancelled is not None and not active, len(done), len(failed), len(cancelled), total,
                   len(running), between)
    return {"state": state, "between": between, "total": total, "done": len(done), "failed": failed,
            "cancelled": cancelled, "running": len(running),
            "pending": len(pending) + len(waiting) + len(retryable), "submitted_pending": len(pending),
            "not_submitted": waiting, "retry": retryable, "retries_used": retries}
