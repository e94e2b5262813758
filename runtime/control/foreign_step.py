"""One launch of a foreign torchft trainer's step, watched and reported by fthsdp.

In `[train] mode = "torchft"` the trainer sends the coordinator nothing, so the process that
starts it (the replica supervisor on Slurm, `fthsdp run --local` here) speaks for the group:

- it tees the step's stdout and stderr through itself (the job log still gets every line) and
  matches `[train] progress_regex` against group rank 0's lines, or tails `[train]
  progress_file`, for the group's step;
- it sends a signed status report (`runtime.report_sender.ReportClient`) about once a second while
  the step runs: alive, the step, the seconds per step since the last report;
- a step whose progress has not advanced for `progress_timeout_s` (from its launch or its last
  step) is hung: it is stopped and ends as a process fault (`ExitCode.PROCESS_FAULT`), which the
  supervisor relaunches in place, so a trainer that is alive but stuck is not reported alive;
- it runs the node watchdog (`runtime.watchdog`: Xid, GPU count, ECC from the kernel log, as a
  native worker does) on its own node; a failing verdict stops the step and makes it a node
  fault (`ExitCode.NODE_FAULT`) with the evidence, so the coordinator drains and requeues;
- when the step ends, however it ended, every process still marked with this launch's
  incarnation is killed (`runtime.foreign.stop_leftovers`): no ghost replica keeps training.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from runtime.foreign import FileProgress, LineProgress, stop_leftovers
from slurm import contract

log = logging.getLogger("fthsdp.foreign")

#: Longest piece of a line read at once (a longer line is matched in pieces).
MAX_LINE = 1 << 16
#: Seconds between a SIGTERM to a step the watchdog condemned and the SIGKILL.
STOP_GRACE_S = 10.0


@dataclass
class NodeFault:
    reason: str
    evidence: list[str]


@dataclass
class ForeignLaunch:
    """What one launch needs: the command and its environment, and how to read its progress."""

    command: list[str]
    env: dict[str, str]
    progress_regex: str | None = None
    progress_file: Path | None = None
    health_checks: Sequence[str] = ()
    report_interval_s: float = 1.0
    #: Seconds without progress after which the step is hung and stopped; 0 = never.
    progress_timeout_s: float = 0.0
    #: Extra Popen arguments (the local runner starts each group in its own session).
    popen: Mapping[str, Any] = field(default_factory=dict)
    #: Where the step's lines go (default: this process's stdout and stderr).
    out: IO[bytes] | None = None
    err: IO[bytes] | None = None


class ForeignStep:
    """Start with `start()`, then `wait()` for the exit code (NODE_FAULT after a watchdog
    verdict, whatever the step itself returned)."""

    def __init__(
        self,
        launch: ForeignLaunch,
        report: Callable[..., None] | None = None,
        watchdog_factory: Callable[..., Any] | None = None,
    ) -> None:
        self.launch = launch
        self.report = report
        self.incarnation = launch.env[contract.INCARNATION]
        self.lines = LineProgress(launch.progress_regex) if launch.progress_regex else None
        self.file = FileProgress(launch.progress_file) if launch.progress_file else None
        self.child: subprocess.Popen[bytes] | None = None
        self.fault: NodeFault | None = None
        #: Why the step was taken as hung (no progress for `progress_timeout_s`), or None.
        self.hung: str | None = None
        self._done = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watchdog_factory = watchdog_factory
        self._watchdog: Any = None

    @property
    def step(self) -> int | None:
        found = [p.step for p in (self.lines, self.file) if p is not None and p.step is not None]
        return max(found) if found else None

    def start(self) -> subprocess.Popen[bytes]:
        launch = self.launch
        self.child = subprocess.Popen(
            launch.command,
            env=launch.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            **dict(launch.popen),
        )
        assert self.child.stdout is not None and self.child.stderr is not None
        outs = (
            (self.child.stdout, launch.out or sys.stdout.buffer),
            (self.child.stderr, launch.err or sys.stderr.buffer),
        )
        for source, sink in outs:
            t = threading.Thread(target=self._tee, args=(source, sink), daemon=True)
            t.start()
            self._threads.append(t)
        reporter = threading.Thread(target=self._report_loop, name="fthsdp-progress", daemon=True)
        reporter.start()
        self._threads.append(reporter)
        self._start_watchdog()
        return self.child

    def _start_watchdog(self) -> None:
        checks = list(self.launch.health_checks)
        if not checks:
            return
        factory = self._watchdog_factory
        if factory is None:
            from runtime.watchdog import NodeWatchdog

            factory = NodeWatchdog
        self._watchdog = factory(checks, on_fault=self._on_node_fault)
        self._watchdog.start()

    def _on_node_fault(self, reason: str, evidence: list[str]) -> None:
        log.error("node watchdog: %s; stopping the step", reason)
        self.fault = NodeFault(reason, list(evidence))
        self.stop(signal.SIGTERM)

    def _on_hung(self, silent_s: float, step: int | None) -> None:
        where = "no step yet" if step is None else f"last step {step}"
        self.hung = f"hung: no progress for {silent_s:.0f}s ({where})"
        log.error("%s; stopping the step", self.hung)
        self.stop(signal.SIGTERM)

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Signal the step (srun forwards it to every task), SIGKILL after a grace period."""
        child = self.child
        if child is None or child.poll() is not None:
            return
        child.send_signal(signum)

        def finish() -> None:
            if not self._done.wait(STOP_GRACE_S) and child.poll() is None:
                child.kill()

        threading.Thread(target=finish, daemon=True).start()

    def _tee(self, source: IO[bytes], sink: IO[bytes]) -> None:
        # Bounded reads: a progress bar redrawn with CR and no LF must not grow one huge line.
        for raw in iter(lambda: source.readline(MAX_LINE), b""):
            try:
                sink.write(raw)
                sink.flush()
            except (OSError, ValueError):
                pass  # a closed log must not stop the progress reading
            if self.lines is not None:
                self.lines.feed(raw.decode("utf-8", "replace"))

    def _report_loop(self) -> None:
        last: tuple[float, int] | None = None
        progressed = time.monotonic()
        while True:
            done = self._done.wait(self.launch.report_interval_s)
            if self.file is not None:
                self.file.poll()
            step = self.step
            now = time.monotonic()
            step_time = None
            if step is not None and last is not None and step > last[1]:
                step_time = (now - last[0]) / (step - last[1])
            if step is not None and (last is None or step > last[1]):
                last = (now, step)
                progressed = now
            limit = self.launch.progress_timeout_s
            if not done and self.hung is None and limit > 0 and now - progressed > limit:
                self._on_hung(now - progressed, step)
            if self.report is not None:  # the last one carries the final step
                try:
                    self.report(step=step or 0, step_time_s=step_time)
                except Exception as exc:  # reporting must never take the step down
                    log.warning("progress report failed: %s", exc)
            if done:
                return

    def wait(self) -> int:
        assert self.child is not None
        code = self.child.wait()
        self._done.set()
        if self._watchdog is not None:
            self._watchdog.stop()
        stop_leftovers(self.incarnation)  # also closes pipes a ghost would hold open
        for t in self._threads:
            t.join(timeout=5.0)
        if self.file is not None:
            self.file.poll()
        from runtime.protocol import ExitCode

        if self.fault is not None:
            return int(ExitCode.NODE_FAULT)
        if self.hung is not None:
            return int(ExitCode.PROCESS_FAULT)
        return code
