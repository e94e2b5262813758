"""Render benchmark: a 1000-replica spec to scripts, and the CLI's import cost.

The four measurements run interleaved, `--repeat` times (default 7); medians and ranges go to
benchmarks/figures/render.json (and benchmarks/results/):
- render_1000_s: wall time to render control + 1000 replica scripts (median of runs, warm);
- render_1000_cold_s: the first render in a fresh process (template compile included);
- cli_import_s: `python -c "import fthsdp_cli.main"` in a fresh process (median);
- render_cli_s: `python -m fthsdp_cli render SPEC --set replicas.count=1000 --out DIR`;
- torch_imported: whether rendering pulled torch into the process (must be false).
Target: render_1000_s < 0.5 and torch_imported false.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.harness import Run, interleave, repeats_arg  # noqa: E402

SPEC = ROOT / "tests" / "specs" / "basic.toml"
RESULTS = ROOT / "benchmarks" / "results" / "render.json"
RUNS = 7


def _child(code: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def _render_cli(out: str) -> float:
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
    return time.perf_counter() - t


def main() -> None:
    repeats = repeats_arg(RUNS)
    from slurm.render import render_run
    from slurm.spec import load_spec

    spec = load_spec(SPEC, ["replicas.count=1000"])

    def warm() -> float:
        t = time.perf_counter()
        scripts = render_run(spec)
        elapsed = time.perf_counter() - t
        assert len(scripts) == 1001
        return elapsed

    cold_code = (
        "import time; t=time.perf_counter(); "
        "from slurm.spec import load_spec; from slurm.render import render_run; "
        f"s=load_spec({str(SPEC)!r}, ['replicas.count=1000']); render_run(s); "
        "import sys; assert 'torch' not in sys.modules; print(time.perf_counter()-t)"
    )
    import_code = (
        "import time; t=time.perf_counter(); import fthsdp_cli.main; print(time.perf_counter()-t)"
    )
    run = Run(
        "render",
        "Rendering",
        "A spec with 1,000 replicas rendered to `control.sbatch` plus 1,000 replica scripts: "
        "in-process (warm), in a fresh process (cold, template compile included), and through "
        "`fthsdp render` to files (whole process); and the CLI's import alone. Interleaved.",
        repeats,
    )
    with tempfile.TemporaryDirectory() as out:
        got = interleave(
            {
                "warm": warm,
                "cold": lambda: _child(cold_code),
                "import": lambda: _child(import_code),
                "cli": lambda: _render_cli(out),
            },
            repeats,
        )
    run.row("render 1,000 replicas, warm", got["warm"], "s", "< 0.5 s")
    run.row("per replica, warm", [t / 1000 * 1e6 for t in got["warm"]], "µs", digits=0)
    run.row("render 1,000 replicas, cold process", got["cold"], "s")
    run.row("import of the CLI", got["import"], "s")
    run.row("`fthsdp render` of 1,000 replicas to files, whole process", got["cli"], "s")
    torch_imported = "torch" in sys.modules
    run.notes.append(f"- torch imported by render/CLI: {'yes' if torch_imported else 'no'}.")
    run.write()
    if statistics.median(got["warm"]) >= 0.5 or torch_imported:
        raise SystemExit("render benchmark missed its target")


if __name__ == "__main__":
    main()
