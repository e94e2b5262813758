"""Each replica's local end of the Lighthouse gate (`runtime.control.lighthouse_gate`).

The supervisor runs a `LighthouseForwarder` on 127.0.0.1:<free port> that does the handshake
towards the gate for every connection, and the trainer's Manager is pointed at the forwarder
(`TORCHFT_LIGHTHOUSE=http://127.0.0.1:<port>`); the forwarder re-reads the gate's address for
every connection, so it follows a control job that was requeued elsewhere. Loopback is open to
every user of the node, so the forwarder serves only connections from its own user (`peer_uid`,
from the kernel's socket table) and drops the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from runtime.control.event_loop import new_event_loop
from runtime.control.lighthouse_gate import client_handshake, host_port, splice, url
from slurm.errors import EnvironmentProblem

log = logging.getLogger("fthsdp.gate")


def peer_uid(
    peer: tuple[str, int], local: tuple[str, int], table: Path = Path("/proc/net/tcp")
) -> int | None:
    """The uid owning the IPv4 socket `peer` connected to `local`, from the kernel's socket
    table; None when it is not there (or not readable)."""
    try:
        lines = table.read_text().splitlines()[1:]
    except OSError:
        return None
    want = (_hex_address(peer), _hex_address(local))
    for line in lines:
        fields = line.split()
        if len(fields) > 7 and (fields[1], fields[2]) == want:
            return int(fields[7])
    return None


def _hex_address(address: tuple[str, int]) -> str:
    """`127.0.0.1:8080` as /proc/net/tcp writes it: `0100007F:1F90`."""
    packed = socket.inet_aton(address[0])
    return f"{int.from_bytes(packed, 'little'):08X}:{address[1]:04X}"


class LighthouseForwarder:
    """A replica's local end of the gate: 127.0.0.1:<port>, one handshake per connection."""

    def __init__(
        self,
        secret: bytes,
        key_id: str,
        gate: Callable[[], str | None],
        timeout_s: float = 5.0,
    ) -> None:
        self.secret = secret
        self.key_id = key_id
        self.gate = gate
        self.timeout_s = timeout_s
        self._server: asyncio.Server | None = None
        self.port = 0
        self.failures = 0
        #: Connections dropped for coming from another user.
        self.strangers = 0
        self._last_note = 0.0

    @property
    def url(self) -> str:
        return url("127.0.0.1", self.port)

    async def start(self, port: int = 0) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", port)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer, local = writer.get_extra_info("peername"), writer.get_extra_info("sockname")
        uid = peer_uid(peer, local) if isinstance(peer, tuple) else None
        if uid != os.getuid():
            self.strangers += 1
            self._fail(f"a connection from uid {uid} (not this user's) was dropped")
            writer.transport.abort()
            return
        address = self.gate()
        try:
            if address is None:
                raise ConnectionError("no Lighthouse address in control.json yet")
            host, port = host_port(address)
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(host, port), self.timeout_s
            )
        except (OSError, ValueError, TimeoutError) as exc:
            self._fail(f"cannot reach the Lighthouse gate {address}: {exc}")
            writer.transport.abort()
            return
        try:
            await asyncio.wait_for(
                client_handshake(up_reader, up_writer, self.secret, self.key_id), self.timeout_s
            )
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            self._fail(f"handshake with the Lighthouse gate {address} failed: {exc!r:.200}")
            up_writer.transport.abort()
            writer.transport.abort()
            return
        await splice((reader, writer), (up_reader, up_writer))

    def _fail(self, why: str) -> None:
        self.failures += 1
        now = time.monotonic()
        if now - self._last_note >= 10.0:
            self._last_note = now
            log.warning("%s (%d failures so far)", why, self.failures)


class ForwarderThread:
    """A `LighthouseForwarder` on its own event loop in a daemon thread, for the synchronous
    replica supervisor: `start()` returns its URL once it listens."""

    def __init__(self, forwarder: LighthouseForwarder) -> None:
        self.forwarder = forwarder
        self._loop = new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="lighthouse-forwarder", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self.forwarder.start())
        except BaseException as exc:  # handed to start()'s caller
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self.forwarder.close())
        tasks = asyncio.all_tasks(self._loop)  # connections still piped: end them
        for task in tasks:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.close()

    def start(self, timeout_s: float = 10.0) -> str:
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise EnvironmentProblem("the Lighthouse forwarder did not listen in time")
        if self._error is not None:
            raise EnvironmentProblem(f"the Lighthouse forwarder cannot listen: {self._error}")
        return self.forwarder.url

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5.0)
