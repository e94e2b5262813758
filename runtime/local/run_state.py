"""What a local run owns in its run directory, and what a fresh one clears.

Each local run starts from fresh state files (`clear_run_state`); a directory that holds a run
submitted to Slurm (`jobs.json`) is left alone and the local run goes to its `local/`
subdirectory instead (`local_run_dir`). Both the native launcher and the foreign-trainer
launcher use these.
"""

from __future__ import annotations

from pathlib import Path

from slurm.rundir import check_run_dir

#: Run-directory entries a fresh local run clears (durable checkpoints are kept with --resume).
RUN_STATE = (
    "progress",
    "ledger",
    "final",
    "logs",
    "finished",
    "slow",
    "rendezvous",
    "control.json",
    "control.sqlite",
    "control.sqlite-wal",
    "control.sqlite-shm",
)
#: Where a local run goes inside a directory that holds a run submitted to Slurm.
LOCAL_SUBDIR = "local"


def local_run_dir(run_dir: Path) -> tuple[Path, str | None]:
    """The directory a local run owns for `run_dir`, and a note when it is not `run_dir`
    itself: a directory with a submitted run (`jobs.json`) is that run's, so the local run
    goes to its `local/` subdirectory and leaves the submitted run's files alone. A directory
    someone else controls is refused (`slurm.rundir.check_run_dir`)."""
    check_run_dir(run_dir, "--run-dir")  # nobody else may be able to change what it runs
    if (run_dir / "jobs.json").exists():
        own = run_dir / LOCAL_SUBDIR
        return own, f"{run_dir} holds a run submitted to Slurm; this local run uses {own}"
    return run_dir, None


def clear_run_state(run_dir: Path, keep_checkpoints: bool) -> None:
    import shutil

    names = RUN_STATE if keep_checkpoints else (*RUN_STATE, "checkpoints")
    for name in names:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
