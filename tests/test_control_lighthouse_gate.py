"""The Lighthouse behind its gate: only a client that proves the run's key gets bytes through.

The fast tests put the gate in front of an echo server (what comes back proves what was piped);
the slow ones run the real control plane (`runtime.control.service.serve`: the real
`torchft_lighthouse` on loopback, the gate on this machine's own address) and two real torchft
trainers (`examples/torchft_trainer.py`) whose Managers go through replica forwarders, while a
stranger tries the dashboard's replica list and kill route on the gate's port.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from runtime.control.lighthouse_forwarder import ForwarderThread, LighthouseForwarder, peer_uid
from runtime.control.lighthouse_gate import (
    GATE_COUNTERS,
    MAGIC,
    NONCE_BYTES,
    GateLimits,
    GateRefused,
    GateStats,
    LighthouseGate,
    client_handshake,
    host_port,
)
from runtime.net import free_port
from runtime.protocol import replica_key_id

ROOT = Path(__file__).resolve().parent.parent
SECRET = b"a" * 64
HELLO = len(MAGIC) + NONCE_BYTES


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(4096):
            writer.write(b"echo:" + data)
            await writer.drain()
    writer.close()


@contextlib.asynccontextmanager
async def gate_on_echo(limits: GateLimits | None = None) -> AsyncIterator[LighthouseGate]:
    echo = await asyncio.start_server(_echo, "127.0.0.1", 0)
    gate = LighthouseGate(SECRET, ("127.0.0.1", echo.sockets[0].getsockname()[1]), limits)
    await gate.start("127.0.0.1", 0)
    try:
        yield gate
    finally:
        await gate.close()
        echo.close()


@contextlib.asynccontextmanager
async def forwarder_to(gate: LighthouseGate, secret: bytes = SECRET) -> AsyncIterator[str]:
    fwd = LighthouseForwarder(secret, replica_key_id(0), lambda: gate.url, timeout_s=2.0)
    await fwd.start()
    try:
        yield fwd.url
    finally:
        await fwd.close()


async def _roundtrip(address: str, payload: bytes = b"ping") -> bytes:
    """What comes back for `payload` through `address` ('' when the connection is closed)."""
    reader, writer = await asyncio.open_connection(*host_port(address))
    writer.write(payload)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(4096), 5.0)
    except ConnectionError:
        return b""
    finally:
        writer.close()


async def _until_closed(reader: asyncio.StreamReader, timeout: float) -> bytes:
    """Everything the gate sends before it closes the connection (within `timeout`)."""
    got = b""
    with contextlib.suppress(ConnectionError):
        while data := await asyncio.wait_for(reader.read(4096), timeout):
            got += data
    return got


@pytest.mark.timeout(30)
def test_a_forwarder_with_the_run_key_gets_through_and_the_gate_proves_itself() -> None:
    async def main() -> None:
        async with gate_on_echo() as gate, forwarder_to(gate) as local:
            assert await _roundtrip(local) == b"echo:ping"
            assert gate.stats.counts["authenticated"] == 1
            # A stranger speaking HTTP reaches nothing: the gate's hello, then the close.
            reader, writer = await asyncio.open_connection(gate.host, gate.port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            got = await _until_closed(reader, 5.0)
            assert got.startswith(MAGIC) and len(got) == HELLO and b"echo" not in got
            assert gate.stats.counts["refused_malformed"] == 1

    asyncio.run(main())


@pytest.mark.timeout(30)
def test_a_wrong_mac_is_refused_and_counted() -> None:
    async def main() -> None:
        async with gate_on_echo() as gate:
            async with forwarder_to(gate, secret=b"b" * 64) as local:
                assert await _roundtrip(local) == b""
            assert gate.stats.counts["refused_bad_mac"] == 1
            assert gate.stats.counts["authenticated"] == 0
            # The handshake by hand, with the right secret, gets through.
            reader, writer = await asyncio.open_connection(gate.host, gate.port)
            await client_handshake(reader, writer, SECRET, "control")
            writer.write(b"x")
            assert await reader.read(100) == b"echo:x"
            writer.close()

    asyncio.run(main())


@pytest.mark.timeout(30)
def test_an_impostor_gate_is_refused_by_the_forwarder() -> None:
    """Whoever took the gate's port without the run's secret cannot produce its proof."""

    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(MAGIC + os.urandom(NONCE_BYTES))
        await reader.readexactly(1 + len("replica-0") + 64)
        writer.write(os.urandom(32))
        await writer.drain()
        seen.append(await reader.read(100))  # what the client sends next: nothing
        writer.close()

    seen: list[bytes] = []

    async def main() -> None:
        server = await asyncio.start_server(impostor, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        with pytest.raises(GateRefused) as err:
            await client_handshake(reader, writer, SECRET, replica_key_id(0))
        assert err.value.kind == "impostor"
        writer.close()
        await asyncio.sleep(0)
        server.close()

    asyncio.run(main())


@pytest.mark.timeout(30)
def test_a_slowloris_handshake_is_closed_at_the_deadline() -> None:
    async def main() -> None:
        async with gate_on_echo(GateLimits(handshake_s=0.5)) as gate:
            reader, writer = await asyncio.open_connection(gate.host, gate.port)
            hello = await reader.readexactly(HELLO)
            assert hello.startswith(MAGIC)
            start = time.monotonic()
            writer.write(bytes([9]) + b"repl")  # half a key id, then silence
            await writer.drain()
            assert await _until_closed(reader, 5.0) == b""
            assert 0.3 < time.monotonic() - start < 3.0
            assert gate.stats.counts["timed_out"] == 1
            assert gate.pending() == 0

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_200_half_open_connections_are_evicted_and_a_replica_still_connects() -> None:
    async def main() -> None:
        limits = GateLimits(handshake_s=30.0, max_pending=64, max_pending_per_peer=16)
        async with gate_on_echo(limits) as gate, forwarder_to(gate) as local:
            held = []
            for _ in range(200):
                reader, writer = await asyncio.open_connection(gate.host, gate.port)
                held.append((reader, writer))
            await asyncio.gather(*(r.readexactly(HELLO) for r, _ in held[-16:]))
            assert gate.pending() <= 16
            start = time.monotonic()
            assert await _roundtrip(local) == b"echo:ping"
            # Long before any deadline: the replica did not wait for the flood to time out.
            assert time.monotonic() - start < 5.0
            assert gate.stats.counts["evicted"] >= 200 - 16
            for _, writer in held:
                writer.close()

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_a_flooding_peer_cannot_evict_another_peers_handshake() -> None:
    """At the global cap the victim is the peer holding the most pending handshakes."""

    async def main() -> None:
        limits = GateLimits(handshake_s=30.0, max_pending=8, max_pending_per_peer=8)
        async with gate_on_echo(limits) as gate:
            other = await asyncio.open_connection(gate.host, gate.port)
            while gate.pending() < 1:
                await asyncio.sleep(0.01)
            # A second peer address on loopback (127.0.0.2), flooding.
            flood = []
            for _ in range(20):
                sock = socket.create_connection(
                    (gate.host, gate.port), source_address=("127.0.0.2", 0)
                )
                flood.append(sock)
            while gate.stats.counts["accepted"] < 21:
                await asyncio.sleep(0.01)
            while gate.stats.counts["evicted"] < 20 - 7:
                await asyncio.sleep(0.01)
            assert gate.stats.counts["evicted"] == 20 - 7
            # The first peer's handshake was never the victim: it completes now.
            await client_handshake(other[0], other[1], SECRET, "control")
            other[1].write(b"x")
            assert await other[0].read(100) == b"echo:x"
            for sock in flood:
                sock.close()
            other[1].close()

    asyncio.run(main())


def test_peer_uid_reads_the_kernels_socket_table(tmp_path: Path) -> None:
    table = tmp_path / "tcp"
    table.write_text(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"
        "   0: 0100007F:A3FB 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1234\n"
    )
    assert peer_uid(("127.0.0.1", 0xA3FB), ("127.0.0.1", 8080), table) == 1234
    assert peer_uid(("127.0.0.1", 0xA3FC), ("127.0.0.1", 8080), table) is None
    assert peer_uid(("127.0.0.1", 1), ("127.0.0.1", 2), tmp_path / "absent") is None


@pytest.mark.timeout(60)
@pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/usr/bin/python3").exists(),
    reason="needs root and /usr/bin/python3 to connect as another user",
)
def test_the_forwarder_drops_another_users_connection() -> None:
    """Loopback is open to every user of the node: the forwarder serves only its own."""

    async def main() -> None:
        async with gate_on_echo() as gate:
            fwd = LighthouseForwarder(SECRET, replica_key_id(0), lambda: gate.url, timeout_s=2.0)
            await fwd.start()
            try:
                code = (
                    "import socket,sys\n"
                    "s=socket.create_connection(('127.0.0.1', int(sys.argv[1])))\n"
                    "s.sendall(b'ping'); s.settimeout(10)\n"
                    "try: print(repr(s.recv(100)))\n"
                    "except OSError as e: print('closed', type(e).__name__)"
                )
                proc = await asyncio.create_subprocess_exec(
                    "/usr/bin/python3",  # the other user may not read this virtualenv
                    "-c",
                    code,
                    str(fwd.port),
                    user=65534,
                    stdout=asyncio.subprocess.PIPE,
                )
                out, _ = await asyncio.wait_for(proc.communicate(), 30)
                assert b"echo" not in out, out
                assert fwd.strangers == 1
                assert gate.stats.counts["accepted"] == 0
                assert await _roundtrip(fwd.url) == b"echo:ping"  # its own user still gets in
            finally:
                await fwd.close()

    asyncio.run(main())


@pytest.mark.timeout(120)
def test_the_gate_process_takes_a_free_port_when_its_own_is_taken_and_comes_back_on_it(
    tmp_path: Path,
) -> None:
    """The control job's gate runs in a child process: a taken port gives way to a free one, a
    gate that dies is started again on the port the replicas know, and its parent reads its
    counters across the restart."""
    from runtime.control.service import GateProcess, supervise

    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)  # the run file rule: the secret is its owner's alone

    async def through(port: int) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await client_handshake(reader, writer, SECRET, replica_key_id(3))
        writer.write(b"x")
        got = await reader.read(100)
        writer.close()
        return got

    async def stranger(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await _until_closed(reader, 5.0)

    async def counted(gate: GateProcess, want: dict[str, int]) -> None:
        deadline = time.monotonic() + 30
        while True:
            counts = gate.stats()["counts"]
            if all(counts[k] >= v for k, v in want.items()):
                assert all(counts[k] == v for k, v in want.items()), counts
                return
            assert time.monotonic() < deadline, counts
            await asyncio.sleep(0.05)

    async def main() -> None:
        echo = await asyncio.start_server(_echo, "127.0.0.1", 0)
        upstream = echo.sockets[0].getsockname()[1]
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            busy = taken.getsockname()[1]
            gate = GateProcess("127.0.0.1", busy, upstream, secret, tmp_path / "gate.log")
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, gate.start_and_wait)
        watcher = asyncio.ensure_future(supervise(gate, "gate"))
        try:
            assert gate.port != busy
            assert await through(gate.port) == b"echo:x"
            await stranger(gate.port)
            await counted(gate, {"authenticated": 1, "refused_malformed": 1})
            assert gate.proc is not None
            gate.proc.kill()
            while gate.restarts < 1:
                await asyncio.sleep(0.05)
            deadline = time.monotonic() + 60
            while True:
                try:
                    assert await through(gate.port) == b"echo:x"
                    break
                except (OSError, asyncio.IncompleteReadError):
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.1)
            # The counters add up over both processes (they are counters on /metrics).
            await stranger(gate.port)
            await counted(gate, {"authenticated": 2, "refused_malformed": 2})
            assert gate.stats()["restarts"] == 1
        finally:
            watcher.cancel()
            await loop.run_in_executor(None, gate.stop)
            echo.close()

    asyncio.run(main())


# -- the real control plane and real torchft trainers ----------------------------------------


def _children_lighthouse(pid: int) -> list[str]:
    """The argv of this process's `torchft_lighthouse` descendant."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(fields[1]) == pid and any(b"torchft_lighthouse" in a for a in cmdline[:2]):
            return [a.decode() for a in cmdline if a]
    return []


