"""The journal's records as lines for people: what `fthsdp events` prints.

Pure functions over the stored rows (JSON payloads, outcomes, times): the store reads them, this
module says what each one means in one line. A payload this version cannot read is shown as
unreadable rather than failing the listing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class JournalEntry:
    """One line of `fthsdp events`."""

    at: float
    kind: str
    replica: int | None
    text: str


def entries_from_rows(
    events: Iterable[tuple[Any, ...]],
    actions: Iterable[tuple[Any, ...]],
    attempts: Iterable[tuple[Any, ...]],
    rejections: Iterable[tuple[Any, ...]],
) -> list[JournalEntry]:
    """The lines for the stored rows, oldest first: events (at, type, replica, payload), their
    actions (at, type, replica, payload, status, result), the attempts at them (at, type,
    replica, outcome, detail, payload) and refusals (at, remote, path, status, reason)."""
    out: list[JournalEntry] = []
    for at, typ, replica, payload in events:
        if typ == "Tick":
            continue
        try:
            text = describe_event(json.loads(payload))
        except (ValueError, TypeError, KeyError) as exc:
            text = f"unreadable record ({exc}), skipped"
        out.append(JournalEntry(at, typ, replica, text))
    for at, typ, replica, payload, _status, _result in actions:
        out.append(JournalEntry(at, f"decide {typ}", replica, describe_action(payload)))
    for at, typ, replica, outcome, detail, payload in attempts:
        text = f"{describe_action(payload)}: {outcome}" + (f" ({detail})" if detail else "")
        out.append(JournalEntry(at, f"slurm {typ}", replica, text))
    for at, remote, path, status, reason in rejections:
        out.append(JournalEntry(at, "rejected", None, f"{status} {path} from {remote}: {reason}"))
    out.sort(key=lambda e: e.at)
    return out


def describe_event(data: dict[str, Any]) -> str:
    if data["type"] == "ReportReceived":
        r = data["report"]
        text = f"{r['kind']} report seq {r['seq']} step {r['step']} job {r['job_id']}"
        if r["kind"] == "fatal":
            text += f" failure={r['failure']} node={r['failed_node']} exit={r['exit_code']}"
            if r.get("last_error"):
                text += f": {r['last_error']}"
        return text
    if data["type"] == "JobObserved":
        return f"job {data['job_id']} {data['state']} restarts {data['restarts']}"
    if data["type"] == "OperatorRequeue":
        return f"operator requeue (drain {data['drain_node']}): {data['reason']}"
    return data["type"]


def describe_action(payload: str) -> str:
    data = json.loads(payload)
    kind = data.pop("type")
    data.pop("replica", None)
    if data.get("last_heard") is None:
        data.pop("last_heard", None)  # set only for a silent replica's Requeue
    return kind + " " + " ".join(f"{k}={v}" for k, v in data.items())
