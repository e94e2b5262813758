"""The Lighthouse behind an authenticated gate: the handshake and the gate's side of it.

torchft 0.2.0's `torchft_lighthouse` serves its gRPC quorum service and an HTTP dashboard on one
port, without authentication, and the dashboard's `POST /replica/<id>/kill` makes a replica's
Manager exit. So the control job binds the Lighthouse to 127.0.0.1 only and puts a `LighthouseGate`
on the public address the Lighthouse used to take. A client must open with a short handshake that
proves it holds a key derived from the run's secret (`runtime.protocol.derive_key`: a replica's
key, or the operator's `control` key); only then are bytes piped both ways to the loopback
Lighthouse. The gate proves the same to the client, so a Manager never talks to an impostor
that took the port while the control job was away.

Each replica's supervisor reaches the gate through its own local end, the forwarder
(`runtime.control.lighthouse_forwarder`), which does the client's side of the handshake below.

The handshake (all sizes fixed, so a reader never waits on a length a stranger chose beyond 32):

    gate   -> client: MAGIC (8 bytes) + server nonce (32)
    client -> gate:   len(key id) (1) + key id (ASCII, 1..32) + client nonce (32)
                      + HMAC-SHA256(key, CLIENT_LABEL + server nonce + client nonce + key id)
    gate   -> client: HMAC-SHA256(key, SERVER_LABEL + server nonce + client nonce + key id)

A MAC over the gate's fresh nonce cannot be replayed. Strangers cost nothing durable: a
handshake has `handshake_s` in all (a slow sender is closed at the deadline), at most
`max_pending` handshakes are open at once and `max_pending_per_peer` per peer address; a new
connection beyond either cap evicts the oldest pending handshake of its own peer (or, at the
global cap, of the peer holding the most), so a flood from one address cannot keep another
address's replicas out, and a legitimate handshake (one round trip) completes between a
flooder's connections. Every refusal is counted in `GateStats`, by a fixed set of names.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import re
import secrets
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from runtime.control.event_loop import freeze_startup_heap
from runtime.control.event_loop import run as run_loop
from runtime.protocol import derive_key

log = logging.getLogger("fthsdp.gate")

MAGIC = b"FTHSDPG1"
NONCE_BYTES = 32
MAC_BYTES = 32
MAX_KEY_ID = 32
CLIENT_LABEL = b"fthsdp-gate-client\n"
SERVER_LABEL = b"fthsdp-gate-server\n"
#: The key ids a run's keys derive from (`runtime.protocol.replica_key_id`, `CONTROL_KEY`).
KEY_ID = re.compile(rb"control|replica-[0-9]{1,6}")
#: Bytes moved per read when piping.
CHUNK = 64 * 1024
#: Seconds between the gate process's counter lines to its parent (only when they changed).
STATS_EVERY_S = 1.0


class GateRefused(ConnectionError):
    """A handshake that does not prove the run's credentials (`kind` names the refusal)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


def _mac(
    key: bytes, label: bytes, server_nonce: bytes, client_nonce: bytes, key_id: bytes
) -> bytes:
    return hmac.new(key, label + server_nonce + client_nonce + key_id, hashlib.sha256).digest()


def host_port(address: str) -> tuple[str, int]:
    """(host, port) of an `http://host:port` address; `ValueError` when it names none."""
    found = urlparse(address)
    host, port = found.hostname, found.port
    if not host or not port:
        raise ValueError(f"not a host:port address: {address!r:.80}")
    return host, port


def url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def client_handshake(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, secret: bytes, key_id: str
) -> None:
    """Prove `key_id`'s key to the gate and check the gate's proof; `GateRefused` otherwise."""
    hello = await reader.readexactly(len(MAGIC) + NONCE_BYTES)
    if not hello.startswith(MAGIC):
        raise GateRefused("not_a_gate", "the peer is not a Lighthouse gate")
    server_nonce = hello[len(MAGIC) :]
    client_nonce = secrets.token_bytes(NONCE_BYTES)
    kid = key_id.encode("ascii")
    key = derive_key(secret, key_id)
    mac = _mac(key, CLIENT_LABEL, server_nonce, client_nonce, kid)
    writer.write(bytes([len(kid)]) + kid + client_nonce + mac)
    await writer.drain()
    try:
        proof = await reader.readexactly(MAC_BYTES)
    except asyncio.IncompleteReadError:
        raise GateRefused("refused", "the gate refused this run's credentials") from None
    expected = _mac(key, SERVER_LABEL, server_nonce, client_nonce, kid)
    if not hmac.compare_digest(proof, expected):
        raise GateRefused("impostor", "the gate did not prove the run's secret")


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()


