"""Cancelling a run: every job recorded for it (replicas, spare slots, the control job), once.

`fthsdp cancel`, a failed demo's cleanup and the tests all cancel through `cancel_jobs`. The
jobs come from the run directory (jobs.json and spares.json), never from job-name guesses. Order
matters: replicas and spare slots go before the control job, so none outlives its control plane.
Only what Slurm still lists as queued or running is cancelled; the rest had finished. A pool file
that cannot be read never counts as "no slots" (its slot jobs may hold nodes): the rest of the run
is cancelled, and then that is reported (`Cancellation.check`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from slurm.backend import SlurmBackend
from slurm.errors import InputError
from slurm.rundir import SPARES_FILE, PoolFileError, RunRecord, live_jobs, read_pool


def cancel_order(record_ids: list[str], live: set[str]) -> tuple[list[str], list[str]]:
    """(ids to cancel, ids already finished), in the record's order: replicas before the control
    job, so none outlives its control plane. A job Slurm no longer lists has finished."""
    return [i for i in record_ids if i in live], [i for i in record_ids if i not in live]


@dataclass(frozen=True)
class Cancellation:
    """What `cancel_jobs` did to a run."""

    #: Every job of the run, in cancel order (replicas, spare slots, the control job).
    ids: tuple[str, ...]
    cancelled: tuple[str, ...]
    #: Jobs Slurm no longer lists as queued or running.
    finished: tuple[str, ...]
    #: Why spares.json could not be read (its slot jobs were not cancelled), or None.
    pool_error: str | None = None

    def check(self) -> None:
        """Raise the InputError that says the spare slots were left, when they were."""
        if self.pool_error is not None:
            raise InputError(
                SPARES_FILE,
                self.pool_error,
                "a readable spare pool; its slot jobs (job name ending -spare) were not "
                "cancelled: scancel them by hand",
            )


def cancel_jobs(
    record: RunRecord, backend: SlurmBackend, run_dir: Path | None = None
) -> Cancellation:
    """Cancel every job of the run that Slurm still lists, replicas and spare slots first.
    `run_dir` is where the run's files are now (default: where jobs.json says it was made)."""
    pool_error: str | None = None
    try:
        pool = read_pool(Path(record.run_dir) if run_dir is None else run_dir)
    except PoolFileError as exc:
        pool, pool_error = None, str(exc)
    spares = [s.job_id for s in pool.slots] if pool else []
    ids = [r.job_id for r in record.replicas] + spares
    ids += [record.control.job_id] if record.control else []
    live = {j.base_id for j in live_jobs(record, backend, spares)}
    to_cancel, finished = cancel_order(ids, live)
    if to_cancel:
        backend.cancel(to_cancel)
    return Cancellation(tuple(ids), tuple(to_cancel), tuple(finished), pool_error)


def cancel_run(record: RunRecord, backend: SlurmBackend) -> list[str]:
    """`cancel_jobs` for a caller that wants it all gone: the run's job ids, in cancel order.
    An unreadable pool file is an InputError, raised once the rest is cancelled."""
    done = cancel_jobs(record, backend)
    done.check()
    return list(done.ids)
