"""A run directory reused: what an earlier run left there, the refusal, and the archive.

A directory whose recorded jobs (or spare slots) are still in the queue holds a *live* run:
`submit` refuses it, forced or not, naming the jobs and `fthsdp cancel RUN_DIR`, so no job is
left running outside jobs.json. A directory with a finished run's state (`RUN_STATE`: jobs.json,
the journal, progress, ledger, the `finished` marker, logs, ...) is refused unless `--force`,
which first moves that state to `archive/<UTC time>/` (a new run that found the old `finished`
marker would end at once); a submit that fails puts it back (`restore_archive`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable
from pathlib import Path

from slurm.backend import SlurmBackend
from slurm.errors import InputError
from slurm.rundir.jobs import live_jobs, read_run
from slurm.rundir.paths import (
    ARCHIVE_DIR,
    CONTROL_FILE,
    JOBS_FILE,
    LOG_DIR,
    RUN_DIR_MODE,
    WARM_DIR,
)
from slurm.rundir.spares import PoolFileError, read_pool

#: What a run leaves in its directory besides its scripts, spec.json and secret (which a new
#: submit replaces): moved to `archive/<time>/` by `submit --force`.
RUN_STATE = (
    JOBS_FILE,
    CONTROL_FILE,
    "control.sqlite",
    "control.sqlite-wal",
    "control.sqlite-shm",
    "control.log",
    "finished",
    "progress",
    "ledger",
    "final",
    "checkpoints",
    "rendezvous",
    WARM_DIR,
    LOG_DIR,
)


def _slot_jobs(run_dir: Path) -> list[str]:
    """The run's spare slot jobs (`spares.json`): a slot outlives a control plane that died,
    holds its nodes and would run a replica's script if it was assigned one. A pool file
    that cannot be read is refused, never taken as "no slots"."""
    try:
        pool = read_pool(run_dir)
    except (PoolFileError, OSError) as exc:
        raise InputError(
            "job.run_dir",
            str(run_dir),
            f"a readable spare pool, not {exc}; cancel its slot jobs with scancel, or use "
            "another run_dir",
        ) from None
    return [s.job_id for s in pool.slots] if pool else []


def previous_state(run_dir: Path) -> list[str]:
    """The entries of `RUN_STATE` that `run_dir` holds (an empty logs/ does not count)."""
    found = []
    for name in RUN_STATE:
        path = Path(run_dir) / name
        if name == LOG_DIR and path.is_dir() and not any(path.iterdir()):
            continue
        if path.exists() or path.is_symlink():
            found.append(name)
    return found


def check_resubmit(run_dir: Path, backend: SlurmBackend, force: bool = False) -> list[str]:
    """What of an earlier run in `run_dir` a submit must archive first (`previous_state`).

    Refuses a run whose recorded jobs are still queued or running, even with `force` (they
    would run on outside the new jobs.json), and an earlier run's state without `force`.
    """
    run_dir = Path(run_dir)
    if (run_dir / JOBS_FILE).exists():
        live = live_jobs(read_run(run_dir), backend, _slot_jobs(run_dir))
        if live:
            ids = ",".join(sorted({j.base_id for j in live}))
            raise InputError(
                "job.run_dir",
                str(run_dir),
                f"holds a live run (jobs {ids}); cancel it first with "
                f"'fthsdp cancel {run_dir}', or use another run_dir",
            )
    state = previous_state(run_dir)
    if state and not force:
        shown = ", ".join(state[:4]) + (", ..." if len(state) > 4 else "")
        raise InputError(
            "job.run_dir",
            str(run_dir),
            f"holds a finished run ({shown}); pass --force to move it to "
            f"{run_dir / ARCHIVE_DIR}/ and submit anew, or use another run_dir",
        )
    return state


def archive_state(run_dir: Path, names: Iterable[str], now: float | None = None) -> Path:
    """Move `names` of `run_dir` into a new `run_dir/archive/<UTC time>/` (0700); its path."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    base = Path(run_dir) / ARCHIVE_DIR
    base.mkdir(mode=RUN_DIR_MODE, exist_ok=True)
    dest = base / stamp
    for n in range(1, 1000):
        try:
            dest.mkdir(mode=RUN_DIR_MODE)
            break
        except FileExistsError:
            dest = base / f"{stamp}.{n}"
    for name in names:
        os.replace(Path(run_dir) / name, dest / name)
    return dest


def restore_archive(run_dir: Path, archived: Path) -> None:
    """Undo `archive_state` (a submit that failed puts the earlier run back)."""
    for path in sorted(archived.iterdir()):
        target = Path(run_dir) / path.name
        if not target.exists():
            os.replace(path, target)
    with contextlib.suppress(OSError):
        archived.rmdir()
