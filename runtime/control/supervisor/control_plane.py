"""Whether a run's control plane is up, and the replica's wait for it before each launch.

Before each launch the supervisor waits for the control plane (`control.json` written by this
run's control job, its coordinator and Lighthouse accepting connections), with backoff, for up to
`control_wait_s` (300 s, env `FTHSDP_CONTROL_WAIT_S`): the Lighthouse imports torch and takes
far longer than its idle 3.4 s on a busy machine. While waiting it asks Slurm about the control
job now and then; if that job ended, or the wait runs out, the wait ends with one line on stderr
and the supervisor stops with `EXIT_NO_CONTROL_PLANE`, having counted no failure and requeued
nothing: a replica that never trained because the control plane was not up has not failed.

A requeued control job is held by Slurm behind a begin time about 100-120 s ahead; the job's
owner may move it (`StartTime`), so while the control plane does not answer the supervisor asks
Slurm about the control job, and releases it when it is held so (`release_held_control_job`),
both in the wait before a launch and, every `control_check_s`, while its step trains
(`ControlJobWatch`): the run's own control plane never waits out the requeue delay. When the
control plane does not answer and Slurm shows its job ended for good on two checks in a row,
the watch stops the step (exit `EXIT_NO_CONTROL_PLANE`, no failure counted) rather than let
the workers wait out `control_wait_s` for a control plane that cannot come back.

The addresses in `control.json` are read tolerantly here (`lighthouse_url`, `coordinator_url`):
None while the control job has not written the file, or is replacing it.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from runtime.control.supervisor.config import SupervisorConfig
from slurm.backend import JobInfo, SlurmBackend, SlurmCommandError, SlurmOutputError
from slurm.errors import EnvironmentProblem, InputError
from slurm.rundir import CONTROL_FILE, RunFileError, read_control

log = logging.getLogger("fthsdp.supervisor")


def _answers(address: object) -> bool:
    """True if `address` (an http URL) accepts a TCP connection now."""
    if not isinstance(address, str):
        return False
    try:
        found = urllib.parse.urlparse(address)
        host, port = found.hostname, found.port
    except ValueError:
        return False
    if not host or not port:
        return False
    try:
        with socket.create_connection((host, port), timeout=2.0):
            return True
    except OSError:
        return False


def control_plane_problem(run_dir: Path, control_job: str | None = None) -> str | None:
    """Why the run's control plane is not usable yet, or None once it is: `control.json`
    written by the control job `control_job` (when known), its coordinator (and Lighthouse,
    when it has one) accepting connections."""
    path = run_dir / CONTROL_FILE
    try:
        data = read_control(run_dir)
    except RunFileError as exc:
        return f"{path} not readable yet ({exc.allowed})"
    if data is None:
        return f"no {path} yet"
    written_by = data.job_id
    if control_job and written_by and written_by != control_job:
        return f"{path} is from control job {written_by}, not this run's {control_job}"
    if not _answers(data.coordinator):
        return f"coordinator {data.coordinator} not answering"
    lighthouse = data.lighthouse
    if lighthouse is not None and not _answers(lighthouse):
        return f"Lighthouse {lighthouse} not answering"
    return None


def _control_address(run_dir: Path, key: str) -> str | None:
    """One address from `control.json`, or None while the control job has not written it."""
    try:
        data = read_control(run_dir)
    except RunFileError:
        return None
    value = getattr(data, key) if data is not None else None
    return value if isinstance(value, str) and value else None


def lighthouse_url(run_dir: Path) -> str | None:
    return _control_address(run_dir, "lighthouse")


def coordinator_url(run_dir: Path) -> str | None:
    return _control_address(run_dir, "coordinator")


def control_job_of(run_dir: Path) -> str | None:
    """The run's control job id from `jobs.json`, or None when it names none."""
    try:
        from slurm.rundir import read_run

        record = read_run(run_dir)
        return record.control.job_id if record.control else None
    except InputError:
        return None  # not a submitted run (no jobs.json): nothing to ask Slurm about


#: A pending control job whose begin time is further ahead than this is held (a requeue's delay).
HELD_AHEAD_S = 5.0


def held_by_requeue(info: JobInfo, now: float) -> bool:
    """Whether a control job's record shows it pending behind a begin time ahead of `now` (what
    Slurm sets on a requeue), as opposed to waiting for resources or running."""
    return info.state.upper() == "PENDING" and info.eligible_time > now + HELD_AHEAD_S


