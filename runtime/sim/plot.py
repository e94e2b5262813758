"""ETTR vs replica count as a PNG (matplotlib is the optional `plot` extra).

Kept apart from the model so that `runtime.sim` never needs matplotlib; the import happens only
when a figure is asked for, and its absence is a one-line `EnvironmentProblem`, not a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slurm.errors import EnvironmentProblem


def plot_ettr_vs_replicas(records: list[dict[str, Any]], path: Path) -> Path:
    """Write FT-HSDP ETTR (with 95 % CI) per replica count and the synchronous ETTR as a line."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise EnvironmentProblem(
            "--plot needs matplotlib: pip install 'fthsdp[plot]' (or pip install matplotlib)"
        ) from exc
    xs = [rec["replicas"] for rec in records]
    ys = [rec["fthsdp"]["ettr"] * 100 for rec in records]
    errs = [
        (rec["fthsdp"]["ettr"] - rec["fthsdp"]["ettr_ci95"][0]) * 100
        if rec["fthsdp"]["ettr_ci95"]
        else 0.0
        for rec in records
    ]
    sync = records[0]["sync"]["ettr"] * 100
    params = records[0]["params"]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    try:
        ax.errorbar(xs, ys, yerr=errs, marker="o", capsize=3, label="FT-HSDP")
        ax.axhline(sync, color="tab:red", linestyle="--", label=f"synchronous ({sync:.1f} %)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("replicas")
        ax.set_ylabel("effective training time (%)")
        ax.set_ylim(0, 100)
        ax.set_title(f"{params['gpus']:,} GPUs, {params['days']:g} days, {params['runs']} runs")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)
    return path
