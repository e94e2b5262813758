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
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import IO

from runtime.protocol import ExitCode
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


class _Leave(Exception):
    """The slot has no reason to wait any longer (the message says why)."""


class _SlotWait:
    """What an idle slot watches: its assignment in the pool, the pool still listing it (submit
    and refills write spares.json right after sbatch, so only after `unlisted_grace_s`), and
    the control job, which a slot must not outlive."""

    def __init__(self, run_dir: Path, job_id: str, control_every_s: float,
                 unlisted_grace_s: float) -> None:  # fmt: skip
        self.run_dir = run_dir
        self.job_id = job_id
        self.control_every_s = control_every_s
        self.unlisted_grace_s = unlisted_grace_s
        self.started = self.next_control = time.monotonic()
        self.control_id = _control_job(run_dir)
        self.backend = make_backend(retries=1, timeout=20.0)

    def until_assigned(
        self, poll_s: float, gone: Callable[[], str | None] = lambda: None
    ) -> Slot | int:
        """This slot once assigned, or the exit code to leave with (0; the slot's log says
        why). `gone` says why the slot's own process ended, if it did."""
        while True:
            try:
                why = gone()
                if why is not None:
                    raise _Leave(why)
                slot = self.assigned()
            except _Leave as why:
                print(f"fthsdp spare: {why}: leaving", file=sys.stderr)
                return 0
            if slot is not None:
                return slot
            time.sleep(poll_s)

    def assigned(self) -> Slot | None:
        """This slot once a replica is assigned to it; None: wait on. `_Leave`: stop waiting."""
        try:
            pool = read_pool(self.run_dir)
        except PoolFileError as exc:
            print(f"fthsdp spare: {exc}", file=sys.stderr)
            pool = None
        slot = pool.slot(self.job_id) if pool else None
        if slot is not None and slot.replica is not None and slot.script is not None:
            return slot
        now = time.monotonic()
        if slot is None and pool is not None and now - self.started > self.unlisted_grace_s:
            raise _Leave(f"job {self.job_id} is not in the pool")
        if self.control_id and now >= self.next_control:
            self.next_control = now + self.control_every_s
            if _ended(self.backend, self.control_id):
                raise _Leave(f"control job {self.control_id} ended")
        return None


def agent(run_dir: Path, job_id: str, poll_s: float = 0.5, control_every_s: float = 15.0,
          unlisted_grace_s: float = 120.0) -> int:  # fmt: skip
    """Hold the slot until the coordinator assigns a replica, then become that replica's script.

    Leaves (exit 0) when the control job has ended, or when the pool no longer lists this slot
    after `unlisted_grace_s`."""
    found = _SlotWait(run_dir, job_id, control_every_s, unlisted_grace_s).until_assigned(poll_s)
    return found if isinstance(found, int) else _become(run_dir, slot=found, job_id=job_id)


