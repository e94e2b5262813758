"""Free TCP ports on this host: the one helper every launcher and server of the runtime uses.

The local launcher, the foreign-trainer launcher, the baselines and the control service each need
a port that nothing listens on yet (a rendezvous store, a lighthouse, an HTTP server). The port
is found by binding port 0 and reading back what the kernel chose; the socket is closed again, so
the caller binds it itself a moment later (another process could take it in between, as with any
such helper).
"""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` (IPv4 or IPv6 address) that was free a moment ago."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
