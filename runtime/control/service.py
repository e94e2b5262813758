"""The control-plane job's process tree: torchft's Lighthouse plus the coordinator.

`fthsdp control` runs this in the run's small CPU job. The Lighthouse is torchft's own quorum
server; importing `torchft` imports torch (about two seconds and a few hundred MB), so it runs
as the `torchft_lighthouse` binary in a child process, restarted if it dies. It listens on
127.0.0.1 only: its dashboard can kill any replica and nothing in it is authenticated, so the
public address is the `runtime.control.lighthouse_gate` gate's, which lets through only clients
that prove the run's secret; the gate runs in a child process of its own (`GateProcess`), so
that piping the Managers' heartbeats never takes the coordinator's event loop, and is restarted
on its port if it dies. The coordinator runs in this process's event loop.
Both public addresses go to `run_dir/control.json`, written atomically, which replicas read (and
re-read after a control-plane restart).

Startup waits are deadlines sized for a busy machine: the Lighthouse is a Python entry point
that imports torch (3.4 s on an idle 2-core machine, far longer under load), so it gets
`start_timeout_s` (120 s) to listen, and a Lighthouse that died on the way (a port taken
meanwhile, say) is started once more on a fresh port. A coordinator port that is taken is
replaced by a free one.

The control job ends by itself: once every replica has finished (its job completed, failed,
was cancelled, left out, or is gone from Slurm) for `finish_grace_s` in a row, `serve` returns
and the job exits 0 instead of holding its node until its time limit.

When the control job is requeued, the new incarnation finds the journal in the run directory,
rebuilds its state from it and carries on. It listens on the ports the previous incarnation wrote
to `control.json` when it is on the same address and they are free (`previous_ports`), so that
whatever holds the old addresses (an operator's dashboard or script) keeps working. The
replicas' Managers reach the Lighthouse through their supervisors' forwarders, which follow the
address in `control.json`, and a quorum that fails meanwhile is retried by the worker once the
Lighthouse is back (see docs/control-plane.md, "When the control job is requeued").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from runtime.control.auth import SECRET_FILE, ensure_secret
from runtime.control.event_loop import loop_name
from runtime.control.http import RunningCoordinator, start_coordinator
from runtime.control.lighthouse_gate import GATE_COUNTERS, GateStats, url
from runtime.control.settings import CoordinatorConfig
from runtime.net import free_port
from slurm import contract
from slurm.errors import EnvironmentProblem
from slurm.rundir import RunFileError, read_control, write_control_file

log = logging.getLogger("fthsdp.control")

#: Where the Lighthouse itself listens: only the gate on this node reaches it.
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class LighthouseConfig:
    host: str
    port: int = 0
    min_replicas: int = 1
    heartbeat_timeout_ms: int = int(contract.DEFAULT_HEARTBEAT_TIMEOUT_S * 1000)
    join_timeout_ms: int = 10000
    quorum_tick_ms: int = 100
    #: Seconds the Lighthouse may take to listen (it imports torch), all attempts together.
    start_timeout_s: float = 120.0
    #: Starts tried when the process dies before it listens.
    start_attempts: int = 2


class LighthouseDied(EnvironmentProblem):
    """The Lighthouse process exited before it listened."""


def lighthouse_binary() -> str:
    """`torchft_lighthouse` from this interpreter's environment, else from PATH."""
    candidate = Path(sys.executable).parent / "torchft_lighthouse"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("torchft_lighthouse")
    if not found:
        raise EnvironmentProblem("torchft_lighthouse not found: install torchft==0.2.0")
    return found


