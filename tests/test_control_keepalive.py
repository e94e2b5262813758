"""Keep-alive for authenticated peers, on a real coordinator over loopback.

A leader that proved its key keeps its connection for its next report; every request on it is
verified again and any refusal closes it; an unauthenticated connection still serves one request;
an idle kept-alive connection is the last to go at the connection cap and is closed, not aborted,
at its lifetime; and the leader's sender (`runtime.persistent_http`) gets over a connection the
coordinator closed with one resend, never a lost or doubled report.
"""

from __future__ import annotations

import asyncio
import select
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from control_harness import RecordingBackend, two_replica_config

from runtime.control.guard import GuardConfig
from runtime.control.http import RunningCoordinator, start_coordinator
from runtime.persistent_http import PersistentConnection
from runtime.protocol import ReplicaReport, replica_key_id, sign
from slurm.rundir import read_secret


def _signed(secret: bytes, replica: int, seq: int) -> tuple[bytes, dict[str, str]]:
    body = ReplicaReport(
        replica=replica, incarnation=f"l{replica}", seq=seq, job_id=str(100 + replica)
    ).to_json()
    headers = sign(secret, replica_key_id(replica), "POST", "/v1/reports", body)
    return body, {"Content-Type": "application/json", **headers}


def _post(conn: PersistentConnection, url: str, secret: bytes, replica: int, seq: int) -> int:
    body, headers = _signed(secret, replica, seq)
    status, _ = conn.request(url, "POST", "/v1/reports", body, headers)
    return status


def _closed_by_peer(conn: PersistentConnection, within_s: float) -> bool:
    """True once the coordinator has closed `conn`'s socket (EOF readable), within `within_s`."""
    sock = conn._conn.sock if conn._conn is not None else None
    if sock is None:
        return True
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([sock], [], [], 0.05)
        if ready:
            return sock.recv(1, socket.MSG_PEEK) == b""
    return False


async def _with_coordinator(
    run_dir: Path, guard: GuardConfig, body: Callable[[RunningCoordinator, bytes], Any]
) -> Any:
    running = await start_coordinator(two_replica_config(run_dir, guard=guard), RecordingBackend())
    try:
        return await asyncio.to_thread(body, running, read_secret(run_dir / "secret"))
    finally:
        await running.close()


@pytest.mark.timeout(60)
def test_a_leader_reports_over_one_connection_and_a_refusal_closes_it(tmp_path: Path) -> None:
    def leader(running: RunningCoordinator, secret: bytes) -> dict[str, Any]:
        conn = PersistentConnection(5.0)
        statuses = [_post(conn, running.url, secret, 0, seq) for seq in range(1, 6)]
        opened_before = conn.opened
        # A request signed with another replica's key name but this secret's wrong key: refused.
        body, headers = _signed(b"not-the-secret" * 3, 0, 6)
        refused, _ = conn.request(running.url, "POST", "/v1/reports", body, headers)
        after = _post(conn, running.url, secret, 0, 7)
        return {
            "statuses": statuses,
            "opened_before": opened_before,
            "refused": refused,
            "after": after,
            "opened": conn.opened,
        }

    out = asyncio.run(_with_coordinator(tmp_path, GuardConfig(), leader))
    assert out["statuses"] == [200] * 5
    assert out["opened_before"] == 1, "five reports should share one connection"
    assert out["refused"] == 401
    # The refusal closed the connection: the next report needed a new one.
    assert (out["after"], out["opened"]) == (200, 2)


@pytest.mark.timeout(60)
def test_an_unauthenticated_connection_still_serves_one_request(tmp_path: Path) -> None:
    def stranger(running: RunningCoordinator, secret: bytes) -> tuple[bytes, bool]:
        host, port = running.url.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(b"GET /v1/state HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            while chunk := s.recv(4096):  # ends only if the coordinator closes the connection
                data += chunk
            return data.split(b"\r\n", 1)[0], True

    status_line, closed = asyncio.run(_with_coordinator(tmp_path, GuardConfig(), stranger))
    assert status_line.startswith(b"HTTP/1.1 401")
    assert closed


@pytest.mark.timeout(60)
def test_an_idle_connection_the_coordinator_closed_costs_one_reconnect(tmp_path: Path) -> None:
    def leader(running: RunningCoordinator, secret: bytes) -> dict[str, Any]:
        conn = PersistentConnection(5.0)
        first = _post(conn, running.url, secret, 1, 1)
        closed = _closed_by_peer(conn, 20)
        # The sender does not know yet: its next report meets the closed socket, then resends.
        second = _post(conn, running.url, secret, 1, 2)
        return {"first": first, "closed": closed, "second": second, "opened": conn.opened}

    out = asyncio.run(_with_coordinator(tmp_path, GuardConfig(keepalive_s=0.3), leader))
    assert out == {"first": 200, "closed": True, "second": 200, "opened": 2}


@pytest.mark.timeout(60)
def test_an_idle_kept_alive_connection_makes_room_at_the_cap(tmp_path: Path) -> None:
    def leaders(running: RunningCoordinator, secret: bytes) -> dict[str, Any]:
        conns = [PersistentConnection(5.0) for _ in range(17)]
        # 16 leaders fill the cap with idle, trusted connections; a 17th still gets in.
        statuses = [_post(c, running.url, secret, k % 2, k + 1) for k, c in enumerate(conns)]
        oldest_closed = _closed_by_peer(conns[0], 10)
        again = _post(conns[0], running.url, secret, 0, 100)
        return {
            "statuses": statuses,
            "oldest_closed": oldest_closed,
            "again": again,
            "refusals": running.coordinator.refusals.snapshot(),
        }

    guard = GuardConfig(max_connections=16, per_peer_connections=16)
    out = asyncio.run(_with_coordinator(tmp_path, guard, leaders))
    assert out["statuses"] == [200] * 17
    assert out["oldest_closed"], "the longest idle connection should have made room"
    assert out["again"] == 200
    assert out["refusals"].get("idle keep-alive closed at the connection cap", 0) >= 1
    assert "connection cap" not in out["refusals"], out["refusals"]


@pytest.mark.timeout(60)
def test_a_trusted_connection_is_closed_between_requests_at_its_lifetime(tmp_path: Path) -> None:
    def leader(running: RunningCoordinator, secret: bytes) -> dict[str, Any]:
        conn = PersistentConnection(5.0)
        first = _post(conn, running.url, secret, 0, 1)
        closed = _closed_by_peer(conn, 20)
        second = _post(conn, running.url, secret, 0, 2)
        return {
            "first": first,
            "closed": closed,
            "second": second,
            "refusals": running.coordinator.refusals.snapshot(),
        }

    out = asyncio.run(_with_coordinator(tmp_path, GuardConfig(lifetime_s=0.5), leader))
    assert (out["first"], out["closed"], out["second"]) == (200, True, 200)
    # Closed at its lifetime between requests: a graceful close, not an abort of a stranger.
    assert "connection lifetime" not in out["refusals"], out["refusals"]


def test_a_request_that_fails_on_a_new_connection_is_not_repeated() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
    conn = PersistentConnection(2.0)
    with pytest.raises(OSError):
        conn.request(f"http://127.0.0.1:{port}", "POST", "/v1/reports", b"{}", {})
    assert conn.opened == 1


@pytest.mark.parametrize("base", ["https://127.0.0.1:1", "127.0.0.1:1", "http://:80"])
def test_only_plain_http_addresses_are_used(base: str) -> None:
    with pytest.raises(ValueError, match="not an http://host:port address"):
        PersistentConnection(1.0).request(base, "POST", "/v1/reports", b"{}", {})
