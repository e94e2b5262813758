"""`fthsdp cancel`: cancel a run's jobs that are still queued or running.

A thin command over `slurm.cancel.cancel_jobs`: it reads the run's record (jobs.json), cancels
what Slurm still lists and says what had already finished. A spare pool file that cannot be
read still lets the rest be cancelled, then exits 2 naming it.
"""

from __future__ import annotations

from pathlib import Path

import click

from fthsdp_cli.commands import stderr_notice


@click.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
def cancel(run_dir: Path) -> None:
    """Cancel every job of a run that is still queued or running (as recorded in
    RUN_DIR/jobs.json); says which had already finished."""
    from slurm.backend import make_backend
    from slurm.cancel import cancel_jobs
    from slurm.rundir import read_run
    from slurm.submit import check_slurm_conf

    record = read_run(run_dir)
    check_slurm_conf()
    done = cancel_jobs(record, make_backend(notice=stderr_notice), run_dir)
    if done.cancelled:
        click.echo(f"cancelled {len(done.cancelled)} job(s): {','.join(done.cancelled)}")
    else:
        click.echo("nothing left to cancel")
    if done.finished:
        click.echo(f"already finished: {','.join(done.finished)}")
    done.check()
