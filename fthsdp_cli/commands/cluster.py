"""`fthsdp cluster up|down|status`: the local dev Slurm cluster (see `slurm.devcluster`)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from slurm import devcluster
from slurm.errors import EnvironmentProblem, InputError

_dir_option = click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=devcluster.DEFAULT_DIR,
    show_default=True,
    envvar="FTHSDP_CLUSTER_DIR",
    help="Folder holding the cluster's config, state, logs and pid files; root's alone (owned by "
    "root, not writable by group or others), created 0755 when missing.",
)


@click.group()
def cluster() -> None:
    """Start, stop and inspect the local dev Slurm cluster (root; slurm-wlm and munge)."""


@cluster.command(short_help="Start a dev cluster; prints the SLURM_CONF export line.")
@_dir_option
@click.option("--nodes", default=4, show_default=True, type=int, help="Simulated nodes (1-64).")
@click.option(
    "--gpus-per-node",
    default=8,
    show_default=True,
    type=int,
    help="GPUs per node (placeholder GRES files; no GPU is needed).",
)
@click.option(
    "--switch-size", default=2, show_default=True, type=int, help="Nodes per leaf switch."
)
@click.option("--gpu-type", default="h100", show_default=True, help="The GPUs' GRES type.")
@click.option("--port", default=16817, show_default=True, type=int, help="slurmctld port.")
@click.option(
    "--slurmd-port", default=17001, show_default=True, type=int, help="First slurmd port."
)
@click.option("--prolog", default=None, help="Prolog= program (PrologFlags=Alloc is set with it).")
@click.option("--epilog", default=None, help="Epilog= program.")
@click.option("--healthcheck", default=None, help="HealthCheckProgram= program.")
@click.option("--healthcheck-interval", default=0, type=int, help="HealthCheckInterval= seconds.")
@click.option(
    "--health",
    is_flag=True,
    help="Simulated hardware per node under DIR/hardware, gated by the project's Prolog, Epilog, "
    "HealthCheckProgram; a TaskProlog points jobs' watchdogs at it (see 'cluster inject').",
)
@click.option(
    "--hold-on-prolog-fail",
    is_flag=True,
    help="Leave out nohold_on_prolog_fail: jobs whose prolog fails are requeued held.",
)
def up(
    directory: Path,
    nodes: int,
    gpus_per_node: int,
    switch_size: int,
    gpu_type: str,
    port: int,
    slurmd_port: int,
    prolog: str | None,
    epilog: str | None,
    healthcheck: str | None,
    healthcheck_interval: int,
    health: bool,
    hold_on_prolog_fail: bool,
) -> None:
    """Start munged, slurmctld and one slurmd per node; wait until all nodes are idle."""
    from prolog_epilog import dev_health

    cfg = devcluster.DevClusterConfig(
        directory=directory.resolve(),
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        switch_size=switch_size,
        gpu_type=gpu_type,
        ctld_port=port,
        slurmd_base_port=slurmd_port,
        prolog=prolog,
        epilog=epilog,
        health_check_program=healthcheck,
        health_check_interval=healthcheck_interval,
        nohold_on_prolog_fail=not hold_on_prolog_fail,
    )
    if health:
        if prolog or epilog or healthcheck:
            raise InputError("--health", "with --prolog/--epilog/--healthcheck", "one or the other")
        cfg = dev_health.with_health(cfg)
    err = Console(stderr=True)
    with err.status(f"starting {nodes}-node dev cluster in {cfg.directory}"):
        devcluster.up(cfg)
    err.print(f"[green]dev cluster up[/]: {nodes} nodes, {len(cfg.switches)} leaf switches")
    if health:
        err.print(
            f"simulated hardware in {dev_health.hardware_dir(cfg)}; Prolog, Epilog and "
            "HealthCheckProgram gate nodes on it; break one with 'fthsdp cluster inject NODE "
            "--fault xid79'. Jobs' tasks get these (TaskProlog; a spec's [job].env may set them):"
        )
        for key, value in dev_health.job_health_env(cfg).items():
            click.echo(f"  {key}={value}", err=True)  # unwrapped: meant to be copied
    click.echo(f"export SLURM_CONF={cfg.conf_path}")


@cluster.command(short_help="Cancel its jobs and stop its daemons (deletes nothing).")
@_dir_option
def down(directory: Path) -> None:
    """Cancel the cluster's jobs and stop the daemons it started (deletes nothing)."""
    cfg = devcluster.DevClusterConfig.load(directory.resolve())
    stopped = devcluster.down(cfg)
    click.echo(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


@cluster.command(short_help="Daemons and node states; exit 1 when it is not running.")
@_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def status(directory: Path, as_json: bool) -> None:
    """Show the cluster's daemons and node states; exit 1 if it is not running.

    The last line is `export SLURM_CONF=...` only while the cluster runs, so
    `eval "$(fthsdp cluster status | tail -1)"` is safe: when it is down the last line is a shell
    comment.
    """
    cfg = devcluster.DevClusterConfig.load(directory.resolve())
    st = devcluster.status(cfg)
    if as_json:
        import json

        click.echo(
            json.dumps({"running": st.running, "daemons": st.daemons, "nodes": st.nodes}, indent=2)
        )
    else:
        table = Table(title=f"dev cluster {cfg.directory}")
        table.add_column("node")
        table.add_column("switch")
        table.add_column("state")
        switch_of = {n: s for s, ns in cfg.switches.items() for n in ns}
        for node in cfg.node_names:
            table.add_row(node, switch_of[node], st.nodes.get(node, "-"))
        console = Console()
        console.print(table)
        daemons = ", ".join(f"{n}={p}" for n, p in st.daemons.items()) or "none"
        console.print(f"daemons: {daemons}")
        if st.running:
            click.echo(f"export SLURM_CONF={cfg.conf_path}")  # unwrapped: meant for eval
        else:
            click.echo("# the dev cluster is not running: start it with 'fthsdp cluster up'")
    if not st.running:
        raise SystemExit(1)


_hardware_option = click.option(
    "--hardware-root",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    envvar="FTHSDP_HARDWARE_ROOT",
    help="Simulated hardware folder (default: DIR/hardware).",
)


_gpus_option = click.option(
    "--gpus",
    type=click.IntRange(min=1),
    default=None,
    help="GPUs of the node's simulated hardware (default: the cluster's --gpus-per-node).",
)


def _target(
    directory: Path, hardware_root: Path | None, node: str, fault: str | None, gpus: int | None
) -> tuple[devcluster.DevClusterConfig, Path, int]:
    """The cluster under --dir, its hardware root and GPU count, once NODE and FAULT fit it."""
    from runtime.control.inject import check_target, fault_name
    from runtime.control.inject import hardware_root as default_root

    if fault is not None:
        fault_name(fault)  # a typo is named before the cluster is looked for
    cfg = devcluster.DevClusterConfig.load(directory.resolve())
    check_target(node, fault, cfg.node_names, cfg.health, cfg.directory)
    if gpus is not None and gpus != cfg.gpus_per_node:
        raise InputError("--gpus", gpus, f"the cluster's {cfg.gpus_per_node} GPUs per node")
    return cfg, hardware_root or default_root(cfg.directory), cfg.gpus_per_node


@cluster.command(short_help="Break a node's simulated hardware, slow it, or kill its ranks.")
@_dir_option
@_hardware_option
@click.argument("node")
@click.option(
    "--fault",
    required=True,
    help="xid79/ecc/nvlink/ib change the node's simulated hardware; kill kills its replica "
    "processes with no hardware sign; slow[=FACTOR] (default 2) makes its replica ranks that "
    "much slower (a straggler); down is a power loss: the node's slurmd and every process of "
    "its jobs are killed at once and Slurm finds the node down by itself ('heal' boots it).",
)
@_gpus_option
def inject(
    directory: Path, hardware_root: Path | None, node: str, fault: str, gpus: int | None
) -> None:
    """Make NODE of the dev cluster under --dir fail the way real hardware does (or kill its
    replica processes).

    Only that cluster is touched: NODE must be one of its nodes, `kill` matches processes by the
    cluster's SLURM_CONF, and a hardware or slow fault needs a cluster started with --health.
    """
    from runtime.control.inject import inject as do_inject

    cfg, root, gpus_per_node = _target(directory, hardware_root, node, fault, gpus)
    if fault == "down":
        from slurm.devcluster.power import power_off

        killed = power_off(cfg, node)
        click.echo(f"{node}: powered off, {len(killed)} processes killed (slurmd first)")
        return
    result = do_inject(root, node, fault, gpus_per_node, slurm_conf=cfg.conf_path)
    if fault == "kill":
        click.echo(f"{node}: killed {len(result)} replica processes {' '.join(result)}".rstrip())
    else:
        click.echo(f"{node}: faults now {', '.join(result)} ({root / node})")


@cluster.command(short_help="Stop slurmctld with its state, or start it again on that state.")
@_dir_option
@click.argument("action", type=click.Choice(["stop", "start"]))
def controller(directory: Path, action: str) -> None:
    """Stop the dev cluster's slurmctld (it saves its state and exits) or start it again on that
    state, as an upgrade or a failover does on a site; slurmds and jobs keep running."""
    from slurm.devcluster import controller as ctld

    cfg = devcluster.DevClusterConfig.load(directory.resolve())
    if action == "stop":
        pid = ctld.stop(cfg)
        click.echo("slurmctld was not running" if pid is None else f"slurmctld stopped (pid {pid})")
    else:
        click.echo(f"slurmctld answers (pid {ctld.start(cfg)})")


@cluster.command(short_help="Make a node's simulated hardware healthy again.")
@_dir_option
@_hardware_option
@click.argument("node")
@_gpus_option
def heal(directory: Path, hardware_root: Path | None, node: str, gpus: int | None) -> None:
    """Boot NODE again if it was powered off (`inject --fault down`) and restore its simulated
    hardware to healthy (the HealthCheckProgram resumes it)."""
    from runtime.control.inject import heal as do_heal
    from slurm.devcluster.daemons import live_daemons
    from slurm.devcluster.power import power_on

    cfg, root, gpus_per_node = _target(directory, hardware_root, node, None, gpus)
    if cfg.health:
        do_heal(root, node, gpus_per_node)
    live = live_daemons(cfg)
    if "slurmctld" in live and f"slurmd {node}" not in live:
        click.echo(f"{node}: booted, slurmd pid {power_on(cfg, node)}")
    elif not cfg.health:
        raise InputError(
            "NODE", node, "is up and the cluster has no simulated hardware: nothing to heal"
        )
    if cfg.health:
        click.echo(f"{node}: healthy ({root / node})")


__all__ = ["EnvironmentProblem", "cluster"]
