"""Keeps unauthenticated traffic from starving the coordinator or costing it anything durable.

Anyone who can reach the coordinator's port can open connections; only holders of the run
secret can make it act. aiohttp (3.14) has a keep-alive timeout and header size limits but no
timeout for reading a request's header and no cap on open connections, so 1,100 connections that
each send half a header used to hold it unreachable for as long as they stayed open. This module
puts a small guard in front of aiohttp's own protocol instead of replacing its HTTP handling:

- `GuardedSite` listens like `web.TCPSite` but wraps each connection's aiohttp protocol in
  `_Guarded`, which counts open connections and aborts a connection whose header is not complete
  within `header_timeout_s`, or that lives longer than `lifetime_s` (the coordinator serves one
  request per connection, so that also bounds a slow body or a slow later request);
- at `max_connections`, a new connection evicts the oldest one still waiting for its header
  (an attacker's half-open connections go first; a legitimate client sends its header at once),
  so a flood cannot keep a signed report out, and file descriptors stay bounded;
- `raise_open_files` lifts the soft open-file limit to the hard one at start and fits the
  connection cap under it (a batch job's usual soft limit is 1,024);
- `Refusals` counts refused requests and connections in memory and logs a summary at most once
  per `log_every_s`: no fsync, no journal row, no log line per request.

The guard is a protocol wrapper, not a proxy: no extra copy of the bytes, no extra task.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

log = logging.getLogger("fthsdp.coordinator")

_HEADER_END = b"\r\n\r\n"


@dataclass(frozen=True)
class GuardConfig:
    """Limits on what any sender, signed or not, can hold of the coordinator."""

    max_connections: int = 4096
    header_timeout_s: float = 5.0
    body_timeout_s: float = 10.0
    lifetime_s: float = 60.0
    #: Connections waiting in the kernel's accept queue.
    backlog: int = 1024
    #: At most one refusal summary line per this many seconds.
    log_every_s: float = 10.0

    def __post_init__(self) -> None:
        if self.max_connections < 16:
            raise ValueError("max_connections must be at least 16")
        if min(self.header_timeout_s, self.body_timeout_s, self.lifetime_s) <= 0:
            raise ValueError("timeouts must be positive")


class Refusals:
    """Refused requests by reason, counted in memory; logged at a bounded rate."""

    def __init__(self, log_every_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.total: collections.Counter[str] = collections.Counter()
        self._window: collections.Counter[str] = collections.Counter()
        self._every = log_every_s
        self._clock = clock
        self._last_log = -float("inf")

    def add(self, reason: str, detail: str = "", remote: str | None = None) -> None:
        self.total[reason] += 1
        self._window[reason] += 1
        now = self._clock()
        if now - self._last_log >= self._every:
            last = f" (last: {detail[:120]} from {remote})" if detail else ""
            log.warning("refused %s%s", dict(self._window), last)
            self._window.clear()
            self._last_log = now

    def snapshot(self) -> dict[str, int]:
        return dict(self.total)


def raise_open_files(want: int, margin: int = 256) -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; the connection cap that fits under it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, want + margin)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d: %s", soft, exc)
    cap = max(16, min(want, soft - margin))
    if cap < want:
        log.warning("open-file limit %d: at most %d connections (wanted %d)", soft, cap, want)
    return cap


class ConnectionGuard:
    """Shared by every connection of one site: the count, the header-pending ones in order."""

    def __init__(self, config: GuardConfig, refusals: Refusals, max_connections: int) -> None:
        self.config = config
        self.refusals = refusals
        self.max_connections = max_connections
        self.open = 0
        self.pending: collections.OrderedDict[_Guarded, None] = collections.OrderedDict()

    def admit(self, conn: _Guarded) -> bool:
        """Count a new connection; make room by evicting the oldest header-pending one."""
        if self.open >= self.max_connections:
            if not self.pending:
                self.refusals.add("connection cap")
                return False
            oldest, _ = self.pending.popitem(last=False)
            oldest.abort("evicted at the connection cap")
        self.open += 1
        self.pending[conn] = None
        return True


class _Guarded(asyncio.Protocol):
    """aiohttp's protocol for one connection, with a header deadline and a lifetime."""

    def __init__(self, inner: Any, guard: ConnectionGuard) -> None:
        self._inner = inner
        self._guard = guard
        self._transport: asyncio.Transport | None = None
        self._tail = b""
        self._admitted = False
        self._timers: list[asyncio.TimerHandle] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        if not self._guard.admit(self):
            transport.abort()  # type: ignore[attr-defined]
            return
        self._admitted = True
        loop = asyncio.get_running_loop()
        cfg = self._guard.config
        self._timers = [
            loop.call_later(cfg.header_timeout_s, self._header_expired),
            loop.call_later(cfg.lifetime_s, self.abort, "connection lifetime"),
        ]
        self._inner.connection_made(transport)

    def _header_expired(self) -> None:
        if self in self._guard.pending:
            self.abort("header timeout")

    def abort(self, reason: str) -> None:
        self._guard.pending.pop(self, None)
        self._guard.refusals.add(reason)
        if self._transport is not None:
            self._transport.abort()

    def data_received(self, data: bytes) -> None:
        if self in self._guard.pending:
            seen = self._tail + data
            if _HEADER_END in seen:
                del self._guard.pending[self]
                self._timers[0].cancel()
            else:
                self._tail = seen[-3:]
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        result: bool | None = self._inner.eof_received()
        return result

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._admitted:
            return
        self._admitted = False
        self._guard.open -= 1
        self._guard.pending.pop(self, None)
        for timer in self._timers:
            timer.cancel()
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class GuardedSite(web.BaseSite):
    """`web.TCPSite` with every connection behind a `ConnectionGuard`."""

    def __init__(
        self, runner: web.BaseRunner, host: str, port: int, guard: ConnectionGuard
    ) -> None:
        super().__init__(runner, backlog=guard.config.backlog)
        self._host = host
        self._port = port
        self._guard = guard

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        guard = self._guard
        self._server = await loop.create_server(
            lambda: _Guarded(server(), guard),
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_address=True,
        )


@web.middleware
async def one_request_per_connection(request: web.Request, handler: Any) -> web.StreamResponse:
    """Close every connection after its response: the header deadline then covers every
    request, and a keep-alive connection cannot be parked between requests."""
    try:
        response: web.StreamResponse = await handler(request)
    except web.HTTPException as exc:
        response = web.json_response({"error": exc.reason}, status=exc.status)
    response.force_close()
    return response
