"""Keeps unauthenticated traffic from starving the coordinator or costing it anything that grows.

Anyone who can reach the coordinator's port can open connections; only holders of the run
secret can make it act. aiohttp (3.14) has a keep-alive timeout and header size limits but no
timeout for reading a request's header and no cap on open connections, so 1,100 connections that
each send half a header used to hold it unreachable for as long as they stayed open. This module
puts a small guard in front of aiohttp's own protocol instead of replacing its HTTP handling.

Each connection is in one of three stages, and only the last one is safe from eviction:

- `header`: accepted, no request parsed yet. A connection leaves this stage only when aiohttp has
  parsed a request from it (the first middleware, `guard_middleware`, says so), never because
  some bytes looked like the end of a header: aiohttp skips leading blank lines, so `\r\n\r\n`
  followed by half a header is still a connection without a request. Aborted at
  `header_timeout_s`.
- `body`: a request was parsed but its sender has not proved anything yet (its body may never
  come). Aborted at the body deadline; `answered` once its response is out (aiohttp may still
  read a body nobody needs for a while), evicted first, and aborted at the same deadline.
- `trusted`: the request's signature (or the metrics token) verified. Not evictable while it
  serves a request. After a successful answer it stays open for the peer's next request
  (keep-alive, `keepalive_s` idle at most): a leader reporting every second then pays for its
  TCP connection and the guard's admission once, not per report. Every request on it is
  verified again, and any refusal closes it. An idle one is the last to go at the connection
  cap, and at `lifetime_s` it is closed between requests rather than aborted. An
  unauthenticated connection is closed after its one response (the header deadline then covers
  every request it makes, and it cannot be parked between requests).

Caps, so that a flood cannot keep a signed report out and file descriptors stay bounded:

- `per_peer_connections`: unauthenticated connections one source address may hold; a new one
  past it evicts that address's own oldest (one still in `header` first). An attacker on one
  host holds at most this many slots, whatever it opens.
- `max_connections`: at the cap, a new connection evicts the oldest unauthenticated connection
  (in `header` first) of the address that holds the most of them, so many addresses each under
  their cap still lose their own slots before a legitimate leader's one connection does.
- `raise_open_files` lifts the soft open-file limit to the hard one at start and fits the
  connection cap under it (a batch job's usual soft limit is 1,024).

What strangers cost is bounded too: `Refusals` counts refused requests by route template and
status (or by connection-level reason) with a cap on the number of keys, in memory only (no
fsync, no journal row); `BoundedLog` writes at most `LOG_BURST` lines per kind and then one per
`log_every_s`, each at most `LOG_LINE_MAX` characters with what a stranger sent escaped, and says
how many it suppressed; `StrangerLog` takes aiohttp's own server log (a malformed request) the
same way, without a traceback. The guard is a protocol wrapper, not a proxy: no extra copy of
the bytes, no extra task.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

log = logging.getLogger("fthsdp.coordinator")

#: Longest log line the coordinator writes about a request (what a stranger sent is cut to fit).
LOG_LINE_MAX = 300
#: Lines of one kind written at once before the rate limit applies.
LOG_BURST = 5
#: Distinct refusal keys kept; a new one past this is counted under `OTHER`.
MAX_REFUSAL_KEYS = 64
OTHER = "other"
#: The route template of a request that matched no route.
UNMATCHED = "unmatched"
#: Seconds past `body_timeout_s` before the guard itself aborts a parsed, unauthenticated
#: request: the handler's own body deadline answers 408 first.
_BODY_GRACE_S = 1.0

Stage = Literal["header", "body", "answered", "trusted"]
#: Which unauthenticated connection goes first at a cap: one already answered (aiohttp may
#: linger reading a body nobody needs), then one without a request, then the oldest.
_EVICT_FIRST: tuple[Stage, ...] = ("answered", "header")


@dataclass(frozen=True)
class GuardConfig:
    """Limits on what any sender, signed or not, can hold of the coordinator."""

    max_connections: int = 4096
    #: Unauthenticated connections one source address may hold at once.
    per_peer_connections: int = 64
    header_timeout_s: float = 5.0
    body_timeout_s: float = 10.0
    lifetime_s: float = 60.0
    #: How long an authenticated connection may sit idle between two of its requests.
    keepalive_s: float = 15.0
    #: Connections waiting in the kernel's accept queue.
    backlog: int = 1024
    #: After a burst, at most one log line of a kind per this many seconds.
    log_every_s: float = 10.0

    def __post_init__(self) -> None:
        if self.max_connections < 16:
            raise ValueError("max_connections must be at least 16")
        if self.per_peer_connections < 1:
            raise ValueError("per_peer_connections must be at least 1")
        if min(self.header_timeout_s, self.body_timeout_s, self.lifetime_s, self.keepalive_s) <= 0:
            raise ValueError("timeouts must be positive")


def printable(text: str, limit: int = LOG_LINE_MAX) -> str:
    """`text` with anything unprintable or not ASCII escaped (`\\n`, `\\x1b`), cut to at most
    `limit` characters at a whole character and then marked `...`."""
    out: list[str] = []
    size = 0
    for c in text:
        piece = c if c.isprintable() and c.isascii() else ascii(c)[1:-1]
        if size + len(piece) > limit:
            while out and size + 3 > limit:
                size -= len(out.pop())
            return "".join(out) + "..."
        out.append(piece)
        size += len(piece)
    return "".join(out)


class BoundedLog:
    """Log lines about strangers, bounded in length and rate: a token bucket per kind.

    A kind may write `LOG_BURST` lines at once, then one per `every_s`; the next line written
    after a suppression says how many were suppressed. Kinds are fixed by the code (a handful),
    never taken from a request.
    """

    def __init__(
        self,
        every_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger = log,
    ) -> None:
        self._every = every_s
        self._clock = clock
        self._log = logger
        #: kind -> [tokens, last refill, suppressed since the last line]
        self._buckets: dict[str, list[float]] = {}

    def write(self, kind: str, text: str, level: int = logging.WARNING) -> bool:
        """Write one line of `kind` if its bucket allows; True if written."""
        now = self._clock()
        bucket = self._buckets.setdefault(kind, [float(LOG_BURST), now, 0.0])
        bucket[0] = min(float(LOG_BURST), bucket[0] + (now - bucket[1]) / self._every)
        bucket[1] = now
        if bucket[0] < 1.0:
            bucket[2] += 1
            return False
        bucket[0] -= 1.0
        suppressed = int(bucket[2])
        bucket[2] = 0.0
        tail = f" ({suppressed} suppressed)" if suppressed else ""
        self._log.log(level, "%s%s", printable(text, LOG_LINE_MAX - len(tail)), tail)
        return True


class Refusals:
    """Refused requests and connections, counted in memory; logged at a bounded rate.

    A key is `"<status> <route template>"` for a request (`"404 unmatched"` when no route
    matched) or a connection-level reason (`"header timeout"`); at most `MAX_REFUSAL_KEYS`
    distinct keys, the rest counted under `"other"`, so neither the counters nor `/metrics`
    grow with what strangers send.
    """

    def __init__(self, log_every_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.total: collections.Counter[str] = collections.Counter()
        self._window: collections.Counter[str] = collections.Counter()
        self._every = log_every_s
        self._clock = clock
        self._last_log = -float("inf")
        self.log = BoundedLog(log_every_s, clock)

    def add(self, key: str, detail: str = "", remote: str | None = None) -> None:
        if key not in self.total and len(self.total) >= MAX_REFUSAL_KEYS:
            key = OTHER
        self.total[key] += 1
        self._window[key] += 1
        now = self._clock()
        if now - self._last_log >= self._every:
            counts = ", ".join(f"{k}: {n}" for k, n in self._window.most_common())
            last = f" (last: {detail} from {remote})" if detail else ""
            self.log.write("refused", f"refused {{{counts}}}{last}")
            self._window.clear()
            self._last_log = now

    def snapshot(self) -> dict[str, int]:
        return dict(self.total)


def route_of(request: web.BaseRequest) -> str:
    """The template of the route `request` matched (`/v1/replicas/{k}/directive`), or
    `UNMATCHED`: what refusals are keyed by, never the raw path."""
    match = getattr(request, "match_info", None)
    resource = match.route.resource if match is not None else None
    return resource.canonical if resource is not None else UNMATCHED


class StrangerLog:
    """What aiohttp's server logs about a request it could not parse (`logger=` of its
    request handler): counted as a refusal, written through the bounded log, no traceback."""

    def __init__(self, refusals: Refusals) -> None:
        self._refusals = refusals

    def _line(self, level: int, msg: str, *args: Any, exc_info: Any = None, **_: Any) -> None:
        try:
            text = msg % args if args else str(msg)
        except (TypeError, ValueError):
            text = str(msg)
        exc = exc_info[1] if isinstance(exc_info, tuple) else exc_info
        if isinstance(exc, BaseException):
            text += f": {type(exc).__name__}: {exc}"
            if isinstance(exc, HttpProcessingError):
                self._refusals.add(f"{exc.code or 400} {UNMATCHED}")
        self._refusals.log.write("aiohttp", text, level)

    def debug(self, msg: str, *args: Any, **kw: Any) -> None:
        # A malformed request (bad method on a first request: not HTTP at all) still counts.
        exc = kw.get("exc_info")
        if isinstance(exc, HttpProcessingError):
            self._refusals.add(f"{exc.code or 400} {UNMATCHED}")

    def info(self, msg: str, *args: Any, **kw: Any) -> None:
        self._line(logging.INFO, msg, *args, **kw)

    def warning(self, msg: str, *args: Any, **kw: Any) -> None:
        self._line(logging.WARNING, msg, *args, **kw)

    def error(self, msg: str, *args: Any, **kw: Any) -> None:
        self._line(logging.ERROR, msg, *args, **kw)

    def exception(self, msg: str, *args: Any, **kw: Any) -> None:
        self._line(logging.WARNING, msg, *args, **kw)


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
    """Shared by every connection of one site: the count, and each source address's
    unauthenticated connections in the order they came."""

    def __init__(self, config: GuardConfig, refusals: Refusals, max_connections: int) -> None:
        self.config = config
        self.refusals = refusals
        self.max_connections = max_connections
        self.per_peer = min(config.per_peer_connections, max_connections)
        self.open = 0
        #: peer address -> its connections not trusted yet, oldest first.
        self.peers: dict[str, collections.OrderedDict[_Guarded, None]] = {}
        #: Trusted connections between two requests (kept alive), longest idle first.
        self.idle: collections.OrderedDict[_Guarded, None] = collections.OrderedDict()

    def admit(self, conn: _Guarded) -> bool:
        """Count a new connection; make room by evicting an unauthenticated one."""
        held = self.peers.get(conn.peer)
        if held is not None and len(held) >= self.per_peer:
            _evict(held, "evicted at the per-peer cap")
        if self.open >= self.max_connections:
            heaviest = max(self.peers.values(), key=len, default=None)
            if heaviest:
                _evict(heaviest, "evicted at the connection cap")
            elif self.idle:
                # Its peer loses nothing but a reconnect: it is between requests.
                next(iter(self.idle)).retire("idle keep-alive closed at the connection cap")
            else:
                self.refusals.add("connection cap")
                return False
        self.open += 1
        self.peers.setdefault(conn.peer, collections.OrderedDict())[conn] = None
        return True

    def settle(self, conn: _Guarded) -> None:
        """`conn` is trusted (or gone): it no longer counts toward its peer's cap."""
        held = self.peers.get(conn.peer)
        if held is not None:
            held.pop(conn, None)
            if not held:
                del self.peers[conn.peer]

    def held_by(self, peer: str) -> int:
        """Unauthenticated connections `peer` holds now."""
        return len(self.peers.get(peer, ()))


