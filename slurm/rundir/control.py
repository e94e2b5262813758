"""control.json: where the run's control plane listens, written by the control job.

The control job writes its coordinator's and Lighthouse's addresses (and who wrote them: host,
pid, Slurm job id, start time) once both listen, with `write_control_file`: atomically, since
replicas may read it at any moment, and 0600. It rewrites the file after a requeue, possibly
from another host, so readers re-read it whenever an address stops answering.

`read_control` is the one strict reader: None before the control plane first wrote the file, a
`ControlFile` once it did, and a `RunFileError` (naming the file and what is wrong) for a file of
any other shape. A reader that must ride out a missing or corrupt file (a replica while the
control job is requeued) catches that error where it reads.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm.rundir.paths import CONTROL_FILE, PRIVATE_FILE_MODE
from slurm.rundir.shape import an_object, is_int, is_number, read_json, want


@dataclass(frozen=True)
class ControlFile:
    """The contents of control.json (every field may be absent: a hand-started control plane
    or a test writes only what it has)."""

    coordinator: str | None = None
    lighthouse: str | None = None
    host: str | None = None
    job_id: str | None = None
    pid: int | None = None
    #: When the control plane that wrote the file started (a new value = it was restarted).
    started_at: float | None = None


def check_control_data(path: Path, data: Any) -> ControlFile:
    """control.json as the control plane writes it: its addresses and who wrote it."""
    top = an_object(path, "the file", data)
    for key in ("coordinator", "lighthouse"):
        value = top.get(key)
        ok = value is None or (isinstance(value, str) and value.startswith(("http://", "https://")))
        want(path, key, value, ok, "an http:// URL or null")
    for key in ("host", "job_id"):
        value = top.get(key)
        want(path, key, value, value is None or isinstance(value, str), "a string or null")
    for key in ("pid",):
        value = top.get(key)
        want(path, key, value, value is None or is_int(value), "an integer or null")
    for key in ("started_at",):
        value = top.get(key)
        want(path, key, value, value is None or is_number(value), "a number or null")
    started = top.get("started_at")
    return ControlFile(
        coordinator=top.get("coordinator"),
        lighthouse=top.get("lighthouse"),
        host=top.get("host"),
        job_id=top.get("job_id"),
        pid=top.get("pid"),
        started_at=None if started is None else float(started),
    )


def read_control_file(path: Path) -> ControlFile | None:
    """The control file at `path` checked (None while it does not exist)."""
    data = read_json(Path(path))
    return None if data is None else check_control_data(Path(path), data)


def read_control(run_dir: Path) -> ControlFile | None:
    """`run_dir/control.json` checked (None before the control plane first wrote it)."""
    return read_control_file(Path(run_dir) / CONTROL_FILE)


def write_control_file(run_dir: Path, data: Mapping[str, Any]) -> Path:
    """Write `run_dir/control.json` atomically (replicas may read it at any moment), mode 0600."""
    path = Path(run_dir) / CONTROL_FILE
    tmp = path.with_name(f".{CONTROL_FILE}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(dict(data), indent=2, sort_keys=True))
    os.replace(tmp, path)
    return path
