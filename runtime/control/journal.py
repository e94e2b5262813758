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

Size and restart time are bounded by the number of replicas, not by the run's age: a status
report that decided nothing is only needed until the next snapshot, so `compact` stores the
coordinator's state (a `snapshot` row, the policy state after event N) and deletes those reports
up to N in the same transaction; replay starts from the snapshot. Events that decided something,
their actions and attempts are kept (they are the run's history, and the exactly-once record of
every Slurm action). Nonces older than twice the clock-skew window can no longer be replayed
(the signature check refuses them as stale) and are dropped too. A `kill -9` during a compaction
rolls the whole transaction back: the snapshot and the deletions land together or not at all.

**Group commit.** A coordinator at 1,000 reports/s cannot pay one fsync per report on its event
loop. It writes through a `GroupWriter`: one thread with its own connection commits whatever
was queued since its last commit in one transaction (one fsync per batch). Sequence numbers and
action ids are given out when an event is queued, so the commit order is the queue order and
the journal on disk is always a prefix of what the coordinator applied. What the coordinator
acts on (a decision, a Slurm action, an attempt) is answered or carried out only once its batch
is durable; a status report that decided nothing is acknowledged without waiting: a crash loses
at most the last few milliseconds of those, and each replica's next report replaces them. A
failed commit stops the writer for good (nothing after a gap is ever committed) and every later
write raises `JournalUnavailable`.

Refused requests are not stored here (they cost an unauthenticated sender nothing durable; the
coordinator counts them in memory). `rejections` is still read for journals of older versions.
A record this version cannot read (written by an older one) is skipped with one log line when
nothing was decided for it; one that carries a decision, an unreadable snapshot or an SQLite
file that is not a database raise `JournalCorrupt`, which names the file and what to do.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import queue
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.control.policy import (
    SLURM_ACTIONS,
    Action,
    Event,
    PolicyConfig,
    ReportReceived,
    RunState,
    action_from_dict,
    action_to_dict,
    apply,
    event_from_dict,
    event_to_dict,
)
from runtime.protocol import MAX_CLOCK_SKEW_S
from slurm.rundir import RunFileError

log = logging.getLogger("fthsdp.journal")

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
CREATE TABLE IF NOT EXISTS snapshot (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    upto_seq INTEGER NOT NULL,
    at REAL NOT NULL,
    state TEXT NOT NULL
);
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
#: Nonces are kept this long (seconds): a request signed earlier is refused as stale anyway.
NONCE_KEEP_S = 2 * MAX_CLOCK_SKEW_S
#: How long a connection waits for another's write lock before it fails.
BUSY_TIMEOUT_MS = 10_000


