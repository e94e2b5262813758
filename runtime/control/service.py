"""The control-plane job's process tree: torchft's Lighthouse plus the coordinator.

`fthsdp control` runs this in the run's small CPU job. The Lighthouse is torchft's own quorum
server; importing `torchft` imports torch (about two seconds and a few hundred MB), so it runs
as the `torchft_lighthouse` binary in a child process, restarted if it dies. The coordinator runs
in this process's event loop. Both addresses go to `run_dir/control.json`, written atomically,
which replicas read (and re-read after a control-plane restart).

When the control job is requeued, the new incarnation finds the journal in the run directory,
rebuilds its state from it and carries on; replicas keep training meanwhile (their quorum waits
at most the quorum timeout for the Lighthouse to come back).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from runtime.control.coordinator import (
    CoordinatorConfig,
    RunningCoordinator,
    start_coordinator,
    write_control_file,
)
from slurm.errors import EnvironmentProblem

log = logging.getLogger("fthsdp.control")


@dataclass(frozen=True)
class LighthouseConfig:
    host: str
    port: int = 0
    min_replicas: int = 1
    heartbeat_timeout_ms: int = 2000
    join_timeout_ms: int = 10000
    quorum_tick_ms: int = 100


def lighthouse_binary() -> str:
    """`torchft_lighthouse` from this interpreter's environment, else from PATH."""
    candidate = Path(sys.executable).parent / "torchft_lighthouse"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("torchft_lighthouse")
    if not found:
        raise EnvironmentProblem("torchft_lighthouse not found: install torchft==0.2.0")
    return found


def free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class Lighthouse:
    """The Lighthouse child process, restarted with backoff when it dies."""

    def __init__(self, config: LighthouseConfig, log_path: Path | None = None) -> None:
        self.config = config
        self.port = config.port or free_port(config.host)
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

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
        self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        if self.log_path:
            out.close()  # type: ignore[union-attr]

    def wait_ready(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise EnvironmentProblem(
                    f"torchft_lighthouse exited ({self.proc.returncode}) on {self.url}"
                )
            with (
                contextlib.suppress(OSError),
                socket.create_connection((self.config.host, self.port), timeout=0.5),
            ):
                return
            time.sleep(0.05)
        raise EnvironmentProblem(f"torchft_lighthouse did not listen on {self.url}")

    async def supervise(self) -> None:
        delay = 0.5
        while True:
            await asyncio.sleep(0.5)
            if self.proc is not None and self.proc.poll() is not None:
                log.error(
                    "lighthouse exited (%s); restarting in %.1fs", self.proc.returncode, delay
                )
                await asyncio.sleep(delay)
                self.restarts += 1
                self.start()
                delay = min(delay * 2, 30.0)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def serve(
    coordinator: CoordinatorConfig,
    lighthouse: LighthouseConfig | None,
    stop: asyncio.Event | None = None,
) -> None:
    """Run the control plane until SIGTERM/SIGINT (or `stop` is set)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    house: Lighthouse | None = None
    running: RunningCoordinator | None = None
    watcher: asyncio.Task[None] | None = None
    try:
        if lighthouse is not None:
            logs = coordinator.run_dir / "logs"
            logs.mkdir(parents=True, exist_ok=True)
            house = Lighthouse(lighthouse, logs / "lighthouse.log")
            house.start()
            await loop.run_in_executor(None, house.wait_ready)
            watcher = loop.create_task(house.supervise())
        running = await start_coordinator(coordinator)
        info: dict[str, object] = {
            "coordinator": running.url,
            "lighthouse": house.url if house else None,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_at": time.time(),
            "job_id": os.environ.get("SLURM_JOB_ID"),
        }
        write_control_file(coordinator.run_dir, info)
        log.info("control plane up: %s", info)
        await stop.wait()
    finally:
        if watcher is not None:
            watcher.cancel()
        if running is not None:
            await running.close()
        if house is not None:
            house.stop()
