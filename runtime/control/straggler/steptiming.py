"""Per-step timing of one rank (its own compute vs. its cross-replica wait) and the slow fault.

Straggler detection needs each replica's *own* compute time per step: forward, backward and the
local reduce-scatter, without the time spent waiting in the cross-replica allreduce. In FT-HSDP
a healthy replica waits for a slow one inside that allreduce, so its plain step time looks as
slow as the straggler's; subtracting the wait separates the replica that is slow from the ones
that wait for it. `StepTimer` accumulates the wait (the cross-replica gradient allreduce runs inside
`waiting()`); compute is the rest of the step.

`SlowFault` is the simulated gray failure used by tests, demos and benchmarks: a rank whose
"GPU" runs at 1/FACTOR speed. The factor comes from `FTHSDP_SLOW_FACTOR`, or from the file
named by `FTHSDP_SLOW_FILE` (`{node}` in it is this node's name; re-read at most once a second,
so a fault can be injected into and removed from a running replica: `fthsdp cluster inject NODE
--fault slow=2` writes it for a dev node). The rank then stretches each step's compute by
sleeping (FACTOR - 1) x its measured compute, which is how a throttled GPU looks from outside.
No torch here, and nothing of the control plane: the worker calls in.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from slurm import contract

SLOW_FACTOR_ENV = "FTHSDP_SLOW_FACTOR"
#: Ranks gather their compute times to the leader every this many steps (a tiny collective).
RANK_TIMING_EVERY_ENV = "FTHSDP_RANK_TIMING_EVERY"
DEFAULT_RANK_TIMING_EVERY = 10
#: A factor above this is refused as a typo rather than sleeping for hours.
MAX_SLOW_FACTOR = 100.0


class StepTimer:
    """Compute vs. cross-replica wait of the current step, for one rank."""

    def __init__(self) -> None:
        self.wait_s = 0.0

    def begin(self) -> None:
        self.wait_s = 0.0

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self.wait_s += time.monotonic() - start

    def compute_s(self, started: float, now: float | None = None) -> float:
        """The step's time since `started` (monotonic) minus the time spent waiting."""
        end = time.monotonic() if now is None else now
        return max(0.0, end - started - self.wait_s)


def parse_factor(text: str) -> float:
    """`2`, `2.0` or `slow=2`: the slowdown factor (1.0 = healthy); ValueError if nonsense."""
    raw = text.strip()
    if raw.startswith("slow="):
        raw = raw[len("slow=") :]
    factor = float(raw)
    if not 1.0 <= factor <= MAX_SLOW_FACTOR:
        raise ValueError(f"slow factor must be in [1, {MAX_SLOW_FACTOR:g}], got {text!r}")
    return factor


class SlowFault:
    """This rank's simulated slowdown: a fixed factor, or one read from a file that may change."""

    def __init__(self, factor: float = 1.0, path: Path | None = None, reread_s: float = 1.0):
        self._static = factor
        self.path = path
        self.reread_s = reread_s
        self._cached = factor
        self._read_at = float("-inf")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> SlowFault:
        factor = parse_factor(env[SLOW_FACTOR_ENV]) if env.get(SLOW_FACTOR_ENV) else 1.0
        path = None
        if env.get(contract.SLOW_FILE):
            node = env.get(contract.SLURMD_NODENAME) or socket.gethostname()
            path = Path(env[contract.SLOW_FILE].replace("{node}", node))
        return cls(factor, path)

    @property
    def active(self) -> bool:
        return self._static != 1.0 or self.path is not None

    def factor(self, now: float | None = None) -> float:
        if self.path is None:
            return self._static
        t = time.monotonic() if now is None else now
        if t - self._read_at >= self.reread_s:
            self._read_at = t
            try:
                self._cached = parse_factor(self.path.read_text())
            except (OSError, ValueError):
                self._cached = self._static  # no file (or garbage): not slow beyond the static
        return self._cached

    def delay_s(self, compute_s: float, now: float | None = None) -> float:
        """Extra seconds this step must take to run at 1/factor speed."""
        return max(0.0, (self.factor(now) - 1.0) * compute_s)


def rank_timing_every(env: Mapping[str, str] | None = None) -> int:
    values = os.environ if env is None else env
    try:
        return max(1, int(values.get(RANK_TIMING_EVERY_ENV, DEFAULT_RANK_TIMING_EVERY)))
    except ValueError:
        return DEFAULT_RANK_TIMING_EVERY