class JournalCorrupt(RunFileError):
    """The journal cannot be read: one line naming the file and what to do (exit code 2, as
    for any bad run file); the control job does not start on it."""

    def __init__(self, path: Path, detail: str) -> None:
        super().__init__(
            path,
            f"the control journal is unreadable ({detail}); move it aside "
            f"(mv {path} {path}.bad) to start this run's control plane with an empty journal "
            "(replicas keep training; past decisions are forgotten), or restore it from a backup",
        )


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
        if not path.exists():
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        elif stat.S_IMODE(path.stat().st_mode) & 0o077 and os.access(path, os.W_OK):
            os.chmod(path, 0o600)  # written by an older version with the default umask
        try:
            self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={'FULL' if durable else 'OFF'}")
            self._db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            # Bound the WAL file: a compaction frees pages the next writes reuse.
            self._db.execute("PRAGMA journal_size_limit=8388608")
            self._db.executescript(_SCHEMA)
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(events)")}
            if "transient" not in columns:
                self._db.execute(
                    "ALTER TABLE events ADD COLUMN transient INTEGER NOT NULL DEFAULT 0"
                )
        except sqlite3.DatabaseError as exc:
            raise JournalCorrupt(path, str(exc)) from None

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
                "INSERT INTO events (at, type, replica, payload, transient) VALUES (?, ?, ?, ?, ?)",
                (
                    event.at,
                    payload["type"],
                    replica,
                    json.dumps(payload),
                    int(transient(event, actions)),
                ),
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
        """Seen in a committed report, or in one queued for the next commit."""
        if self.writer is not None and nonce in self.writer.pending_nonces:
            return True
        with self._lock:
            row = self._db.execute("SELECT 1 FROM nonces WHERE nonce = ?", (nonce,)).fetchone()
        return row is not None

    def attempt(self, action_id: int, outcome: str, detail: str = "") -> None:
        """Record one attempt at a Slurm action; `outcome` is started|done|failed|skipped|retry."""
        with self._tx() as db:
            for sql, args in _attempt_ops(action_id, outcome, detail, time.time()):
                db.execute(sql, args)

    def compact(self, state: RunState, upto_seq: int, now: float | None = None) -> int:
        """Snapshot `state` (the state after event `upto_seq`) and drop what it makes redundant.

        One transaction: the snapshot, the deletion of the status reports it covers and of
        expired nonces commit together. Returns the number of events deleted.
        """
        now = time.time() if now is None else now
        data = json.dumps(state.to_dict(), separators=(",", ":"))
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO snapshot (id, upto_seq, at, state) VALUES (1, ?, ?, ?)",
                (upto_seq, now, data),
            )
            cur = db.execute("DELETE FROM events WHERE transient = 1 AND seq <= ?", (upto_seq,))
            db.execute("DELETE FROM nonces WHERE at < ?", (now - NONCE_KEEP_S,))
        return int(cur.rowcount)

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
            try:
                text = _describe_event(json.loads(payload))
            except (ValueError, TypeError, KeyError) as exc:
                text = f"unreadable record ({exc}), skipped"
            out.append(JournalEntry(at, typ, replica, text))
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


def transient(event: Event, actions: list[Action]) -> bool:
    """A status report that decided nothing: the next report of its replica replaces it, so
    compaction drops it and the coordinator acknowledges it without waiting for its commit."""
    return isinstance(event, ReportReceived) and event.report.kind == "status" and not actions


class JournalUnavailable(Exception):
    """A journal commit failed (disk full, I/O error): nothing more is written or acknowledged;
    the coordinator answers 503 and its log says why."""


_Op = tuple[str, tuple[Any, ...]]
_NONCE_SQL = "INSERT INTO nonces VALUES (?, ?)"
_EVENT_SQL = (
    "INSERT INTO events (seq, at, type, replica, payload, transient) VALUES (?, ?, ?, ?, ?, ?)"
)


def _attempt_ops(action_id: int, outcome: str, detail: str, now: float) -> list[_Op]:
    """The rows of one attempt at a Slurm action, and its action's new status."""
    detail = detail[:2000]
    ops: list[_Op] = [
        (
            "INSERT INTO attempts (action_id, at, outcome, detail) VALUES (?, ?, ?, ?)",
            (action_id, now, outcome, detail),
        )
    ]
    if outcome == "retry":
        sql = "UPDATE actions SET attempts = attempts + 1, result = ?, updated = ? WHERE id = ?"
        ops.append((sql, (detail, now, action_id)))
    elif outcome == "started":
        sql = (
            "UPDATE actions SET status = 'started', attempts = attempts + 1, updated = ?"
            " WHERE id = ?"
        )
        ops.append((sql, (now, action_id)))
    else:
        sql = "UPDATE actions SET status = ?, result = ?, updated = ? WHERE id = ?"
        ops.append((sql, (outcome, detail, now, action_id)))
    return ops


@dataclass
class _Item:
    ops: list[_Op]
    future: asyncio.Future[Any] | None
    nonce: str | None
    #: Runs in the writer thread after `ops`, inside the transaction (compaction's count).
    then: Callable[[sqlite3.Connection], Any] | None = None
    result: Any = None


