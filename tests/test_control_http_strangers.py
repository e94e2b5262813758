"""Strangers cost nothing that grows: whatever an unauthenticated sender puts in a request is a
counted 4xx, keyed by route template and status, with bounded log lines, never a 500 or a
traceback, and `/metrics` and the process stay small.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import string
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from control_harness import RecordingBackend, two_replica_config

from benchmarks.control_attack import rss_mib, start_control
from runtime.control.guard import LOG_LINE_MAX, MAX_REFUSAL_KEYS, BoundedLog, Refusals, printable
from runtime.control.http import start_coordinator
from runtime.protocol import SIGNATURE_HEADER, TIMESTAMP_HEADER, ReplicaReport, replica_key_id, sign
from slurm.rundir import read_secret

_config = two_replica_config


def _raw(port: int, request: bytes) -> bytes:
    """Send `request` as it is; the status code of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        data = b""
        while b"\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    return data.split(b"\r\n", 1)[0].split(b" ")[1]


async def _odd_requests(run_dir: Path) -> dict[str, Any]:
    running = await start_coordinator(_config(run_dir, metrics_token="t0k3n"), RecordingBackend())
    secret = read_secret(run_dir / "secret")
    port = int(running.url.rsplit(":", 1)[1])
    loop = asyncio.get_running_loop()
    body = ReplicaReport(replica=0, incarnation="a", seq=1, job_id="100").to_json()
    out: dict[str, Any] = {}

    def signed_with(**override: str) -> bytes:
        headers = sign(secret, replica_key_id(0), "POST", "/v1/reports", body)
        headers.update(override)
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        return (
            f"POST /v1/reports HTTP/1.1\r\nHost: x\r\n{head}Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body

    try:
        cases = {
            "non-ASCII signature": signed_with(**{SIGNATURE_HEADER: "é" * 64}),
            "superscript timestamp": signed_with(**{TIMESTAMP_HEADER: "²"}),
            "non-UTF-8 metrics token": b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
            b"Authorization: Bearer \xff\xfe\x80\r\n\r\n",
            "request line too long": b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
            "not HTTP": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" * 4 + b"\r\n\r\n",
            "bad header": b"GET /metrics HTTP/1.1\r\nHo st: x\r\n\r\n",
        }
        for name, raw in cases.items():
            out[name] = await loop.run_in_executor(None, _raw, port, raw)

        # Anything a handler raises is a counted 400 too.
        def broken() -> float | None:
            raise RuntimeError("admission broke: " + "\x1b[31m" * 200)

        running.coordinator.admission = broken  # type: ignore[method-assign]
        async with (
            aiohttp.ClientSession() as http,
            http.post(running.url + "/v1/reports", data=body) as resp,
        ):
            out["handler raised"] = resp.status
        out["refusals"] = running.coordinator.refusals.snapshot()
    finally:
        await running.close()
    return out


@pytest.mark.timeout(60)
def test_odd_requests_are_counted_4xx_without_a_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        out = asyncio.run(_odd_requests(tmp_path))
    refusals = out.pop("refusals")
    handler = out.pop("handler raised")
    assert out == {
        "non-ASCII signature": b"401",
        "superscript timestamp": b"401",
        "non-UTF-8 metrics token": b"401",
        "request line too long": b"400",
        "not HTTP": b"400",
        "bad header": b"400",
    }
    assert handler == 400
    assert refusals["401 /v1/reports"] == 2
    assert refusals["401 /metrics"] == 1
    assert refusals["400 unmatched"] == 3
    assert refusals["400 /v1/reports"] == 1
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    for r in caplog.records:
        if r.name.startswith("fthsdp"):
            assert len(r.getMessage()) <= LOG_LINE_MAX, r.getMessage()
            assert "\x1b" not in r.getMessage()


def test_refusal_keys_are_capped_and_log_lines_bounded(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    refusals = Refusals(log_every_s=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="fthsdp.coordinator"):
        for i in range(1000):
            refusals.add(f"404 /{i}", "x" * 10_000, "127.0.0.2")
    counts = refusals.snapshot()
    assert len(counts) == MAX_REFUSAL_KEYS + 1
    assert counts["other"] == 1000 - MAX_REFUSAL_KEYS
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and len(lines[0]) <= LOG_LINE_MAX


def test_a_kind_of_line_is_rate_limited_and_says_what_it_suppressed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    log = BoundedLog(every_s=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="fthsdp.coordinator"):
        written = [log.write("k", f"line {i}") for i in range(100)]
        now[0] = 10.0
        log.write("k", "after the pause")
        log.write("other kind", "its own bucket")
    assert sum(written) == 5
    lines = [r.getMessage() for r in caplog.records]
    assert lines[-2] == "after the pause (95 suppressed)"
    assert lines[-1] == "its own bucket"
    assert printable("a\nb\x00" + "é" * 400, 20) == "a\\nb\\x00\\xe9\\xe9..."
    assert printable("short") == "short"


def _flood(url: str, n: int, size: int) -> dict[str, int]:
    """`n` GETs of random paths of about `size` characters, 50 in flight; statuses counted."""
    rng = random.Random(3)
    alphabet = string.ascii_letters + string.digits
    statuses: dict[str, int] = {}

    async def run() -> None:
        import yarl

        connector = aiohttp.TCPConnector(limit=50, force_close=True, local_addr=("127.0.0.2", 0))
        async with aiohttp.ClientSession(connector=connector) as http:

            async def one() -> None:
                # Half match no route; half match one, with a replica number of `size` digits.
                if rng.random() < 0.5:
                    kind, path = "unmatched", "/" + "".join(rng.choices(alphabet, k=size))
                else:
                    k = rng.randrange(10 ** (size - 1), 10**size)
                    kind, path = "directive", f"/v1/replicas/{k}/directive"
                async with http.get(yarl.URL(url + path, encoded=True)) as resp:
                    await resp.read()
                    key = f"{resp.status} {kind}"
                    statuses[key] = statuses.get(key, 0) + 1

            await asyncio.gather(*(one() for _ in range(n)))

    asyncio.run(run())
    return statuses


@pytest.mark.timeout(300)
def test_a_long_path_flood_leaves_metrics_and_memory_small(tmp_path: Path) -> None:
    """5,000 requests with random 4 KB paths against a real control process: each refused and
    counted under its route's template (`404 unmatched`; `401 /v1/replicas/{k}/directive`, whose
    requests must be signed); `/metrics`
    stays under 20 KB, the process grows by little, and the log by a few bounded lines."""
    proc, url, _ = start_control(tmp_path)
    try:
        assert proc.proc is not None
        log = tmp_path / "run" / "control.log"
        warm = _flood(url, 300, 3900)  # allocator arenas, aiohttp's caches
        rss_before = rss_mib(proc.proc.pid)
        log_before = log.stat().st_size
        t0 = time.monotonic()
        statuses = _flood(url, 5000, 3900)
        seconds = time.monotonic() - t0
        rss_growth = rss_mib(proc.proc.pid) - rss_before
        with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
            metrics = resp.read().decode()
        log_lines = log.read_bytes()[log_before:].decode(errors="replace").splitlines()
    finally:
        proc.stop()
    codes = {"unmatched": 404, "directive": 401}
    assert sum(statuses.values()) == 5000 and set(statuses) == {
        f"{c} {k}" for k, c in codes.items()
    }
    by_route = {k: warm[f"{c} {k}"] + statuses[f"{c} {k}"] for k, c in codes.items()}
    assert len(metrics) < 20_000, len(metrics)
    refused = [line for line in metrics.splitlines() if line.startswith("fthsdp_control_refused")]
    # Connections the client opened and never used may also time out; only requests count here.
    refused = [line for line in refused if "404" in line or "401 /v1/replicas" in line]
    reasons = {"directive": "401 /v1/replicas/{k}/directive", "unmatched": "404 unmatched"}
    counted = {
        k: float(line.rsplit(" ", 1)[1])
        for line in refused
        for k, reason in reasons.items()
        if line.startswith(f'fthsdp_control_refused_total{{reason="{reason}"}} ')
    }
    assert len(refused) == 2 and set(counted) == set(reasons), refused
    # aiohttp's client sends a GET again once when its connection fails before the answer is
    # read, so the server may have refused (and counted) a few requests twice; never fewer.
    for k, seen in by_route.items():
        assert seen <= counted[k] <= seen + 50, (k, seen, refused)
    assert rss_growth < 8.0, f"{rss_growth:.1f} MiB in {seconds:.0f} s"
    # One summary line per 10 s at most, each short (the timestamp and logger name come first).
    assert len(log_lines) <= 2 + seconds / 10, log_lines
    assert all(len(line) < LOG_LINE_MAX + 100 for line in log_lines), log_lines
