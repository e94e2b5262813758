"""Load beside a test: the tests that promise "works on a busy machine" run next to burners."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


def burners_needed(count: int, lanes: int) -> int:
    """How many of `count` burners to start when `lanes` test lanes run at once.

    Each other lane of `make test` (tests/slow_tiers.py) keeps at least a core's worth of dev
    cluster, torch and Slurm processes runnable, so it already stands for one burner; the
    machine is as busy as the test asks, and extra spinning would only slow the other lanes.
    """
    return max(0, count - max(0, lanes - 1))


@contextmanager
def cpu_burners(count: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Up to `count` processes spinning `while True: pass` (fewer beside other test lanes, see
    `burners_needed`), killed on the way out, even on failure."""
    lanes = int(os.environ.get("FTHSDP_TEST_LANES", "1") or "1")
    started = burners_needed(count, lanes)
    print(
        f"cpu_load: {started} of {count} burners ({lanes} test lanes running); "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(started)]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()
