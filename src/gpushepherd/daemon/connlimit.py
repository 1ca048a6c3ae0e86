"""Connection limits of ``shepherd server``'s HTTP side (design note 017, point 11).

uvicorn closes a keep-alive connection idle for ``timeout_keep_alive`` seconds, but it
has no limit on open connections and no timeout for a request's headers: a client that
opens sockets and sends nothing, or trickles a header a byte at a time (slowloris), holds
a descriptor for ever, and a few hundred of them starve every other request.

``guarded_protocol`` subclasses uvicorn's HTTP protocol (httptools, else h11) with:

* a header timeout: a request must have its headers (and be running) within
  ``header_timeout_s`` of the connection's start or of the end of the previous
  response, else the connection is closed;
* a body timeout: its body must have arrived within ``body_timeout_s`` of that start,
  else 408 and close;
* a cap on open connections: ``max_connections``, and never more than the process's
  descriptor limit less ``FD_RESERVE`` (the database, logs and jobs need descriptors
  too); a connection over the cap gets 503 and is closed at once.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger("gpushepherd.daemon")

#: descriptors kept for everything but HTTP connections
FD_RESERVE = 128
#: the fewest connections the cap ever allows
MIN_CONNECTIONS = 16

_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
         b"connection: close\r\ncontent-length: 58\r\n\r\n"
         b'{"detail": "too many connections open: retry in a second"}')
_SLOW = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
         b"content-length: 50\r\n\r\n{\"detail\": \"the request did not arrive in time\"}")


def connection_cap(max_connections: int) -> int:
    """``max_connections``, lowered to the descriptor limit less ``FD_RESERVE`` (at
    least ``MIN_CONNECTIONS``)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections
    return max(MIN_CONNECTIONS, min(max_connections, soft - FD_RESERVE))


def guarded_protocol(header_timeout_s: float = 10.0, body_timeout_s: float = 30.0, max_connections: int = 1000):
    """The HTTP protocol class to give ``uvicorn.run(http=...)``: uvicorn's own, with the
    header and body timeouts and the connection cap of this module's docstring.

    Raises:
        ValueError: a timeout that is not positive, or a body timeout shorter than the
            header timeout; fewer than 1 connection.
    """
    if not 0 < header_timeout_s <= body_timeout_s:
        raise ValueError(f"header_timeout_s / body_timeout_s: {header_timeout_s!r} / {body_timeout_s!r} is not "
                         "allowed: 0 < header timeout <= body timeout")
    if max_connections < 1:
        raise ValueError(f"max_connections: {max_connections!r} is not allowed: at least 1")
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as Base
    except ImportError:  # pragma: no cover - httptools is a dependency
        from uvicorn.protocols.http.h11_impl import H11Protocol as Base
    cap = connection_cap(max_connections)

    class Guarded(Base):
        """uvicorn's protocol with timeouts and a cap (``guarded_protocol``)."""

        _timer = None
        _refused = False

        def connection_made(self, transport) -> None:  # noqa: ANN001
            super().connection_made(transport)
            if len(self.connections) > cap:
                self._refused = True
                transport.write(_BUSY)
                transport.close()
                return
            self._arm(header_timeout_s, self._headers_late)

        def _arm(self, seconds: float, fn) -> None:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self.loop.call_later(seconds, fn)

        def _in_request(self) -> bool:
            cycle = self.cycle
            return cycle is not None and not cycle.response_complete

        def _headers_late(self) -> None:
            self._timer = None
            if self.transport.is_closing():
                return
            if not self._in_request():  # idle, or headers not complete: a slow or silent client
                self.transport.close()
            elif self.cycle.more_body:  # headers in, body still arriving: wait for the rest of it
                self._arm(body_timeout_s - header_timeout_s, self._body_late)

        def _body_late(self) -> None:
            self._timer = None
            if not self.transport.is_closing() and self._in_request() and self.cycle.more_body:
                self.transport.write(_SLOW)
                self.transport.close()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():  # the next request's headers are timed again
                self._arm(header_timeout_s, self._headers_late)

        def connection_lost(self, exc) -> None:  # noqa: ANN001
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            super().connection_lost(exc)

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{Base.__name__}"
    Guarded.cap = cap
    return Guarded


def listen_socket(host: str, port: int, backlog: int = 2048):
    """A TCP socket bound to ``host:port`` and listening (``SO_REUSEADDR``, as uvicorn
    binds), for ``uvicorn.Server.run(sockets=[...])``: ``shepherd server`` binds before its
    daemon starts, so a port in use is a clean error and its first log line states a
    fact (note 019). Returns ``(socket, "http://HOST:PORT")``, IPv6 hosts in brackets.

    Raises:
        OSError: the address cannot be resolved or bound (in use, not this machine's).
    """
    import socket

    family, kind, proto, _name, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(backlog)
        sock.set_inheritable(False)
    except BaseException:
        sock.close()
        raise
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if family == socket.AF_INET6 else bound_host
    return sock, f"http://{shown}:{bound_port}"