async def splice(
    a: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    b: tuple[asyncio.StreamReader, asyncio.StreamWriter],
) -> None:
    """Pipe bytes both ways until either side ends, then close both."""
    tasks = [asyncio.ensure_future(_pump(a[0], b[1])), asyncio.ensure_future(_pump(b[0], a[1]))]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for _, w in (a, b):
            w.close()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass(frozen=True)
class GateLimits:
    #: Seconds a client has for its whole handshake.
    handshake_s: float = 3.0
    #: Handshakes open at once, all peers together, and per peer address.
    max_pending: int = 256
    max_pending_per_peer: int = 32
    #: Seconds to reach the loopback Lighthouse.
    connect_s: float = 5.0


#: The gate's counters; a fixed set, whatever strangers send.
GATE_COUNTERS = (
    "accepted",
    "authenticated",
    "refused_bad_mac",
    "refused_malformed",
    "timed_out",
    "closed_early",
    "evicted",
    "upstream_down",
)


#: The counters of connections that did not get through.
REFUSALS = ("refused_bad_mac", "refused_malformed", "timed_out", "evicted")


@dataclass
class GateStats:
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(GATE_COUNTERS, 0))
    #: Authenticated connections open now.
    open: int = 0

    def add(self, name: str) -> None:
        self.counts[name] += 1

    def to_line(self) -> str:
        """One JSON line, what the gate process prints for its parent (`parse_line`)."""
        return json.dumps({"counts": self.counts, "open": self.open}, separators=(",", ":"))

    @classmethod
    def parse_line(cls, line: str) -> GateStats | None:
        """A line of `to_line`, or None for anything else: only the fixed counter names, each
        a count (a gate of another version adds nothing unknown to the metrics)."""
        try:
            data = json.loads(line)
        except ValueError:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("counts"), dict):
            return None
        counts, opened = data["counts"], data.get("open")
        if set(counts) != set(GATE_COUNTERS) or not isinstance(opened, int) or opened < 0:
            return None
        if not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts.values()
        ):
            return None
        return cls(counts={k: counts[k] for k in GATE_COUNTERS}, open=opened)


