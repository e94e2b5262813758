"""`fthsdp status`, `fthsdp requeue`, `fthsdp events`: a run as Slurm and its control plane see it.

`run_status` builds plain data from jobs.json joined with squeue; `full_status` adds the
coordinator's view (`runtime.control.client`): per replica step, state, restarts, last failure,
plus the quorum, the cursor and the drained nodes. `--json` prints that dict as is;
`render_status` only draws it with rich, at any width down to 80 columns. `requeue` and
`events` are thin wrappers over the same client module.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from fthsdp_cli.commands import stderr_notice
from slurm.backend import SlurmBackend, SlurmCommandError


def run_status(
    run_dir: Path, backend: SlurmBackend, away: SlurmCommandError | None = None
) -> dict[str, Any]:
    """A run's state as plain data: the run's name and dir, and one row per job.

    `away`: slurmctld could not be asked at all (stopped, restarting), so squeue is not asked
    again; every job's state is `UNKNOWN` and `slurm_unreachable` says why (claiming the jobs
    `GONE` would be a misread)."""
    from slurm.rundir import job_rows, read_run

    record = read_run(run_dir)
    queued = backend.jobs(record.job_ids) if away is None else []
    rows = job_rows(record, queued)
    for row in rows:  # squeue says "None" for no reason: JSON says null
        if row.get("reason") in ("", "None"):
            row["reason"] = None
        if away is not None:
            row.update(state="UNKNOWN", restarts=None, reason=None)
    return {
        "name": record.name,
        "run_dir": record.run_dir,
        "submitted_at": record.submitted_at,
        "jobs": rows,
        "slurm_unreachable": None if away is None else str(away),
    }


def straggler_rows(view: dict[str, Any]) -> list[dict[str, Any]]:
    """Straggler verdicts (suspects and stragglers) with the decision taken for each."""
    decisions = {d["replica"]: d for d in view.get("straggler_decisions", [])}
    rows = []
    for v in view.get("stragglers", []):
        d = decisions.get(v["replica"], {})
        rows.append({**v, "action": d.get("action"), "why": d.get("why")})
    return rows


#: Slurm job states of a replica job that has ended, and the state shown for it.
_FINISHED = {"COMPLETED": "done", "FAILED": "failed", "CANCELLED": "cancelled"}
_FINISHED |= {"TIMEOUT": "timed out", "OUT_OF_MEMORY": "out of memory", "NODE_FAIL": "node failed"}


def settle_replicas(status: dict[str, Any]) -> None:
    """Make each replica row say what its job is now (pure; tested by a table).

    A job Slurm reports ended is shown as ended (the coordinator's last phase would still say
    `training`); a het replica's helper component's nodes go to `helper_nodes`, so `nodes` lists
    the trainer's nodes only."""
    components = {
        j["replica"]: list(j.get("nodes", []))
        for j in status.get("jobs", [])
        if j.get("role") == "replica"
    }
    for row in status.get("replicas", []):
        ended = _FINISHED.get(str(row.get("slurm_state") or ""))
        if ended and row["state"] not in ("done", "out", "ended"):
            row["state"] = ended
        comps = components.get(row["replica"], [])
        row["helper_nodes"] = [n for n in comps[1:] if n]
        if len(comps) > 1:
            row["nodes"] = [comps[0]] if comps[0] else []


def full_status(run_dir: Path, backend: SlurmBackend) -> dict[str, Any]:
    """`run_status` joined with the coordinator's view and the nodes fthsdp drained.

    `drained` is None, and `drained_unknown` says why, when Slurm's node list cannot be read:
    an empty list would claim that nothing is drained. While slurmctld cannot be asked at all,
    the coordinator's view is shown with the jobs' states unknown; with no coordinator either
    nothing is known, and the Slurm error is raised."""
    from runtime.control.client import fetch_state, merge_status
    from slurm.backend import SlurmCommandError
    from slurm.records import unreachable

    coord: dict[str, Any] | None = None
    try:
        base = run_status(run_dir, backend)
    except SlurmCommandError as exc:
        coord = fetch_state(run_dir) if unreachable(exc) else None
        if coord is None:
            raise
        base = run_status(run_dir, backend, away=exc)
    nodes: list[Any] | None = None
    unreadable = base["slurm_unreachable"]
    if unreadable is None:  # else asking again only waits as long once more
        try:
            nodes = backend.nodes()
        except SlurmCommandError as exc:  # unknown, not "none drained"
            unreadable = str(exc)
        coord = fetch_state(run_dir)
    merged = merge_status(base, coord, nodes or [])
    if nodes is None:
        merged["drained"] = None
        merged["drained_unknown"] = unreadable
    merged["stragglers"] = straggler_rows(coord or {})
    merged["outage"] = (coord or {}).get("outage")
    settle_replicas(merged)
    on_spares(merged, coord or {})
    return merged


