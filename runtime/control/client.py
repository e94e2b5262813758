"""Operator-side access to a run's control plane: its state, a manual requeue, its journal.

`fthsdp status`, `fthsdp requeue` and `fthsdp events` call these. The coordinator's address comes
from `run_dir/control.json`; when the coordinator cannot be reached, status falls back to Slurm's
view alone and requeue acts on Slurm directly through `slurm.backend` (and says so), so an
operator is never stuck behind a dead control job. An answer is believed only when it is signed
for the request's own nonce under the control key (`runtime.protocol.verify_answer`); a status
answer that is not is treated as no coordinator. The journal's text is escaped before anyone
prints it (`journal_entries`): a leader's report may carry any characters.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

from runtime.control.journal.describe import JournalEntry
from runtime.control.journal.schema import JOURNAL_FILE
from runtime.control.journal.store import Journal
from runtime.protocol import (
    CONTROL_KEY,
    MAX_REPORT_BYTES,
    NONCE_HEADER,
    SignatureError,
    derive_key,
    sign,
    verify_answer,
)
from slurm.backend import NodeInfo, SlurmBackend, check_node_name, drain_reason
from slurm.errors import InputError
from slurm.hostlist import job_nodes
from slurm.rundir import read_control, read_secret

#: squeue state -> the status table's state when the coordinator has nothing to say of the
#: job: "running" is Slurm's word alone (what its ranks do, training or waiting for the control
#: plane, only the coordinator knows).
_SLURM_STATE = {"PENDING": "pending", "RUNNING": "running", "REQUEUED": "requeued"}


def coordinator_url(run_dir: Path) -> str | None:
    """The coordinator's URL from `control.json`; None while there is none (not written yet,
    or being replaced). A file of another shape is an `InputError`, never "no coordinator"."""
    found = read_control(run_dir)
    return None if found is None else found.coordinator


def fetch_state(run_dir: Path, timeout: float = 2.0) -> dict[str, Any] | None:
    """The coordinator's `/v1/state` (a request signed with the control key), or None when
    there is no reachable coordinator, no readable secret, or the answer is not a state."""
    url = coordinator_url(run_dir)
    if url is None:
        return None
    try:
        secret = read_secret(Path(run_dir) / "secret")
    except OSError:
        return None
    headers = sign(secret, CONTROL_KEY, "GET", "/v1/state")
    req = urllib.request.Request(url + "/v1/state", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read(_STATE_MAX + 1)
            key = derive_key(secret, CONTROL_KEY)
            verify_answer(key, "GET", "/v1/state", headers[NONCE_HEADER], raw, resp.headers)
        if len(raw) > _STATE_MAX:
            return None
        data = json.loads(raw)
    except (OSError, ValueError, RecursionError):  # SignatureError is a ValueError
        return None
    if not isinstance(data, dict) or not isinstance(data.get("replicas"), list):
        return None
    data["url"] = url
    return data


#: The largest `/v1/state` answer read (a run of 100,000 replicas is well under it).
_STATE_MAX = 512 * 1024 * 1024


def merge_status(
    base: dict[str, Any], coord: dict[str, Any] | None, nodes: list[NodeInfo]
) -> dict[str, Any]:
    """Add `replicas`, `drained` and the quorum/cursor to the squeue-based status of a run."""
    rows = {r["replica"]: r for r in base.get("jobs", []) if r.get("role") == "replica"}
    creps = {r["replica"]: r for r in (coord or {}).get("replicas", [])}
    replicas = []
    for k in sorted(set(rows) | set(creps)):
        row, c = rows.get(k, {}), creps.get(k)
        slurm_state = str(row.get("state", "")).upper()
        # Slurm restarted the job since the coordinator last polled it: the coordinator's
        # phase is the lost incarnation's, which Slurm's state replaces until it catches up.
        behind = (
            c is not None
            and isinstance(row.get("restarts"), int)
            and (row["restarts"] > (c["restarts"] or 0))
        )
        if c and not behind:
            state = c["phase"]
        elif behind and slurm_state == "RUNNING":
            state = "starting"  # a new incarnation the coordinator has not seen yet
        else:
            state = _SLURM_STATE.get(slurm_state, slurm_state.lower() or "-")
        if slurm_state in ("PENDING", "REQUEUED") and state in ("starting", "restarting"):
            state = "pending"
        nodes_field = [n for n in row.get("nodes", []) if n] or (c["nodes"] if c else [])
        restarts = row.get("restarts")
        if restarts is None and c is not None:
            restarts = c["restarts"]
        replicas.append(
            {
                "replica": k,
                "job_id": row.get("job_id") or (c["job_id"] if c else None),
                "state": state,
                "slurm_state": slurm_state or None,
                "nodes": nodes_field,
                "step": c["step"] if c else None,
                "restarts": restarts,
                "relaunches": c["relaunches"] if c else None,
                "requeues": (c["requeues"] + c["slurm_requeues"]) if c else None,
                "last_failure": c["last_failure"] if c else None,
            }
        )
    drained = {d["node"]: d["reason"] for d in (coord or {}).get("drained", [])}
    for n in nodes:
        if n.drained_by_us:
            drained[n.name] = n.reason
    out = dict(base)
    out["replicas"] = replicas
    out["drained"] = [{"node": n, "reason": r} for n, r in sorted(drained.items())]
    out["coordinator"] = coord.get("url") if coord else None
    out["quorum_id"] = coord.get("quorum_id") if coord else None
    out["participants"] = coord.get("participants") if coord else None
    out["cursor"] = coord.get("cursor") if coord else None
    return out


def request_requeue(
    run_dir: Path,
    replica: int,
    backend: SlurmBackend,
    drain: str | None = None,
    reason: str = "requeued by operator",
    timeout: float = 5.0,
) -> dict[str, Any]:
    """Requeue one replica's job (draining `drain` first) via the coordinator, else directly."""
    from slurm.rundir import read_run

    job_id = read_run(run_dir).replica(replica).job_id
    url = coordinator_url(run_dir)
    if url is not None:
        body = json.dumps({"replica": replica, "drain": drain, "reason": reason}).encode()
        headers = {"Content-Type": "application/json"}
        secret = read_secret(Path(run_dir) / "secret")
        headers.update(sign(secret, CONTROL_KEY, "POST", "/v1/requeue", body))
        req = urllib.request.Request(url + "/v1/requeue", data=body, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read(MAX_REPORT_BYTES + 1)
                answer_headers = resp.headers
            key = derive_key(secret, CONTROL_KEY)
            nonce = headers[NONCE_HEADER]
            verify_answer(key, "POST", "/v1/requeue", nonce, raw, answer_headers)
            answer = json.loads(raw)
            found = answer.get("job_id") if isinstance(answer, dict) else None
            return {"via": "coordinator", "job_id": found if isinstance(found, str) else job_id}
        except urllib.error.HTTPError as exc:
            if 400 <= exc.code < 500:
                detail = exc.read(2000).decode(errors="replace")
                raise InputError(
                    "--replica", replica, f"refused by the coordinator: {detail}"
                ) from None
        except (OSError, SignatureError, ValueError, RecursionError):
            pass  # no coordinator, or an answer it did not sign: act on Slurm directly
    if drain:
        # As through the coordinator: only a node Slurm lists for this replica's job.
        check_node_name(drain, "drain")
        nodes = {
            n for j in backend.jobs([job_id]) if j.base_id == job_id for n in job_nodes(j.nodes)
        }
        if drain not in nodes:
            raise InputError("--drain", drain, f"a node of job {job_id}: {sorted(nodes)}")
    drained = backend.drain(drain, drain_reason("manual", reason)) if drain else None
    backend.requeue(job_id)
    backend.release(job_id)
    return {"via": "slurm", "job_id": job_id, "drained": drained}


def escaped(text: str) -> str:
    """`text` with every character outside printable ASCII written as a Python escape (`\\x1b`,
    `\\u202e`, `\\n`): what a report carried stays visible, and no terminal acts on it."""
    return "".join(c if " " <= c <= "~" else c.encode("unicode_escape").decode() for c in text)


def journal_entries(run_dir: Path) -> list[JournalEntry]:
    """The journal's entries, oldest first, their text escaped for a terminal (`escaped`)."""
    path = Path(run_dir) / JOURNAL_FILE
    if not path.exists():
        raise InputError("RUN_DIR", str(run_dir), f"a run directory with {JOURNAL_FILE}")
    journal = Journal(path)
    try:
        entries = journal.entries()
    finally:
        journal.close()
    return [replace(e, kind=escaped(e.kind), text=escaped(e.text)) for e in entries]
