"""`fthsdp simulate`: effective training time at scale, synchronous vs FT-HSDP.

Thin front end over `runtime.sim`: parse the options into `SimParams`, run `compare`, show a
rich table (or `--json`), optionally write a plot. All modelling lives in `runtime.sim`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from slurm.errors import InputError


def _parse_counts(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InputError(
            "sweep_replicas", text, "a comma-separated list of whole numbers"
        ) from None
    if not counts:
        raise InputError("sweep_replicas", text, "a comma-separated list of whole numbers")
    return counts


def _fmt_s(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
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


def _table(records: list[dict[str, Any]]) -> Table:
    params = records[0]["params"]
    mtbf = params["job_mtbf_s"]
    rate = f"failure every {_fmt_s(mtbf)}" if mtbf else "no failures"
    title = (
        f"{params['gpus']:,} GPUs · {rate} · "
        f"{params['days']:g} days × {params['runs']} runs (seed {params['seed']})"
    )
    table = Table(title=title)
    for name in (
        "mode",
        "R",
        "ETTR % (95% CI)",
        "stall/fail",
        "recovery",
        "fail/day",
        "ckpt every",
        "ckpt",
    ):
        table.add_column(name, justify="left" if name == "mode" else "right", no_wrap=True)
    rows = [records[0]["sync"]] + [rec["fthsdp"] for rec in records]
    for s in rows:
        table.add_row(
            "sync" if s["mode"] == "sync" else "FT-HSDP",
            str(s["replicas"]),
            _fmt_ettr(s),
            _fmt_s(s["stall_s_mean"]),
            _fmt_s(s["recovery_s_mean"]),
            f"{s['failures_per_day']:.1f}",
            _fmt_interval(s["checkpoint_interval_s"], params["days"]),
            f"{s['checkpoint_overhead'] * 100:.1f}%",
        )
    return table


@click.command()
@click.option("--preset", default="paper-100k", show_default=True, help="Starting parameters.")
@click.option("--gpus", type=int, default=None, help="GPUs in the job.")
@click.option("--gpus-per-node", type=int, default=None)
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
@click.option("--seed", type=int, default=None)
@click.option(
    "--sweep-replicas", default=None, help="Comma-separated replica counts, e.g. 1,2,4,12."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write ETTR vs replica count to this PNG (needs matplotlib).",
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
    as_json: bool,
    plot: Path | None,
) -> None:
    """Simulate effective training time (ETTR) of synchronous vs FT-HSDP training under failures.

    Monte Carlo over RUNS runs of DAYS days each, from component costs (detection, allocation,
    NCCL init, checkpoint load or peer fetch, slow first step, lost work). The default preset
    is the paper's 98,304-GPU job in 12 replicas with a failure every ~18 minutes.
    """
    from runtime.sim import compare, params_from_options

    counts = _parse_counts(sweep_replicas)
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
    )
    if as_json:
        comparisons = compare(params, counts)
    else:
        with Console(stderr=True).status("simulating"):
            comparisons = compare(params, counts)
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
    if not console.is_terminal:
        console = Console(width=120)
    console.print(_table(records))
    if plot is not None:
        console.print(f"plot written to {plot}")
