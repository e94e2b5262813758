"""Load beside a test: the tests that promise "works on a busy machine" run next to burners."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def cpu_burners(count: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`count` processes spinning `while True: pass`, killed on the way out, even on failure."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()
