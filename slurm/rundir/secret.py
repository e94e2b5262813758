"""The run's secret: the HMAC key from which every replica's and the operator's keys derive.

`fthsdp submit` creates a fresh one per run in `run_dir/secret` (mode 0600, created exclusively,
so it is never world-readable); the control plane, the replica supervisors, the leaders and the
operator's commands read it back, and only when it is still this user's alone (`read_secret`).
What is signed with it, and how, is the wire protocol's
business (`runtime.protocol`); where it lives and how it is made is the run directory's.
"""

from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path

from slurm.rundir.paths import PRIVATE_FILE_MODE
from slurm.rundir.shape import read_trusted


def create_secret(path: Path) -> bytes:
    """Create the run secret with mode 0600 (atomically: it is never world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return read_secret(path)


def read_secret(path: Path) -> bytes:
    """The run secret; `FileNotFoundError` when there is none, `RunFileError` when it is not
    this user's alone (another owner, or a mode that lets group or others read or write it)."""
    text = read_trusted(Path(path), private=True)
    if text is None:
        raise FileNotFoundError(errno.ENOENT, "no run secret", str(path))
    return text.strip().encode()