def port_is_free(host: str, port: int) -> bool:
    """True if `host:port` can be bound now (with SO_REUSEADDR, as the servers bind it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def previous_ports(
    previous: dict[str, object], host: str, free: Callable[[str, int], bool] = port_is_free
) -> tuple[int, int]:
    """(lighthouse port, coordinator port) of an earlier incarnation of this control plane
    (`control.json` as it wrote it) that can be reused on `host`: 0 for a port that was on
    another address, is taken, or is unknown."""
    ports = []
    for key in ("lighthouse", "coordinator"):
        value = previous.get(key)
        found = urlparse(value) if isinstance(value, str) else None
        try:
            port = found.port if found is not None else None
        except ValueError:
            port = None
        same_host = found is not None and found.hostname == host
        ports.append(port if port and same_host and free(host, port) else 0)
    return ports[0], ports[1]


def read_previous(run_dir: Path) -> dict[str, object]:
    try:
        found = read_control(run_dir)
    except RunFileError:
        return {}
    return {} if found is None else asdict(found)


#: What the control job writes in the run directory: readable by the run's user only.
PRIVATE_FILES = ("control.sqlite", "control.sqlite-wal", "control.sqlite-shm", "control.json")


def make_private(run_dir: Path) -> None:
    """Tighten files an older version (or another umask) left readable: 0600, `logs/` 0700."""
    for name in (*PRIVATE_FILES, "control.log"):
        path = run_dir / name
        with contextlib.suppress(FileNotFoundError, PermissionError):
            if path.stat().st_mode & 0o077 and path.is_file():
                os.chmod(path, 0o600)
    logs = run_dir / "logs"
    if logs.is_dir() and logs.stat().st_mode & 0o077:
        with contextlib.suppress(PermissionError):
            os.chmod(logs, 0o700)


class Lighthouse:
    """The Lighthouse child process, restarted with backoff when it dies."""

    def __init__(self, config: LighthouseConfig, log_path: Path | None = None) -> None:
        self.config = config
        self.port = config.port or free_port(config.host)
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def _where(self) -> str:
        return f"; see {self.log_path}" if self.log_path else ""

    @property
    def url(self) -> str:
        return url(self.config.host, self.port)

    def start(self) -> None:
        c = self.config
        bind = f"[{c.host}]:{self.port}" if ":" in c.host else f"{c.host}:{self.port}"
        argv = [
            lighthouse_binary(),
            "--min_replicas",
            str(c.min_replicas),
            "--bind",
            bind,
            "--heartbeat_timeout_ms",
            str(c.heartbeat_timeout_ms),
            "--join_timeout_ms",
            str(c.join_timeout_ms),
            "--quorum_tick_ms",
            str(c.quorum_tick_ms),
        ]
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        # Its own process group, so that stopping it also stops anything it started.
        self.proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        if self.log_path:
            out.close()  # type: ignore[union-attr]

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Return once it accepts connections; `LighthouseDied` if it exits first,
        `EnvironmentProblem` (after stopping it) if `timeout` seconds pass."""
        start = time.monotonic()
        told = start
        delay = 0.05
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise LighthouseDied(
                    f"torchft_lighthouse exited ({self.proc.returncode}) before it listened "
                    f"on {self.url}{self._where()}"
                )
            with (
                contextlib.suppress(OSError),
                socket.create_connection((self.config.host, self.port), timeout=1.0),
            ):
                if self.proc is None or self.proc.poll() is None:
                    return
                continue  # something else answers there; it exited: LighthouseDied above
            now = time.monotonic()
            if now - start >= timeout:
                self.stop()
                raise EnvironmentProblem(
                    f"torchft_lighthouse did not listen on {self.url} within {timeout:.0f}s"
                    f"{self._where()}"
                )
            if now - told >= 10.0:
                told = now
                log.info(
                    "waiting for torchft_lighthouse on %s (%.0fs so far)", self.url, now - start
                )
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def start_and_wait(self) -> None:
        """Start it and wait until it listens, within `start_timeout_s` for all attempts; one
        that dies on the way is started again (on a fresh port if its port is taken)."""
        c = self.config
        deadline = time.monotonic() + c.start_timeout_s
        for attempt in range(max(1, c.start_attempts)):
            if attempt:
                if not port_is_free(c.host, self.port):
                    self.port = free_port(c.host)
                log.warning("starting torchft_lighthouse again on %s", self.url)
            self.start()
            try:
                self.wait_ready(max(0.0, deadline - time.monotonic()))
                return
            except LighthouseDied as exc:
                log.error("%s", exc)
                if attempt + 1 >= max(1, c.start_attempts) or time.monotonic() >= deadline:
                    raise

    async def supervise(self) -> None:
        await supervise(self, "lighthouse")

    def stop(self) -> None:
        """Stop its process group: SIGTERM, then SIGKILL after 5 s."""
        stop_group(self.proc)


