"""Benchmark: a signed report gets through while strangers flood the coordinator.

A real control process (`fthsdp control --no-lighthouse --no-poll`, Slurm's commands replaced by
the test harness's stand-ins) on loopback. Each round interleaves two configurations:

- quiet: 5 signed status reports, one after the other, each on a new connection;
- attack: 1,100 connections that each send half a request header and are reopened whenever
  the coordinator drops them (bounded: at most 20 reopenings per slot), plus 3,000 requests
  with a bad signature (200 in flight at a time); once both are under way, the same 5 signed
  reports are timed.

Target (loopback only): every signed report under attack is answered in under 1 s, and the
journal grows by the accepted reports only (no row and no fsync for a refusal). Prints the
medians and ranges over the rounds and writes benchmarks/results/control_attack.json.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import sqlite3
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import aiohttp  # noqa: E402
from control_harness import ControlProcess, install_fake_slurm  # noqa: E402

from runtime.control.report import (  # noqa: E402
    SIGNATURE_HEADER,
    ReplicaReport,
    read_secret,
    replica_key_id,
    sign,
)

ROUNDS = 5
HALF_OPEN = 1100
BAD_REQUESTS = 3000
LEGIT = 5
IN_FLIGHT = 200
HALF_HEADER = b"POST /v1/reports HTTP/1.1\r\nHost: coordinator\r\nX-Fthsdp-Sig"


@dataclass
class Flood:
    """What the attacker did and saw."""

    opened: int = 0
    dropped_by_server: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    errors: int = 0


async def _hold(host: str, port: int, flood: Flood, stop: asyncio.Event) -> None:
    """One half-open slot: connect, send half a header, wait; reconnect when dropped."""
    for _ in range(20):
        if stop.is_set():
            return
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            flood.errors += 1
            await asyncio.sleep(0.1)
            continue
        flood.opened += 1
        try:
            writer.write(HALF_HEADER)
            await writer.drain()
            read = asyncio.ensure_future(reader.read(1))
            done = asyncio.ensure_future(stop.wait())
            await asyncio.wait({read, done}, return_when=asyncio.FIRST_COMPLETED)
            if read.done():
                flood.dropped_by_server += 1
            for task in (read, done):
                task.cancel()
        except OSError:
            flood.dropped_by_server += 1
        finally:
            writer.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await writer.wait_closed()


async def _bad_signatures(url: str, secret: bytes, n: int, flood: Flood) -> None:
    body = ReplicaReport(replica=0, incarnation="x", seq=1, job_id="100").to_json()
    headers = sign(secret, replica_key_id(0), "POST", "/v1/reports", body)
    headers[SIGNATURE_HEADER] = "0" * 64
    connector = aiohttp.TCPConnector(limit=IN_FLIGHT, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def one() -> None:
            try:
                async with http.post(url + "/v1/reports", data=body, headers=headers) as resp:
                    await resp.read()
                    flood.statuses[resp.status] = flood.statuses.get(resp.status, 0) + 1
            except (TimeoutError, aiohttp.ClientError, OSError):
                flood.errors += 1

        await asyncio.gather(*(one() for _ in range(n)))


def legit_report(url: str, secret: bytes, seq: int) -> tuple[int, float]:
    """(status, seconds) of one signed status report of replica 0 on a new connection."""
    body = ReplicaReport(replica=0, incarnation="bench", seq=seq, job_id="100", step=seq)
    data = body.to_json()
    headers = sign(secret, replica_key_id(0), "POST", "/v1/reports", data)
    req = urllib.request.Request(url + "/v1/reports", data=data, method="POST", headers=headers)
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=30) as resp:
        status = int(resp.status)
    return status, time.perf_counter() - t0


def journal_rows(
    run_dir: Path, tables: tuple[str, ...] = ("events", "nonces", "rejections")
) -> dict[str, int]:
    """Row counts of the run's journal tables (read-only)."""
    db = sqlite3.connect(f"file:{run_dir / 'control.sqlite'}?mode=ro", uri=True)
    try:
        return {t: int(db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]) for t in tables}
    finally:
        db.close()


