"""`fthsdp doctor`: a read-only site preflight of the Slurm that fthsdp will run on.

Reads `scontrol show config` (and, with `--spec`, the partitions and, when the spec asks for a
topology, `scontrol show topology`), runs `slurm.doctor`'s checks and prints each verdict with
the slurm.conf line that fixes it: a rich table, or `--json` with
`{"slurm_version", "findings": [{"check", "status", "detail", "fix"}], "summary"}`.
Exit 0 when nothing fails (warnings allowed), 1 when a check fails, 2 bad input (the spec),
3 when Slurm cannot be read (scontrol missing, slurmctld down, output not recognised).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

EXIT_UNREACHABLE = 3
_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red"}


@click.command()
@click.option(
    "--spec",
    "spec_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also check what this run needs: its topology, GPUs, het jobs and partitions.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=30.0,
    show_default=True,
    help="Seconds to wait for each scontrol.",
)
def doctor(spec_path: Path | None, as_json: bool, timeout: float) -> None:
    """Check this Slurm's configuration against what fthsdp relies on (changes nothing)."""
    from slurm.doctor import diagnose, exit_code, summary, wants_topology
    from slurm.records import SlurmOutputError
    from slurm.slurm_config import (
        SlurmUnreachable,
        read_config,
        read_partitions,
        read_topology,
    )
    from slurm.spec import load_spec
    from slurm.submit import check_slurm_conf

    spec = load_spec(spec_path) if spec_path is not None else None
    check_slurm_conf()  # a SLURM_CONF naming no file: one line now, not a minute of retries
    try:
        cfg = read_config(timeout)
        partitions = read_partitions(cfg.version, timeout) if spec is not None else None
        shown = read_topology(cfg.version, timeout) if wants_topology(cfg, spec) else None
    except (SlurmUnreachable, SlurmOutputError) as exc:
        click.echo(f"fthsdp doctor: {exc}", err=True)
        sys.exit(EXIT_UNREACHABLE)
    findings = diagnose(cfg, spec, partitions, shown)
    if as_json:
        data = {
            "slurm_version": cfg.version_text,
            "findings": [f.to_dict() for f in findings],
            "summary": summary(findings),
        }
        click.echo(json.dumps(data, indent=2))
    else:
        table = Table(title=f"fthsdp doctor: Slurm {cfg.version_text}")
        for col in ("check", "status", "detail"):
            table.add_column(col, overflow="fold")
        for f in findings:
            table.add_row(Text(f.check), Text(f.status, _STYLE[f.status]), Text(f.detail))
        console = Console()
        console.print(table)
        counts = summary(findings)
        console.print(f"{counts['pass']} pass, {counts['warn']} warn, {counts['fail']} fail")
        fixes = [f.fix for f in findings if f.fix]
        if fixes:
            # Unwrapped, so the lines can be copied as they are.
            click.echo("\nAdd to slurm.conf, then reconfigure or restart the daemons:")
            for line in fixes:
                click.echo(f"  {line}")
    sys.exit(exit_code(findings))