def release_held_control_job(backend: SlurmBackend, job: str, now: float | None = None) -> bool:
    """Make the control job `job` eligible now when Slurm holds it behind a requeue's begin
    time; True when released. Only what was read is acted on: a job Slurm cannot be asked
    about, or not held, is left alone."""
    try:
        infos = [i for i in backend.jobs([job]) if i.base_id == job and i.het_offset == 0]
    except (SlurmCommandError, SlurmOutputError, EnvironmentProblem) as exc:
        log.warning("cannot ask Slurm about control job %s: %s", job, exc)
        return False
    if not infos or not held_by_requeue(infos[0], time.time() if now is None else now):
        return False
    try:
        backend.release(job)
    except (SlurmCommandError, SlurmOutputError, EnvironmentProblem) as exc:
        log.warning("could not release control job %s: %s", job, exc)
        return False
    log.info("control job %s was held behind its requeue's begin time: released it", job)
    return True


def control_job_ended(backend: SlurmBackend, job: str | None) -> str | None:
    """How the control job `job` ended ("FAILED", "gone", ...), or None while it is queued,
    running, or Slurm cannot tell."""
    if not job:
        return None
    try:
        infos = [i for i in backend.jobs([job]) if i.base_id == job]
    except (SlurmCommandError, SlurmOutputError, EnvironmentProblem) as exc:
        log.warning("cannot ask Slurm about control job %s: %s", job, exc)
        return None
    if not infos:
        return "gone"
    from slurm.rundir import TERMINAL_STATES

    state = infos[0].state.upper()
    return state if state in TERMINAL_STATES else None


class ControlJobWatch:
    """While the step trains: every `control_check_s`, if the control plane does not answer,
    release the control job when Slurm holds it behind a requeue's begin time; and when Slurm
    shows it ended for good on two checks in a row (a requeue passes through no such state
    twice), call `on_ended`, so the replica stops waiting for a control plane that will not
    come back."""

    def __init__(
        self,
        config: SupervisorConfig,
        backend: SlurmBackend,
        on_ended: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self.backend = backend
        self.job = control_job_of(config.run_dir)
        self.on_ended = on_ended
        self.released = 0
        #: How the control job ended, once two checks in a row said so.
        self.ended: str | None = None
        self._seen_ended: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fthsdp-control-watch", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.config.control_check_s):
            self.check()

    def check(self) -> None:
        """One pass of the watch (module docstring)."""
        if not self.job or self.ended is not None:
            return
        if control_plane_problem(self.config.run_dir, None) is None:
            self._seen_ended = None
            return
        self.released += release_held_control_job(self.backend, self.job)
        ended = control_job_ended(self.backend, self.job)
        confirmed = ended is not None and ended == self._seen_ended
        self._seen_ended = ended
        if confirmed and ended is not None:
            self.ended = ended
            log.error(
                "control job %s ended (%s) and the control plane does not answer; see %s; "
                "replica %d stops its step",
                self.job,
                ended.lower(),
                self.config.run_dir / "logs" / f"control-{self.job}.err",
                self.config.replica,
            )
            if self.on_ended is not None:
                self.on_ended(ended)

    def start(self) -> None:
        if self.job:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()


class ControlPlaneWait:
    """The wait for the control plane before a launch (module docstring)."""

    def __init__(
        self,
        config: SupervisorConfig,
        backend: SlurmBackend,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.config = config
        self.backend = backend
        self.sleep = sleep
        self.control_job = control_job_of(config.run_dir)

    def control_job_ended(self) -> str | None:
        return control_job_ended(self.backend, self.control_job)

    def wait(self) -> bool:
        """Wait, with backoff, until the control plane is up; False (after one line on stderr)
        when the control job ended first or `control_wait_s` passed."""
        c = self.config
        start = time.monotonic()
        next_check = start + min(c.control_check_s, 5.0)
        told = False
        delay = 0.2
        while True:
            why = control_plane_problem(c.run_dir, self.control_job)
            if why is None:
                if told:
                    log.info("control plane up after %.0fs", time.monotonic() - start)
                return True
            now = time.monotonic()
            if not told and now - start >= 5.0:
                log.info("replica %d waits for the control plane: %s", c.replica, why)
                told = True
            if now >= next_check:
                next_check = now + c.control_check_s
                if self.control_job:
                    release_held_control_job(self.backend, self.control_job)
                ended = self.control_job_ended()
                if ended is not None:
                    job = self.control_job
                    log.error(
                        "control job %s ended (%s) before the control plane came up; "
                        "see %s; replica %d did not train and counts no failure",
                        job,
                        ended.lower(),
                        c.run_dir / "logs" / f"control-{job}.err",
                        c.replica,
                    )
                    return False
            if now - start >= c.control_wait_s:
                log.error(
                    "the control plane did not come up within %.0fs (%s); replica %d did not "
                    "train and counts no failure",
                    c.control_wait_s,
                    why,
                    c.replica,
                )
                return False
            self.sleep(delay)
            delay = min(delay * 2, 5.0)
