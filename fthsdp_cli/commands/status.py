"""`fthsdp status`: where each replica of a run stands, from jobs.json joined with squeue.

`run_status` builds plain data (a dict that `--json` prints as is) and `_present` draws it with
rich; other sources (the coordinator's view) extend the data, not the presenter.
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
    view = coordinator_view(run_dir)
    if view is not None:
        data["stragglers"] = straggler_rows(view)
    return data


def coordinator_view(run_dir: Path, timeout_s: float = 2.0) -> dict[str, Any] | None:
    """The coordinator's `/v1/state`, or None when the control plane is not reachable."""
    import urllib.request

    try:
        url = json.loads((run_dir / "control.json").read_text())["coordinator"]
        with urllib.request.urlopen(url.rstrip("/") + "/v1/state", timeout=timeout_s) as resp:
            view = json.loads(resp.read())
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return view if isinstance(view, dict) else None


def straggler_rows(view: dict[str, Any]) -> list[dict[str, Any]]:
    """Straggler verdicts (suspects and stragglers) with the decision taken for each."""
    decisions = {d["replica"]: d for d in view.get("straggler_decisions", [])}
    rows = []
    for v in view.get("stragglers", []):
        d = decisions.get(v["replica"], {})
        rows.append({**v, "action": d.get("action"), "why": d.get("why")})
    return rows


def _present(status: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"run {status['name']} ({status['run_dir']})")
    for col in ("role", "replica", "job id", "state", "nodes", "restarts", "reason"):
        table.add_column(col)
    for row in status["jobs"]:
        table.add_row(
            row["role"],
            "" if row["replica"] is None else str(row["replica"]),
            row["job_id"],
            row["state"],
            " + ".join(n or "-" for n in row["nodes"]) or "-",
            "-" if row["restarts"] is None else str(row["restarts"]),
            row["reason"] if row["reason"] not in ("None", "") else "",
        )
    console = Console()
    console.print(table)
    for v in status.get("stragglers", []):
        text = f"replica {v['replica']}: {v['state']} {v['factor'] or 0:.1f}x"
        text += f" on {v['slow_node'] or 'unknown node'} for {v['steps']} steps"
        if v.get("action"):
            text += f" -> {v['action']} ({v['why']})"
        console.print(text)


@click.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def status(run_dir: Path, as_json: bool) -> None:
    """Show the state of a run's replicas and control job."""
    from slurm.backend import default_backend

    data = run_status(run_dir, default_backend())
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        _present(data)