async def attack_round(
    url: str, secret: bytes, seq0: int, half_open: int = HALF_OPEN, bad: int = BAD_REQUESTS
) -> dict[str, Any]:
    """Flood, then time `LEGIT` signed reports while the flood is in flight."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    flood = Flood()
    stop = asyncio.Event()
    holders = [asyncio.ensure_future(_hold(host, int(port), flood, stop)) for _ in range(half_open)]
    while flood.opened < half_open and not all(h.done() for h in holders):
        await asyncio.sleep(0.05)
    bad_task = asyncio.ensure_future(_bad_signatures(url, secret, bad, flood))
    await asyncio.sleep(0.5)  # the bad requests are in flight
    loop = asyncio.get_running_loop()
    latencies, statuses = [], []
    for i in range(LEGIT):
        status, seconds = await loop.run_in_executor(None, legit_report, url, secret, seq0 + i)
        statuses.append(status)
        latencies.append(seconds)
    in_flight_after = not bad_task.done()
    await bad_task
    stop.set()
    await asyncio.gather(*holders)
    return {
        "legit_statuses": statuses,
        "legit_latency_s": latencies,
        "bad_requests_still_in_flight_after_legit": in_flight_after,
        "half_open_opened": flood.opened,
        "half_open_dropped_by_server": flood.dropped_by_server,
        "bad_statuses": {str(k): v for k, v in sorted(flood.statuses.items())},
        "client_errors": flood.errors,
    }


def start_control(root: Path) -> tuple[ControlProcess, str, bytes]:
    run_dir = root / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"replicas": 2}))
    (run_dir / "jobs.json").write_text(json.dumps({"replicas": {"0": "100", "1": "101"}}))
    env = install_fake_slurm(root, {"100": "node1", "101": "node2"})
    proc = ControlProcess(run_dir, env, extra=["--no-poll"])
    url = proc.start()
    return proc, url, read_secret(run_dir / "secret")


def raise_nofile() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main() -> int:
    raise_nofile()
    root = Path(tempfile.mkdtemp(prefix="fthsdp-bench-attack-"))
    proc, url, secret = start_control(root)
    run_dir = root / "run"
    rounds: list[dict[str, Any]] = []
    seq = 1
    try:
        for r in range(ROUNDS):
            quiet = [legit_report(url, secret, seq + i) for i in range(LEGIT)]
            seq += LEGIT
            before = journal_rows(run_dir)
            size_before = (run_dir / "control.sqlite").stat().st_size
            attacked = asyncio.run(attack_round(url, secret, seq))
            seq += LEGIT
            after = journal_rows(run_dir)
            accepted = sum(1 for s in attacked["legit_statuses"] if s == 200)
            rounds.append(
                {
                    "round": r,
                    "quiet_latency_s": [s for _, s in quiet],
                    **attacked,
                    "events_added": after["events"] - before["events"],
                    "nonces_added": after["nonces"] - before["nonces"],
                    "rejections_added": after["rejections"] - before["rejections"],
                    "accepted": accepted,
                    "db_bytes_before": size_before,
                    "db_bytes_after": (run_dir / "control.sqlite").stat().st_size,
                }
            )
            print(
                f"round {r}: quiet max {max(s for _, s in quiet) * 1000:.0f} ms, under attack "
                f"max {max(attacked['legit_latency_s']) * 1000:.0f} ms, half-open opened "
                f"{attacked['half_open_opened']}, bad statuses {attacked['bad_statuses']}, "
                f"journal +{after['events'] - before['events']} events for {accepted} accepted"
            )
    finally:
        proc.stop()
    quiet_all = [s for r in rounds for s in r["quiet_latency_s"]]
    attack_max = [max(r["legit_latency_s"]) for r in rounds]
    attack_all = [s for r in rounds for s in r["legit_latency_s"]]
    journal_ok = all(
        r["events_added"] == r["accepted"] == LEGIT and r["rejections_added"] == 0 for r in rounds
    )
    results = {
        "rounds": rounds,
        "half_open": HALF_OPEN,
        "bad_requests": BAD_REQUESTS,
        "quiet_median_s": statistics.median(quiet_all),
        "quiet_range_s": [min(quiet_all), max(quiet_all)],
        "attack_median_s": statistics.median(attack_all),
        "attack_range_s": [min(attack_all), max(attack_all)],
        "attack_round_max_median_s": statistics.median(attack_max),
        "journal_grew_only_by_accepted_reports": journal_ok,
        "targets": {"legit_under_attack_s": 1.0},
    }
    results["targets_met"] = max(attack_all) < 1.0 and journal_ok
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "control_attack.json").write_text(json.dumps(results, indent=2))
    print(
        f"signed report, quiet: median {results['quiet_median_s'] * 1000:.0f} ms "
        f"(range {min(quiet_all) * 1000:.0f}-{max(quiet_all) * 1000:.0f}); under attack: "
        f"median {results['attack_median_s'] * 1000:.0f} ms "
        f"(range {min(attack_all) * 1000:.0f}-{max(attack_all) * 1000:.0f}); journal grew only "
        f"by accepted reports: {journal_ok}; targets met: {results['targets_met']}"
    )
    return 0 if results["targets_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
