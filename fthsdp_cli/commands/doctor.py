"""`fthsdp doctor`: a read-only site preflight of the Slurm that fthsdp will run on.

Reads `scontrol show config` (and, with `--spec`, the partitions and, when the spec asks for a
topology, `scontrol show topology`), runs `slurm.doctor`'s checks and prints each verdict with
the slurm.conf line that fixes it: a rich table, or `--json` with
`{"slurm_version", "findings": [{"check", "status", "detail", "fix"}], "summary", "drain"}`.

It also says how a run of the calling user drains a suspect node (`slurm.privileges`, read
only): `direct` when the user may change node state, else `request` (the node is kept off the
requeued job, and the drain is asked of root's Epilog through the job's comment), and why.
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

from slurm.doctor import Finding
from slurm.privileges import Privileges

EXIT_UNREACHABLE = 3
_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red"}
#: What a run does about a suspect node in each drain mode (docs/operators.md, "Security model").
DRAIN_EFFECT = {
    "direct": "a run of this user drains a suspect node itself (scontrol update NodeName=N "
    "State=DRAIN), requeues the replica and keeps the node off its requeued job (ExcNodeList)",
    "request": "a run of this user cannot drain: it requeues the replica, keeps the node off its "
    "requeued job (ExcNodeList), and asks root's Epilog for the drain in the job's comment; "
    "the Epilog drains under the site's policy (off, recheck, trust)",
}


def drain_finding(rights: Privileges) -> Finding:
    """The drain mode as one row of the doctor's table: information, never a failure (a run
    without drain rights is the normal case on a site)."""
    return Finding(
        "drain mode", "pass", f"{rights.mode} for {rights.user}: {rights.reason}; "
        f"{DRAIN_EFFECT[rights.mode]}",
    )  # fmt: skip


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
    from slurm.privileges import probe as probe_privileges
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
    rights = probe_privileges(timeout, cfg)
    findings = [*diagnose(cfg, spec, partitions, shown), drain_finding(rights)]
    if as_json:
        data = {
            "slurm_version": cfg.version_text,
            "findings": [f.to_dict() for f in findings],
            "summary": summary(findings),
            "drain": {**rights.to_dict(), "effect": DRAIN_EFFECT[rights.mode]},
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
