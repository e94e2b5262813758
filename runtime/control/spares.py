"""The agent a hot-spare slot job runs.

Why slots and not a shrinking pool job: Slurm cannot hand a node from one job to another (job
expansion is gone from 23.02 on), and a node released by `scontrol update NumNodes=` goes back
to the scheduler, where anyone's pending job may take it first. A job step runs only inside its
own job's allocation. So each slot is its own job shaped like one replica (same partition, GRES,
constraint, switches; gated by the Prolog like any job), and a failed replica moves *into* a slot:
the slot's batch script (`agent`) waits for an assignment in `RUN_DIR/spares.json` and then runs
that replica's own script in the slot's allocation. The replica's job id becomes the slot's; its
old job is cancelled, and one refill slot is queued (it waits like anyone's job).

The pool's data (`Pool`, `Slot`, read and written as `spares.json`, 0600, written only by
`fthsdp submit` and then by the coordinator) is the run directory's (`slurm.rundir.spares`).
Here: the slot's side (`agent`, run as `python -m runtime.control.spares agent` by
`slurm/templates/spares.sbatch.j2`). The pure decisions are `runtime.control.spare_slots`; the
coordinator's side is `runtime.control.spare_manager`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from slurm import contract
from slurm.backend import SlurmBackend, SlurmCommandError, make_backend
from slurm.errors import EnvironmentProblem, InputError
from slurm.records import lead_record
from slurm.rundir import (
    LOG_DIR,
    REPLICA_SCRIPT,
    SLOT_JOB_ID,
    PoolFileError,
    Slot,
    read_pool,
    read_run,
)

LIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED")


# -- the slot's side --------------------------------------------------------------------------


def agent(run_dir: Path, job_id: str, poll_s: float = 0.5, control_every_s: float = 15.0,
          unlisted_grace_s: float = 120.0) -> int:  # fmt: skip
    """Hold the slot until the coordinator assigns a replica, then become that replica's script.

    Leaves (exit 0) when the control job has ended, or when the pool no longer lists this slot
    after `unlisted_grace_s` (submit and refills write spares.json right after sbatch)."""
    started = time.monotonic()
    next_control = started
    control_id = _control_job(run_dir)
    backend = make_backend(retries=1, timeout=20.0)
    while True:
        try:
            pool = read_pool(run_dir)
        except PoolFileError as exc:
            print(f"fthsdp spare: {exc}", file=sys.stderr)
            pool = None
        slot = pool.slot(job_id) if pool else None
        if slot is not None and slot.replica is not None and slot.script is not None:
            return _become(run_dir, slot, job_id)
        if slot is None and pool is not None and time.monotonic() - started > unlisted_grace_s:
            print(f"fthsdp spare: job {job_id} is not in the pool: leaving", file=sys.stderr)
            return 0
        if control_id and time.monotonic() >= next_control:
            next_control = time.monotonic() + control_every_s
            if _ended(backend, control_id):
                print(f"fthsdp spare: control job {control_id} ended: leaving", file=sys.stderr)
                return 0
        time.sleep(poll_s)


def replica_logs(run_dir: Path, script: str, job_id: str) -> tuple[Path, Path]:
    """The stdout and stderr files a replica's script gets in job `job_id` (`--output` and
    `--error` of its `#SBATCH` block, `%j` filled in)."""
    stem = Path(run_dir) / LOG_DIR / f"{script.removesuffix('.sbatch')}-{job_id}"
    return stem.with_name(stem.name + ".out"), stem.with_name(stem.name + ".err")


def _become(run_dir: Path, slot: Slot, job_id: str) -> int:
    assert slot.script is not None and REPLICA_SCRIPT.fullmatch(slot.script)
    path = Path(run_dir) / slot.script
    st = path.stat()
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        print(f"fthsdp spare: {path} is not this user's private script", file=sys.stderr)
        return 2
    logs = replica_logs(run_dir, slot.script, job_id)
    print(
        f"fthsdp spare: running replica {slot.replica} ({slot.script}); its output goes to "
        f"{logs[0]} and {logs[1]}",
        file=sys.stderr,
    )
    sys.stderr.flush()
    # The replica's output belongs in its own logs (named as if Slurm had started its script in
    # this job), not in this slot's.
    for fd, log in zip((1, 2), logs, strict=True):
        try:
            target = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError as exc:  # the replica runs on; its output stays here
            print(f"fthsdp spare: cannot open {log} ({exc}); output stays here", file=sys.stderr)
            sys.stderr.flush()
            continue
        os.dup2(target, fd)
        os.close(target)
    os.execv("/bin/bash", ["/bin/bash", str(path)])
    return 0  # pragma: no cover - execv does not return


def _control_job(run_dir: Path) -> str | None:
    try:
        record = read_run(run_dir)
    except (InputError, OSError):
        return None
    return record.control.job_id if record.control else None


def _ended(backend: SlurmBackend, job_id: str) -> bool:
    try:
        found = lead_record(backend.jobs([job_id]), job_id)
    except (SlurmCommandError, EnvironmentProblem):
        return False  # unknown is not ended
    return found is None or found.state.upper() not in LIVE_STATES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.control.spares")
    sub = parser.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("agent", help="run in a spare slot job: wait for a replica to host")
    a.add_argument("--run-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    job_id = os.environ.get(contract.SLURM_JOB_ID, "")
    if not SLOT_JOB_ID.fullmatch(job_id):
        print("fthsdp spare: SLURM_JOB_ID is not set: run this inside a slot job", file=sys.stderr)
        return 2
    return agent(args.run_dir, job_id)


if __name__ == "__main__":
    sys.exit(main())
