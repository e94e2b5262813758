"""Load beside a test: the tests that promise "works on a busy machine" run next to burners."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


def burners_needed(count: int, lanes: int) -> int:
    """How many of `count` burners to start when `lanes` test lanes run at once.

    Beside the story, `make test`'s other lanes (tests/slow_tiers.py) together keep at least a
    core's worth of dev-cluster, Slurm and torch processes runnable (load average 5 and more on
    this 2-core machine), so they stand for one burner; spinning the rest too would only starve
    the heavy test that holds the other slot (tests/machine_slots.py).
    """
    return max(0, count - 1) if lanes > 1 else max(0, count)


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
