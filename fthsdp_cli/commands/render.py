"""`fthsdp render`, `fthsdp submit`: from a spec to jobs in the queue (`fthsdp cancel` is in
`fthsdp_cli.commands.cancel`).

Thin commands: parse options, call `slurm.spec` / `slurm.render` / `slurm.submit`, present the
result. `render` is the dry run (it never talks to Slurm); `submit --dry-run` is exactly `render`.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import click

from fthsdp_cli.commands import stderr_notice

_spec_arg = click.argument("spec", type=click.Path(dir_okay=False, path_type=Path))
_set_option = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a spec field, e.g. --set replicas.count=4 (repeatable).",
)


def _render(
    spec_path: Path, overrides: tuple[str, ...], out: Path | None, replica: int | None
) -> None:
    from slurm.errors import InputError
    from slurm.render import concatenated, render_run, write_scripts
    from slurm.spec import load_spec

    spec = load_spec(spec_path, overrides)
    scripts = render_run(spec, None if replica is None else [replica], control=replica is None)
    if out is None:
        click.echo(concatenated(scripts), nl=False)
        return
    try:
        paths = write_scripts(scripts, out)
    except OSError as exc:  # the user's folder: bad input, not a broken machine
        raise InputError(
            "--out", str(out), f"a folder this user can create and write ({exc.strerror})"
        ) from None
    for path in paths:
        click.echo(str(path))


@click.command()
@_spec_arg
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write the scripts into this folder instead of printing them.",
)
@click.option(
    "--replica",
    type=click.IntRange(min=0),
    default=None,
    help="Render only this replica's script.",
)
@_set_option
def render(spec: Path, out: Path | None, replica: int | None, overrides: tuple[str, ...]) -> None:
    """Render a spec's sbatch scripts (dry run: nothing is submitted).

    Without --out every script is printed, each after a line '# ==> NAME.sbatch <=='.
    """
    _render(spec, overrides, out, replica)


def _expedite_args() -> list[str]:
    """`--requeue=expedite` for the replica jobs where the running slurmctld grants it; nothing
    (and one line saying why) where it does not, or where its configuration cannot be read now
    (never guessed)."""
    from slurm.errors import EnvironmentProblem
    from slurm.expedite import SBATCH_OPTION, expedited_requeue
    from slurm.records import SlurmOutputError
    from slurm.slurm_config import read_config

    try:
        granted, why = expedited_requeue(read_config(timeout=10))
    except (EnvironmentProblem, SlurmOutputError) as exc:
        granted, why = False, str(exc)
    if not granted:
        stderr_notice(f"fthsdp: no expedited requeue: {why}")
    return [SBATCH_OPTION] if granted else []


@click.command()
@_spec_arg
@click.option("--dry-run", is_flag=True, help="Print the scripts instead (same as 'render').")
@click.option(
    "--force",
    is_flag=True,
    help="Move a finished run's state in run_dir to run_dir/archive/<time>/ and submit anew "
    "(a run whose jobs still run is always refused: fthsdp cancel it first).",
)
@click.option(
    "--expedite",
    is_flag=True,
    help="Ask Slurm for an expedited requeue of the replica jobs (25.11+, where the site enabled "
    "it). Off by default: an expedited job restarts before its ExcNodeList can be set, so a run "
    "that cannot drain may come back on the suspect node.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the job record as JSON.")
@_set_option
def submit(
    spec: Path,
    dry_run: bool,
    force: bool,
    expedite: bool,
    as_json: bool,
    overrides: tuple[str, ...],
) -> None:
    """Render a spec into its run_dir and submit the control job, then one job per replica."""
    if dry_run:
        _render(spec, overrides, None, None)
        return
    from slurm.backend import make_backend
    from slurm.spec import load_spec
    from slurm.spec.model import DEFAULT_PYTHON
    from slurm.submit import check_slurm_conf, submit_run

    loaded = load_spec(spec, overrides)
    if loaded.control.python == DEFAULT_PYTHON:
        # Unset: the jobs run the installation this command runs from (a site's shared
        # virtualenv), not whichever `python` comes first on the job's PATH.
        loaded = replace(loaded, control=replace(loaded.control, python=sys.executable))
    check_slurm_conf()
    record = submit_run(
        loaded,
        make_backend(notice=stderr_notice),
        force=force,
        replica_args=_expedite_args() if expedite else [],
    )
    if as_json:
        click.echo(record.to_json(), nl=False)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"run {record.name} submitted ({record.run_dir})")
    for col in ("role", "replica", "job id", "job name", "script"):
        table.add_column(col)
    for j in record.jobs:
        table.add_row(
            j.role, "" if j.replica is None else str(j.replica), j.job_id, j.job_name, j.script
        )
    from slurm.rundir import SPARE_SCRIPT, read_pool

    pool = read_pool(Path(record.run_dir))  # [spares]: the slot jobs
    for slot in pool.slots if pool else ():
        table.add_row("spare", "", slot.job_id, f"{record.name}-spare", SPARE_SCRIPT)
    Console().print(table)
