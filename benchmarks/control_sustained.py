"""Control plane over a long run: 1,000 leaders reporting every second for minutes on end.

`benchmarks/control_load.py` measures short windows against a fresh coordinator; what it cannot
show is whether a coordinator keeps its figures once its journal has filled up to its steady
state (the nonces of the last 600 s, a snapshot, compaction every 4 events per replica). This
runs the same coordinator process (`control_load.coordinator_process`: aiohttp, the SQLite
journal, the policy, signatures, an in-memory Slurm) with 1,000 leaders on kept-alive
connections, each reporting once a second, for `--minutes` minutes. At the end of every minute
the load pauses for 5 s while 16 leaders post back to back (the capacity at that minute), and
the journal's size and its count of kept nonces are read. Each minute is one sample; the first
and last thirds of the run are compared.

    python benchmarks/control_sustained.py [--minutes 12] [--nice -10]
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.control_load import (  # noqa: E402
    _journal_bytes,
    _proc_cpu_s,
    _proc_rss_mib,
    coordinator_process,
    percentile,
    raise_limits,
    saturate,
    window,
)
from benchmarks.harness import MIN_REPEATS, Run  # noqa: E402
from runtime.control.event_loop import chosen  # noqa: E402

SENDERS = 16
CAPACITY_S = 5.0


def nonces_kept(run_dir: Path) -> int:
    """Rows in the journal's nonce table, read through a read-only connection."""
    path = run_dir / "control.sqlite"
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10) as db:
        return int(db.execute("SELECT count(*) FROM nonces").fetchone()[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=1000, help="leaders, each once a second")
    parser.add_argument("--minutes", type=int, default=12, help="minutes of load (one sample each)")
    parser.add_argument(
        "--nice", type=int, default=0, help="scheduling priority of both processes (root: < 0)"
    )
    args = parser.parse_args()
    if args.minutes < MIN_REPEATS:
        raise SystemExit(f"control_sustained: --minutes must be >= {MIN_REPEATS}")
    steady = args.replicas
    load_s = 60.0 - CAPACITY_S
    niced = raise_limits(args.nice)
    with coordinator_process(steady) as (proc, run_dir, leaders):
        leaders.keepalive = True
        run = Run(
            "control_sustained",
            "Control plane over a long run",
            f"One coordinator process (as in control_load: {chosen()} event loop, aiohttp, "
            f"SQLite journal with group "
            f"commit, in-memory Slurm backend) and {steady:,} replica leaders, each on its own "
            f"kept-alive loopback connection, each sending a signed status report once a second "
            f"for {args.minutes} minutes. Each minute: {load_s:g} s of that load, then "
            f"{CAPACITY_S:g} s with {SENDERS} leaders posting back to back (the capacity at that "
            f"minute); each minute is one sample. The leaders share the 2 cores with the "
            f"coordinator (both at nice {niced}).",
            args.minutes,
        )
        series: dict[str, list[float]] = {}
        start = time.monotonic()
        for minute in range(args.minutes):
            cpu0 = _proc_cpu_s(proc.pid)
            got = asyncio.run(leaders.closing(window(leaders, steady, load_s, [])))
            cpu1 = _proc_cpu_s(proc.pid)
            capacity = asyncio.run(leaders.closing(saturate(leaders, steady, CAPACITY_S, SENDERS)))
            lat = [lt for st, lt, _ in got["results"] if st == 200] or [float("nan")]
            sample = {
                "p50": percentile(lat, 50) * 1000,
                "p99": percentile(lat, 99) * 1000,
                "rps": sum(1 for st, _, _ in got["results"] if st == 200) / got["elapsed_s"],
                "lost": sum(1 for st, _, _ in got["results"] if st == -1),
                "refused": sum(1 for st, _, _ in got["results"] if st not in (200, -1)),
                "cpu_ms": (cpu1 - cpu0) * 1000 / max(1, len(got["results"])),
                "capacity": capacity,
                "rss": _proc_rss_mib(proc.pid),
                "journal_mib": _journal_bytes(run_dir) / 2**20,
                "nonces": nonces_kept(run_dir),
                "t_s": time.monotonic() - start,
            }
            for key, value in sample.items():
                series.setdefault(key, []).append(float(value))
            print(
                f"  minute {minute + 1}/{args.minutes}: p99 {sample['p99']:.1f} ms, answered "
                f"{sample['rps']:.0f}/s, lost {sample['lost']}, capacity {capacity:.0f}/s, "
                f"journal {sample['journal_mib']:.0f} MiB, {sample['nonces']:,} nonces, "
                f"RSS {sample['rss']:.0f} MiB",
                flush=True,
            )
        at = f"at {steady:,} reports/s"
        run.row("capacity: reports/s answered, each minute", series["capacity"], "/s", "≥ 2,000", 0)
        third = max(1, args.minutes // 3)
        first, last = series["capacity"][:third], series["capacity"][-third:]
        run.row(
            f"capacity, last {third} minutes / first {third} (medians)",
            [statistics.median(last) / statistics.median(first)],
            "",
            digits=2,
        )
        run.row(f"report latency p50, {at}", series["p50"], "ms", digits=3)
        run.row(f"report latency p99, {at}", series["p99"], "ms", "< 100 ms", digits=3)
        run.row(f"reports answered per second, {at}", series["rps"], "/s", f"{steady:,}", 0)
        run.row(
            f"reports lost (no answer within 10 s) per minute, {at}", series["lost"], "", "0", 0
        )
        run.row(f"reports refused per minute, {at}", series["refused"], "", digits=0)
        run.row(f"coordinator CPU time per report, {at}", series["cpu_ms"], "ms", digits=3)
        run.row("coordinator RSS at the end of a minute", series["rss"], "MiB", digits=0)
        run.row("journal size at the end of a minute", series["journal_mib"], "MiB", digits=0)
        run.row("nonces kept in the journal at the end of a minute", series["nonces"], "", digits=0)
        listed = ", ".join(f"{c:,.0f}" for c in series["capacity"])
        run.notes.append(f"- Capacity minute by minute (reports/s): {listed}.")
        run.notes.append(
            "- Journal (MiB) and nonces kept, minute by minute: "
            + ", ".join(
                f"{j:.0f}/{n / 1000:.0f}k"
                for j, n in zip(series["journal_mib"], series["nonces"], strict=True)
            )
            + "."
        )
        run.extra["series"] = series
        run.extra["nice"] = niced
        run.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
