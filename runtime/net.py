"""Free TCP ports on this host: the one helper every launcher and server of the runtime uses.

The local launcher, the foreign-trainer launcher, the baselines and the control service each need
a port that nothing listens on yet (a rendezvous store, a lighthouse, an HTTP server). The port
is checked by binding it; the socket is closed again, so the caller binds it itself a moment
later. It is drawn at random from below the kernel's ephemeral range (and below the dev
cluster's daemon ports, which start at 20000): a port the kernel chose for port 0 is an
ephemeral one, which any process's next outgoing connection may take as its source port before
the caller binds it (seen as a rendezvous store's `EADDRINUSE` on a loaded machine).
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: Where ports are drawn from, below the ephemeral range and the dev cluster's port blocks.
LOW, HIGH = 10000, 20000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_TRIES = 64


def _ephemeral_start(path: Path = _EPHEMERAL_RANGE) -> int:
    """The first port of the kernel's ephemeral range (Linux's default when unreadable)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _binds(family: socket.AddressFamily, host: str, port: int) -> int | None:
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return None
        return int(s.getsockname()[1])


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` (IPv4 or IPv6 address) that was free a moment ago, outside the
    ephemeral range where it can be; the kernel's choice when no port there is free."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    high = min(HIGH, _ephemeral_start())
    for _ in range(_TRIES if high > LOW else 0):
        port = _binds(family, host, random.randrange(LOW, high))
        if port is not None:
            return port
    port = _binds(family, host, 0)
    if port is None:
        raise OSError(f"no free TCP port on {host}")
    return port
