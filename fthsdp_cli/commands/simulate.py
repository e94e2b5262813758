"""`fthsdp simulate`: effective training time at scale, synchronous vs FT-HSDP.

Thin front end over `runtime.sim`: parse the options into `SimParams`, run `compare`, show a
rich table (or `--json`), optionally write a plot. All modelling lives in `runtime.sim`.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from slurm.errors import InputError


def _parse_counts(text: str | None, option: str = "--sweep-replicas") -> list[int] | None:
    if text is None:
        return None
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        counts = []
    if not counts:
        raise InputError(option, text, "a comma-separated list of whole numbers")
    return counts


def spares_table(rows: list[dict[str, Any]]) -> Table:
    """ETTR vs spare nodes: what each K buys, and what it costs in nodes held."""
    table = Table(title="FT-HSDP with hot spares (ETTR vs spare nodes, cold and warm slots)")
    cols = ("spare nodes", "kind", "slots", "ETTR", "per node held", "recovery s", "moves/day")
    for col in cols:
        table.add_column(col, justify="right")
    for r in rows:
        rec = r["recovery_s_mean"]
        table.add_row(
            str(r["spare_nodes"]),
            str(r["spare_kind"]),
            str(r["spare_slots"]),
            f"{r['ettr']:.1%}",
            f"{r['ettr_per_node_held']:.1%}",
            "-" if rec is None else f"{rec:.0f}",
            f"{r['spare_moves_per_day']:.1f}",
        )
    return table


#: What matplotlib writes without extra packages; anything else fails only after the run.
PLOT_SUFFIXES = (".png", ".pdf", ".svg")


def check_plot_path(path: Path) -> None:
    """Refuse a --plot path that cannot be written, before minutes of simulation."""
    import os

    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise InputError("--plot", str(path), f"a file ending in {', '.join(PLOT_SUFFIXES)}")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise InputError("--plot", str(path), f"a file in an existing folder ({parent} is not)")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise InputError("--plot", str(path), "a file this user can write")


def _fmt_s(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds >= 90 * 60:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _fmt_interval(seconds: float | None, days: float) -> str:
    if seconds is None or seconds >= days * 86_400:
        return "> run"
    return _fmt_s(seconds)


def _fmt_ettr(summary: dict[str, Any]) -> str:
    ci = summary["ettr_ci95"]
    text = f"{summary['ettr'] * 100:.1f}"
    if ci:
        text += f" ±{(ci[1] - summary['ettr']) * 100:.1f}"
    return text


#: Column headers, and the order in which narrow terminals drop them (least telling first).
COLUMNS = (
    "mode",
    "R",
    "ETTR %\n±95% CI",
    "stall\n/fail",
    "recovery",
    "fail\n/day",
    "ckpt\nevery",
    "ckpt",
)
DROP_ORDER = ("fail\n/day", "ckpt", "ckpt\nevery", "recovery")


def _table(records: list[dict[str, Any]], drop: tuple[str, ...] = ()) -> Table:
    from rich import box

    params = records[0]["params"]
    mtbf = params["job_mtbf_s"]
    rate = f"failure every {_fmt_s(mtbf)}" if mtbf else "no failures"
    title = (
        f"{params['gpus']:,} GPUs · {rate} · "
        f"{params['days']:g} days × {params['runs']} runs (seed {params['seed']})"
    )
    table = Table(title=title, box=box.SIMPLE_HEAD)
    keep = [name for name in COLUMNS if name not in drop]
    for name in keep:
        table.add_column(name, justify="left" if name == "mode" else "right", no_wrap=True)
    rows = [records[0]["sync"]] + [rec["fthsdp"] for rec in records]
    for s in rows:
        cells = {
            "mode": "sync" if s["mode"] == "sync" else "FT-HSDP",
            "R": str(s["replicas"]),
            COLUMNS[2]: _fmt_ettr(s),
            COLUMNS[3]: _fmt_s(s["stall_s_mean"]),
            "recovery": _fmt_s(s["recovery_s_mean"]),
            COLUMNS[5]: f"{s['failures_per_day']:.1f}",
            COLUMNS[6]: _fmt_interval(s["checkpoint_interval_s"], params["days"]),
            "ckpt": f"{s['checkpoint_overhead'] * 100:.1f}%",
        }
        table.add_row(*(cells[name] for name in keep))
    return table


def fitted_table(records: list[dict[str, Any]], console: Console) -> Table:
    """The table, less its least telling columns until it fits the console's width."""
    drop: tuple[str, ...] = ()
    table = _table(records)
    for name in DROP_ORDER:
        wide = console.options.update_width(10_000)  # measure unclamped by the console
        if console.measure(table, options=wide).maximum <= console.width:
            break
        drop = (*drop, name)
        table = _table(records, drop)
    return table


def as_option_error(exc: InputError, options: dict[str, str]) -> InputError:
    """The same error naming options (`--mtbf-minutes`) where it named fields (`mtbf_minutes`)."""
    allowed = exc.allowed
    for name, option in options.items():
        if "_" in name:
            allowed = re.sub(rf"\b{name}\b", option, allowed)
    return InputError(options.get(exc.field, exc.field), exc.value, allowed)


def _option_names(ctx: click.Context) -> dict[str, str]:
    """Python field -> the option that sets it, so an error names what the user typed."""
    return {p.name: p.opts[0] for p in ctx.command.params if p.name and p.opts}


