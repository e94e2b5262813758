"""`fthsdp run --local SPEC` for a spec with `[train] mode = "torchft"` (a foreign trainer).

Thin: the options that make sense for a trainer fthsdp does not drive, a
`runtime.local.foreign.ForeignLocalRun`, and its summary (a table, or one JSON object).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from slurm.errors import InputError


def run_foreign(
    job: Any,
    *,
    native_only: dict[str, Any],
    replicas: int | None,
    run_dir: Path | None,
    kill_replica: int | None,
    at_step: int | None,
    restart_delay: float,
    timeout_s: float,
    as_json: bool,
) -> None:
    from runtime.local.foreign import ForeignLocalRun, config_from_spec
    from runtime.local.run_state import clear_run_state, local_run_dir

    for name, value in native_only.items():
        if value not in (None, False):
            raise InputError(
                name, value, 'only for the native API; a [train] mode = "torchft" trainer owns it'
            )
    cfg = config_from_spec(
        job,
        replicas=replicas,
        run_dir=run_dir,
        kill_replica=kill_replica,
        kill_at_step=at_step,
        restart_delay_s=restart_delay,
        run_timeout_s=timeout_s,
    )
    err = Console(stderr=True)
    cfg.run_dir, note = local_run_dir(cfg.run_dir.resolve())
    if note:
        err.print(note, highlight=False, soft_wrap=True)  # a path is never broken
    clear_run_state(cfg.run_dir, keep_checkpoints=True)
    summary = ForeignLocalRun(cfg).run()
    if as_json:
        click.echo(json.dumps(asdict(summary), sort_keys=True))
    else:
        table = Table(title=f"fthsdp run --local ({job.train.mode} mode)")
        for col in ("group", "step", "restarts", "exit codes", "finished"):
            table.add_column(col)
        for g in summary.groups:
            codes = ",".join(str(c) for c in g.exit_codes)
            table.add_row(str(g.replica), str(g.step), str(g.restarts), codes, str(g.ok))
        Console().print(table)
        if summary.error:
            err.print(f"[red]{summary.error}[/]")
    if summary.signal is not None:
        raise SystemExit(128 + summary.signal)
    if not summary.ok:
        raise SystemExit(1)