def on_spares(status: dict[str, Any], coord: dict[str, Any]) -> None:
    """Show the spare pool (`spares`), and a replica that moved into a spare slot with the
    slot's job, nodes and Slurm state (jobs.json still names its old, cancelled job)."""
    pool = coord.get("spares")
    status["spares"] = pool
    if not pool or "slots" not in pool:
        return
    slots = {s["job_id"]: s for s in pool["slots"]}
    current = {r["replica"]: r for r in coord.get("replicas", [])}
    for row in status.get("replicas", []):
        c = current.get(row["replica"])
        slot = slots.get(c["job_id"]) if c else None
        if c is None or slot is None or slot.get("replica") != row["replica"]:
            continue
        row["job_id"] = slot["job_id"]
        row["nodes"] = list(slot["nodes"]) or row["nodes"]
        row["helper_nodes"] = []
        row["slurm_state"] = slot["state"]
        row["spare"] = True
        ended = _FINISHED.get(str(slot["state"] or ""))
        row["state"] = ended if ended and c["phase"] not in ("done", "out") else c["phase"]


def spare_lines(pool: dict[str, Any] | None) -> list[str]:
    """The pool in words: slots, their health and use; a fallback to plain requeue."""
    if not pool:
        return []
    if "error" in pool:
        return [f"spares: unreadable ({pool['error']})"]
    lines = [
        f"spares: {pool['idle']} idle, {pool['in_use']} in use, target {pool['target']} "
        "available (idle or queued)"
    ]
    for s in pool["slots"]:
        use = f"replica {s['replica']}" if s["replica"] is not None else "idle"
        if s.get("warm") and s["replica"] is None:
            use += " (warm: its processes wait, model built)"
        bad = f" ({','.join(s['bad_nodes'])} failed a check)" if s["bad_nodes"] else ""
        nodes = ",".join(s["nodes"]) or "-"
        lines.append(
            f"  slot {s['job_id']}: {_dash(s['state'])} on {nodes}, {s['health']}{bad}, {use}"
        )
    if not pool["idle"]:
        lines.append("  pool empty: the next node fault requeues its replica (waits for Slurm)")
    last = pool.get("last_fallback")
    if last:
        lines.append(f"  replica {last['replica']} (job {last['job_id']}): {last['why']}")
    return lines


def quorum_line(status: dict[str, Any]) -> str:
    """The coordinator's line: its address and the quorum, or that there is none yet."""
    if not status.get("coordinator"):
        return "coordinator: not reachable (Slurm's view only)"
    quorum = status.get("quorum_id")
    if quorum is None or quorum < 0:
        return f"coordinator {status['coordinator']}: no quorum yet"
    return (
        f"coordinator {status['coordinator']}: quorum {quorum} of "
        f"{status['participants']} replicas, data cursor {status['cursor']}"
    )


def straggler_line(v: dict[str, Any]) -> str:
    """One straggler verdict in words: a suspect is only watched; a straggler may be evicted."""
    where = f"on {v['slow_node']}" if v.get("slow_node") else "on an unknown node"
    pace = f"{v['factor'] or 0:.1f}x the others' step time {where} for {v['steps']} steps"
    if v["state"] == "suspect":
        text = f"replica {v['replica']}: slow, {pace}; watched, no action unless it lasts"
    else:
        text = f"replica {v['replica']}: straggler ({pace})"
    if v.get("action"):
        text += f" -> {v['action']} ({v['why']})"
    return text


def _dash(value: Any) -> str:
    return "-" if value is None else str(value)