class LighthouseGate:
    """The public side of the control job's Lighthouse (module docstring)."""

    def __init__(
        self, secret: bytes, upstream: tuple[str, int], limits: GateLimits | None = None
    ) -> None:
        self.secret = secret
        self.upstream = upstream
        self.limits = limits or GateLimits()
        self.stats = GateStats()
        self._pending: dict[str, deque[asyncio.StreamWriter]] = {}
        self._evicted: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self.host = ""
        self.port = 0
        self._last_note = 0.0

    @property
    def url(self) -> str:
        return url(self.host, self.port)

    async def start(self, host: str, port: int = 0) -> None:
        """Listen on `host:port` (0: a free port); `OSError` when it cannot be bound."""
        self._server = await asyncio.start_server(self._handle, host, port, reuse_address=True)
        self.host = host
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop listening and end every connection, pending or piped."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    def pending(self) -> int:
        return sum(len(q) for q in self._pending.values())

    def _make_room(self, peer: str) -> None:
        """Evict the oldest pending handshake of `peer` at its cap, or of the peer holding the
        most at the global cap."""
        own = self._pending.get(peer)
        victim_peer = None
        if own is not None and len(own) >= self.limits.max_pending_per_peer:
            victim_peer = peer
        elif self.pending() >= self.limits.max_pending:
            victim_peer = max(self._pending, key=lambda p: len(self._pending[p]))
        if victim_peer is None:
            return
        victim = self._pending[victim_peer].popleft()
        if not self._pending[victim_peer]:
            del self._pending[victim_peer]
        self._evicted.add(victim)
        victim.transport.abort()

    def _forget(self, peer: str, writer: asyncio.StreamWriter) -> None:
        queue = self._pending.get(peer)
        if queue is not None:
            with contextlib.suppress(ValueError):
                queue.remove(writer)
            if not queue:
                del self._pending[peer]

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> str:
        server_nonce = secrets.token_bytes(NONCE_BYTES)
        writer.write(MAGIC + server_nonce)
        await writer.drain()
        size = (await reader.readexactly(1))[0]
        if not 1 <= size <= MAX_KEY_ID:
            raise GateRefused("refused_malformed", "bad key id length")
        kid = await reader.readexactly(size)
        if not KEY_ID.fullmatch(kid):
            raise GateRefused("refused_malformed", "bad key id")
        client_nonce = await reader.readexactly(NONCE_BYTES)
        mac = await reader.readexactly(MAC_BYTES)
        key = derive_key(self.secret, kid.decode("ascii"))
        if not hmac.compare_digest(mac, _mac(key, CLIENT_LABEL, server_nonce, client_nonce, kid)):
            raise GateRefused("refused_bad_mac", "bad MAC")
        writer.write(_mac(key, SERVER_LABEL, server_nonce, client_nonce, kid))
        await writer.drain()
        return kid.decode("ascii")

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except asyncio.CancelledError:
            writer.transport.abort()  # the gate is closing
        finally:
            if task is not None:
                self._tasks.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peername = writer.get_extra_info("peername")
        peer = str(peername[0]) if isinstance(peername, tuple) else "?"
        self.stats.add("accepted")
        self._make_room(peer)
        self._pending.setdefault(peer, deque()).append(writer)
        outcome = "closed_early"
        key_id = None
        try:
            key_id = await asyncio.wait_for(
                self._handshake(reader, writer), self.limits.handshake_s
            )
        except TimeoutError:
            outcome = "timed_out"
        except GateRefused as exc:
            outcome = exc.kind
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            outcome = "evicted" if writer in self._evicted else "closed_early"
        finally:
            self._forget(peer, writer)
            self._evicted.discard(writer)
        if key_id is None:
            self.stats.add(outcome)
            writer.transport.abort()
            if outcome != "closed_early":  # a bare connect is how replicas see the gate is up
                self._note()
            return
        self.stats.add("authenticated")
        try:
            upstream = await asyncio.wait_for(
                asyncio.open_connection(*self.upstream), self.limits.connect_s
            )
        except (OSError, TimeoutError):
            self.stats.add("upstream_down")
            writer.close()
            return
        self.stats.open += 1
        try:
            await splice((reader, writer), upstream)
        finally:
            self.stats.open -= 1

    def _note(self) -> None:
        """At most one log line a minute about refused connections, whatever their number."""
        now = time.monotonic()
        if now - self._last_note >= 60.0:
            self._last_note = now
            counts = {k: v for k, v in self.stats.counts.items() if v and k in REFUSALS}
            log.warning("Lighthouse gate refused unauthenticated connections: %s", counts)


def main(argv: list[str] | None = None) -> None:
    """`python -m runtime.control.lighthouse_gate --bind HOST --port P --upstream-port L
    --secret-file F`: the gate in a process of its own, as the control job runs it, so that
    piping every Manager's heartbeats never takes the coordinator's event loop or its core. It
    prints the port it listens on as its first line, then its counters (`GateStats.to_line`)
    whenever they changed, at most once a second; it stops on SIGTERM. The secret comes
    from a file: a command line is readable by every user of the node."""
    import argparse
    import signal
    import sys

    from slurm.rundir import read_secret

    parser = argparse.ArgumentParser(description="The run's Lighthouse gate.")
    parser.add_argument("--bind", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--secret-file", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    async def run() -> None:
        gate = LighthouseGate(read_secret(args.secret_file), ("127.0.0.1", args.upstream_port))
        await gate.start(args.bind, args.port)
        print(gate.port, flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        last = ""
        while not stop.is_set():
            line = gate.stats.to_line()
            if line != last:  # at most one line a second, whatever the traffic
                with contextlib.suppress(OSError, ValueError):  # the parent stopped reading
                    print(line, flush=True)
                last = line
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), STATS_EVERY_S)
        await gate.close()

    freeze_startup_heap()
    try:
        run_loop(run())
    except OSError as exc:
        print(
            f"the Lighthouse gate cannot listen on {args.bind}:{args.port}: {exc}", file=sys.stderr
        )
        sys.exit(3)


if __name__ == "__main__":
    main()
