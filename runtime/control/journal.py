"""The coordinator's durable journal: SQLite in the run directory.

Everything the coordinator learns or does is written here before it matters: every accepted
event (leader reports, squeue observations, ticks that changed something, operator requests), the
actions the policy decided for it (in the same transaction, so a decision is never half-stored),
every attempt to carry out a Slurm action and its result, every refused request, and the nonces
of accepted reports (replay protection survives a restart).

After a restart (the control job itself was requeued, or the process was killed) the coordinator
replays the events through the pure policy to get its state back, and carries out only the Slurm
actions whose outcome was never recorded. Actions in state `started` may have reached Slurm
before the crash; the executor checks Slurm before repeating them (a Requeue whose job's restart
count already rose is done), so no decision is lost and none is carried out twice.

The database uses WAL and `synchronous=FULL`: a committed row survives `kill -9`.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.control.policy import (
    SLURM_ACTIONS,
    Action,
    Event,
    PolicyConfig,
    RunState,
    action_from_dict,
    action_to_dict,
    event_from_dict,
    event_to_dict,
    step,
)

JOURNAL_FILE = "control.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    type TEXT NOT NULL,
    replica INTEGER,
    payload TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS actions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    event_seq INTEGER NOT NULL REFERENCES events(seq),
    type TEXT NOT NULL,
    replica INTEGER,
    payload TEXT NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    result TEXT,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS attempts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    action_id INTEGER NOT NULL REFERENCES actions(id),
    at REAL NOT NULL,
    outcome TEXT NOT NULL,
    detail TEXT
);
CREATE TABLE IF NOT EXISTS nonces (nonce TEXT PRIMARY KEY, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS rejections (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    remote TEXT,
    path TEXT,
    status INTEGER NOT NULL,
    reason TEXT NOT NULL
);
"""

#: Action states. `decided` -> `started` -> `done` | `failed` | `skipped`.
OPEN_STATES = ("decided", "started")


@dataclass(frozen=True)
class StoredAction:
    id: int
    event_seq: int
    action: Action
    status: str
    attempts: int


@dataclass(frozen=True)
class JournalEntry:
    """One line of `fthsdp events`."""

    at: float
    kind: str
    replica: int | None
    text: str


