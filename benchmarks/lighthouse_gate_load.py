"""Benchmark: the CPU the Lighthouse gate spends per piped request and answer.

The gate runs as the control job runs it (`runtime.control.service.GateProcess`, a child
process) in front of an echo server; `--connections` clients (20) each do the handshake with a
replica key, then `--roundtrips` (2,000) request/answer round trips of `--size` bytes (200, about
a torchft heartbeat), all at once. The gate's CPU time comes from /proc/<pid>/stat. A Manager
heartbeats every 100 ms, so one replica costs ten round trips a second. Prints one line with
the CPU model.

    python -m benchmarks.lighthouse_gate_load [--connections 20] [--roundtrips 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import time
from pathlib import Path

from benchmarks.harness import _cpu_model
from runtime.control.lighthouse_gate import client_handshake
from runtime.control.service import GateProcess
from runtime.protocol import replica_key_id

SECRET = b"0" * 64


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, asyncio.CancelledError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()


async def run(connections: int, roundtrips: int, size: int) -> str:
    echo = await asyncio.start_server(_echo, "127.0.0.1", 0)
    with tempfile.TemporaryDirectory() as tmp:
        secret = Path(tmp) / "secret"
        secret.write_bytes(SECRET)
        gate = GateProcess(
            "127.0.0.1", 0, echo.sockets[0].getsockname()[1], secret, Path(tmp) / "gate.log"
        )
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, gate.start_and_wait)
        assert gate.proc is not None
        try:
            clients = []
            for k in range(connections):
                reader, writer = await asyncio.open_connection("127.0.0.1", gate.port)
                await client_handshake(reader, writer, SECRET, replica_key_id(k))
                clients.append((reader, writer))
            message = b"x" * size

            async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                for _ in range(roundtrips):
                    writer.write(message)
                    await writer.drain()
                    await reader.readexactly(size)

            cpu0, t0 = cpu_s(gate.proc.pid), time.perf_counter()
            await asyncio.gather(*(one(r, w) for r, w in clients))
            cpu1, t1 = cpu_s(gate.proc.pid), time.perf_counter()
            for _, writer in clients:
                writer.close()
        finally:
            gate.stop()
            echo.close()
    total = connections * roundtrips
    per = (cpu1 - cpu0) / total
    return (
        f"{_cpu_model()} ({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}): {total} round "
        f"trips of {size} B over {connections} connections in {t1 - t0:.1f} s; gate CPU "
        f"{per * 1e6:.0f} us per round trip = {per * 10 * 1000:.2f} ms/s per replica at "
        "10 heartbeats/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=20)
    parser.add_argument("--roundtrips", type=int, default=2000)
    parser.add_argument("--size", type=int, default=200)
    args = parser.parse_args()
    print(asyncio.run(run(args.connections, args.roundtrips, args.size)))


if __name__ == "__main__":
    main()