class GroupWriter:
    """Commits queued journal writes in groups, one transaction (one fsync) per group.

    Used from one event loop: `record`, `attempt` and `compact` queue their rows and return at
    once (a future for writes the caller must see durable); a thread with its own SQLite
    connection commits everything queued since its previous commit. The loop's own connection
    (the `Journal`) keeps serving reads; WAL lets them run beside the commit.
    """

    def __init__(self, journal: Journal, max_batch: int = 2048) -> None:
        self.journal = journal
        self.max_batch = max_batch
        self.pending_nonces: set[str] = set()
        self.failed: BaseException | None = None
        self.commits = 0
        self.committed_items = 0
        #: Seconds the last commit took (its fsync included).
        self.last_commit_s = 0.0
        self._queued_at: collections.deque[float] = collections.deque()
        self._loop = asyncio.get_running_loop()
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        with journal._lock:
            row = journal._db.execute(
                "SELECT MAX(seq) FROM (SELECT MAX(seq) AS seq FROM events UNION ALL "
                "SELECT seq FROM sqlite_sequence WHERE name = 'events')"
            ).fetchone()
            self._seq = int(row[0] or 0)
            row = journal._db.execute(
                "SELECT MAX(id) FROM (SELECT MAX(id) AS id FROM actions UNION ALL "
                "SELECT seq FROM sqlite_sequence WHERE name = 'actions')"
            ).fetchone()
            self._action_id = int(row[0] or 0)
        self._db = sqlite3.connect(str(journal.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={'FULL' if journal.durable else 'OFF'}")
        self._db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        self._thread = threading.Thread(target=self._run, name="journal-writer", daemon=True)
        journal.writer = self
        self._thread.start()

    # -- the loop's side ----------------------------------------------------------------------

    def backlog_s(self) -> float:
        """How long the oldest write not yet committed has waited (0 when none)."""
        return time.monotonic() - self._queued_at[0] if self._queued_at else 0.0

    def _put(self, item: _Item) -> None:
        if self.failed is not None:
            raise JournalUnavailable(f"journal {self.journal.path}: {self.failed}")
        self._queued_at.append(time.monotonic())
        self._queue.put(item)

    def record(
        self,
        event: Event,
        actions: list[Action],
        nonce: str | None = None,
        durable: bool = True,
        now: float | None = None,
    ) -> tuple[int, list[StoredAction], asyncio.Future[Any] | None]:
        """Queue an event, its nonce and its actions (one transaction, as `Journal.record`).

        Returns its sequence number, the stored actions and, if `durable`, a future done once
        it is committed. `KeyError` (and nothing queued) if the nonce was seen before.
        """
        if nonce is not None and self.journal.nonce_seen(nonce):
            raise KeyError(nonce)
        now = time.time() if now is None else now
        payload = event_to_dict(event)
        seq = self._seq + 1
        ops: list[_Op] = []
        if nonce is not None:
            ops.append((_NONCE_SQL, (nonce, now)))
        ops.append(
            (
                _EVENT_SQL,
                (
                    seq,
                    event.at,
                    payload["type"],
                    _replica_of(payload),
                    json.dumps(payload),
                    int(transient(event, actions)),
                ),
            )
        )
        stored: list[StoredAction] = []
        action_id = self._action_id
        for action in actions:
            action_id += 1
            data = action_to_dict(action)
            status = "decided" if isinstance(action, SLURM_ACTIONS) else "done"
            ops.append(
                (
                    "INSERT INTO actions (id, event_seq, type, replica, payload, status, updated)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        action_id,
                        seq,
                        data["type"],
                        data.get("replica"),
                        json.dumps(data),
                        status,
                        now,
                    ),
                )
            )
            stored.append(StoredAction(action_id, seq, action, status, 0))
        future = self._loop.create_future() if durable else None
        self._put(_Item(ops, future, nonce))
        self._seq, self._action_id = seq, action_id
        if nonce is not None:
            self.pending_nonces.add(nonce)
        return seq, stored, future

    def attempt(self, action_id: int, outcome: str, detail: str = "") -> asyncio.Future[Any]:
        """Queue one attempt at a Slurm action (as `Journal.attempt`); done once committed."""
        future = self._loop.create_future()
        self._put(_Item(_attempt_ops(action_id, outcome, detail, time.time()), future, None))
        return future

    def compact(
        self, state: RunState, upto_seq: int, now: float | None = None
    ) -> asyncio.Future[Any]:
        """Queue a snapshot of `state` (the state after event `upto_seq`) and the deletions it
        allows (as `Journal.compact`); the future's result is the events dropped.

        The snapshot is serialised by the writer thread (tens of milliseconds at 2,000
        replicas, which the event loop does not stall for), so `state` must not change after
        this call: the coordinator replaces its state on every event, never changes one.
        """
        now = time.time() if now is None else now

        def snapshot(db: sqlite3.Connection) -> int:
            data = json.dumps(state.to_dict(), separators=(",", ":"))
            db.execute(
                "INSERT OR REPLACE INTO snapshot (id, upto_seq, at, state) VALUES (1, ?, ?, ?)",
                (upto_seq, now, data),
            )
            db.execute("DELETE FROM nonces WHERE at < ?", (now - NONCE_KEEP_S,))
            cur = db.execute("DELETE FROM events WHERE transient = 1 AND seq <= ?", (upto_seq,))
            return int(cur.rowcount)

        future = self._loop.create_future()
        self._put(_Item([], future, None, snapshot))
        return future

    async def flush(self) -> None:
        """Return once everything queued so far is committed (`JournalUnavailable` if not)."""
        future = self._loop.create_future()
        self._put(_Item([], future, None))
        await future

    async def close(self) -> None:
        """Commit what is queued, stop the thread, close its connection."""
        if self.failed is None:
            with contextlib.suppress(JournalUnavailable):
                await self.flush()
        self._queue.put(None)
        await self._loop.run_in_executor(None, self._thread.join, 30.0)
        self.journal.writer = None
        self._db.close()

    def _done(self, batch: list[_Item], error: BaseException | None, took: float) -> None:
        """On the loop: the batch is committed (or failed)."""
        self.last_commit_s = took
        if error is not None and self.failed is None:
            self.failed = error
            log.error("journal %s: commit failed, no more writes: %s", self.journal.path, error)
        for item in batch:
            if self._queued_at:
                self._queued_at.popleft()
            if item.nonce is not None:
                self.pending_nonces.discard(item.nonce)
            if item.future is None or item.future.done():
                continue
            if error is None:
                item.future.set_result(item.result)
            else:
                item.future.set_exception(
                    JournalUnavailable(f"journal {self.journal.path}: {error}")
                )
        if error is None:
            self.commits += 1
            self.committed_items += len(batch)

    # -- the writer thread --------------------------------------------------------------------

    def _run(self) -> None:
        broken: BaseException | None = None
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                break
            batch = [first]
            while len(batch) < self.max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            start = time.perf_counter()
            if broken is None:
                broken = self._commit(batch)
            took = time.perf_counter() - start
            try:
                self._loop.call_soon_threadsafe(self._done, batch, broken, took)
            except RuntimeError:
                return  # the loop is closed: nobody waits any more

    def _commit(self, batch: list[_Item]) -> BaseException | None:
        db = self._db
        try:
            # The reports' own rows first, one executemany per table: each execute hands the
            # GIL to the event loop and back, and a batch holds hundreds of rows. Nothing else
            # depends on their order; actions and attempts follow in queue order.
            first: dict[str, list[tuple[Any, ...]]] = {_NONCE_SQL: [], _EVENT_SQL: []}
            rest: list[_Op | _Item] = []
            for item in batch:
                for op in item.ops:
                    if op[0] in first:
                        first[op[0]].append(op[1])
                    else:
                        rest.append(op)
                if item.then is not None:
                    rest.append(item)
            db.execute("BEGIN IMMEDIATE")
            try:
                for sql, rows in first.items():
                    if rows:
                        db.executemany(sql, rows)
                for step in rest:
                    if isinstance(step, _Item):
                        assert step.then is not None
                        step.result = step.then(db)
                    else:
                        db.execute(*step)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        except Exception as exc:  # handed to the loop: every waiter gets JournalUnavailable
            return exc
        return None


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
