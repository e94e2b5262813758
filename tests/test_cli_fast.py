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
    # What this catches: `--help` pulling in a heavy import (torch costs seconds, aiohttp half a
    # second). The bound is relative, so that a loaded machine slows both sides alike: a fresh
    # interpreter that only imports numpy (about 6x `--help` on an idle machine), run
    # interleaved with `--help` in this test. The absolute cost of the CLI's import is a figure
    # of benchmarks/render.py.
    argvs = {
        "help": [sys.executable, "-m", "fthsdp_cli", "--help"],
        "numpy": [sys.executable, "-c", "import numpy"],
    }
    timings: dict[str, list[float]] = {name: [] for name in argvs}
    for _ in range(5):
        for name, argv in argvs.items():
            t0 = time.perf_counter()
            subprocess.run(argv, capture_output=True, env=ENV, timeout=60, check=True)
            timings[name].append(time.perf_counter() - t0)
    assert statistics.median(timings["help"]) < statistics.median(timings["numpy"]), timings
