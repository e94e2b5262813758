"""Benchmark: a signed report gets through while strangers flood the coordinator.

A real control process (`fthsdp control --no-lighthouse --no-poll`, Slurm's commands replaced by
the test harness's stand-ins) on loopback. Each round interleaves two configurations:

- quiet: 5 signed status reports, one after the other, each on a new connection;
- attack: 1,100 connections that each hold a slot and are reopened whenever the coordinator
  drops them (bounded: at most 20 reopenings per slot), a third each sending half a request
  header, `\r\n\r\n` and then half a header (aiohttp skips the blank lines: still no request),
  or a whole header whose body never comes; plus 3,000 requests with a bad signature and 2,000
  with a random 4 KB path (50 in flight at a time each); once all are under way, the same 5 signed
  reports are timed, then `/metrics` is read.

The attacker speaks from 127.0.0.2-4 (held slots, bad signatures, long paths), the leaders from
127.0.0.1 (other hosts, as on a cluster: the guard caps what one address holds). Target
(loopback only): every signed report under attack is answered in under 1 s, the journal grows
by the accepted reports only (no row and no fsync for a refusal), and `/metrics` and the control
process's memory stay small. Prints the medians and ranges over the repeats (`--repeat N`,
default 5) and writes
benchmarks/results/control_attack.json and benchmarks/figures/control_attack.json.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import resource
import sqlite3
import string
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import aiohttp  # noqa: E402
import yarl  # noqa: E402
from control_harness import ControlProcess, install_fake_slurm  # noqa: E402

from benchmarks.harness import Run, interleave, repeats_arg  # noqa: E402
from runtime.protocol import SIGNATURE_HEADER, ReplicaReport, replica_key_id, sign  # noqa: E402
from slurm.rundir import read_secret  # noqa: E402

HALF_OPEN = 1100
BAD_REQUESTS = 3000
LONG_PATHS = 2000
PATH_BYTES = 4000
#: The attacker's source addresses (loopback: all of 127/8 reaches a socket bound to 127.0.0.1):
#: the held slots from one, the bad signatures and the long paths from one each, so that each
#: flood's requests stay under the guard's per-address cap (64) and are answered.
ATTACKER = "127.0.0.2"
BAD_FROM = "127.0.0.3"
PATHS_FROM = "127.0.0.4"
LEGIT = 5
IN_FLIGHT = 50
#: What the same attack did before the guard (static text for the generated docs section).
BEFORE = [
    "- Before the connection guard and in-memory refusals (measured when the problem was "
    "found): 1,100 half-open connections kept the coordinator unreachable for as long as they "
    "were open, and 3,000 bad signatures wrote 3,000 journal rows (111 KB to 4.35 MB) while a "
    "signed report went from 20 to 90 ms. The eviction at the connection cap and the header "
    "deadline are tested with a small cap in `tests/test_story_control_attacks.py`.",
    "- Before the guard counted what aiohttp counts (measured when the second review found it): "
    "`\\r\\n\\r\\n` then half a header, or a whole header and no body, was never evicted; about "
    "cap+1 such sockets reset the leaders' reports and the policy then drained every replica's "
    "node for silence. 5,000 requests with 4 KB paths added 22 MB of memory, made `/metrics` "
    "20 MB and wrote one 8 MB log line (refusals were keyed by the raw path).",
]
HALF_HEADER = b"POST /v1/reports HTTP/1.1\r\nHost: coordinator\r\nX-Fthsdp-Sig"
#: What each third of the held slots sends: half a header; a guard bypass (a header's end first,
#: then half a header); a whole header with no body.
HOLDS = (
    HALF_HEADER,
    b"\r\n\r\n" + HALF_HEADER,
    b"POST /v1/reports HTTP/1.1\r\nHost: coordinator\r\nContent-Length: 900\r\n\r\n",
)


@dataclass
class Flood:
    """What the attacker did and saw."""

    opened: int = 0
    dropped_by_server: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    path_statuses: dict[int, int] = field(default_factory=dict)
    errors: int = 0


async def _hold(
    host: str, port: int, flood: Flood, stop: asyncio.Event, payload: bytes = HALF_HEADER
) -> None:
    """One held slot: connect, send `payload`, wait; reconnect when dropped."""
    for _ in range(20):
        if stop.is_set():
            return
        try:
            reader, writer = await asyncio.open_connection(host, port, local_addr=(ATTACKER, 0))
        except OSError:
            flood.errors += 1
            await asyncio.sleep(0.1)
            continue
        flood.opened += 1
        try:
            writer.write(payload)
            await writer.drain()
            read = asyncio.ensure_future(reader.read(1))
            done = asyncio.ensure_future(stop.wait())
            await asyncio.wait({read, done}, return_when=asyncio.FIRST_COMPLETED)
            if read.done():
                flood.dropped_by_server += 1
                read.exception()  # a reset is the drop itself; retrieved, so asyncio logs nothing
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
    connector = aiohttp.TCPConnector(limit=IN_FLIGHT, force_close=True, local_addr=(BAD_FROM, 0))
    async with aiohttp.ClientSession(connector=connector) as http:

        async def one() -> None:
            try:
                async with http.post(url + "/v1/reports", data=body, headers=headers) as resp:
                    await resp.read()
                    flood.statuses[resp.status] = flood.statuses.get(resp.status, 0) + 1
            except (TimeoutError, aiohttp.ClientError, OSError):
                flood.errors += 1

        await asyncio.gather(*(one() for _ in range(n)))


async def _long_paths(url: str, n: int, flood: Flood, size: int = PATH_BYTES) -> None:
    """`n` GETs of random paths of `size` characters: each must cost a bounded refusal."""
    rng = random.Random(7)
    alphabet = string.ascii_letters + string.digits + "-._~"
    connector = aiohttp.TCPConnector(limit=IN_FLIGHT, force_close=True, local_addr=(PATHS_FROM, 0))
    async with aiohttp.ClientSession(connector=connector) as http:

        async def one() -> None:
            path = "/" + "".join(rng.choices(alphabet, k=size))
            try:
                async with http.get(yarl.URL(url + path, encoded=True)) as resp:
                    await resp.read()
                    flood.path_statuses[resp.status] = flood.path_statuses.get(resp.status, 0) + 1
            except (TimeoutError, aiohttp.ClientError, OSError):
                flood.errors += 1

        await asyncio.gather(*(one() for _ in range(n)))


def metrics_bytes(url: str) -> int:
    """Size of the coordinator's `/metrics` page (without a token: the benchmark sets none)."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
        return len(resp.read())


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


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
    url: str,
    secret: bytes,
    seq0: int,
    half_open: int = HALF_OPEN,
    bad: int = BAD_REQUESTS,
    long_paths: int = LONG_PATHS,
) -> dict[str, Any]:
    """Flood, then time `LEGIT` signed reports while the flood is in flight."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    flood = Flood()
    stop = asyncio.Event()
    holders = [
        asyncio.ensure_future(_hold(host, int(port), flood, stop, HOLDS[i % len(HOLDS)]))
        for i in range(half_open)
    ]
    while flood.opened < half_open and not all(h.done() for h in holders):
        await asyncio.sleep(0.05)
    bad_task = asyncio.ensure_future(
        asyncio.gather(
            _bad_signatures(url, secret, bad, flood), _long_paths(url, long_paths, flood)
        )
    )
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
        "long_path_statuses": {str(k): v for k, v in sorted(flood.path_statuses.items())},
        "client_errors": flood.errors,
    }


def start_control(root: Path) -> tuple[ControlProcess, str, bytes]:
    run_dir = root / "run"
    run_dir.mkdir()
    # Long attacked rounds leave replica 0 without a report for a while: not a silence to act on.
    (run_dir / "run.json").write_text(json.dumps({"replicas": 2, "report_timeout_s": 3600.0}))
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
    repeats = repeats_arg()
    root = Path(tempfile.mkdtemp(prefix="fthsdp-bench-attack-"))
    proc, url, secret = start_control(root)
    run_dir = root / "run"
    run = Run(
        "control_attack",
        "Control plane under attack",
        "A real control process (`fthsdp control --no-lighthouse --no-poll`) on loopback. Each "
        f"repeat interleaves a quiet measurement ({LEGIT} signed status reports, one per new "
        f"connection) with an attacked one: {HALF_OPEN:,} connections holding a slot (a third "
        "each: half a header; `\\r\\n\\r\\n` then half a header; a whole header and no body; "
        f"reopened when dropped), {BAD_REQUESTS:,} requests with a bad signature and "
        f"{LONG_PATHS:,} with a random {PATH_BYTES:,}-byte path ({IN_FLIGHT} in flight each) "
        f"under way from {ATTACKER}-4, then the same {LEGIT} signed reports from 127.0.0.1, then "
        "`/metrics`.",
        repeats,
    )
    seq = 1

    def quiet() -> list[float]:
        nonlocal seq
        out = [legit_report(url, secret, seq + i)[1] for i in range(LEGIT)]
        seq += LEGIT
        return out

    assert proc.proc is not None
    pid = proc.proc.pid
    rss_start = rss_mib(pid)

    def settled() -> dict[str, int]:
        """The journal's rows once every report accepted so far is on disk: a status report
        is committed with the journal's next group, so a count taken at once may miss it."""
        deadline = time.monotonic() + 30
        rows = journal_rows(run_dir)
        while rows["events"] < seq and time.monotonic() < deadline:  # the start + seq - 1
            time.sleep(0.05)
            rows = journal_rows(run_dir)
        return rows

    def attacked() -> dict[str, Any]:
        nonlocal seq
        before = settled()
        rss_before = rss_mib(pid)
        got = asyncio.run(attack_round(url, secret, seq))
        seq += LEGIT
        got["metrics_bytes"] = metrics_bytes(url)
        got["rss_growth_mib"] = rss_mib(pid) - rss_before
        after = settled()
        got["accepted"] = sum(1 for s in got["legit_statuses"] if s == 200)
        got["added"] = {t: after[t] - before[t] for t in after}
        return got

    try:
        got = interleave({"quiet": quiet, "attack": attacked}, repeats)
        rss_end = rss_mib(pid)
    finally:
        proc.stop()
    rounds = cast(list[dict[str, Any]], got["attack"])
    quiet_all = [s for r in cast(list[list[float]], got["quiet"]) for s in r]
    attack_all = [s for r in rounds for s in r["legit_latency_s"]]
    refused = sum(sum(r["bad_statuses"].values()) for r in rounds)
    journal_ok = all(
        r["added"]["events"] == r["accepted"] == LEGIT and r["added"]["rejections"] == 0
        for r in rounds
    )
    in_flight = all(r["bad_requests_still_in_flight_after_legit"] for r in rounds)
    run.row("signed report, quiet", [v * 1000 for v in quiet_all], "ms")
    run.row(
        f"signed report, {HALF_OPEN:,} held slots + {BAD_REQUESTS:,} bad signatures + "
        f"{LONG_PATHS:,} long paths in flight",
        [v * 1000 for v in attack_all],
        "ms",
        "< 1000 ms",
    )
    run.row(
        "bad-signature requests answered 401, per repeat",
        [r["bad_statuses"].get("401", 0) for r in rounds],
        "",
        f"{BAD_REQUESTS:,}",
        digits=0,
    )
    run.row(
        f"random {PATH_BYTES:,}-byte paths answered 404, per repeat",
        [r["long_path_statuses"].get("404", 0) for r in rounds],
        "",
        f"{LONG_PATHS:,}",
        digits=0,
    )
    run.row(
        "held slots the coordinator dropped, per repeat",
        [r["half_open_dropped_by_server"] for r in rounds],
        "",
        digits=0,
    )
    run.row(
        "/metrics after a repeat",
        [r["metrics_bytes"] / 1024 for r in rounds],
        "KiB",
        "< 20 KiB",
        digits=1,
    )
    run.row(
        "control process RSS growth per attacked repeat",
        [r["rss_growth_mib"] for r in rounds],
        "MiB",
        "small, not growing",
        digits=1,
    )
    run.row(
        "journal events added per repeat (accepted reports only)",
        [r["added"]["events"] for r in rounds],
        "",
        f"{LEGIT} (0 for refusals)",
        digits=0,
    )
    run.notes.append(
        f"- The journal grew by the accepted reports only in every repeat: {journal_ok} "
        f"({refused:,} refusals, no row and no fsync for any). The bad requests were still in "
        f"flight when the last signed report was answered: {in_flight}."
    )
    run.notes.append(
        f"- Control process RSS: {rss_start:.1f} MiB after start, {rss_end:.1f} MiB after "
        f"{repeats} attacked repeats."
    )
    run.notes.extend(BEFORE)
    run.extra["repeats_raw"] = {"quiet_s": got["quiet"], "attack": rounds}
    small = all(r["metrics_bytes"] < 20 * 1024 for r in rounds)
    ok = max(attack_all) < 1.0 and journal_ok and small
    run.extra["targets_met"] = ok
    run.write()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
