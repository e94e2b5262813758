"""The report's timeline as a PNG, with matplotlib (the `plot` extra), imported only here.

The same lanes as the HTML page: one bar per replica over wall time, coloured by state, a
black line at each fault and a diamond at each recovery action.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from runtime.report.html import COLORS
from runtime.report.read import RunReport
from slurm.errors import EnvironmentProblem


def write_png(report: RunReport, path: Path | BinaryIO) -> None:
    """Draw the timeline into `path` (a file or a binary stream); `EnvironmentProblem` when
    matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise EnvironmentProblem("--png needs matplotlib: pip install 'fthsdp[plot]'") from None
    s = report.start
    fig, ax = plt.subplots(figsize=(10, 1.0 + 0.6 * len(report.lanes)), dpi=100)
    for i, lane in enumerate(report.lanes):
        for seg in lane.segments:
            ax.broken_barh([(seg.start - s, seg.seconds)], (i - 0.35, 0.7), color=COLORS[seg.state])
        for f in lane.faults:
            ax.plot([f.t - s] * 2, [i - 0.45, i + 0.45], color="black", linewidth=2)
            ax.plot([f.t - s], [i + 0.5], marker="v", color="#d63c3c", markersize=9)
        for a in lane.actions:
            ax.plot([a.t - s], [i], marker="D", color="#6a3d9a", markersize=6)
    ax.set_yticks(range(len(report.lanes)), [f"replica {lane.replica}" for lane in report.lanes])
    ax.set_ylim(len(report.lanes) - 0.3, -0.7)
    ax.set_xlim(0, max(report.end - s, 1e-6))
    ax.set_xlabel("seconds since start")
    handles = [
        matplotlib.patches.Patch(color=c, label=name)
        for name, c in COLORS.items()
        if name != "done"
    ]
    ax.legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=4, frameon=False)
    ax.set_title(f"fthsdp run {report.name}", loc="left")
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
