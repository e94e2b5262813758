"""Render benchmark: a 1000-replica spec to scripts, and the CLI's import cost.

Prints and writes benchmarks/results/render.json:
- render_1000_s: wall time to render control + 1000 replica scripts (median of runs, warm);
- render_1000_cold_s: the first render in a fresh process (template compile included);
- cli_import_s: `python -c "import fthsdp_cli.main"` in a fresh process (median);
- render_cli_s: `python -m fthsdp_cli render SPEC --set replicas.count=1000 --out DIR`;
- torch_imported: whether rendering pulled torch into the process (must be false).
Target: render_1000_s < 0.5 and torch_imported false.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "tests" / "specs" / "basic.toml"
RESULTS = ROOT / "benchmarks" / "results" / "render.json"
RUNS = 7


def _child(code: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    cold = _child(
        "import time; t=time.perf_counter(); "
        "from slurm.spec import load_spec; from slurm.render import render_run; "
        f"s=load_spec({str(SPEC)!r}, ['replicas.count=1000']); render_run(s); "
        "import sys; assert 'torch' not in sys.modules; print(time.perf_counter()-t)"
    )
    from slurm.render import render_run
    from slurm.spec import load_spec

    spec = load_spec(SPEC, ["replicas.count=1000"])
    render_run(spec)
    times = []
    for _ in range(RUNS):
        t = time.perf_counter()
        scripts = render_run(spec)
        times.append(time.perf_counter() - t)
    assert len(scripts) == 1001
    imports = [
        _child(
            "import time; t=time.perf_counter(); import fthsdp_cli.main; "
            "print(time.perf_counter()-t)"
        )
        for _ in range(RUNS)
    ]
    cli = []
    with tempfile.TemporaryDirectory() as out:
        for _ in range(3):
            t = time.perf_counter()
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "fthsdp_cli",
                    "render",
                    str(SPEC),
                    "--set",
                    "replicas.count=1000",
                    "--out",
                    out,
                ],
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                capture_output=True,
                check=True,
            )
            cli.append(time.perf_counter() - t)
    result = {
        "replicas": 1000,
        "render_1000_s": statistics.median(times),
        "render_1000_min_s": min(times),
        "render_1000_cold_s": cold,
        "per_replica_us": statistics.median(times) / 1000 * 1e6,
        "cli_import_s": statistics.median(imports),
        "render_cli_s": statistics.median(cli),
        "torch_imported": "torch" in sys.modules,
        "target_render_1000_s": 0.5,
        "runs": RUNS,
    }
    for key, value in result.items():
        print(f"{key:>22}: {value:.4f}" if isinstance(value, float) else f"{key:>22}: {value}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    if result["render_1000_s"] >= 0.5 or result["torch_imported"]:
        raise SystemExit("render benchmark missed its target")


if __name__ == "__main__":
    main()
