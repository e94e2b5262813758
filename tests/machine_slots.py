"""Heavy tests take turns across `make test`'s lanes: at most N of them run at once on the machine.

The lanes (tests/slow_tiers.py) keep this 2-core machine busy with dev clusters and Slurm calls,
which mostly wait. The heavy tests (`slow` and `one_release`: several torch or torchft processes
each, for minutes) are another matter: four of them at once took the load average past 20, and
then heartbeats, quorums and straggler windows failed for want of CPU, not for a fault in the
code. So each heavy test first takes one of `FTHSDP_HEAVY_SLOTS` slots, an exclusive `flock` on
a file under /tmp, which the release chroots share at the same path, and the light tests go on
beside it. The wait happens before pytest-timeout starts the test's clock. Without the variable
(one lane, `make test-slurm`) nothing waits.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

SLOT_DIR = Path(os.environ.get("FTHSDP_SLOT_DIR", "/tmp/fthsdp-test-slots"))


def heavy_slots() -> int:
    """How many heavy tests may run at once on this machine (0: no limit)."""
    try:
        return max(0, int(os.environ.get("FTHSDP_HEAVY_SLOTS", "0") or "0"))
    except ValueError:
        return 0


@contextlib.contextmanager
def slot(slots: int, folder: Path = SLOT_DIR, poll_s: float = 0.25) -> Iterator[int | None]:
    """Hold one of `slots` machine-wide slots (its number) while the block runs; None if no limit.
    A process that dies gives its slot back with its file descriptors."""
    if slots <= 0:
        yield None
        return
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    files = [open(folder / f"slot-{i}", "a") for i in range(slots)]  # noqa: SIM115
    try:
        while True:
            for i, f in enumerate(files):
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                try:
                    yield i
                finally:
                    fcntl.flock(f, fcntl.LOCK_UN)
                return
            time.sleep(poll_s)
    finally:
        for f in files:
            f.close()
