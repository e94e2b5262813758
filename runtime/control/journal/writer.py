"""Journal writes: the rows each write adds, and the group writer that commits them in batches.

Every statement that writes the journal is built here once (`record_ops`, `attempt_ops`,
`compact_in`); the `Journal`'s direct writes run them in their own transaction, the
`GroupWriter` queues them and commits many in one. Both number events and actions the way
SQLite's AUTOINCREMENT would (`last_ids`), so the two paths leave the same rows.

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
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from runtime.control.journal.nonce_filter import NonceFilter
from runtime.control.journal.schema import StoredAction, connect
from runtime.control.policy import (
    SLURM_ACTIONS,
    Action,
    Event,
    ReportReceived,
    RunState,
    action_to_dict,
    event_to_dict,
)
from runtime.protocol import MAX_CLOCK_SKEW_S

log = logging.getLogger("fthsdp.journal")

#: Nonces are kept this long (seconds): a request signed earlier is refused as stale anyway.
NONCE_KEEP_S = 2 * MAX_CLOCK_SKEW_S


def transient(event: Event, actions: list[Action]) -> bool:
    """A status report that decided nothing: the next report of its replica replaces it, so
    compaction drops it and the coordinator acknowledges it without waiting for its commit."""
    return isinstance(event, ReportReceived) and event.report.kind == "status" and not actions


class JournalUnavailable(Exception):
    """A journal commit failed (disk full, I/O error): nothing more is written or acknowledged;
    the coordinator answers 503 and its log says why."""


#: One SQL statement and its arguments.
Op = tuple[str, tuple[Any, ...]]
NONCE_SQL = "INSERT INTO nonces VALUES (?, ?)"
EVENT_SQL = (
    "INSERT INTO events (seq, at, type, replica, payload, transient) VALUES (?, ?, ?, ?, ?, ?)"
)
ACTION_SQL = (
    "INSERT INTO actions (id, event_seq, type, replica, payload, status, updated)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)


def last_ids(db: sqlite3.Connection) -> tuple[int, int]:
    """The last event sequence number and action id handed out (AUTOINCREMENT's rule: the
    largest ever used, deleted rows included)."""
    row = db.execute(
        "SELECT MAX(seq) FROM (SELECT MAX(seq) AS seq FROM events UNION ALL "
        "SELECT seq FROM sqlite_sequence WHERE name = 'events')"
    ).fetchone()
    seq = int(row[0] or 0)
    row = db.execute(
        "SELECT MAX(id) FROM (SELECT MAX(id) AS id FROM actions UNION ALL "
        "SELECT seq FROM sqlite_sequence WHERE name = 'actions')"
    ).fetchone()
    return seq, int(row[0] or 0)


def record_ops(
    event: Event,
    actions: list[Action],
    nonce: str | None,
    now: float,
    seq: int,
    last_action_id: int,
) -> tuple[list[Op], list[StoredAction]]:
    """The rows of one event stored as `seq`: its nonce, the event, and its actions (numbered
    from `last_action_id` + 1); and the actions as stored."""
    payload = event_to_dict(event)
    ops: list[Op] = []
    if nonce is not None:
        ops.append((NONCE_SQL, (nonce, now)))
    ops.append(
        (
            EVENT_SQL,
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
    action_id = last_action_id
    for action in actions:
        action_id += 1
        data = action_to_dict(action)
        status = "decided" if isinstance(action, SLURM_ACTIONS) else "done"
        ops.append(
            (
                ACTION_SQL,
                (action_id, seq, data["type"], data.get("replica"), json.dumps(data), status, now),
            )
        )
        stored.append(StoredAction(action_id, seq, action, status, 0))
    return ops, stored


def compact_in(db: sqlite3.Connection, state: RunState, upto_seq: int, now: float) -> int:
    """Inside a transaction: snapshot `state` (the state after event `upto_seq`), delete the
    status reports it covers and the expired nonces. Returns the number of events deleted."""
    data = json.dumps(state.to_dict(), separators=(",", ":"))
    db.execute(
        "INSERT OR REPLACE INTO snapshot (id, upto_seq, at, state) VALUES (1, ?, ?, ?)",
        (upto_seq, now, data),
    )
    db.execute("DELETE FROM nonces WHERE at < ?", (now - NONCE_KEEP_S,))
    cur = db.execute("DELETE FROM events WHERE transient = 1 AND seq <= ?", (upto_seq,))
    return int(cur.rowcount)


def attempt_ops(action_id: int, outcome: str, detail: str, now: float) -> list[Op]:
    """The rows of one attempt at a Slurm action, and its action's new status."""
    detail = detail[:2000]
    ops: list[Op] = [
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


def _replica_of(payload: dict[str, Any]) -> int | None:
    if "report" in payload:
        return int(payload["report"]["replica"])
    value = payload.get("replica")
    return int(value) if isinstance(value, int) else None


@dataclass
class _Item:
    ops: list[Op]
    future: asyncio.Future[Any] | None
    nonce: str | None
    #: Runs in the writer thread after `ops`, inside the transaction (compaction's count).
    then: Callable[[sqlite3.Connection], Any] | None = None
    result: Any = None


class WrittenJournal(Protocol):
    """What the group writer needs of the journal it writes (a `runtime.control.journal.store.
    Journal`): where it is, how durably to commit, and the attribute that marks the writer as
    the owner of its writes."""

    path: Path
    durable: bool
    writer: GroupWriter | None
    nonces: NonceFilter | None

    def nonce_seen(self, nonce: str) -> bool: ...


class GroupWriter:
    """Commits queued journal writes in groups, one transaction (one fsync) per group.

    Used from one event loop: `record`, `attempt` and `compact` queue their rows and return at
    once (a future for writes the caller must see durable); a thread with its own SQLite
    connection commits everything queued since its previous commit. The loop's own connection
    (the `Journal`) keeps serving reads; WAL lets them run beside the commit.
    """

    def __init__(self, journal: WrittenJournal, max_batch: int = 2048) -> None:
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
        self._db = connect(journal.path, journal.durable)
        self._seq, self._action_id = last_ids(self._db)
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
        seq = self._seq + 1
        ops, stored = record_ops(event, actions, nonce, now, seq, self._action_id)
        action_id = stored[-1].id if stored else self._action_id
        future = self._loop.create_future() if durable else None
        self._put(_Item(ops, future, nonce))
        self._seq, self._action_id = seq, action_id
        if nonce is not None:
            self.pending_nonces.add(nonce)
            if self.journal.nonces is not None:
                self.journal.nonces.add(nonce, now)
        return seq, stored, future

    def attempt(self, action_id: int, outcome: str, detail: str = "") -> asyncio.Future[Any]:
        """Queue one attempt at a Slurm action (as `Journal.attempt`); done once committed."""
        future = self._loop.create_future()
        self._put(_Item(attempt_ops(action_id, outcome, detail, time.time()), future, None))
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
            return compact_in(db, state, upto_seq, now)

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
            first: dict[str, list[tuple[Any, ...]]] = {NONCE_SQL: [], EVENT_SQL: []}
            rest: list[Op | _Item] = []
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
