"""The hot-spare pool's file (`spares.json`) and the agent a spare slot job runs.

Why slots and not a shrinking pool job: Slurm cannot hand a node from one job to another (job
expansion is gone from 23.02 on), and a node released by `scontrol update NumNodes=` goes back
to the scheduler, where anyone's pending job may take it first. A job step runs only inside its
own job's allocation. So each slot is its own job shaped like one replica (same partition, GRES,
constraint, switches; gated by the Prolog like any job), and a failed replica moves *into* a slot:
the slot's batch script (`agent`) waits for an assignment in `RUN_DIR/spares.json` and then runs
that replica's own script in the slot's allocation. The replica's job id becomes the slot's; its
old job is cancelled, and one refill slot is queued (it waits like anyone's job).

Here: the pool's data (`Pool`, `Slot`, read and written as `spares.json`, 0600, written only by
`fthsdp submit` and then by the coordinator), and the slot's side (`agent`, run as
`python -m runtime.control.spares agent` by `slurm/templates/spares.sbatch.j2`). The pure
decisions are `runtime.control.spare_slots`; the coordinator's side is
`runtime.control.spare_manager`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from slurm.backend import SlurmBackend, SlurmCommandError, make_backend
from slurm.errors import EnvironmentProblem, InputError
from slurm.records import lead_record
from slurm.submit import SPARES_FILE

#: What a slot may run: a replica script `fthsdp submit` wrote (a bare file name, never a path).
_SCRIPT = re.compile(r"replica-[0-9]{1,7}\.sbatch")
_JOB = re.compile(r"[0-9]{1,12}")
#: `_SCRIPT`, public: the coordinator checks a replica's script with it before a slot gets it.
REPLICA_SCRIPT = _SCRIPT
#: Slurm states of a slot job that still holds (or will hold) its nodes.
LIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED")


class PoolFileError(ValueError):
    """spares.json is not what this version writes."""


@dataclass(frozen=True)
class Slot:
    job_id: str
    #: The replica this slot runs, once it was moved here.
    replica: int | None = None
    script: str | None = None
    since: float | None = None


@dataclass(frozen=True)
class Move:
    replica: int
    from_job: str
    to_job: str
    nodes: tuple[str, ...]
    at: float


@dataclass(frozen=True)
class Fallback:
    replica: int
    job_id: str
    at: float
    why: str


@dataclass(frozen=True)
class Pool:
    #: Slots to keep available (running idle or waiting in the queue): `[spares] nodes` divided
    #: by `replicas.nodes`.
    target: int
    slots: tuple[Slot, ...] = ()
    moves: tuple[Move, ...] = ()
    fallbacks: tuple[Fallback, ...] = ()
    #: Slot jobs retired because a node of theirs failed a health check.
    retired: tuple[str, ...] = ()

    def slot(self, job_id: str) -> Slot | None:
        return next((s for s in self.slots if s.job_id == job_id), None)

    def moved_from(self, job_id: str) -> Move | None:
        return next((m for m in self.moves if m.from_job == job_id), None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Pool:
        """A pool read back from spares.json; `PoolFileError` naming what is wrong."""
        try:
            if not isinstance(data, dict):
                raise TypeError("not an object")
            target = data["target"]
            if not isinstance(target, int) or isinstance(target, bool) or target < 0:
                raise ValueError(f"target {target!r}")
            slots = tuple(_slot(s) for s in data.get("slots", []))
            moves = tuple(
                Move(int(m["replica"]), _job(m["from_job"]), _job(m["to_job"]),
                     tuple(str(n) for n in m["nodes"]), float(m["at"]))
                for m in data.get("moves", [])
            )  # fmt: skip
            falls = tuple(
                Fallback(int(f["replica"]), _job(f["job_id"]), float(f["at"]), str(f["why"]))
                for f in data.get("fallbacks", [])
            )
            retired = tuple(_job(j) for j in data.get("retired", []))
        except (KeyError, TypeError, ValueError) as exc:
            raise PoolFileError(f"{SPARES_FILE}: {type(exc).__name__}: {exc}") from None
        return cls(target, slots, moves, falls, retired)


def _job(value: Any) -> str:
    if not isinstance(value, str) or not _JOB.fullmatch(value):
        raise ValueError(f"job id {value!r}")
    return value


def _slot(raw: Any) -> Slot:
    if not isinstance(raw, dict):
        raise TypeError(f"slot {raw!r}")
    replica, script = raw.get("replica"), raw.get("script")
    if replica is not None and (not isinstance(replica, int) or replica < 0):
        raise ValueError(f"slot replica {replica!r}")
    if script is not None and not (isinstance(script, str) and _SCRIPT.fullmatch(script)):
        raise ValueError(f"slot script {script!r}")
    if (replica is None) != (script is None):
        raise ValueError("slot replica and script go together")
    since = raw.get("since")
    return Slot(_job(raw["job_id"]), replica, script, None if since is None else float(since))


# -- the pool file ----------------------------------------------------------------------------


def read_pool(run_dir: Path) -> Pool | None:
    """The pool of `run_dir`, or None when the run has no spares."""
    path = Path(run_dir) / SPARES_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise PoolFileError(f"{path}: not JSON ({exc})") from None
    return Pool.from_dict(data)


def write_pool(run_dir: Path, pool: Pool) -> None:
    from slurm.run_dir import write_private

    write_private(Path(run_dir) / SPARES_FILE, json.dumps(pool.to_dict(), indent=1) + "\n")


def pool_job_ids(run_dir: Path) -> list[str]:
    """Every slot job the pool file lists (for `fthsdp cancel`); [] without spares."""
    try:
        pool = read_pool(run_dir)
    except PoolFileError:
        return []
    return [s.job_id for s in pool.slots] if pool else []


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
    from slurm.run_dir import LOG_DIR

    stem = Path(run_dir) / LOG_DIR / f"{script.removesuffix('.sbatch')}-{job_id}"
    return stem.with_name(stem.name + ".out"), stem.with_name(stem.name + ".err")


def _become(run_dir: Path, slot: Slot, job_id: str) -> int:
    assert slot.script is not None and _SCRIPT.fullmatch(slot.script)
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
    from slurm.run_dir import read_run

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
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if not _JOB.fullmatch(job_id):
        print("fthsdp spare: SLURM_JOB_ID is not set: run this inside a slot job", file=sys.stderr)
        return 2
    return agent(args.run_dir, job_id)


if __name__ == "__main__":
    sys.exit(main())
