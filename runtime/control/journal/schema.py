"""The journal's file format: its SQLite tables, their one migration, the connection settings.

The database uses WAL and `synchronous=FULL`: a committed row survives `kill -9`. Every
connection to the journal (the `Journal`'s own and the group writer's) is opened by `connect`,
so both commit the same way.

The format only grows: a journal an older version wrote is opened as it is, and gains what it
lacks (the `events.transient` column, defaulting to 0). The `rejections` table is no longer
written (refused requests are counted in memory) and stays for older journals' history. A file
that is not a SQLite database raises `JournalCorrupt`, which names the file and what to do.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from dataclasses import dataclass
from pathlib import Path

from runtime.control.policy import Action
from slurm.rundir import RunFileError

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

#: Action states. `decided` -> `started` -> `done` | `failed` | `skipped` | `requested` (a drain
#: asked of root's Epilog, `runtime.control.executor`).
OPEN_STATES = ("decided", "started")
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
    """One row of `actions`: a decided action, its event and where carrying it out stands."""

    id: int
    event_seq: int
    action: Action
    status: str
    attempts: int


def connect(path: Path, durable: bool) -> sqlite3.Connection:
    """A connection to the journal at `path`: WAL, fsync per commit unless not `durable`."""
    db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={'FULL' if durable else 'OFF'}")
    db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    return db


def open_db(path: Path, durable: bool) -> sqlite3.Connection:
    """Open (or create, mode 0600) the journal and bring its tables up to this version;
    `JournalCorrupt` if it is not one."""
    if not path.exists():
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    elif stat.S_IMODE(path.stat().st_mode) & 0o077 and os.access(path, os.W_OK):
        os.chmod(path, 0o600)  # written by an older version with the default umask
    try:
        db = connect(path, durable)
        # Bound the WAL file: a compaction frees pages the next writes reuse.
        db.execute("PRAGMA journal_size_limit=8388608")
        db.executescript(_SCHEMA)
        columns = {row[1] for row in db.execute("PRAGMA table_info(events)")}
        if "transient" not in columns:
            db.execute("ALTER TABLE events ADD COLUMN transient INTEGER NOT NULL DEFAULT 0")
    except sqlite3.DatabaseError as exc:
        raise JournalCorrupt(path, str(exc)) from None
    return db