class Journal:
    """A thread-safe handle on the run's SQLite journal."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    @classmethod
    def in_run_dir(cls, run_dir: Path) -> Journal:
        return cls(run_dir / JOURNAL_FILE)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # -- writing ------------------------------------------------------------------------------

    def record(
        self, event: Event, actions: list[Action], nonce: str | None = None
    ) -> tuple[int, list[StoredAction]]:
        """Store an event, its nonce and the actions decided for it, atomically.

        Raises `KeyError` (and stores nothing) if the nonce was seen before.
        """
        now = time.time()
        payload = event_to_dict(event)
        replica = _replica_of(payload)
        stored: list[StoredAction] = []
        with self._tx() as db:
            if nonce is not None:
                try:
                    db.execute("INSERT INTO nonces VALUES (?, ?)", (nonce, now))
                except sqlite3.IntegrityError:
                    raise KeyError(nonce) from None
            cur = db.execute(
                "INSERT INTO events (at, type, replica, payload) VALUES (?, ?, ?, ?)",
                (event.at, payload["type"], replica, json.dumps(payload)),
            )
            seq = int(cur.lastrowid or 0)
            for action in actions:
                data = action_to_dict(action)
                status = "decided" if isinstance(action, SLURM_ACTIONS) else "done"
                cur = db.execute(
                    "INSERT INTO actions (event_seq, type, replica, payload, status, updated)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (seq, data["type"], data.get("replica"), json.dumps(data), status, now),
                )
                stored.append(StoredAction(int(cur.lastrowid or 0), seq, action, status, 0))
        return seq, stored

    def nonce_seen(self, nonce: str) -> bool:
        with self._lock:
            row = self._db.execute("SELECT 1 FROM nonces WHERE nonce = ?", (nonce,)).fetchone()
        return row is not None

    def attempt(self, action_id: int, outcome: str, detail: str = "") -> None:
        """Record one attempt at a Slurm action; `outcome` is started|done|failed|skipped|retry."""
        now = time.time()
        with self._tx() as db:
            db.execute(
                "INSERT INTO attempts (action_id, at, outcome, detail) VALUES (?, ?, ?, ?)",
                (action_id, now, outcome, detail[:2000]),
            )
            if outcome == "retry":
                db.execute(
                    "UPDATE actions SET attempts = attempts + 1, result = ?, updated = ?"
                    " WHERE id = ?",
                    (detail[:2000], now, action_id),
                )
            elif outcome == "started":
                db.execute(
                    "UPDATE actions SET status = 'started', attempts = attempts + 1, updated = ?"
                    " WHERE id = ?",
                    (now, action_id),
                )
            else:
                db.execute(
                    "UPDATE actions SET status = ?, result = ?, updated = ? WHERE id = ?",
                    (outcome, detail[:2000], now, action_id),
                )

    def reject(self, remote: str | None, path: str, status: int, reason: str) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO rejections (at, remote, path, status, reason) VALUES (?, ?, ?, ?, ?)",
                (time.time(), remote, path, status, reason[:500]),
            )

    # -- reading ------------------------------------------------------------------------------

    def events(self) -> list[tuple[int, Event]]:
        with self._lock:
            rows = self._db.execute("SELECT seq, payload FROM events ORDER BY seq").fetchall()
        return [(int(seq), event_from_dict(json.loads(p))) for seq, p in rows]

    def actions(self, states: tuple[str, ...] | None = None) -> list[StoredAction]:
        sql = "SELECT id, event_seq, payload, status, attempts FROM actions"
        args: tuple[Any, ...] = ()
        if states:
            sql += f" WHERE status IN ({','.join('?' * len(states))})"
            args = states
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY id", args).fetchall()
        return [
            StoredAction(int(i), int(s), action_from_dict(json.loads(p)), st, int(n))
            for i, s, p, st, n in rows
        ]

    def rejections(self) -> list[tuple[float, str | None, str, int, str]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT at, remote, path, status, reason FROM rejections ORDER BY id"
            ).fetchall()
        return [(float(a), r, str(p), int(s), str(w)) for a, r, p, s, w in rows]

    def rebuild(
        self, config: PolicyConfig, job_ids: dict[int, str] | None = None
    ) -> tuple[RunState, list[StoredAction]]:
        """Replay the journal: the state it leads to, and the Slurm actions still open."""
        state = RunState.new(config, job_ids)
        for _, event in self.events():
            state, _ = step(state, event)
        return state, self.actions(OPEN_STATES)

    def entries(self) -> list[JournalEntry]:
        """Events, decisions, Slurm action attempts and refusals, oldest first."""
        out: list[JournalEntry] = []
        with self._lock:
            ev = self._db.execute("SELECT at, type, replica, payload FROM events").fetchall()
            act = self._db.execute(
                "SELECT e.at, a.type, a.replica, a.payload, a.status, a.result"
                " FROM actions a JOIN events e ON e.seq = a.event_seq"
            ).fetchall()
            att = self._db.execute(
                "SELECT t.at, a.type, a.replica, t.outcome, t.detail, a.payload"
                " FROM attempts t JOIN actions a ON a.id = t.action_id"
            ).fetchall()
            rej = self._db.execute("SELECT at, remote, path, status, reason FROM rejections")
            rej_rows = rej.fetchall()
        for at, typ, replica, payload in ev:
            if typ == "Tick":
                continue
            out.append(JournalEntry(at, typ, replica, _describe_event(json.loads(payload))))
        for at, typ, replica, payload, _status, _result in act:
            out.append(JournalEntry(at, f"decide {typ}", replica, _describe_action(payload)))
        for at, typ, replica, outcome, detail, payload in att:
            text = f"{_describe_action(payload)}: {outcome}" + (f" ({detail})" if detail else "")
            out.append(JournalEntry(at, f"slurm {typ}", replica, text))
        for at, remote, path, status, reason in rej_rows:
            out.append(
                JournalEntry(at, "rejected", None, f"{status} {path} from {remote}: {reason}")
            )
        out.sort(key=lambda e: e.at)
        return out


def _replica_of(payload: dict[str, Any]) -> int | None:
    if "report" in payload:
        return int(payload["report"]["replica"])
    value = payload.get("replica")
    return int(value) if isinstance(value, int) else None


def _describe_event(data: dict[str, Any]) -> str:
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


def _describe_action(payload: str) -> str:
    data = json.loads(payload)
    kind = data.pop("type")
    data.pop("replica", None)
    return kind + " " + " ".join(f"{k}={v}" for k, v in data.items())