@pytest.fixture
def control_plane(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """`serve` with the real Lighthouse (min 2 replicas) in a thread; yields (run dir, gate)."""
    from runtime.control.auth import ensure_secret
    from runtime.control.http import own_address
    from runtime.control.policy import PolicyConfig
    from runtime.control.service import LighthouseConfig, serve
    from runtime.control.settings import CoordinatorConfig
    from slurm.rundir import read_control

    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    ensure_secret(run_dir)
    host = own_address()
    coordinator = CoordinatorConfig(
        run_dir=run_dir, policy=PolicyConfig(replicas=2, min_replicas=2), host=host, poll_jobs=False
    )
    house = LighthouseConfig(host=host, min_replicas=2, start_timeout_s=240.0)
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            loop.run_until_complete(serve(coordinator, house, stop=stop, finish_grace_s=None))
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 240
        found = None
        while time.monotonic() < deadline and not failed:
            with contextlib.suppress(Exception):
                found = read_control(run_dir)
            if found is not None and found.lighthouse:
                break
            time.sleep(0.2)
        assert not failed, failed
        assert found is not None and found.lighthouse, "the control plane did not come up"
        yield run_dir, found.lighthouse
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)


def _trainer(group: int, lighthouse: str, steps: int) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TORCHFT_LIGHTHOUSE": lighthouse,
        "REPLICA_GROUP_ID": str(group),
        "NUM_REPLICA_GROUPS": "2",
        "MASTER_ADDR": "127.0.0.1",
        # Outside the ephemeral range: a port from there can be taken meanwhile as the source
        # port of any loopback connection (other lanes of `make test` make many).
        "MASTER_PORT": str(free_port()),
        "RANK": "0",
        "WORLD_SIZE": "1",
    }
    argv = [sys.executable, str(ROOT / "examples" / "torchft_trainer.py"), "--steps", str(steps)]
    argv += ["--step-sleep", "0.05", "--min-replicas", "2"]
    return subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _stranger(host: str, port: int, request: bytes) -> bytes:
    """Everything a stranger's `request` gets back from `host:port` before the close."""
    got = b""
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(request)
        with contextlib.suppress(ConnectionError):
            while data := sock.recv(4096):
                got += data
    return got


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_replicas_train_through_the_gate_and_a_stranger_cannot_list_or_kill(
    control_plane: tuple[Path, str],
) -> None:
    pytest.importorskip("torchft")
    from slurm.rundir import read_secret

    run_dir, gate = control_plane
    gate_host, gate_port = host_port(gate)
    # The Lighthouse itself listens on loopback only.
    argv = _children_lighthouse(os.getpid())
    bind = argv[argv.index("--bind") + 1]
    assert bind.startswith("127.0.0.1:"), argv
    house_port = int(bind.rsplit(":", 1)[1])
    assert house_port != gate_port
    if gate_host != "127.0.0.1":
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((gate_host, house_port), timeout=5).close()

    secret = read_secret(run_dir / "secret")
    forwarders = [
        ForwarderThread(LighthouseForwarder(secret, replica_key_id(r), lambda: gate))
        for r in (0, 1)
    ]
    procs: list[subprocess.Popen[str]] = []
    try:
        urls = [f.start() for f in forwarders]
        procs = [_trainer(r, urls[r], steps=60) for r in (0, 1)]
        lines: list[list[str]] = [[], []]
        readers = [
            threading.Thread(target=lambda p=p, out=out: out.extend(p.stdout), daemon=True)  # type: ignore[misc]
            for p, out in zip(procs, lines, strict=True)
        ]
        for t in readers:
            t.start()
        deadline = time.monotonic() + 300
        while not all(any("participants: 2" in line for line in out) for out in lines):
            assert time.monotonic() < deadline, lines
            assert all(p.poll() is None for p in procs), lines
            time.sleep(0.2)
        # Through a forwarder (the run's key) the dashboard answers, with both replicas.
        with urllib.request.urlopen(urls[0] + "/status", timeout=10) as resp:
            page = resp.read().decode()
        ids = sorted(set(re.findall(r"torchft_trainer_[01]:[0-9a-f-]{36}", page)))
        assert len(ids) == 2, page
        # A stranger on the gate's port: no replica list, no kill.
        listing = _stranger(gate_host, gate_port, b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b"HTTP/" not in listing and b"torchft_trainer" not in listing
        for replica_id in ids:
            kill = f"POST /replica/{replica_id}/kill HTTP/1.1\r\nHost: x\r\n"
            kill += "Content-Length: 0\r\n\r\n"
            got = _stranger(gate_host, gate_port, kill.encode())
            assert b"HTTP/" not in got
        # 200 half-open connections while the replicas keep training; the insider still gets in.
        held = [socket.create_connection((gate_host, gate_port), timeout=10) for _ in range(200)]
        try:
            with urllib.request.urlopen(urls[1] + "/", timeout=10) as resp:
                assert resp.status == 200
        finally:
            for sock in held:
                sock.close()
        for p in procs:
            assert p.wait(240) == 0, lines
        for t in readers:
            t.join(10)
        for out in lines:
            steps = [int(m.group(1)) for line in out if (m := re.match(r"step: (\d+)", line))]
            assert steps and steps[-1] == 60, out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(30)
        for f in forwarders:
            f.stop()
    control = json.loads((run_dir / "control.json").read_text())
    assert control["lighthouse"] == gate
    # The gate's refusals are on the coordinator's /metrics: the stranger's listing and kills
    # (malformed handshakes) and the 200 half-open connections (timed out, closed or evicted).
    with urllib.request.urlopen(control["coordinator"] + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    outcome = re.compile(r'^fthsdp_lighthouse_gate_connections_total\{outcome="(\w+)"\} (\S+)$')
    counts = {m[1]: float(m[2]) for line in text.splitlines() if (m := outcome.match(line))}
    assert counts["refused_malformed"] >= 1 + len(ids), text
    assert counts["authenticated"] >= 2, text
    assert sum(counts[k] for k in ("timed_out", "closed_early", "evicted")) >= 200, text


NONE_COUNTED = dict.fromkeys(GATE_COUNTERS, 0)


@pytest.mark.parametrize(
    ("line", "ok"),
    [
        (
            GateStats(counts={**dict.fromkeys(GATE_COUNTERS, 0), "evicted": 3}, open=2).to_line(),
            True,
        ),
        ("4242", False),  # the port line
        ("not json", False),
        ('{"counts": {"accepted": 1}, "open": 0}', False),  # not the fixed set
        (json.dumps({"counts": dict.fromkeys(GATE_COUNTERS, -1), "open": 0}), False),
        (json.dumps({"counts": dict.fromkeys(GATE_COUNTERS, True), "open": 0}), False),
        (json.dumps({"counts": dict.fromkeys(GATE_COUNTERS, 0), "open": "1"}), False),
        (json.dumps({"counts": {**dict.fromkeys(GATE_COUNTERS, 0), "x": 1}, "open": 0}), False),
    ],
)
def test_the_gate_processs_counter_lines_are_read_strictly(line: str, ok: bool) -> None:
    stats = GateStats.parse_line(line)
    assert (stats is not None) is ok
    if stats is not None:
        assert stats.counts["evicted"] == 3 and stats.open == 2