def warm_agent(run_dir: Path, job_id: str, command: list[str], poll_s: float = 0.1,
               control_every_s: float = 15.0, unlisted_grace_s: float = 120.0) -> int:  # fmt: skip
    """A warm slot: start the training command now, keep it waiting, and when the coordinator
    assigns a replica, supervise that step as the replica's (`runtime.warm_handoff`).

    The step's output is copied through this process, so that it goes to the slot's log while
    it waits and to the replica's logs once it is that replica. A step whose node fails its
    check before any assignment ends the slot: the coordinator's upkeep forgets it and queues a
    refill, whose Prolog keeps it off that node. A step that fails otherwise leaves the slot
    waiting cold, as `agent` does: a refill would run the same failing script again."""
    from runtime.control.supervisor.config import SupervisorConfig
    from runtime.control.supervisor.loop import Supervisor, WarmStep
    from runtime.warm_handoff import handoff_path, ready_path

    handoff = handoff_path(run_dir, job_id)
    for stale in (handoff, ready_path(handoff)):  # a requeued slot job starts over
        stale.unlink(missing_ok=True)
    restarts = os.environ.get(contract.SLURM_RESTART_COUNT, "0") or "0"
    env = dict(os.environ)
    env.update(
        {
            contract.WARM_HANDOFF: str(handoff),
            contract.INCARNATION: f"{job_id}.{restarts}.warm",
            contract.RUN_DIR: str(run_dir),
        }
    )
    env.pop(contract.REPLICA_ID, None)
    child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pumps = [_pump(child.stdout, 1), _pump(child.stderr, 2)]

    def stop(signum: int, _frame: FrameType | None) -> None:
        child.send_signal(signum)
        raise SystemExit(0)

    previous = signal.signal(signal.SIGTERM, stop)
    wait = _SlotWait(run_dir, job_id, control_every_s, unlisted_grace_s)

    def ended() -> str | None:
        code = child.poll()
        return None if code is None else f"the warm step ended ({code}) before a replica came"

    try:
        slot = wait.until_assigned(poll_s, ended)
        if isinstance(slot, int):
            code = child.poll()
            if code is None:  # left for the slot's own reasons (control job ended, unlisted)
                return slot
            if code == ExitCode.NODE_FAULT:
                print("fthsdp spare: the node failed its check: the pool replaces this slot",
                      file=sys.stderr)  # fmt: skip
                return 1
            # Anything else (the training script crashed while warm) would crash in a refill
            # too: the slot stays, cold, rather than churn through slot jobs.
            print("fthsdp spare: this slot waits cold from now on", file=sys.stderr)
            return agent(run_dir, job_id, control_every_s=control_every_s,
                         unlisted_grace_s=unlisted_grace_s)  # fmt: skip
        signal.signal(signal.SIGTERM, previous)
        assert slot.replica is not None and slot.script is not None
        _switch_logs(run_dir, slot.script, job_id, f"replica {slot.replica} takes the warm step")
        try:
            config = SupervisorConfig.from_env(run_dir, slot.replica, command)
        except InputError as exc:
            print(f"fthsdp spare: {exc}", file=sys.stderr)
            return 2
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s"
        )
        return Supervisor(config, warm=WarmStep(child, handoff)).run()
    finally:
        signal.signal(signal.SIGTERM, previous)
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        for pump in pumps:
            pump.join(timeout=5)


def _pump(stream: IO[bytes] | None, fd: int) -> threading.Thread:
    """Copy a child's output to this process's `fd`, whichever file that names at the time."""

    def run() -> None:
        assert stream is not None
        for chunk in iter(lambda: stream.read1(65536), b""):  # type: ignore[attr-defined]
            with contextlib.suppress(OSError):
                os.write(fd, chunk)

    thread = threading.Thread(target=run, name=f"fthsdp-spare-pump-{fd}", daemon=True)
    thread.start()
    return thread


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
    _switch_logs(run_dir, slot.script, job_id, f"running replica {slot.replica} ({slot.script})")
    os.execv("/bin/bash", ["/bin/bash", str(path)])
    return 0  # pragma: no cover - execv does not return


def _switch_logs(run_dir: Path, script: str, job_id: str, what: str) -> None:
    """From here on, this process's stdout and stderr are the replica's logs (named as if Slurm
    had started its script in this job), not the slot's; the slot's log says so last."""
    logs = replica_logs(run_dir, script, job_id)
    print(f"fthsdp spare: {what}; its output goes to {logs[0]} and {logs[1]}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, log in zip((1, 2), logs, strict=True):
        try:
            target = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError as exc:  # the replica runs on; its output stays here
            print(f"fthsdp spare: cannot open {log} ({exc}); output stays here", file=sys.stderr)
            sys.stderr.flush()
            continue
        os.dup2(target, fd)
        os.close(target)


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
    a.add_argument(
        "--warm",
        action="store_true",
        help="a warm slot: start COMMAND (the replicas' srun line) now and hand it a replica",
    )
    a.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND")
    args = parser.parse_args(argv)
    job_id = os.environ.get(contract.SLURM_JOB_ID, "")
    if not SLOT_JOB_ID.fullmatch(job_id):
        print("fthsdp spare: SLURM_JOB_ID is not set: run this inside a slot job", file=sys.stderr)
        return 2
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.warm != bool(command):
        print("fthsdp spare: --warm goes with the step's command (-- srun ...)", file=sys.stderr)
        return 2
    if args.warm:
        return warm_agent(args.run_dir, job_id, command)
    return agent(args.run_dir, job_id)


if __name__ == "__main__":
    sys.exit(main())
