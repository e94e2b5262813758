"""One persistent HTTP/1.1 connection to the coordinator, for a sender that posts every second.

The coordinator keeps an authenticated connection open after a successful answer
(`runtime.control.guard`), so a replica leader pays for its TCP connection and the guard's
admission once rather than per report. The coordinator may close an idle connection at any
moment (its keep-alive timeout, its connection cap, the connection's lifetime), so a request that
fails on a reused connection is sent once more on a new one. The repeat carries the same
signature and nonce: a request the coordinator already took is refused as a replay, never acted
on twice. A timeout is not repeated (the coordinator is slow, not gone), and a request that
fails on a new connection is the caller's "unreachable".
"""

from __future__ import annotations

import http.client
import threading
import urllib.parse
from collections.abc import Mapping


class PersistentConnection:
    """A connection to one base URL at a time, remade when the URL changes or it was closed.
    Safe to share between threads (one request at a time)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None
        self._base: str | None = None
        #: Connections opened so far.
        self.opened = 0

    def request(
        self, base: str, method: str, path: str, body: bytes, headers: Mapping[str, str]
    ) -> tuple[int, bytes]:
        """(status, body) of `method path` at `base` (`http://host:port`); raises OSError,
        ValueError or http.client.HTTPException when no answer came."""
        with self._lock:
            reused = self._conn is not None and self._base == base
            if not reused:
                self._open(base)
            try:
                return self._exchange(method, path, body, headers)
            except TimeoutError:
                self._close()
                raise
            except (OSError, http.client.HTTPException):
                self._close()
                if not reused:
                    raise
            self._open(base)
            try:
                return self._exchange(method, path, body, headers)
            except (OSError, http.client.HTTPException):
                self._close()
                raise

    def close(self) -> None:
        with self._lock:
            self._close()

    def _open(self, base: str) -> None:
        self._close()
        url = urllib.parse.urlsplit(base)
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"not an http://host:port address: {base!r}")
        self._conn = http.client.HTTPConnection(url.hostname, url.port, timeout=self.timeout_s)
        self._base = base
        self.opened += 1

    def _exchange(
        self, method: str, path: str, body: bytes, headers: Mapping[str, str]
    ) -> tuple[int, bytes]:
        conn = self._conn
        assert conn is not None
        conn.request(method, path, body=body, headers=dict(headers))
        resp = conn.getresponse()
        data = resp.read()
        if resp.will_close:
            self._close()
        return resp.status, data

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None
        self._base = None