def _evict(held: collections.OrderedDict[_Guarded, None], reason: str) -> None:
    """Abort the oldest of `held` in the first stage of `_EVICT_FIRST` it has, else its oldest."""
    for stage in _EVICT_FIRST:
        victim = next((c for c in held if c.stage == stage), None)
        if victim is not None:
            victim.abort(reason)
            return
    next(iter(held)).abort(reason)


class _Guarded(asyncio.Protocol):
    """aiohttp's protocol for one connection, with its stage, its deadlines and its lifetime."""

    def __init__(self, inner: Any, guard: ConnectionGuard) -> None:
        self._inner = inner
        self._guard = guard
        self._transport: asyncio.Transport | None = None
        self.peer = ""
        self.stage: Stage = "header"
        #: Trusted and past its lifetime: closed after the answer in progress.
        self.retiring = False
        #: Counted in `guard.open` (until aborted or lost).
        self._counted = False
        #: aiohttp's protocol saw `connection_made` (so it must see `connection_lost`).
        self._inner_made = False
        self._timers: list[asyncio.TimerHandle] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        peername = transport.get_extra_info("peername")
        self.peer = str(peername[0]) if isinstance(peername, tuple) and peername else "?"
        if not self._guard.admit(self):
            transport.abort()  # type: ignore[attr-defined]
            return
        self._counted = True
        loop = asyncio.get_running_loop()
        cfg = self._guard.config
        self._timers = [
            loop.call_later(cfg.header_timeout_s, self._expired, "header", "header timeout"),
            loop.call_later(cfg.lifetime_s, self._lifetime),
        ]
        self._inner_made = True
        self._inner.connection_made(transport)

    def _expired(self, stage: Stage, reason: str) -> None:
        if self.stage == stage or (stage == "body" and self.stage == "answered"):
            self.abort(reason)

    def _lifetime(self) -> None:
        if self.stage != "trusted":
            self.abort("connection lifetime")
        elif self in self._guard.idle:
            self.retire(None)
        else:
            self.retiring = True

    def request_parsed(self) -> None:
        """aiohttp parsed a request from this connection: the header deadline is met; the
        body deadline starts (the connection stays evictable until it is trusted). On a kept
        alive, trusted connection it is busy again."""
        if self.stage == "trusted":
            self._rest(False)
            return
        if self.stage != "header" or not self._counted:
            return
        self.stage = "body"
        self._timers[0].cancel()
        deadline = self._guard.config.body_timeout_s + _BODY_GRACE_S
        loop = asyncio.get_running_loop()
        self._timers.append(loop.call_later(deadline, self._expired, "body", "body timeout"))

    def answered(self) -> None:
        """Its response is out; an unauthenticated connection is now the first to evict."""
        if self.stage == "body":
            self.stage = "answered"

    def trust(self) -> None:
        """The request proved it holds a key: no longer evictable, off its peer's cap."""
        if self.stage == "trusted":
            return
        self.stage = "trusted"
        self._guard.settle(self)

    def kept_alive(self) -> None:
        """Its answer is out and the connection stays open for the peer's next request."""
        if self.retiring:
            self.retire(None)
        elif self._counted:
            self._rest(True)

    def _rest(self, idle: bool) -> None:
        """Into or out of `guard.idle`: trusted and between requests."""
        if idle:
            self._guard.idle[self] = None
        else:
            self._guard.idle.pop(self, None)

    def retire(self, reason: str | None) -> None:
        """Close a trusted connection between requests (a graceful close, not an abort)."""
        if not self._counted:
            return
        self._release()
        if reason is not None:
            self._guard.refusals.add(reason)
        if self._transport is not None:
            self._transport.close()

    def _release(self) -> None:
        if self._counted:
            self._counted = False
            self._guard.open -= 1
            self._guard.settle(self)
            self._rest(False)
        for timer in self._timers:
            timer.cancel()

    def abort(self, reason: str) -> None:
        if not self._counted:
            return
        self._release()
        self._guard.refusals.add(reason)
        if self._transport is not None:
            self._transport.abort()

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        result: bool | None = self._inner.eof_received()
        return result

    def connection_lost(self, exc: Exception | None) -> None:
        self._release()
        if self._inner_made:
            self._inner_made = False
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


