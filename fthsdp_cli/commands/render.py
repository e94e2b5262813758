"""`fthsdp render`, `fthsdp submit`, `fthsdp cancel`: from a spec to jobs in the queue and back.

Thin commands: parse options, call `slurm.spec` / `slurm.render` / `slurm.submit`, present the
result. `render` is the dry run (it never talks to Slurm); `submit --dry-run` is exactly `render`.
"""

from __future__ import annotations

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


@click.command()
@_spec_arg
@click.option("--dry-run", is_flag=True, help="Print the scripts instead (same as 'render').")
@click.option(
    "--force",
    is_flag=True,
    help="Move a finished run's state in run_dir to run_dir/archive/<time>/ and submit anew "
    "(a run whose jobs still run is always refused: fthsdp cancel it first).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the job record as JSON.")
@_set_option
def submit(
    spec: Path, dry_run: bool, force: bool, as_json: bool, overrides: tuple[str, ...]
) -> None:
    """Render a spec into its run_dir and submit the control job, then one job per replica."""
    if dry_run:
        _render(spec, overrides, None, None)
        return
    from slurm.backend import default_backend
    from slurm.spec import load_spec
    from slurm.submit import check_slurm_conf, submit_run

    loaded = load_spec(spec, overrides)
    check_slurm_conf()
    record = submit_run(loaded, default_backend(notice=stderr_notice), force=force)
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
    from slurm.rundir import pool_job_ids

    for job_id in pool_job_ids(Path(record.run_dir)):  # [spares]: the slot jobs
        table.add_row("spare", "", job_id, f"{record.name}-spare", "spare.sbatch")
    Console().print(table)


def cancel_order(record_ids: list[str], live: set[str]) -> tuple[list[str], list[str]]:
    """(ids to cancel, ids already finished), in the record's order: replicas before the control
    job, so none outlives its control plane. A job Slurm no longer lists has finished."""
    return [i for i in record_ids if i in live], [i for i in record_ids if i not in live]


@click.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
def cancel(run_dir: Path) -> None:
    """Cancel every job of a run that is still queued or running (as recorded in
    RUN_DIR/jobs.json); says which had already finished."""
    from slurm.backend import default_backend
    from slurm.rundir import live_jobs, read_run
    from slurm.submit import check_slurm_conf

    record = read_run(run_dir)
    check_slurm_conf()
    backend = default_backend(notice=stderr_notice)
    from slurm.errors import InputError
    from slurm.rundir import PoolFileError, read_pool

    # The hot-spare slots (a replica may run in one). A pool file that cannot be read still
    # lets the rest be cancelled, then fails: its slot jobs may hold nodes.
    unreadable: PoolFileError | None = None
    try:
        pool = read_pool(run_dir)
    except PoolFileError as exc:
        pool, unreadable = None, exc
    spares = [s.job_id for s in pool.slots] if pool else []
    ids = [r.job_id for r in record.replicas] + spares
    ids += [record.control.job_id] if record.control else []
    live = {j.base_id for j in live_jobs(record, backend, spares)}
    to_cancel, finished = cancel_order(ids, live)
    if to_cancel:
        backend.cancel(to_cancel)
        click.echo(f"cancelled {len(to_cancel)} job(s): {','.join(to_cancel)}")
    else:
        click.echo("nothing left to cancel")
    if finished:
        click.echo(f"already finished: {','.join(finished)}")
    if unreadable is not None:
        raise InputError(
            "spares.json",
            str(unreadable),
            "a readable spare pool; its slot jobs (job name ending -spare) were not cancelled: "
            "scancel them by hand",
        )
