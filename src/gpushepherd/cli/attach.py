"""The client side of ``shepherd run --pty`` (issue 18 point 5, design note 041): the
user's terminal attached to a running pty job's terminal through the server's WebSocket
``/jobs/{id}/attach`` (a token over TCP, or the kernel's word on the Unix socket).

The local terminal is put in raw mode while attached (restored on every way out): each
key goes to the job as a byte - Ctrl-C is 0x03, which the job's terminal turns into
SIGINT for the job's foreground processes, as ssh and ``srun --pty`` do - and the job's
output is written as it comes. SIGWINCH sends the window's size. Stdlib and the
``websockets`` package's synchronous client; imported only by ``run --pty``.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import struct
import termios
import threading
import time
import tty
from contextlib import ExitStack
from typing import Any

#: seconds between two looks for the end of the job's receive wait (signal handlers run between)
RECV_POLL_S = 0.5
#: times a dropped connection is tried again (within the server's detach grace)
RECONNECTS = 3


class AttachRefused(Exception):
    """The server refused the attach: ``status`` (403, 404, 409) and its ``detail``."""

    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status = status


def ws_url(http_url: str) -> str:
    """``http://h:p`` -> ``ws://h:p``, ``https://`` -> ``wss://``.

    Raises:
        ValueError: not an http(s) URL.
    """
    for scheme, ws in (("https://", "wss://"), ("http://", "ws://")):
        if http_url[:len(scheme)].lower() == scheme:  # a scheme is case-insensitive (HTTP://)
            return ws + http_url[len(scheme):]
    raise ValueError(f"--server: {http_url!r} is not allowed for --pty: an http:// or https:// URL, or unix:PATH")


def connect(server: str | None, token: str | None, job_id: str, offset: int):
    """A WebSocket to the job's terminal (a ``websockets.sync.client`` connection, to be
    used as a context manager), from
    byte ``offset`` of its output: on the local Unix socket when the CLI would use it
    (no token sent), else the server's URL with the token.

    Raises:
        AttachRefused: the server answered the handshake with an error.
        OSError: no server there.
    """
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect as ws_connect
    from websockets.sync.client import unix_connect

    from gpushepherd.cli.daemon import _job_path, _url, local_socket

    path = _job_path(job_id, "/attach") + f"?offset={offset}"
    unix = local_socket(server, token)
    try:
        if unix is not None:
            from gpushepherd.daemon.unixsock import short_path

            with short_path(unix) as where:
                return unix_connect(where, "ws://shepherd" + path, max_size=None, compression=None)
        headers = {"Authorization": f"Bearer {token}"} if token else None
        return ws_connect(ws_url(_url(server)) + path, additional_headers=headers, max_size=None, compression=None)
    except InvalidStatus as exc:
        body = exc.response.body or b""
        try:
            detail = json.loads(body).get("detail")
        except ValueError:
            detail = body.decode(errors="replace")
        raise AttachRefused(exc.response.status_code, str(detail or exc)) from None


def window_size(fd: int) -> tuple[int, int] | None:
    """``(rows, columns)`` of the terminal ``fd``; ``None``: not a terminal."""
    try:
        rows, cols, _x, _y = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
    except OSError:
        return None
    return (rows, cols) if rows and cols else None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class Attached:
    """One attach session: ``open(0)``, then ``run()`` relays until the job's terminal
    ends (``True``) or the connection is lost for good (``False``). ``received``: bytes of
    output so far (the offset a reconnect asks from)."""

    def __init__(self, server: str | None, token: str | None, job_id: str, stdin: int = 0, stdout: int = 1):
        self.server, self.token, self.job_id = server, token, job_id
        self.stdin, self.stdout = stdin, stdout
        self.received = 0
        self.ws: Any = None
        self._stop = threading.Event()
        self._conns = ExitStack()

    def open(self, offset: int) -> None:
        """Connect (``connect``'s errors) from byte ``offset``; closed at the end of ``run``."""
        self.ws = self._conns.enter_context(connect(self.server, self.token, self.job_id, offset))

    def _send(self, message: bytes | str) -> None:
        ws = self.ws
        if ws is None:
            return
        try:
            ws.send(message)
        except Exception:  # noqa: BLE001 - closed under us: the receiving side sees why
            pass

    def _send_size(self, *_: Any) -> None:
        size = window_size(self.stdin) or window_size(self.stdout)
        if size is not None:
            self._send(json.dumps({"resize": list(size)}))

    def _keys(self) -> None:
        """The stdin thread: every byte read goes to the job; at the end of a stdin that
        is no terminal, the terminal's end-of-file character (Ctrl-D)."""
        while not self._stop.is_set():
            try:
                data = os.read(self.stdin, 4096)
            except OSError:
                return
            if not data:
                if not os.isatty(self.stdin):
                    self._send(b"\x04")
                return
            self._send(data)

    def _relay(self) -> bool:
        from websockets.exceptions import ConnectionClosed, ConnectionClosedOK

        while True:
            try:
                data = self.ws.recv(timeout=RECV_POLL_S)
            except TimeoutError:
                continue
            except ConnectionClosedOK:
                return True
            except (ConnectionClosed, OSError):
                return False
            if isinstance(data, bytes):
                self.received += len(data)
                _write_all(self.stdout, data)

    def run(self) -> bool:
        """Relay on the connection ``open`` made, and reconnect from ``received`` after a
        dropped connection. Raw mode and the SIGWINCH handler are restored on every way out.

        Raises:
            AttachRefused: a reconnect refused with anything but 409 (the terminal ended).
        """
        saved = termios.tcgetattr(self.stdin) if os.isatty(self.stdin) else None
        previous = signal.signal(signal.SIGWINCH, self._send_size)
        try:
            if saved is not None:
                tty.setraw(self.stdin, termios.TCSANOW)
            self._send_size()
            threading.Thread(target=self._keys, name="stdin", daemon=True).start()
            for attempt in range(RECONNECTS + 1):
                if self._relay():
                    return True
                if attempt == RECONNECTS:
                    return False
                time.sleep(1.0)
                try:
                    self.open(self.received)
                except AttachRefused as exc:
                    if exc.status == 409:
                        return True  # it ended while we were away
                    raise
                except OSError:
                    continue
                self._send_size()
            return False
        finally:
            self._stop.set()
            signal.signal(signal.SIGWINCH, previous)
            if saved is not None:
                try:
                    termios.tcsetattr(self.stdin, termios.TCSAFLUSH, saved)
                except termios.error:  # the terminal is gone (hung up)
                    pass
            try:
                self._conns.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass
