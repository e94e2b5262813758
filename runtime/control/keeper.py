"""The control job's keeper: the control plane restarted in place when its process dies.

Slurm requeues a batch job for a node failure, not for its script's exit. So a control plane
whose process is killed (the OOM killer, an operator's `kill -9`, a crash) would end the control
job for good, and with it the run: the replicas wait `control_wait_s` for it and then stop. With
`fthsdp control --restart-in-place` (what the rendered control job runs), a small parent process
keeps the control plane as its child:

- a child that ends by a signal or an unexpected exit code is started again, after a backoff
  (1 s doubling to 30 s), at most `max_restarts` times in `window_s`; the new one replays the
  journal and listens on the same ports, as after a requeue (`runtime.control.service`);
- exit 0 (every replica finished) and exit 2 (bad input, an unreadable journal) end the job with
  that code: restarting cannot change them;
- SIGTERM, SIGINT or SIGHUP to the keeper (Slurm cancelling or requeuing the job) go to the
  child, and the keeper ends with it, restarting nothing.

The keeper is the child subreaper of its tree (`PR_SET_CHILD_SUBREAPER`): the Lighthouse and the
gate the dead child left behind, each in its own session, become the keeper's children, and are
stopped before the next child starts, so that none holds a port or answers for a dead
coordinator. The child asks to be killed if the keeper dies (`PR_SET_PDEATHSIG`), so no control
plane outlives its keeper either.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

log = logging.getLogger("fthsdp.keeper")

#: Set in the child's environment: the process that runs the control plane itself.
CHILD_ENV = "FTHSDP_CONTROL_CHILD"
#: Exit codes after which a restart cannot help: done, or bad input.
FINAL_CODES = frozenset({0, 2})
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class KeeperPolicy:
    max_restarts: int = 5
    window_s: float = 600.0
    base_delay_s: float = 1.0
    max_delay_s: float = 30.0


def exit_code(returncode: int) -> int:
    """A child's `Popen.returncode` as a shell would report it (signal N: 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def decide(
    returncode: int, recent_restarts: int, policy: KeeperPolicy
) -> tuple[Literal["end", "restart"], float]:
    """What to do after the child ended with `returncode`, given the restarts in the window:
    ("end", 0) or ("restart", delay before it)."""
    if returncode in FINAL_CODES or recent_restarts >= policy.max_restarts:
        return "end", 0.0
    delay = min(policy.base_delay_s * 2**recent_restarts, policy.max_delay_s)
    return "restart", delay


def how_it_ended(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit {returncode}"


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent() -> None:
    """In the child: be killed when the keeper dies (a no-op where prctl is missing)."""
    if os.environ.get(CHILD_ENV) == "1":
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() == 1:  # the keeper died before the call
            os._exit(1)


def _children(pid: int) -> list[int]:
    """Live children of `pid`, read from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def reap_orphans(timeout_s: float = 10.0) -> list[int]:
    """Stop what a dead child left behind (now the keeper's children): SIGTERM to each one's
    process group, SIGKILL after `timeout_s`; returns their pids."""
    left = _children(os.getpid())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(os.getpgid(pid), sig)
        deadline = time.monotonic() + timeout_s
        while left and time.monotonic() < deadline:
            left = [pid for pid in left if not _reaped(pid)]
            if left:
                time.sleep(0.05)
        if not left:
            break
    return _children(os.getpid())


def _reaped(pid: int) -> bool:
    """True once `pid` has ended (reaped here, or not a child of this process at all)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done != 0


class Keeper:
    """Runs `argv` as the control plane and restarts it in place (module docstring)."""

    def __init__(
        self,
        argv: Sequence[str],
        policy: KeeperPolicy | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.policy = policy or KeeperPolicy()
        self.say = say or (
            lambda line: print(f"fthsdp control: {line}", file=sys.stderr, flush=True)
        )
        self.restarts: list[float] = []
        self._stopping = threading.Event()
        self._child: subprocess.Popen[bytes] | None = None

    def _forward(self, signum: int, _frame: object) -> None:
        self._stopping.set()
        child = self._child
        if child is not None and child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)

    def run(self) -> int:
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._forward)
        env = {**os.environ, CHILD_ENV: "1"}
        while True:
            self._child = subprocess.Popen(self.argv, env=env)
            returncode = self._child.wait()
            left = reap_orphans()
            if left:
                self.say(f"processes {left} of the old control plane would not stop")
            if self._stopping.is_set():
                return exit_code(returncode)
            now = time.monotonic()
            self.restarts = [t for t in self.restarts if now - t <= self.policy.window_s]
            action, delay = decide(returncode, len(self.restarts), self.policy)
            if action == "end":
                if returncode not in FINAL_CODES:
                    self.say(
                        f"the control plane ended ({how_it_ended(returncode)}) after "
                        f"{len(self.restarts)} restarts in {self.policy.window_s:g}s; not "
                        "restarting it again"
                    )
                return exit_code(returncode)
            self.restarts.append(now)
            self.say(
                f"the control plane ended ({how_it_ended(returncode)}); restarting it in "
                f"{delay:g}s (restart {len(self.restarts)} of {self.policy.max_restarts} in "
                f"{self.policy.window_s:g}s)"
            )
            if self._stopping.wait(delay):
                return exit_code(returncode)