def _connection(request: web.BaseRequest) -> _Guarded | None:
    transport = request.transport
    protocol = transport.get_protocol() if transport is not None else None
    return protocol if isinstance(protocol, _Guarded) else None


def trust(request: web.BaseRequest) -> None:
    """Mark `request`'s connection as authenticated (its signature or token verified)."""
    conn = _connection(request)
    if conn is not None:
        conn.trust()


class GuardedSite(web.BaseSite):
    """`web.TCPSite` with every connection behind a `ConnectionGuard`.

    With `serve=False` the port is bound but not listening, so a connection to it is refused
    until `serve()`: the owner can publish the address first (the control plane's
    `control.json`), and nobody reaches it before it is published."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        guard: ConnectionGuard,
        serve: bool = True,
    ) -> None:
        super().__init__(runner, backlog=guard.config.backlog)
        self._host = host
        self._port = port
        self._guard = guard
        self._serve = serve

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
            start_serving=self._serve,
        )

    async def serve(self) -> None:
        """Listen and accept, after a start with `serve=False`."""
        assert self._server is not None
        await self._server.start_serving()


async def _answer_then(
    request: web.Request, response: web.StreamResponse, then: Callable[[], None]
) -> web.StreamResponse:
    """Write `response` here rather than after the middleware returns, then call `then`: the
    connection's stage changes only once its answer is out."""
    try:
        await response.prepare(request)
        await response.write_eof()
    except ConnectionError:
        return response
    then()
    return response


