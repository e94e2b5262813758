"""`fthsdp check|prolog|epilog|healthcheck`: node health checks from the command line.

`check` runs the suite here and presents it (a rich table, or `--json` with the contract
`{"healthy", "checks": [{"name", "status", "detail"}], "drain_reason"}`); it changes nothing in
Slurm. Exit 0 healthy, 1 unhealthy, 2 bad usage or config (a path given explicitly must exist:
a missing one is a typo, not a node without that hardware). The other three are the Slurm entry
points (`prolog_epilog.entrypoints`) under the `fthsdp` command.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from slurm import contract

_STYLE = {"pass": "green", "skip": "dim", "warn": "yellow", "error": "magenta", "fail": "bold red"}

_gpu_source_option = click.option(
    "--gpu-source",
    type=click.Choice(["auto", "nvml", "nvidia-smi"]),
    default="auto",
    show_default=True,
    help="Where GPU state is read from.",
)


@click.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    envvar=contract.HEALTH_CONFIG,
    help="Health-check TOML config (defaults built in).",
)
@click.option("--only", default=None, help="Comma list of checks to run instead of the suite.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@_gpu_source_option
@click.option(
    "--sysfs-root",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=None,
    help="Read InfiniBand state under DIR/class/infiniband.",
)
@click.option(
    "--kernel-log",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="Read Xids from this file instead of the configured kernel log.",
)
@click.option("--node", default=None, help="Node name for {node} in config paths.")
def check(
    config_path: Path | None,
    only: str | None,
    as_json: bool,
    gpu_source: str,
    sysfs_root: Path | None,
    kernel_log: Path | None,
    node: str | None,
) -> None:
    """Run the node health checks here and print the verdict (changes nothing)."""
    from prolog_epilog import load_config, run_checks
    from prolog_epilog.runner import CHECK_NAMES, parse_check_list
    from slurm.errors import InputError

    cfg = load_config(config_path, node=node)
    try:
        names = parse_check_list(only)
    except InputError as exc:
        raise InputError("--only", exc.value, exc.allowed) from None
    if names == []:  # "--only ''" would check nothing and call the node healthy
        raise InputError("--only", only, f"at least one of: {', '.join(CHECK_NAMES)}")
    if names is None and os.environ.get(contract.HEALTH_CHECKS):
        names = cfg.default_checks + [
            c
            for c in parse_check_list(os.environ[contract.HEALTH_CHECKS]) or []
            if c not in cfg.default_checks
        ]
    result = run_checks(
        names, cfg, gpu_source=gpu_source, sysfs_root=sysfs_root, kernel_log=kernel_log
    )
    if as_json:
        data = result.to_dict()
        click.echo(
            json.dumps({k: data[k] for k in ("healthy", "checks", "drain_reason")}, indent=2)
        )
    else:
        table = Table(title=f"health of {result.node} ({result.elapsed_s:.2f}s)")
        table.add_column("check")
        table.add_column("status")
        table.add_column("detail", overflow="fold")
        for c in result.checks:
            table.add_row(c.name, f"[{_STYLE[c.status]}]{c.status}[/]", c.detail)
        console = Console()
        console.print(table)
        if result.drain_reason:
            console.print(f"drain reason: [bold]{result.drain_reason}[/]")
        else:
            console.print("[green]healthy[/]")
    raise SystemExit(0 if result.healthy else 1)


def _entry(mode: str) -> click.Command:
    @click.command(name=mode, context_settings={"ignore_unknown_options": True})
    @click.option(
        "--config",
        "config_path",
        default=None,
        envvar=contract.HEALTH_CONFIG,
        help="Health-check TOML config (env FTHSDP_HEALTH_CONFIG; defaults built in).",
    )
    @click.option(
        "--node", default=None, help="This node's Slurm name (default: $SLURMD_NODENAME)."
    )
    @click.option(
        "--only", default=None, help="Comma list of checks to run instead of the configured ones."
    )
    @_gpu_source_option
    @click.option("--no-drain", is_flag=True, help="Report only; change nothing in Slurm.")
    def command(
        config_path: str | None, node: str | None, only: str | None, gpu_source: str, no_drain: bool
    ) -> None:
        from prolog_epilog.entrypoints import run_mode

        code, _ = run_mode(
            mode,
            config_path,
            node=node,
            only=[c for c in only.split(",") if c] if only else None,
            gpu_source=gpu_source,
            drain=not no_drain,
        )
        raise SystemExit(code)

    command.help = {
        "prolog": "Slurm Prolog entry point: check, drain on failure, exit 1 to requeue the job.",
        "epilog": "Slurm Epilog entry point: clean up strays, re-check, drain on failure.",
        "healthcheck": "Slurm HealthCheckProgram: check, drain on failure, resume our drains.",
    }[mode]
    return command


prolog = _entry("prolog")
epilog = _entry("epilog")
healthcheck = _entry("healthcheck")
