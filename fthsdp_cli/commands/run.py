"""`fthsdp run SPEC` (or `run --local SPEC`): a spec's FT-HSDP job on this machine, with faults.

Thin: load the spec, build a `runtime.local.config.LaunchConfig`, run it while a rich table
shows each replica's step, state and restarts, then print the summary (or one JSON object with
`--json`). torch is imported only inside the command, by the launcher's weight comparison.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table

from slurm.errors import InputError


def _status_table(replicas: list[Any]) -> Table:
    table = Table(title="fthsdp run --local")
    for col in ("replica", "step", "state", "restarts"):
        table.add_column(col)
    for rs in replicas:
        table.add_row(str(rs.replica), str(rs.step), rs.state, str(len(rs.restarts)))
    return table


def _failures(failures: list[dict[str, Any]]) -> str:
    """`2 (1 injected, 1 crashed)`: one per replica that died, whatever its ranks did."""
    if not failures:
        return "0"
    kinds: dict[str, int] = {}
    for f in failures:
        kind = {"crash": "crashed", "straggler": "evicted"}.get(f["kind"], f["kind"])
        kinds[kind] = kinds.get(kind, 0) + 1
    return f"{len(failures)} (" + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) + ")"


def _summary_table(summary: Any) -> Table:
    table = Table(title="run summary", show_header=False)
    rows = [
        ("steps", f"{summary.steps}/{summary.target_steps}"),
        ("failures", _failures(summary.failures)),
        ("max healthy-replica stall", f"{summary.max_healthy_stall_s:.2f} s"),
        ("rejoin (from relaunch)", ", ".join(f"{x:.2f} s" for x in summary.rejoin_s) or "-"),
        ("median step", f"{summary.median_step_s * 1000:.0f} ms"),
        ("ETTR", f"{summary.ettr:.2f}"),
        ("final weights agree", str(summary.weights_agree)),
        ("ledger exactly-once", str(summary.ledger_ok)),
        ("replicas out", ", ".join(map(str, summary.replicas_out)) or "-"),
    ]
    for key, value in rows:
        table.add_row(key, value)
    return table


@click.command()
@click.argument("spec", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--local",
    "local",
    is_flag=True,
    hidden=True,
    help="Accepted for clarity: replicas always run as local processes here.",
)
@click.option(
    "--replicas", type=click.IntRange(min=1), default=None, help="Override replicas.count."
)
@click.option(
    "--ranks-per-replica",
    type=click.IntRange(min=1),
    default=None,
    help="Ranks (processes) per replica.",
)
@click.option("--steps", type=click.IntRange(min=1), default=None, help="Override train.steps.")
@click.option(
    "--kill-replica",
    type=click.IntRange(min=0),
    default=None,
    help="kill -9 this replica once, when it reaches --at-step.",
)
@click.option(
    "--at-step",
    type=click.IntRange(min=1),
    default=None,
    help="The step at which --kill-replica dies (within the run's steps).",
)
@click.option(
    "--chaos-mtbf",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Random kills, mean seconds apart.",
)
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Seed of the chaos kills.",
)
@click.option(
    "--restart-delay",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Seconds before a dead replica is restarted (stands in for requeue + allocation).",
)
@click.option(
    "--slow-replica",
    type=click.IntRange(min=0),
    default=None,
    help="Make this replica a straggler, --slow-factor times slower.",
)
@click.option(
    "--slow-factor",
    type=click.FloatRange(min=1, max=100),
    default=2.0,
    show_default=True,
    help="How much slower --slow-replica computes.",
)
@click.option(
    "--slow-from-step",
    type=click.IntRange(min=0),
    default=20,
    show_default=True,
    help="The step from which --slow-replica is slow (0: its node is slow from the start).",
)
@click.option(
    "--straggler-window",
    type=click.IntRange(min=1),
    default=50,
    show_default=True,
    help="Steps a replica must stay slow to be a straggler (then it is evicted if that pays).",
)
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the run keeps its state, logs and checkpoints (default: the spec's "
    "job.run_dir). A local run starts it afresh, keeping checkpoints only with --resume.",
)
@click.option("--resume", is_flag=True, help="Keep durable checkpoints from an earlier run.")
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=1800.0,
    show_default=True,
    help="Seconds the whole run may take; then every process is stopped and the run fails.",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a spec field, e.g. --set train.steps=50 (repeatable).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
def run(
    spec: Path,
    local: bool,
    replicas: int | None,
    ranks_per_replica: int | None,
    steps: int | None,
    kill_replica: int | None,
    at_step: int | None,
    chaos_mtbf: float | None,
    seed: int,
    restart_delay: float,
    slow_replica: int | None,
    slow_factor: float,
    slow_from_step: int,
    straggler_window: int,
    run_dir: Path | None,
    resume: bool,
    timeout_s: float,
    overrides: tuple[str, ...],
    as_json: bool,
) -> None:
    """Run SPEC's training job on this machine: the quorum service plus R x W worker processes
    (on Slurm, use 'fthsdp submit').

    A replica whose processes die is restarted (the local stand-in for a requeue); the others
    keep training. Exit 0 when all steps committed, the final weights agree and the data ledger
    shows every sample exactly once; 1 otherwise.
    """
    if (kill_replica is None) != (at_step is None):
        raise InputError(
            "--kill-replica/--at-step", (kill_replica, at_step), "give both or neither"
        )
    if restart_delay < 0:
        raise InputError("--restart-delay", restart_delay, "seconds >= 0")
    if chaos_mtbf is not None and chaos_mtbf <= 0:
        raise InputError("--chaos-mtbf", chaos_mtbf, "a positive number of seconds")
    from runtime.local.config import config_from_spec
    from runtime.local.launcher import LocalLauncher
    from runtime.local.run_state import clear_run_state, local_run_dir
    from slurm.spec import load_spec

    job = load_spec(spec, overrides)
    if job.train.mode == "torchft":
        from fthsdp_cli.commands.run_foreign import run_foreign

        return run_foreign(
            job,
            native_only={
                "--steps": steps,
                "--ranks-per-replica": ranks_per_replica,
                "--chaos-mtbf": chaos_mtbf,
                "--slow-replica": slow_replica,
                "--resume": resume,
            },
            replicas=replicas,
            run_dir=run_dir,
            kill_replica=kill_replica,
            at_step=at_step,
            restart_delay=restart_delay,
            timeout_s=timeout_s,
            as_json=as_json,
        )
    cfg = config_from_spec(
        job,
        replicas=replicas,
        ranks_per_replica=ranks_per_replica,
        steps=steps,
        run_dir=run_dir.resolve() if run_dir is not None else None,
        kill_replica=kill_replica,
        kill_at_step=at_step,
        slow_replica=slow_replica,
        slow_factor=slow_factor,
        slow_after_step=slow_from_step,
        straggler_window_steps=straggler_window,
        chaos_mtbf_s=chaos_mtbf,
        seed=seed,
        restart_delay_s=restart_delay,
        run_timeout_s=timeout_s,
    )
    if at_step is not None and at_step > cfg.steps:
        raise InputError("--at-step", at_step, f"a step in 1..{cfg.steps} (the run's steps)")
    err = Console(stderr=True)
    cfg.run_dir, note = local_run_dir(cfg.run_dir)
    if note:
        err.print(note, highlight=False, soft_wrap=True)  # a path is never broken
    clear_run_state(cfg.run_dir, keep_checkpoints=resume)
    if as_json or not err.is_terminal:
        summary = LocalLauncher(cfg).run()
    else:
        with Live(_status_table([]), console=err, refresh_per_second=4) as live:
            summary = LocalLauncher(cfg, lambda rs: live.update(_status_table(rs))).run()
    if as_json:
        click.echo(json.dumps(asdict(summary), sort_keys=True))
    else:
        Console().print(_summary_table(summary))
        if summary.error:
            err.print(f"[red]{summary.error}[/]")
        for problem in summary.ledger_problems[:5]:
            err.print(f"[yellow]ledger:[/] {problem}")
    if summary.signal is not None:
        raise SystemExit(128 + summary.signal)  # the shell's code for a signal
    if not summary.ok:
        raise SystemExit(1)
