"""What every benchmark shares: interleaved repeats, median and range, provenance, JSON out.

On a shared 2-core machine one run of a ratio swings by +-15 %, so a benchmark runs its
configurations interleaved (A, B, A, B, ... with the starting one rotated each repeat, so none
always runs first), takes ratios within one repeat (both sides saw the same load), and reports the
median and min-max over at least five repeats. The JSON goes to `benchmarks/results/<name>.json`
(scratch, git-ignored) and `benchmarks/figures/<name>.json` (tracked): `benchmarks/report.py`
regenerates docs/benchmarks.md's sections from the tracked copies.

The JSON shape `report.py` reads: `{"name", "title", "script", "setup", "provenance": {...},
"repeats", "rows": [{"figure", "median", "min", "max", "unit", "target", "n"}], "notes": [...]}`
plus whatever raw data the benchmark adds.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
FIGURES = ROOT / "benchmarks" / "figures"
MIN_REPEATS = 5
T = TypeVar("T")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _mem_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for mod in ("torch", "torchft", "aiohttp"):
        if mod in sys.modules:
            out[mod] = str(getattr(sys.modules[mod], "__version__", "?"))
    return out


def machine_speed_ms() -> float:
    """Milliseconds a fixed pure-Python loop takes, the best of five. The shared VM runs the
    same code up to 1.5x slower from one hour to the next (other guests on its host), which no
    load average shows; each run records this at its start and end, so that runs of different
    hours can be compared."""
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        total = 0
        for i in range(200_000):
            total += i * i
        best = min(best, time.perf_counter() - t0)
    return round(best * 1000, 2)


class Run:
    """One benchmark run: provenance at the start, load average at both ends, JSON at the end."""

    def __init__(
        self, name: str, title: str, setup: str, repeats: int, script: str | None = None
    ) -> None:
        if repeats < 1:
            raise SystemExit(f"{name}: --repeat must be >= 1, got {repeats}")
        self.name = name
        self.script = script or f"benchmarks/{name}.py"
        self.title = title
        self.setup = setup
        self.repeats = repeats
        self.rows: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.extra: dict[str, Any] = {}
        self.started = dt.datetime.now(dt.UTC)
        self.load_start = os.getloadavg()
        self.speed_start = machine_speed_ms()

    def row(
        self,
        figure: str,
        values: Sequence[float],
        unit: str = "",
        target: str | None = None,
        digits: int = 3,
    ) -> dict[str, Any]:
        """Add one figure (median and min-max over `values`) to the table; values that are not
        numbers (a repeat that measured nothing) are left out and said so in a note."""
        kept = [float(v) for v in values if v == v]
        if len(kept) < len(values):
            self.notes.append(
                f"- {figure}: {len(values) - len(kept)} of {len(values)} repeats measured nothing."
            )
        if not kept:
            return {}
        row = {"figure": figure, **summary(kept), "unit": unit, "target": target}
        row["digits"] = digits
        self.rows.append(row)
        return row

    def write(self) -> Path:
        """Write results/<name>.json and figures/<name>.json; returns the tracked copy's path."""
        data = {
            "name": self.name,
            "title": self.title,
            "script": self.script,
            "setup": self.setup,
            "repeats": self.repeats,
            "provenance": {
                "date": self.started.strftime("%Y-%m-%d %H:%M UTC"),
                "host": platform.node(),
                "cpu": _cpu_model(),
                "cores": os.cpu_count(),
                "mem_gib": _mem_gib(),
                "os": platform.platform(terse=True),
                "versions": _versions(),
                "loadavg_start": [round(x, 2) for x in self.load_start],
                "loadavg_end": [round(x, 2) for x in os.getloadavg()],
                "speed_ms": [self.speed_start, machine_speed_ms()],
                "duration_s": round((dt.datetime.now(dt.UTC) - self.started).total_seconds(), 1),
            },
            "rows": self.rows,
            "notes": self.notes,
            **self.extra,
        }
        text = json.dumps(data, indent=2) + "\n"
        for folder in (RESULTS, FIGURES):
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{self.name}.json").write_text(text)
        for row in self.rows:
            print(f"{self.name}: {format_row(row)}")
        return FIGURES / f"{self.name}.json"


def summary(values: Sequence[float]) -> dict[str, Any]:
    """Median, min, max, count and the values themselves (rounded for the JSON)."""
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("no values to summarise")
    return {
        "median": statistics.median(vals),
        "min": min(vals),
        "max": max(vals),
        "n": len(vals),
        "values": [round(v, 6) for v in vals],
    }


def interleave(configs: Mapping[str, Callable[[], T]], repeats: int) -> dict[str, list[T]]:
    """Run every configuration once per repeat, in rotated order; their results by name."""
    names = list(configs)
    out: dict[str, list[T]] = {n: [] for n in names}
    for i in range(repeats):
        order = names[i % len(names) :] + names[: i % len(names)]
        for name in order:
            value = configs[name]()
            out[name].append(value)
            shown = f"{value:.4g}" if isinstance(value, float) else "done"
            print(f"  repeat {i + 1}/{repeats} {name}: {shown}", flush=True)
    return out


def ratios(samples: Mapping[str, Sequence[float]], num: str, den: str) -> list[float]:
    """Per-repeat ratio num/den (both measured in the same repeat)."""
    return [a / b for a, b in zip(samples[num], samples[den], strict=True)]


def format_value(value: float, unit: str, digits: int) -> str:
    if unit == "ms":
        return f"{value:.{max(0, digits - 2)}f} ms"
    if unit == "%":
        return f"{value:.1f} %"
    text = f"{value:,.{digits}f}" if abs(value) < 1e4 else f"{value:,.0f}"
    return f"{text} {unit}".strip() if unit not in ("", "x") else text + ("×" if unit else "")


def format_row(row: Mapping[str, Any]) -> str:
    unit, digits = str(row.get("unit", "")), int(row.get("digits", 3))
    med = format_value(row["median"], unit, digits)
    lo, hi = format_value(row["min"], unit, digits), format_value(row["max"], unit, digits)
    target = f" (target {row['target']})" if row.get("target") else ""
    return f"{row['figure']}: {med} [{lo} – {hi}, n={row['n']}]{target}"


def repeats_arg(default: int = MIN_REPEATS) -> int:
    """`--repeat N` from argv (env BENCH_REPEATS otherwise)."""
    import argparse

    parser = argparse.ArgumentParser(add_help=True)
    parser.add_argument("--repeat", type=int, default=int(os.environ.get("BENCH_REPEATS", default)))
    args, _ = parser.parse_known_args()
    return int(args.repeat)
