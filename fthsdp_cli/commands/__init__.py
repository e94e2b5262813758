"""One module per command family; loaded lazily by `fthsdp_cli.main.LazyGroup`."""

import click


def stderr_notice(message: str) -> None:
    """Where a slow Slurm command says what it waits for: stderr, so `--json` stays clean."""
    click.echo(message, err=True)
