"""`fthsdp status`, `fthsdp requeue`, `fthsdp events`: a run as Slurm and its control plane see it.

`run_status` builds plain data from jobs.json joined with squeue; `full_status` adds the
coordinator's view (`runtime.control.client`): per replica step, state, restarts, last failure,
plus the quorum, the cursor and the drained nodes. `--json` prints that dict as is; `_render`
only draws it with rich. `requeue` and `events` are thin wrappers over the same client module.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from slurm.backend import SlurmBackend


def run_status(run_dir: Path, backend: SlurmBackend) -> dict[str, Any]:
    """A run's state as plain data: the run's name and dir, and one row per job."""
    from slurm.run_dir import job_rows, read_run

    record = read_run(run_dir)
    queued = backend.jobs(record.job_ids)
    data = {
        "name": record.name,
        "run_dir": record.run_dir,
        "submitted_at": record.submitted_at,
        "jobs": job_rows(record, queued),
    }
    return data


def straggler_rows(view: dict[str, Any]) -> list[dict[str, Any]]:
    """Straggler verdicts (suspects and stragglers) with the decision taken for each."""
    decisions = {d["replica"]: d for d in view.get("straggler_decisions", [])}
    rows = []
    for v in view.get("stragglers", []):
        d = decisions.get(v["replica"], {})
        rows.append({**v, "action": d.get("action"), "why": d.get("why")})
    return rows


def full_status(run_dir: Path, backend: SlurmBackend) -> dict[str, Any]:
    """`run_status` joined with the coordinator's view and the nodes fthsdp drained.

    `drained` is None, and `drained_unknown` says why, when Slurm's node list cannot be read:
    an empty list would claim that nothing is drained."""
    from runtime.control.client import fetch_state, merge_status
    from slurm.backend import SlurmCommandError

    base = run_status(run_dir, backend)
    try:
        nodes: list[Any] | None = backend.nodes()
    except SlurmCommandError as exc:  # unknown, not "none drained"
        nodes = None
        unreadable = str(exc)
    coord = fetch_state(run_dir)
    merged = merge_status(base, coord, nodes or [])
    if nodes is None:
        merged["drained"] = None
        merged["drained_unknown"] = unreadable
    merged["stragglers"] = straggler_rows(coord or {})
    return merged


def _render(status: dict[str, Any]) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"run {status['name']} ({status['run_dir']})")
    for col in ("replica", "job id", "nodes", "step", "state", "restarts", "relaunches", "failure"):
        table.add_column(col)
    for row in status["replicas"]:
        table.add_row(
            str(row["replica"]),
            row["job_id"] or "-",
            ",".join(row["nodes"]) or "-",
            "-" if row["step"] is None else str(row["step"]),
            row["state"],
            "-" if row["restarts"] is None else str(row["restarts"]),
            "-" if row["relaunches"] is None else str(row["relaunches"]),
            (row["last_failure"] or "")[:60],
        )
    control = [j for j in status["jobs"] if j["role"] == "control"]
    lines = []
    for job in control:
        lines.append(f"control job {job['job_id']}: {job['state']}")
    if status["coordinator"]:
        lines.append(
            f"coordinator {status['coordinator']}: quorum {status['quorum_id']}, "
            f"{status['participants']} participants, cursor {status['cursor']}"
        )
    else:
        lines.append("coordinator: not reachable (Slurm's view only)")
    if status["drained"] is None:
        lines.append("drained: unknown (Slurm's node list could not be read)")
    for d in status["drained"] or []:
        lines.append(f"drained {d['node']}: {d['reason']}")
    for v in status.get("stragglers", []):
        text = f"replica {v['replica']}: {v['state']} {v['factor'] or 0:.1f}x"
        text += f" on {v['slow_node'] or 'unknown node'} for {v['steps']} steps"
        if v.get("action"):
            text += f" -> {v['action']} ({v['why']})"
        lines.append(text)
    return Group(table, *(Text(line) for line in lines))


@click.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--watch", is_flag=True, help="Keep the table live until interrupted.")
@click.option("--interval", default=2.0, show_default=True, help="Seconds between refreshes.")
def status(run_dir: Path, as_json: bool, watch: bool, interval: float) -> None:
    """Show the state of a run's replicas and control job."""
    import time

    from rich.console import Console
    from rich.live import Live

    from slurm.backend import default_backend
    from slurm.run_dir import check_run_files
    from slurm.submit import check_slurm_conf

    check_run_files(run_dir)
    check_slurm_conf()
    backend = default_backend()
    data = full_status(run_dir, backend)
    if data.get("drained_unknown"):
        click.echo(f"drained nodes unknown: {data['drained_unknown']}", err=True)
    if as_json and not watch:
        click.echo(json.dumps(data, indent=2))
        return
    if not watch:
        Console().print(_render(data))
        return
    with Live(_render(data), refresh_per_second=4) as live:
        try:
            while True:
                time.sleep(interval)
                data = full_status(run_dir, backend)
                if as_json:
                    click.echo(json.dumps(data))
                else:
                    live.update(_render(data))
        except KeyboardInterrupt:
            pass


@click.command()
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--replica", required=True, type=int, help="The replica whose job to requeue.")
@click.option("--drain", "drain_node", default=None, help="Drain this node first.")
@click.option("--reason", default="requeued by operator", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def requeue(
    run_dir: Path, replica: int, drain_node: str | None, reason: str, as_json: bool
) -> None:
    """Requeue one replica's job (draining a node first), through the coordinator if it runs."""
    from runtime.control.client import request_requeue
    from slurm.backend import default_backend
    from slurm.run_dir import check_run_files
    from slurm.submit import check_slurm_conf

    check_run_files(run_dir, spec=False)
    check_slurm_conf()
    result = request_requeue(run_dir, replica, default_backend(), drain_node, reason)
    if as_json:
        click.echo(json.dumps(result))
    else:
        click.echo(f"replica {replica}: job {result['job_id']} requeued (via {result['via']})")


@click.command()
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option("--last", type=int, default=None, help="Only the last N entries.")
def events(run_dir: Path, as_json: bool, last: int | None) -> None:
    """Print the run's control-plane journal (reports, decisions, Slurm actions), newest last."""
    import dataclasses
    from datetime import datetime

    from runtime.control.client import journal_entries

    entries = journal_entries(run_dir)
    if last is not None:
        entries = entries[-last:]
    for e in entries:
        if as_json:
            click.echo(json.dumps(dataclasses.asdict(e)))
        else:
            when = datetime.fromtimestamp(e.at).strftime("%H:%M:%S.%f")[:-3]
            who = "" if e.replica is None else f"r{e.replica} "
            click.echo(f"{when} {who}{e.kind}: {e.text}")