class _Child(Protocol):
    proc: subprocess.Popen[bytes] | None
    restarts: int

    def start(self) -> None: ...


async def supervise(child: _Child, name: str) -> None:
    """Start `child` again, with backoff, whenever its process exits."""
    delay = 0.5
    while True:
        await asyncio.sleep(0.5)
        if child.proc is not None and child.proc.poll() is not None:
            log.error("%s exited (%s); restarting in %.1fs", name, child.proc.returncode, delay)
            await asyncio.sleep(delay)
            child.restarts += 1
            child.start()
            delay = min(delay * 2, 30.0)


def stop_group(proc: subprocess.Popen[bytes] | None) -> None:
    """Stop a child's process group: SIGTERM, then SIGKILL after 5 s."""
    if proc is None:
        return
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


class GateProcess:
    """The Lighthouse's gate (`runtime.control.lighthouse_gate`) in a child process of its own,
    so that piping the Managers' heartbeats never takes the coordinator's event loop; restarted
    on the same port when it dies. A thread per process reads what it prints: its port first,
    then its counters, which `stats` adds up over every process it started (for `/metrics`)."""

    def __init__(
        self, host: str, port: int, upstream_port: int, secret_file: Path, log_path: Path
    ) -> None:
        self.host = host
        self.port = port
        self.upstream_port = upstream_port
        self.secret_file = secret_file
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._lock = threading.Lock()
        #: The counters of the processes that ended, and the latest of the running one.
        self._ended: dict[str, int] = dict.fromkeys(GATE_COUNTERS, 0)
        self._current = GateStats()
        self._listening: queue.Queue[int | None] = queue.Queue()

    @property
    def url(self) -> str:
        return url(self.host, self.port)

    def start(self) -> None:
        self._listening = queue.Queue()
        argv = [sys.executable, "-m", "runtime.control.lighthouse_gate", "--bind", self.host]
        argv += ["--port", str(self.port), "--upstream-port", str(self.upstream_port)]
        argv += ["--secret-file", str(self.secret_file)]
        with self._lock, open(self.log_path, "ab") as out:
            for k, v in self._current.counts.items():
                self._ended[k] += v
            self._current = GateStats()
            self.proc = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=out, start_new_session=True
            )
        threading.Thread(
            target=self._read, args=(self.proc, self._listening), daemon=True, name="gate-out"
        ).start()

    def _read(self, proc: subprocess.Popen[bytes], listening: queue.Queue[int | None]) -> None:
        """Read one process's output to its end (a gate blocked on a full pipe stops serving)."""
        assert proc.stdout is not None
        first = True
        with proc.stdout:
            for raw in proc.stdout:
                text = raw.decode("ascii", "replace").strip()
                if first:
                    listening.put(int(text) if text.isdigit() else None)
                    first = False
                elif (stats := GateStats.parse_line(text)) is not None:
                    with self._lock:
                        if proc is self.proc:
                            self._current = stats
        if first:
            listening.put(None)

    def stats(self) -> dict[str, Any]:
        """Every process's counters added up, and the authenticated connections open now."""
        with self._lock:
            counts = {k: self._ended[k] + self._current.counts[k] for k in GATE_COUNTERS}
            return {"counts": counts, "open": self._current.open, "restarts": self.restarts}

    def start_and_wait(self, timeout_s: float = 60.0) -> None:
        """Start it, on `port` then (when that is taken) on a free one, and wait for the port it
        listens on; `EnvironmentProblem` when it cannot listen."""
        for port in (self.port, 0) if self.port else (0,):
            self.port = port
            self.start()
            found = self._read_port(timeout_s)
            if found:
                self.port = found
                return
            stop_group(self.proc)
            if port:
                log.warning("Lighthouse port %d is taken; the gate uses a free one", port)
        raise EnvironmentProblem(
            f"the Lighthouse gate cannot listen on {self.host}; see {self.log_path}"
        )

    def _read_port(self, timeout_s: float) -> int | None:
        try:
            return self._listening.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def stop(self) -> None:
        stop_group(self.proc)