def guard_middleware(refusals: Refusals) -> Any:
    """The app's first middleware: tells the guard a request was parsed, closes every
    connection after its response unless the request was authenticated and answered without a
    refusal (then the connection is kept alive for the peer's next request), and turns
    whatever a handler raises into a counted 4xx refusal with one bounded log line, never a 500
    or a traceback."""

    @web.middleware
    async def guarded(request: web.Request, handler: Any) -> web.StreamResponse:
        conn = _connection(request)
        if conn is not None:
            conn.request_parsed()
        try:
            response: web.StreamResponse = await handler(request)
        except web.HTTPException as exc:
            if exc.status >= 400:
                refusals.add(f"{exc.status} {route_of(request)}")
            response = web.json_response({"error": exc.reason}, status=exc.status)
        except Exception as exc:  # anything a stranger's request sets off
            route = route_of(request)
            where = exc.__traceback__
            while where is not None and where.tb_next is not None:
                where = where.tb_next
            at = f" at {where.tb_frame.f_code.co_filename}:{where.tb_lineno}" if where else ""
            refusals.add(f"400 {route}")
            refusals.log.write(
                "handler failed",
                f"{request.method} {route} from {request.remote} failed: "
                f"{type(exc).__name__}: {exc}{at}",
            )
            response = web.json_response({"error": "request could not be handled"}, status=400)
        if conn is None:
            response.force_close()
            return response
        if conn.stage == "trusted" and not conn.retiring and response.status < 400:
            # Kept alive; idle (closable at the cap) only once its answer is out.
            return await _answer_then(request, response, conn.kept_alive)
        response.force_close()
        if conn.stage == "body":
            # Answered (first to evict) only once its response is on its way.
            return await _answer_then(request, response, conn.answered)
        return response

    return guarded
