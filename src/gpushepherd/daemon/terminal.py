"""The server's side of a job's pseudo-terminal (``pty: true``, design note 041).

``open_terminal`` makes the pair: the slave goes to the job's runner (its stdin; the
runner makes it the controlling terminal of its session and the job's stdin, stdout and
stderr), the master stays here in a ``Terminal``: one thread reads it for the run's
whole life - into the run's stdout log and a replay buffer, and to every attached client
- so the job never blocks on a full terminal while nobody is attached. Clients
(``GET /jobs/{id}/attach``, a WebSocket) write keystrokes and window sizes to it.

When the last client goes and none comes back within ``DETACH_GRACE_S`` (or none came
within ``START_GRACE_S`` of the start) the ``on_detached`` callback runs - the server
cancels the job: the session ended. A client
that comes back within the grace keeps it; it passes the byte offset it has already
seen, and the buffer replays what it missed (up to ``REPLAY_BYTES``).
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import select
import struct
import termios
import threading
from collections.abc import Callable

log = logging.getLogger("gpushepherd.daemon")

#: seconds a running pty job may be without a client once its last one left, before it is cancelled
DETACH_GRACE_S = 5.0
#: seconds from its start a pty job may wait for its first client (``run`` looks every 0.5 s)
START_GRACE_S = 30.0
#: bytes of output kept for a client that attaches late or comes back
REPLAY_BYTES = 256 * 1024
#: a new terminal's size (rows, columns) until a client sends its own
DEFAULT_SIZE = (24, 80)
_READ = 65536
#: reads of a closing terminal's buffered output at most (a process still writing cannot keep it open)
CLOSING_READS = 64
#: seconds a closing terminal waits for more of its output before it ends
CLOSING_WAIT_S = 0.05


def open_terminal(owner_uid: int | None = None) -> tuple[int, int]:
    """A new pseudo-terminal ``(master, slave)`` of ``DEFAULT_SIZE``; the slave given to
    ``owner_uid`` when set (as ``login`` does: its user may reopen it, ``mesg``). Both
    descriptors are close-on-exec; the caller passes the slave to one child and closes
    its own copy.

    Raises:
        OSError: no pseudo-terminal could be made (``/dev/ptmx``, the devpts limit).
    """
    master, slave = os.openpty()
    try:
        set_size(master, *DEFAULT_SIZE)
        if owner_uid is not None:
            os.fchown(slave, owner_uid, -1)
    except OSError:
        os.close(master)
        os.close(slave)
        raise
    return master, slave


def set_size(fd: int, rows: int, cols: int) -> None:
    """``TIOCSWINSZ``: the terminal's size; the kernel sends SIGWINCH to its foreground group."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class Terminal:
    """The master side of one run's terminal, relayed. ``log_fd``: the run's stdout log,
    opened to append (this object closes it, and ``master``, at the end).

    Thread-safety: ``subscribe``/``unsubscribe``/``write``/``resize`` may be called from
    any thread; subscribers' callbacks run in the reader thread (they hand the bytes to
    their own event loop)."""

    def __init__(self, job_id: str, run: int, master: int, log_fd: int,
                 on_detached: Callable[[str, int], None] | None = None, grace_s: float = DETACH_GRACE_S,
                 start_grace_s: float = START_GRACE_S):
        self.job_id, self.run, self.master, self.log_fd = job_id, run, master, log_fd
        self.on_detached, self.grace_s, self.start_grace_s = on_detached, grace_s, start_grace_s
        self.ended = False
        self.total = 0  # bytes read from the job so far
        self._buf = bytearray()  # the last REPLAY_BYTES of them
        self._subs: dict[int, Callable[[bytes | None], None]] = {}
        self._next_sub = 0
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._read_loop, name=f"pty-{job_id}", daemon=True)

    def start(self) -> None:
        """Start reading; the start grace runs until a client subscribes."""
        self._thread.start()
        with self._lock:
            self._arm(self.start_grace_s)

    # -- the reader thread
    def _read_loop(self) -> None:
        closing = 0  # after close(): reads left for what is already buffered, then the end
        try:
            while True:
                # closing: output the kernel is still handing to the master arrives within the wait
                ready, _, _ = select.select([self.master, self._wake_r], [], [], CLOSING_WAIT_S if closing else None)
                if self._wake_r in ready and not closing:
                    closing = CLOSING_READS
                if self.master not in ready or closing == 1:
                    if closing:
                        break
                    continue
                closing = max(0, closing - 1)
                try:
                    data = os.read(self.master, _READ)
                except OSError:  # EIO: every slave descriptor is closed (the run ended)
                    break
                if not data:
                    break
                try:
                    os.write(self.log_fd, data)
                except OSError as exc:
                    log.warning("job %s: run %d: cannot write the terminal's output to its log: %s",
                                self.job_id, self.run, exc)
                with self._lock:
                    self.total += len(data)
                    self._buf += data
                    del self._buf[:-REPLAY_BYTES]
                    subs = list(self._subs.values())
                for deliver in subs:
                    deliver(data)
        finally:
            with self._lock:
                self.ended = True
                subs = list(self._subs.values())
                self._subs.clear()
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
            for deliver in subs:
                deliver(None)
            with self._write_lock:  # no write is under way on the master as it closes
                for fd in (self.master, self.log_fd, self._wake_r, self._wake_w):
                    try:
                        os.close(fd)
                    except OSError:
                        pass

    def close(self) -> None:
        """Stop relaying (the run is over): what the terminal holds already is read, then
        the master is closed - processes of the run still on the terminal are hung up (read
        EOF/EIO) - and subscribers get the end."""
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    # -- clients
    def subscribe(self, deliver: Callable[[bytes | None], None], offset: int = 0) -> tuple[int, bytes] | None:
        """Attach a client: ``deliver(bytes)`` for each later chunk of output, then
        ``deliver(None)`` at the end. Returns ``(subscription, what it missed since byte
        offset)`` - the replay buffer from ``offset`` (from its start when ``offset`` is
        older) - or ``None`` when the terminal has ended."""
        with self._lock:
            if self.ended:
                return None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            start = max(0, min(offset, self.total) - (self.total - len(self._buf)))
            sub = self._next_sub
            self._next_sub += 1
            self._subs[sub] = deliver
            return sub, bytes(self._buf[start:])

    def unsubscribe(self, sub: int) -> None:
        """Detach a client; the last one going arms the detach grace."""
        with self._lock:
            if self._subs.pop(sub, None) is not None and not self._subs and not self.ended:
                self._arm(self.grace_s)

    def _arm(self, seconds: float) -> None:
        if self.on_detached is None:
            return
        self._timer = threading.Timer(seconds, self._detached)
        self._timer.daemon = True
        self._timer.start()

    def _detached(self) -> None:
        with self._lock:
            if self._subs or self.ended:
                return
            self._timer = None
        log.info("job %s: run %d: no client attached to its terminal: the session ended", self.job_id, self.run)
        try:
            self.on_detached(self.job_id, self.run)
        except Exception:  # noqa: BLE001 - a timer thread: the log says it
            log.exception("job %s: cancelling the detached session failed", self.job_id)

    def write(self, data: bytes) -> None:
        """Keystrokes to the job (blocks while the terminal's input queue is full)."""
        with self._write_lock:  # ended is set before the master closes, under this lock
            view = memoryview(data)
            while view and not self.ended:
                try:
                    view = view[os.write(self.master, view):]
                except OSError:
                    return

    def resize(self, rows: int, cols: int) -> None:
        """A client's window size (``ValueError`` outside 1..65535)."""
        if not (0 < rows < 65536 and 0 < cols < 65536):
            raise ValueError(f"resize: {rows}x{cols} is not allowed: rows and columns 1-65535")
        if not self.ended:
            try:
                set_size(self.master, rows, cols)
            except OSError:
                pass


def async_deliver(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> Callable[[bytes | None], None]:
    """A ``Terminal.subscribe`` callback that puts each chunk into ``queue`` on ``loop``."""
    def deliver(data: bytes | None) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, data)
        except RuntimeError:  # the loop is closed: the server stops
            pass
    return deliver