async def watch_finish(
    coordinator: Any, grace_s: float, stop: asyncio.Event, every_s: float = 1.0
) -> None:
    """Set `stop` once the run has been over (`Coordinator.run_over`) for `grace_s` in a row."""
    since: float | None = None
    while not stop.is_set():
        why = coordinator.run_over()
        now = time.monotonic()
        if why is None:
            since = None
        elif since is None:
            since = now
            log.info("%s; the control job ends in %.0fs unless that changes", why, grace_s)
        elif now - since >= grace_s:
            log.info("%s: the control job ends", why)
            stop.set()
            return
        await asyncio.sleep(every_s)


async def serve(
    coordinator: CoordinatorConfig,
    lighthouse: LighthouseConfig | None,
    stop: asyncio.Event | None = None,
    finish_grace_s: float | None = 30.0,
) -> None:
    """Run the control plane until SIGTERM/SIGINT, `stop` is set, or the run has been over for
    `finish_grace_s` (None: never ends by itself)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    make_private(coordinator.run_dir)
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    house: Lighthouse | None = None
    gate: GateProcess | None = None
    gate_watcher: asyncio.Task[None] | None = None
    running: RunningCoordinator | None = None
    watcher: asyncio.Task[None] | None = None
    finisher: asyncio.Task[None] | None = None
    lighthouse_port, coordinator_port = previous_ports(
        read_previous(coordinator.run_dir), coordinator.host
    )
    if lighthouse is not None and lighthouse.port == 0 and lighthouse_port:
        lighthouse = replace(lighthouse, port=lighthouse_port)
    if coordinator.port == 0 and coordinator_port:
        coordinator = replace(coordinator, port=coordinator_port)
    if lighthouse_port or coordinator_port:
        log.info(
            "reusing the previous incarnation's ports where free: %s",
            (lighthouse_port, coordinator_port),
        )
    try:
        if lighthouse is not None:
            logs = coordinator.run_dir / "logs"
            logs.mkdir(mode=0o700, parents=True, exist_ok=True)
            # The Lighthouse on loopback, the gate on the address and port it used to take.
            house = Lighthouse(replace(lighthouse, host=LOOPBACK, port=0), logs / "lighthouse.log")
            await loop.run_in_executor(None, house.start_and_wait)
            watcher = loop.create_task(house.supervise())
            ensure_secret(coordinator.run_dir)
            gate = GateProcess(
                lighthouse.host,
                lighthouse.port,
                house.port,
                coordinator.run_dir / SECRET_FILE,
                logs / "lighthouse-gate.log",
            )
            await loop.run_in_executor(None, gate.start_and_wait)
            gate_watcher = loop.create_task(supervise(gate, "the Lighthouse gate"))
            log.info("Lighthouse on %s behind the gate %s", house.url, gate.url)
        if coordinator.port and not port_is_free(coordinator.host, coordinator.port):
            log.warning("coordinator port %d is taken; using a free one", coordinator.port)
            coordinator = replace(coordinator, port=0)
        try:
            # Bound, not yet answering: a worker that finds this coordinator's address
            # answering must find this incarnation in control.json as well.
            running = await start_coordinator(coordinator, serve=False)
        except OSError as exc:
            raise EnvironmentProblem(
                f"the coordinator cannot listen on {url(coordinator.host, coordinator.port)}: "
                f"{exc.strerror or exc}"
            ) from None
        if gate is not None:
            running.coordinator.gate_stats = gate.stats
        info: dict[str, object] = {
            "coordinator": running.url,
            "lighthouse": gate.url if gate else None,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_at": time.time(),
            "job_id": os.environ.get(contract.SLURM_JOB_ID),
        }
        write_control_file(coordinator.run_dir, info)
        await running.serve()
        log.info("control plane up on the %s event loop: %s", loop_name(loop), info)
        if finish_grace_s is not None:
            finisher = loop.create_task(watch_finish(running.coordinator, finish_grace_s, stop))
        await stop.wait()
    finally:
        for task in (watcher, gate_watcher, finisher):
            if task is not None:
                task.cancel()
        if running is not None:
            await running.close()
        if gate is not None:
            gate.stop()
        if house is not None:
            house.stop()
