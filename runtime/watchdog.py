"""The node watchdog inside a replica: notice a bad GPU before a collective timeout does.

A GPU that falls off the bus or starts reporting uncorrectable ECC errors usually shows first in
the kernel log (an Xid) or in NVML, seconds to minutes before a collective notices a peer is gone.
Each rank runs the cheap `prolog_epilog` checks (Xid, GPU count, volatile ECC) for its own node
every few seconds in a background thread; a failing verdict is a *node* fault: the leader reports
it with the evidence and the worker exits `ExitCode.NODE_FAULT`, so the coordinator drains that
node and requeues the replica instead of relaunching it in place on bad hardware.

The checks' sources follow `fthsdp check`'s options (NVML or nvidia-smi, a sysfs root, a kernel
log), read here from `FTHSDP_GPU_SOURCE`, `FTHSDP_SYSFS_ROOT` and `FTHSDP_KERNEL_LOG`, so the dev
cluster's simulated hardware drives the watchdog as it drives the prolog.

The cheap checks run every `interval_s`; the kernel log is also *followed* (`KernelLogFollower`:
inotify on a log file, a blocking read of `/dev/kmsg` for the `dmesg` source), and a new driver
line (`NVRM:`) runs the Xid check at once, so an Xid becomes a node fault in well under a second
instead of up to one interval later. The verdict is the check's, over the same window, and is
acted on once: a line seen by both the follower and the periodic pass is not counted twice.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from prolog_epilog import FAST_MODE
from slurm import contract

log = logging.getLogger("fthsdp.watchdog")
DEFAULT_INTERVAL_S = 5.0
CHEAP_CHECKS = ("xid", "gpu-count", "ecc")
#: Every message of the NVIDIA driver (an Xid, a GPU fallen off the bus) carries this.
DRIVER_MARK = b"NVRM"
#: How often a follower looks up from its blocking wait to see whether it should stop.
_WAKE_S = 0.5
#: The most a follower reads of a log file per change (the Xid check reads the file itself).
_READ_MAX = 1 << 20


class KernelLogFollower:
    """Calls `on_driver_line()` when a line with `DRIVER_MARK` is written to the kernel log.

    `source` is a log file (followed with inotify on its folder, so a file that is rotated or
    rewritten in place is still followed) or "dmesg" (the kernel's ring buffer, read record by
    record from `/dev/kmsg`, starting at its end). Without inotify, or when `/dev/kmsg` cannot
    be read (unprivileged users often cannot), it returns at once and says why: the periodic
    checks still run.
    """

    def __init__(self, source: str, on_driver_line: Callable[[], None]) -> None:
        self.source = source
        self.on_driver_line = on_driver_line
        self.why_not: str | None = None

    def run(self, stop: threading.Event) -> None:
        try:
            if self.source == "dmesg":
                self._follow_kmsg(stop)
            else:
                self._follow_file(Path(self.source), stop)
        except OSError as exc:
            self.why_not = f"cannot follow {self.source}: {exc.strerror or exc}"
        if self.why_not:
            log.info("kernel log not followed (%s); the periodic checks still run", self.why_not)

    def _follow_file(self, path: Path, stop: threading.Event) -> None:
        try:
            from inotify_simple import INotify
            from inotify_simple import flags as f
        except ImportError:
            self.why_not = "inotify_simple is not installed"
            return
        offset = path.stat().st_size if path.exists() else 0
        with INotify() as ino:
            ino.add_watch(path.parent, f.MODIFY | f.CLOSE_WRITE | f.CREATE | f.MOVED_TO | f.ATTRIB)
            while not stop.is_set():
                events = ino.read(timeout=int(_WAKE_S * 1000))
                if not any(e.name == path.name for e in events):
                    continue
                offset, found = _new_driver_lines(path, offset)
                if found:
                    self.on_driver_line()

    def _follow_kmsg(self, stop: threading.Event) -> None:
        import select

        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        try:
            os.lseek(fd, 0, os.SEEK_END)  # only what is written from now on
            while not stop.is_set():
                ready, _, _ = select.select([fd], [], [], _WAKE_S)
                if not ready:
                    continue
                try:
                    record = os.read(fd, 8192)  # one record per read
                except BlockingIOError:
                    continue
                except BrokenPipeError:
                    continue  # the ring buffer overran this reader; it goes on from there
                if DRIVER_MARK in record:
                    self.on_driver_line()
        finally:
            os.close(fd)


def _new_driver_lines(path: Path, offset: int) -> tuple[int, bool]:
    """(new offset, whether the bytes written since `offset` hold a driver line). A file that
    shrank was replaced or rotated: it is read from its start."""
    try:
        size = path.stat().st_size
        if size < offset:
            offset = 0
        with path.open("rb") as fh:
            fh.seek(max(offset, size - _READ_MAX))
            data = fh.read(_READ_MAX)
    except OSError:
        return offset, False
    return offset + len(data), DRIVER_MARK in data


def check_options(env: Mapping[str, str]) -> dict[str, Any]:
    """`run_checks` keyword arguments from the environment (only those that are set)."""
    out: dict[str, Any] = {}
    if env.get(contract.HEALTH_CONFIG):
        from prolog_epilog import load_config

        out["config"] = load_config(env[contract.HEALTH_CONFIG], env.get(contract.SLURMD_NODENAME))
    if env.get(contract.GPU_SOURCE):
        out["gpu_source"] = env[contract.GPU_SOURCE]
    for key, var in (("sysfs_root", contract.SYSFS_ROOT), ("kernel_log", contract.KERNEL_LOG)):
        if env.get(var):
            out[key] = Path(env[var])
    return out


def verdict_of(result: Any) -> tuple[str, list[str]] | None:
    """(reason, evidence) for an unhealthy `SuiteResult`, None when healthy."""
    if getattr(result, "healthy", True):
        return None
    evidence = []
    for check in getattr(result, "checks", []) or []:
        if getattr(check, "status", "pass") in ("fail", "error"):
            evidence.append(f"{check.name}: {check.detail}".strip())
    reason = getattr(result, "drain_reason", None) or "fthsdp: health check failed"
    return str(reason), evidence or [str(reason)]


class NodeWatchdog:
    """Runs the cheap health checks periodically; calls `on_fault(reason, evidence)` once."""

    def __init__(
        self,
        checks: Sequence[str],
        on_fault: Callable[[str, list[str]], None],
        interval_s: float = DEFAULT_INTERVAL_S,
        run_checks: Callable[..., Any] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self.checks = [c for c in checks if c in CHEAP_CHECKS]
        self.on_fault = on_fault
        self.interval_s = float(os.environ.get(contract.WATCHDOG_INTERVAL_S, interval_s))
        self._run_checks = run_checks
        self.options = dict(options) if options is not None else check_options(os.environ)
        self.verdict: tuple[str, list[str]] | None = None
        self._stop = threading.Event()
        self._since = time.time()
        self._fired = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="fthsdp-watchdog", daemon=True)
        self.follower: KernelLogFollower | None = None
        source = self._kernel_log_source()
        if "xid" in self.checks and source:
            self.follower = KernelLogFollower(source, self._on_driver_line)
        self._follow_thread = threading.Thread(
            target=self._follow, name="fthsdp-watchdog-kmsg", daemon=True
        )

    def _kernel_log_source(self) -> str | None:
        if self.options.get("kernel_log"):
            return str(self.options["kernel_log"])
        config = self.options.get("config")
        if config is not None:
            return str(config.path("kernel_log"))
        return None

    def _checker(self) -> Callable[..., Any]:
        if self._run_checks is None:
            from prolog_epilog import run_checks

            self._run_checks = run_checks
        return self._run_checks

    def check_once(
        self, only: Sequence[str] | None = None, mode: str = "check"
    ) -> tuple[str, list[str]] | None:
        names = list(self.checks if only is None else only)
        try:
            result = self._checker()(only=names, since=self._since, mode=mode, **self.options)
        except Exception as exc:  # a broken check must not kill training
            log.warning("watchdog check failed to run: %s", exc)
            return None
        return verdict_of(result)

    def _fire(self, found: tuple[str, list[str]]) -> None:
        """Act on the first verdict only, whichever thread found it."""
        with self._fired:
            if self.verdict is not None:
                return
            self.verdict = found
        self._stop.set()
        self.on_fault(*found)

    def _on_driver_line(self) -> None:
        if self.verdict is None:
            found = self.check_once(["xid"], mode=FAST_MODE)
            if found is not None:
                self._fire(found)

    def _follow(self) -> None:
        assert self.follower is not None
        self.follower.run(self._stop)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            found = self.check_once()
            if found is not None:
                self._fire(found)
                return

    def start(self) -> None:
        if self.checks:
            self._thread.start()
        if self.follower is not None:
            self._follow_thread.start()

    def stop(self) -> None:
        self._stop.set()
