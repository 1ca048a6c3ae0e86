"""Who is at the other end of a loopback TCP connection: the kernel's TCP table
(``/proc/net/tcp``, ``/proc/net/tcp6``) names the uid that owns each socket, as
``identd`` (RFC 1413) answers for a port pair - here without a daemon, for the
connections of this host only (design note 087).

A loopback connection has both ends on this host: the client's socket is the table row
whose local address is the request's client address and whose remote address is the
server's. Its ``uid`` column is the effective uid of the process that made the socket,
while that socket is open (an orphan reads 0). The client address must be the socket's
own, never a proxy header's (``X-Forwarded-For``): the server runs uvicorn without them.
No library reads it (``psutil.net_connections`` gives pids, and only of processes it may
inspect), and the format is fixed since Linux 2.2: a few lines here.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

#: the tables read, IPv4 then IPv6 (an IPv4 client of a dual-stack server is in tcp6)
TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
#: the TCP state whose socket still belongs to its maker: ESTABLISHED (01). A client that
#: closed its end (FIN_WAIT1/2: 04, 05) left an orphan the kernel lists as uid 0: trusting
#: it made a caller who sent a request and closed at once root (note 087, review)
LIVE_STATES = frozenset({"01"})


def _address(field: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    """``0100007F:1F90`` (the kernel's hex: each 32-bit word in host byte order, the
    port big-endian) -> ``(127.0.0.1, 8080)``."""
    host, port = field.split(":")
    raw = bytes.fromhex(host)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # little-endian hosts
    ip = ipaddress.ip_address(words)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip, int(port, 16)


def _ip(host: str):
    ip = ipaddress.ip_address(host.strip("[]"))
    return ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None else ip


def peer_uid(client: tuple[str, int], server: tuple[str, int], tables=TABLES) -> int | None:
    """The uid owning the client socket of the TCP connection ``client`` -> ``server``
    (``(host, port)`` as the ASGI scope gives them), or ``None`` when no live row of the
    tables is that connection (closed already, not on this host, no ``/proc``).

    Raises:
        ValueError: ``client`` or ``server`` is not an IP address and port.
    """
    want = ((_ip(client[0]), int(client[1])), (_ip(server[0]), int(server[1])))
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) < 8 or cols[3] not in LIVE_STATES:
                continue
            try:
                if (_address(cols[1]), _address(cols[2])) == want:
                    return int(cols[7])
            except ValueError:
                continue
    return None
