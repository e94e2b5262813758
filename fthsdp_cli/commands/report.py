"""`fthsdp report RUN_DIR`: one self-contained HTML file of what a run did (and `--png`).

Thin: `runtime.report` reads the run directory (never Slurm) and derives the lanes, faults,
step rate, metrics and effective time; this command adds the status table as `fthsdp status`
draws it (`render_status`, fed from the files instead of squeue) and writes the files
atomically: each goes to a temporary name beside its target and is renamed once all are
written, so a failure leaves no half-written report.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import click

#: What the status table says of a local run's control plane (it has no coordinator).
LOCAL_CONTROL = "control plane: the local launcher (no coordinator, no journal)"


def status_text(status: dict[str, Any], local: bool) -> str:
    """The status table as `fthsdp status` prints it, as plain text."""
    from rich.console import Console

    from fthsdp_cli.commands.status import quorum_line, render_status, settle_replicas

    settle_replicas(status)
    console = Console(file=io.StringIO(), width=100, record=True, color_system=None)
    console.print(render_status(status))
    text = console.export_text()
    return text.replace(quorum_line(status), LOCAL_CONTROL) if local else text


def write_atomically(contents: dict[Path, bytes]) -> None:
    """Write every file under a temporary name, then rename them all; on failure none stays."""
    temps: list[tuple[Path, Path]] = []
    try:
        for path, data in contents.items():
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            temps.append((tmp, path))
            tmp.write_bytes(data)
        for tmp, path in temps:
            os.replace(tmp, path)
    finally:
        for tmp, _ in temps:
            tmp.unlink(missing_ok=True)


@click.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where to write the HTML file (default: RUN_DIR/report.html).",
)
@click.option("--png", is_flag=True, help="Also write the timeline as PNG (OUT with .png).")
def report(run_dir: Path, out: Path | None, png: bool) -> None:
    """Write a run's report: one HTML file with no network needed to view it.

    It shows one lane per replica over wall time (training, healing, pending, down), every
    fault with its cause and the drain/requeue that followed, the step rate, the recorded
    metrics against step, the effective training time and the status table. It reads the run
    directory only (progress files, journal, jobs.json), for a live or a finished run.
    """
    from runtime.report.html import render_html
    from runtime.report.read import build_report
    from slurm.errors import InputError

    if not run_dir.is_dir():
        raise InputError("RUN_DIR", str(run_dir), "an existing run directory")
    out = out if out is not None else run_dir / "report.html"
    if not out.parent.is_dir():
        raise InputError("--out", str(out), "a file in an existing directory")
    if png and out.suffix == ".png":
        raise InputError("--out", str(out), "the HTML file (with --png, OUT with .png is the PNG)")
    data = build_report(run_dir)
    files = {out: render_html(data, status_text(data.status, data.kind == "local")).encode()}
    if png:
        from runtime.report.png import write_png

        png_path = out.with_suffix(".png")
        buffer = io.BytesIO()
        write_png(data, buffer)
        files[png_path] = buffer.getvalue()
    write_atomically(files)
    for path in files:
        click.echo(str(path))
