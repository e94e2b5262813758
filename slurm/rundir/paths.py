"""The names and modes of everything in a run directory, and the one way a private file is written.

`run_dir` (on a shared filesystem) is the run's single source of truth outside Slurm. Every file
name in it is spelled here once, so `fthsdp submit`, the control plane, the replicas and the
operator's commands agree on them. The directory is private to its owner (0700) and the files
that hold the run's state or key are 0600, written atomically (`write_private`): a reader never
sees half a file, and a key is never briefly readable by others.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

#: Which Slurm job id belongs to which replica (`jobs.RunRecord`).
JOBS_FILE = "jobs.json"
#: The resolved spec (defaults filled in, overrides applied).
SPEC_FILE = "spec.json"
#: The control plane's addresses, written by the control job (`control.ControlFile`).
CONTROL_FILE = "control.json"
#: The run's HMAC key for the leaders' reports.
SECRET_FILE = "secret"
#: Every job's stdout/stderr.
LOG_DIR = "logs"
#: The spare slot script and the hot-spare pool file (`spares.Pool`).
SPARE_SCRIPT = "spare.sbatch"
SPARES_FILE = "spares.json"
#: Warm slots' handoff files: `warm/<slot job>.json` names the replica a warm slot becomes
#: (written by its supervisor), `warm/<slot job>.ready` says its process is warm (its leader).
WARM_DIR = "warm"
#: Where `submit --force` moves an earlier run's state (`archive.archive_state`).
ARCHIVE_DIR = "archive"
#: The run directory and logs/: the owner only (the run's key and state live there).
RUN_DIR_MODE = 0o700
#: jobs.json, spec.json, secret, spares.json, control.json.
PRIVATE_FILE_MODE = 0o600


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` atomically, mode 0600 from the start (never briefly readable)."""
    write_whole(path, text, PRIVATE_FILE_MODE)


def write_whole(path: Path, text: str, mode: int) -> None:
    """`text` at `path` by rename: a reader sees the old file or the new one, never part of
    either, and a script that is being run is replaced rather than rewritten in place (which is
    ETXTBSY for the writer or for the exec). The file is 0600 until it has its content, then
    `mode`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
