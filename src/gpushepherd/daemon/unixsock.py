"""The local Unix socket of ``shepherd server`` (design note 025).

Any local user may connect (mode 0666); the kernel tells who they are: the peer's
``SO_PEERCRED`` (pid, uid, gid), read once per connection by ``peer_protocol``'s
``connection_made`` and put into every request's ASGI scope under ``PEER_KEY``. Only
this protocol sets that key, and a client cannot (the scope is the server's), so a TCP
request never carries it.

``sun_path`` holds 108 bytes: a longer path is bound and connected through
``/proc/self/fd/N/NAME``, ``N`` a descriptor of its directory (``short_path``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: the ASGI scope key of a socket request's peer (``PeerCred``)
PEER_KEY = "gpushepherd.peer"
#: the socket's name in the data directory
SOCKET_NAME = "shepherd.sock"
#: the longest path ``bind``/``connect`` take directly (``sun_path`` less its NUL)
MAX_SUN_PATH = 107
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass(frozen=True)
class PeerCred:
    """What the kernel says of the process at the other end of a Unix socket."""

    pid: int
    uid: int
    gid: int


def peer_cred(sock) -> PeerCred:
    """``SO_PEERCRED`` of a connected Unix socket (a ``socket.socket`` or asyncio's
    ``TransportSocket``): the credentials of the peer when it connected.

    Raises:
        OSError: not a Unix socket, or not connected.
    """
    return PeerCred(*_UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)))


def peer_protocol(base: type) -> type:
    """A subclass of the uvicorn HTTP protocol ``base`` (``connlimit.guarded_protocol``'s)
    that reads the peer's ``SO_PEERCRED`` when a connection is made and serves that
    connection's requests with ``scope[PEER_KEY]`` set to it. A connection whose peer
    cannot be read is closed at once."""

    class Peer(base):
        def connection_made(self, transport) -> None:
            try:
                cred = peer_cred(transport.get_extra_info("socket"))
            except (OSError, AttributeError):
                transport.close()
                return
            super().connection_made(transport)
            inner = self.app

            async def app(scope, receive, send):
                scope[PEER_KEY] = cred
                return await inner(scope, receive, send)
            self.app = app

    Peer.__name__ = Peer.__qualname__ = f"Peer{base.__name__}"
    return Peer


@contextlib.contextmanager
def short_path(path: Path) -> Iterator[str]:
    """A path ``bind``/``connect`` take for ``path``: itself when it fits ``sun_path``,
    else ``/proc/self/fd/N/NAME`` with ``N`` a descriptor of its directory, open while
    the context lasts (Linux)."""
    text = os.fsdecode(path)
    if len(os.fsencode(text)) <= MAX_SUN_PATH:
        yield text
        return
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


def is_socket(path: Path) -> bool:
    """``path`` exists and is a socket."""
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def live_socket(path: Path, timeout: float = 1.0) -> bool:
    """Whether a process answers on the Unix socket ``path``: ``connect`` succeeds, or
    fails other than refused (a full backlog, no permission: someone may be there). A
    missing path, one that is no socket, or a refused connection (a stale file, its
    server gone) is ``False``."""
    if not is_socket(path):
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(timeout)
    try:
        with short_path(path) as where:
            probe.connect(where)
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return True
    finally:
        probe.close()
    return True


class UnixListener:
    """A listening Unix socket bound to ``path`` (``sock``), and the inode of the file
    it made: ``close`` removes that file only, never one a later server bound there."""

    def __init__(self, path: Path, backlog: int = 2048):
        self.path = path
        self.sock = listen_unix(path, backlog)
        self.ino = os.stat(path).st_ino

    def unlink(self) -> None:
        """Remove the socket's file if it is still the one this listener made."""
        try:
            if os.stat(self.path).st_ino == self.ino:
                self.path.unlink()
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()
        self.unlink()


def listen_unix(path: Path, backlog: int = 2048) -> socket.socket:
    """A Unix stream socket bound to ``path``, mode 0666, listening. A socket file
    already there is removed first: call this only while holding the data directory's
    lock (no live server can own it then).

    Raises:
        OSError: the directory is missing or not writable; ``path`` is something other
            than a socket, or a socket another process answers on (never removed).
    """
    if path.is_symlink() or (path.exists() and not is_socket(path)):
        raise OSError(f"{path} exists and is not a socket: remove it or choose another --socket")
    if path.exists():
        if live_socket(path):  # another server's (another data dir's) socket: never taken over
            raise OSError("another process listens on it: stop it or choose another --socket")
        path.unlink()  # stale: its server is gone
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with short_path(path) as where:
            sock.bind(where)
        os.chmod(path, 0o666)  # any local user may connect; the kernel says who they are
        sock.listen(backlog)
        sock.set_inheritable(False)
    except BaseException:
        sock.close()
        raise
    return sock
