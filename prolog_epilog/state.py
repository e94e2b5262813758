"""A tiny persistent store for what one run must remember for the next, and the node's lock.

Counter growth (ECC correctable rate, NVLink error growth), "N consecutive passes before
resume" and "fthsdp's prolog failed here at T" need the previous run's facts. Prolog, epilog and
HealthCheckProgram are separate processes, so the facts live in one JSON file under `state_dir`.

These processes run as root and act on Slurm by what the file says, so the directory is trusted
only when its owner is this user or root and no one else may write it (a directory a job user
could create or fill must not steer a resume); otherwise, and when the directory is not writable
(a user running `fthsdp check`), the store keeps values in memory only, which is also what the
in-job watchdog wants between its calls.

`node_lock` serializes the hooks of one node: an exclusive `fcntl.flock` on `state_dir/lock`,
waited for with a deadline, so a HealthCheckProgram run cannot resume a node between the
prolog's drain and its exit.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_MEMORY: dict[str, dict[str, Any]] = {}
_LOCK = threading.Lock()
LOCK_FILE = "lock"
STATE_FILE = "state.json"


def untrusted_reason(st: os.stat_result, kind: str) -> str | None:
    """Why a file or directory with this stat may not steer a root hook (None: it may)."""
    if st.st_uid not in (0, os.geteuid()):
        return f"{kind} owned by uid {st.st_uid}, not root or this user"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{kind} writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def private_dir(directory: Path) -> str | None:
    """Create `directory` (0700) if missing; None when it is trusted, else the reason it is not."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(directory)
    except OSError as exc:
        return f"{directory}: {exc.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{directory} is not a directory"
    return untrusted_reason(st, str(directory))


class StateStore:
    def __init__(self, directory: str | Path | None) -> None:
        self.directory = Path(directory) if directory else None
        self.path = self.directory / STATE_FILE if self.directory else None
        self._key = str(self.path) if self.path else "<memory>"

    def _trusted_file(self) -> bool:
        assert self.path is not None and self.directory is not None
        try:
            if untrusted_reason(os.lstat(self.directory), "dir"):
                return False
            st = os.lstat(self.path)
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode) and untrusted_reason(st, "file") is None

    def _load(self) -> dict[str, Any]:
        if self.path is not None and self._trusted_file():
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(self.path.read_text())
                if isinstance(data, dict):
                    return data
        return dict(_MEMORY.get(self._key, {}))

    def get(self, key: str, default: Any = None) -> Any:
        with _LOCK:
            return self._load().get(key, default)

    def put(self, key: str, value: Any) -> None:
        with _LOCK:
            data = self._load()
            data[key] = value
            _MEMORY[self._key] = data
            if self.directory is None or private_dir(self.directory) is not None:
                return
            with contextlib.suppress(OSError):
                fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".state")
                with os.fdopen(fd, "w") as f:
                    json.dump(data, f)
                os.replace(tmp, self.directory / STATE_FILE)


@contextlib.contextmanager
def node_lock(directory: str | Path | None, timeout: float) -> Iterator[str | None]:
    """Hold the node's hook lock for the block; yields None when held, else why it is not
    (no trusted state_dir, or another hook held it for `timeout` seconds)."""
    if not directory:
        yield "no state_dir"
        return
    where = Path(directory)
    problem = private_dir(where)
    if problem is not None:
        yield problem
        return
    try:
        fd = os.open(where / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        yield f"{where / LOCK_FILE}: {exc.strerror}"
        return
    try:
        if not flock_within(fd, timeout):
            yield f"another fthsdp hook held {where / LOCK_FILE} for {timeout:g}s"
            return
        yield None
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def flock_within(fd: int, timeout: float) -> bool:
    """Take an exclusive `flock` on `fd`, waiting at most `timeout` seconds; False when another
    holder kept it that long (an error other than "held" raises OSError)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
