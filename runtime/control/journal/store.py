"""The `Journal`: a thread-safe handle on the run's SQLite journal, for reading and replay.

After a restart (the control job itself was requeued, or the process was killed) the coordinator
replays the events through the pure policy to get its state back, and carries out only the Slurm
actions whose outcome was never recorded: `rebuild` does the replay, from the latest
snapshot. `entries` lists the records for `fthsdp events`. The direct writes (`record`,
`attempt`, `compact`) run the rows of `runtime.control.journal.writer` in one transaction
each; while a `GroupWriter` is attached, it does the writing.

Refused requests are not stored here (they cost an unauthenticated sender nothing durable; the
coordinator counts them in memory). `rejections` is still read for journals of older versions.
A record this version cannot read (written by an older one) is skipped with one log line when
nothing was decided for it; one that carries a decision, an unreadable snapshot or an SQLite
file that is not a database raise `JournalCorrupt`, which names the file and what to do.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from runtime.control.journal.describe import JournalEntry, entries_from_rows
from runtime.control.journal.nonce_filter import NonceFilter
from runtime.control.journal.schema import (
    JOURNAL_FILE,
    OPEN_STATES,
    JournalCorrupt,
    StoredAction,
    open_db,
)
from runtime.control.journal.writer import (
    NONCE_KEEP_S,
    NONCE_SQL,
    GroupWriter,
    attempt_ops,
    compact_in,
    last_ids,
    record_ops,
)
from runtime.control.policy import (
    Action,
    Event,
    PolicyConfig,
    RunState,
    action_from_dict,
    apply,
    event_from_dict,
)

log = logging.getLogger("fthsdp.journal")


class Journal:
    """A thread-safe handle on the run's SQLite journal."""

    def __init__(self, path: Path, durable: bool = True) -> None:
        """Open (or create, mode 0600) the journal; `JournalCorrupt` if it is not one.

        `durable=False` skips the fsync per commit: only for loading volume in benchmarks and
        tests, never for a coordinator (a crash could lose committed decisions).
        """
        self.path = path
        self.durable = durable
        self._lock = threading.Lock()
        #: Set while a `GroupWriter` owns the writes (it hands out the ids).
        self.writer: GroupWriter | None = None
        self._db = open_db(path, durable)
        #: Once `filter_nonces` was called: every nonce stored (or queued) in the last
        #: NONCE_KEEP_S, and a few others; a nonce it does not hold is not looked up.
        self.nonces: NonceFilter | None = None

    def filter_nonces(self) -> None:
        """Put a filter in front of the nonce table, filled from it: the coordinator's replay
        checks then ask SQLite only about nonces it may hold. About 0.8 s for the 600,000 nonces
        of 1,000 reports a second, which is why readers of the journal do not do it."""
        nonces = NonceFilter(NONCE_KEEP_S)
        try:
            with self._lock:
                for nonce, at in self._db.execute("SELECT nonce, at FROM nonces"):
                    nonces.add(str(nonce), float(at))
        except sqlite3.DatabaseError as exc:
            raise JournalCorrupt(self.path, str(exc)) from None
        self.nonces = nonces

    def check(self) -> None:
        """SQLite's own consistency check (a truncated or overwritten file fails it)."""
        try:
            with self._lock:
                rows = self._db.execute("PRAGMA quick_check").fetchall()
        except sqlite3.DatabaseError as exc:
            raise JournalCorrupt(self.path, str(exc)) from None
        if rows != [("ok",)]:
            raise JournalCorrupt(self.path, "; ".join(str(r[0]) for r in rows[:3]))

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
        self,
        event: Event,
        actions: list[Action],
        nonce: str | None = None,
        now: float | None = None,
    ) -> tuple[int, list[StoredAction]]:
        """Store an event, its nonce and the actions decided for it, atomically.

        Raises `KeyError` (and stores nothing) if the nonce was seen before. Not while a
        `GroupWriter` is attached: it hands out the sequence numbers then.
        """
        if self.writer is not None:
            raise RuntimeError("the journal is written through its GroupWriter")
        now = time.time() if now is None else now
        with self._tx() as db:
            last_seq, last_action_id = last_ids(db)
            seq = last_seq + 1
            ops, stored = record_ops(event, actions, nonce, now, seq, last_action_id)
            for sql, args in ops:
                try:
                    db.execute(sql, args)
                except sqlite3.IntegrityError:
                    if sql == NONCE_SQL:
                        raise KeyError(nonce) from None
                    raise
        if nonce is not None and self.nonces is not None:
            self.nonces.add(nonce, now)
        return seq, stored

    def nonce_seen(self, nonce: str) -> bool:
        """Seen in a committed report, or in one queued for the next commit."""
        if self.writer is not None and nonce in self.writer.pending_nonces:
            return True
        if self.nonces is not None and not self.nonces.may_contain(nonce):
            return False
        with self._lock:
            row = self._db.execute("SELECT 1 FROM nonces WHERE nonce = ?", (nonce,)).fetchone()
        return row is not None

    def attempt(self, action_id: int, outcome: str, detail: str = "") -> None:
        """Record one attempt at a Slurm action; `outcome` is started|done|failed|skipped|retry."""
        with self._tx() as db:
            for sql, args in attempt_ops(action_id, outcome, detail, time.time()):
                db.execute(sql, args)

    def compact(self, state: RunState, upto_seq: int, now: float | None = None) -> int:
        """Snapshot `state` (the state after event `upto_seq`) and drop what it makes redundant.

        One transaction: the snapshot, the deletion of the status reports it covers and of
        expired nonces commit together. Returns the number of events deleted.
        """
        now = time.time() if now is None else now
        with self._tx() as db:
            dropped = compact_in(db, state, upto_seq, now)
        return dropped

    # -- reading ------------------------------------------------------------------------------

    def events(self, after: int = 0) -> list[tuple[int, Event]]:
        """Stored events after `after`, oldest first; unreadable ones skipped (see `_parse`)."""
        try:
            with self._lock:
                rows = self._db.execute(
                    "SELECT seq, payload FROM events WHERE seq > ? ORDER BY seq", (after,)
                ).fetchall()
        except sqlite3.DatabaseError as exc:
            raise JournalCorrupt(self.path, str(exc)) from None
        out = []
        for seq, payload in rows:
            event = self._parse(int(seq), payload)
            if event is not None:
                out.append((int(seq), event))
        return out

    def _parse(self, seq: int, payload: str) -> Event | None:
        """One stored event, or None (with one log line) for a record an older version wrote
        that this one refuses; a record with a decision cannot be skipped."""
        try:
            return event_from_dict(json.loads(payload))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            with self._lock:
                decided = self._db.execute(
                    "SELECT 1 FROM actions WHERE event_seq = ? LIMIT 1", (seq,)
                ).fetchone()
            if decided:
                raise JournalCorrupt(self.path, f"event {seq} has a decision but: {exc}") from None
            log.warning("journal %s: skipping unreadable event %d: %s", self.path, seq, exc)
            return None

    def count_events(self, kind: str) -> int:
        with self._lock:
            row = self._db.execute("SELECT COUNT(*) FROM events WHERE type = ?", (kind,)).fetchone()
        return int(row[0])

    def snapshot(self) -> tuple[int, dict[str, Any]] | None:
        """(upto_seq, state dict) of the latest snapshot, if any."""
        try:
            with self._lock:
                row = self._db.execute("SELECT upto_seq, state FROM snapshot").fetchone()
            if row is None:
                return None
            data = json.loads(row[1])
            if not isinstance(data, dict):
                raise ValueError("snapshot is not an object")
        except (sqlite3.DatabaseError, ValueError) as exc:
            raise JournalCorrupt(self.path, f"snapshot: {exc}") from None
        return int(row[0]), data

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
    ) -> tuple[RunState, list[StoredAction], int]:
        """Replay the journal from its snapshot: the state, the open Slurm actions, the last seq."""
        snap = self.snapshot()
        upto = 0
        if snap is None:
            state = RunState.new(config, job_ids)
        else:
            upto = snap[0]
            try:
                state = RunState.from_dict(config, snap[1])
            except (ValueError, TypeError, KeyError) as exc:
                raise JournalCorrupt(self.path, f"snapshot: {exc}") from None
            for k, job in (job_ids or {}).items():
                if k in state.replicas and state.replicas[k].job_id is None:
                    state.replicas[k].job_id = job
        last = upto
        for seq, event in self.events(after=upto):
            apply(state, event)  # in place: nothing else holds this state yet
            last = seq
        try:
            open_actions = self.actions(OPEN_STATES)
        except (sqlite3.DatabaseError, ValueError, TypeError, KeyError) as exc:
            raise JournalCorrupt(self.path, f"actions: {exc}") from None
        return state, open_actions, last

    def last_seq(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT MAX(seq) FROM events").fetchone()
        return int(row[0] or 0)

    def entries(self) -> list[JournalEntry]:
        """Events, decisions, Slurm action attempts and refusals, oldest first."""
        try:
            return self._entries()
        except sqlite3.DatabaseError as exc:
            raise JournalCorrupt(self.path, str(exc)) from None

    def _entries(self) -> list[JournalEntry]:
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
        return entries_from_rows(ev, act, att, rej_rows)