@click.command()
@click.option("--preset", default="paper-100k", show_default=True, help="Starting parameters.")
@click.option("--gpus", type=int, default=None, help="GPUs in the job.")
@click.option("--gpus-per-node", type=int, default=None, help="GPUs per node.")
@click.option(
    "--replicas", type=int, default=None, help="FT-HSDP replicas (must divide the nodes)."
)
@click.option("--mtbf-minutes", type=float, default=None, help="Job MTBF at this size.")
@click.option(
    "--failures-per-1000-nodes-day", type=float, default=None, help="Per-node failure rate."
)
@click.option("--rack-failures-per-day", type=float, default=None, help="Correlated rack events.")
@click.option("--rack-span-replicas", type=int, default=None, help="Replicas one rack event hits.")
@click.option("--checkpoint-interval-s", type=float, default=None, help="Default: Young/Daly.")
@click.option(
    "--report-interval-s", type=float, default=None, help="Status report interval (default 1)."
)
@click.option(
    "--reporters-per-replica",
    type=int,
    default=None,
    help="Reporters per replica: 1 (the leader) or its node count (per-node watchdogs).",
)
@click.option(
    "--report-cost-s",
    type=float,
    default=None,
    help="Coordinator time per report (default: measured by benchmarks/control_load.py).",
)
@click.option("--checkpoint-write-s", type=float, default=None, help="Blocking write time.")
@click.option("--days", type=float, default=None, help="Simulated wall-clock days per run.")
@click.option("--runs", type=int, default=None, help="Monte Carlo runs.")
@click.option("--seed", type=int, default=None, help="Seed of the Monte Carlo runs.")
@click.option(
    "--sweep-replicas", default=None, help="Comma-separated replica counts, e.g. 1,2,4,12."
)
@click.option(
    "--queue-wait-s",
    type=float,
    default=None,
    help="Mean queue wait for nodes when a replica is requeued (0: nodes free at once).",
)
@click.option(
    "--spare-nodes", type=int, default=None, help="Nodes held as hot spares ([spares] nodes)."
)
@click.option(
    "--spare-kind",
    type=click.Choice(["cold", "warm"]),
    default=None,
    help="Cold slots hold nodes; warm ones run the replica's processes, ready to take over.",
)
@click.option(
    "--sweep-spares",
    default=None,
    help="Comma-separated spare node counts: ETTR vs K, cold and warm slots.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write ETTR vs replica count to this .png, .pdf or .svg (needs matplotlib).",
)
def simulate(
    preset: str,
    gpus: int | None,
    gpus_per_node: int | None,
    replicas: int | None,
    mtbf_minutes: float | None,
    failures_per_1000_nodes_day: float | None,
    rack_failures_per_day: float | None,
    rack_span_replicas: int | None,
    checkpoint_interval_s: float | None,
    report_interval_s: float | None,
    reporters_per_replica: int | None,
    report_cost_s: float | None,
    checkpoint_write_s: float | None,
    days: float | None,
    runs: int | None,
    seed: int | None,
    sweep_replicas: str | None,
    queue_wait_s: float | None,
    spare_nodes: int | None,
    spare_kind: str | None,
    sweep_spares: str | None,
    as_json: bool,
    plot: Path | None,
) -> None:
    """Simulate effective training time (ETTR) of synchronous vs FT-HSDP training under failures.

    Monte Carlo over RUNS runs of DAYS days each, from component costs (detection, allocation,
    NCCL init, checkpoint load or peer fetch, slow first step, lost work). The default preset
    is the paper's 98,304-GPU job in 12 replicas with a failure every ~18 minutes.
    """
    from runtime.sim import compare, params_from_options

    if plot is not None:
        check_plot_path(plot)
    counts = _parse_counts(sweep_replicas)
    spares = _parse_counts(sweep_spares, "--sweep-spares")
    try:
        params = params_from_options(
            preset,
            mtbf_minutes=mtbf_minutes,
            failures_per_1000_nodes_day=failures_per_1000_nodes_day,
            gpus=gpus,
            gpus_per_node=gpus_per_node,
            replicas=replicas,
            rack_failures_per_day=rack_failures_per_day,
            rack_span_replicas=rack_span_replicas,
            checkpoint_interval_s=checkpoint_interval_s,
            report_interval_s=report_interval_s,
            reporters_per_replica=reporters_per_replica,
            report_cost_s=report_cost_s,
            checkpoint_write_s=checkpoint_write_s,
            days=days,
            runs=runs,
            seed=seed,
            queue_wait_s=queue_wait_s,
            spare_nodes=spare_nodes,
            spare_kind=spare_kind,
        )
        if spares is not None:
            from runtime.sim import spares_sweep

            kinds = (spare_kind,) if spare_kind else ("cold", "warm")
            rows = spares_sweep(params, spares, kinds)
            if as_json:
                click.echo(json.dumps(rows, indent=2))
            else:
                Console().print(spares_table(rows))
            return
        if as_json:
            comparisons = compare(params, counts)
        else:
            with Console(stderr=True).status("simulating"):
                comparisons = compare(params, counts)
    except InputError as exc:
        raise as_option_error(exc, _option_names(click.get_current_context())) from None
    records = [c.record(params) for c in comparisons]
    for c in comparisons:
        # one coordinator per run: warn (stderr, so --json stays parseable) when it cannot hold it
        line = params.control_load(c.fthsdp.replicas).warning()
        if line:
            click.echo(f"fthsdp simulate: R={c.fthsdp.replicas}: {line}", err=True)
    if plot is not None:
        from runtime.sim.plot import plot_ettr_vs_replicas

        plot_ettr_vs_replicas(records, plot)
    if as_json:
        click.echo(json.dumps(records if counts else records[0], indent=2))
        return
    console = Console()
    console.print(fitted_table(records, console))
    if plot is not None:
        console.print(f"plot written to {plot}", soft_wrap=True)
