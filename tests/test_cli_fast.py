"""`fthsdp --help` must stay fast and must never import torch (or numpy, jinja2)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def test_help_imports_no_torch() -> None:
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "fthsdp_cli", "--help"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
        check=True,
    )
    assert "Commands:" in r.stdout
    imported = {line.split("|")[-1].strip() for line in r.stderr.splitlines() if "|" in line}
    assert not {m for m in imported if m.split(".")[0] in {"torch", "torchft", "numpy", "jinja2"}}


def test_help_is_fast() -> None:
    timings = []
    for _ in range(5):
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "fthsdp_cli", "--help"],
            capture_output=True,
            env=ENV,
            timeout=60,
            check=True,
        )
        timings.append(time.perf_counter() - t0)
    assert statistics.median(timings) < 0.3, timings