def render_status(status: dict[str, Any]) -> Any:
    """The status as a rich renderable that fits 80 columns: names fold, never get cut, and each
    failure is a line below the table rather than a wrapped cell."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"run {status['name']} ({status['run_dir']})", box=box.SIMPLE_HEAD)
    for col in ("replica", "job", "nodes", "step", "state", "requeued", "relaunched"):
        table.add_column(col, overflow="fold", no_wrap=col != "nodes")
    for row in status["replicas"]:
        nodes = ",".join(row["nodes"]) or "-"
        if row.get("helper_nodes"):
            nodes += f" (helper: {','.join(row['helper_nodes'])})"
        table.add_row(
            str(row["replica"]),
            row["job_id"] or "-",
            nodes,
            _dash(row["step"]),
            row["state"],
            _dash(row["restarts"]),
            _dash(row["relaunches"]),
        )
    lines = [
        f"replica {row['replica']} last failure: {row['last_failure']}"
        for row in status["replicas"]
        if row.get("last_failure")
    ]
    for job in status["jobs"]:
        if job["role"] == "control":
            lines.append(f"control job {job['job_id']}: {job['state']}")
    lines.append(quorum_line(status))
    if status.get("outage"):
        o = status["outage"]
        lines.append(
            f"CONTROL PLANE PROBLEM: {len(o['silent'])} of {o['watched']} replicas silent at once "
            "(the coordinator does not hear them); nothing is drained or requeued for silence"
        )
    if status["drained"] is None:
        lines.append("drained: unknown (Slurm's node list could not be read)")
    for d in status["drained"] or []:
        lines.append(f"drained {d['node']}: {d['reason']}")
    lines.extend(straggler_line(v) for v in status.get("stragglers", []))
    lines.extend(spare_lines(status.get("spares")))
    return Group(table, *(Text(line) for line in lines))


_render = render_status  # the demo draws the same table


def _watch(
    run_dir: Path, backend: SlurmBackend, data: dict[str, Any], as_json: bool, interval: float
) -> None:
    """Refresh every `interval` seconds until interrupted: a live table on a terminal, one
    snapshot per interval into a pipe or file, JSON lines only with `--json`."""
    import signal
    import time

    from rich.console import Console
    from rich.live import Live

    # It runs until interrupted, so SIGINT must interrupt it even when the parent ignored it
    # (a shell without job control starts its background commands so).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    console = Console()
    if as_json or not console.is_terminal:
        while True:
            if as_json:
                click.echo(json.dumps(data))
            else:
                console.print(render_status(data))
                click.echo("")
            time.sleep(interval)
            data = full_status(run_dir, backend)
    with Live(render_status(data), console=console, refresh_per_second=4) as live:
        while True:
            time.sleep(interval)
            live.update(render_status(full_status(run_dir, backend)))


@click.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option(
    "--watch",
    is_flag=True,
    help="Refresh until interrupted: live on a terminal; into a pipe one snapshot per interval "
    "(with --json one JSON object per line).",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0, min_open=True),
    default=2.0,
    show_default=True,
    help="Seconds between refreshes.",
)
def status(run_dir: Path, as_json: bool, watch: bool, interval: float) -> None:
    """Show the state of a run's replicas and control job.

    A replica row's `requeued` counts Slurm requeues (new nodes), `relaunched` restarts in place.
    While slurmctld cannot be reached, the jobs' states are shown as UNKNOWN beside the control
    plane's view (a line on stderr says so); exit 3 when Slurm fails otherwise, or when neither
    Slurm nor the control plane answers.
    """
    from rich.console import Console

    from slurm.backend import make_backend
    from slurm.rundir import check_run_files
    from slurm.submit import check_slurm_conf

    check_run_files(run_dir)
    check_slurm_conf()
    # One try: while slurmctld is away, status shows the control plane's view at once.
    backend = make_backend(notice=stderr_notice, retries=1)
    data = full_status(run_dir, backend)
    if data.get("slurm_unreachable"):
        away = data["slurm_unreachable"]
        click.echo(f"Slurm not answering, job states unknown: {away}", err=True)
    elif data.get("drained_unknown"):
        click.echo(f"drained nodes unknown: {data['drained_unknown']}", err=True)
    if not watch:
        if as_json:
            click.echo(json.dumps(data, indent=2))
        else:
            Console().print(render_status(data))
        return
    try:
        _watch(run_dir, backend, data, as_json, interval)
    except KeyboardInterrupt:
        return
    except BrokenPipeError:  # `| head`: the reader is gone, nothing left to say
        import os
        import sys

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


@click.command()
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option(
    "--replica",
    required=True,
    type=click.IntRange(min=0),
    help="The replica whose job to requeue.",
)
@click.option(
    "--drain",
    "drain_node",
    default=None,
    help="Drain this node first (only a node of the replica's own job).",
)
@click.option(
    "--reason",
    default="requeued by operator",
    show_default=True,
    help="Why, for the journal (and the drain reason with --drain).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def requeue(
    run_dir: Path, replica: int, drain_node: str | None, reason: str, as_json: bool
) -> None:
    """Requeue one replica's job (draining a node first), through the coordinator if it runs."""
    from runtime.control.client import request_requeue
    from slurm.backend import make_backend
    from slurm.rundir import check_run_files
    from slurm.submit import check_slurm_conf

    check_run_files(run_dir, spec=False)
    check_slurm_conf()
    backend = make_backend(notice=stderr_notice)
    result = request_requeue(run_dir, replica, backend, drain_node, reason)
    if as_json:
        click.echo(json.dumps(result))
    else:
        click.echo(f"replica {replica}: job {result['job_id']} requeued (via {result['via']})")


def event_text(kind: str, text: str) -> str:
    """`kind: text`, or the kind alone when the text only repeats it."""
    return kind if text.strip() in ("", kind) else f"{kind}: {text}"


@click.command()
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option("--last", type=click.IntRange(min=1), default=None, help="Only the last N entries.")
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
            click.echo(f"{when} {who}{event_text(e.kind, e.text)}")
