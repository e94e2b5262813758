"""The replica job's supervisor: runs the replica's srun step and, when it ends, asks what next.

The replica's batch script runs `fthsdp replica --run-dir D --replica K -- srun ...`. When the step
ends with a failure, the supervisor sends a signed fatal report of its own (the worker's leader
may have died before it could; the coordinator treats both reports of one death as one failure,
keyed by job, restart count and launch number), then asks the coordinator for a directive:

- `relaunch`: run the step again inside this allocation (tier 1), after the given delay;
- `requeue`: the coordinator is requeuing this job (tier 2); wait to be stopped by Slurm;
- `exit`: leave for good (tier 3, a user error, or a superseded run);
- `continue`: no decision yet; ask again shortly.

Before each launch the supervisor waits for the control plane (`control.json` written by this
run's control job, its coordinator and Lighthouse accepting connections), with backoff, for up to
`control_wait_s` (300 s, env `FTHSDP_CONTROL_WAIT_S`): the Lighthouse imports torch and takes
far longer than its idle 3.4 s on a busy machine. While waiting it asks Slurm about the control
job now and then; if that job ended, or the wait runs out, the supervisor stops with one line and
exit code 3 (`EXIT_NO_CONTROL_PLANE`), having counted no failure and requeued nothing: a replica
that never trained because the control plane was not up has not failed. A step that exits 3
itself (the worker gave up on the quorum service) is treated the same way: wait, then launch
again, uncounted (at most `max_unreached` times in a row).

If the coordinator cannot be reached after a failure, the supervisor falls back to
exit-for-requeue and requeues its own job through `slurm.backend` (a coordinator that comes back
sees the restart count rise without its own action and does not requeue it again). The step
gets `FTHSDP_REPLICA`, `FTHSDP_RUN_DIR`, `FTHSDP_LAUNCH` and `FTHSDP_INCARNATION` so the
worker's reports can name the same launch.

In `[train] mode = "torchft"` (`FTHSDP_TRAIN_MODE`) the step is a foreign torchft trainer that
reports nothing: the supervisor gives each launch the Lighthouse from `control.json`
(`TORCHFT_LIGHTHOUSE`) and a free rendezvous port on the group's first node (`MASTER_ADDR`,
`MASTER_PORT`, `FTHSDP_RDZV_ENDPOINT`), and speaks for the group itself
(`runtime.control.foreign_step`): progress read from the trainer's output or file, its node
watched, leftovers of a dead step killed.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from runtime.protocol import ExitCode, ReplicaReport, replica_key_id, sign
from slurm import hostlist
from slurm.backend import SlurmBackend, SlurmCommandError, SlurmOutputError, make_backend
from slurm.errors import EnvironmentProblem, InputError
from slurm.rundir import CONTROL_FILE, RunFileError, read_control, read_secret

if TYPE_CHECKING:
    from runtime.report_sender import ReportClient

log = logging.getLogger("fthsdp.supervisor")

#: The supervisor's own exit code when it leaves so that the job is requeued.
EXIT_FOR_REQUEUE = 75
#: ... when the control plane never came up (nothing counted, nothing requeued).
EXIT_NO_CONTROL_PLANE = int(ExitCode.NO_QUORUM_SERVICE)
CONTROL_WAIT_ENV = "FTHSDP_CONTROL_WAIT_S"
#: Seconds without progress after which a foreign trainer's step is hung (render sets it; 0: off).
PROGRESS_TIMEOUT_ENV = "FTHSDP_PROGRESS_TIMEOUT_S"


@dataclass
class SupervisorConfig:
    run_dir: Path
    replica: int
    command: list[str]
    job_id: str | None = None
    restarts: int = 0
    nodes: list[str] = field(default_factory=list)
    #: How long to keep asking while the coordinator says `continue`.
    decision_wait_s: float = 30.0
    #: How long to wait for Slurm to stop this job after a `requeue` directive.
    requeue_wait_s: float = 180.0
    http_timeout_s: float = 5.0
    max_launches: int = 1000
    #: How long to wait for the control plane before a launch.
    control_wait_s: float = 300.0
    #: How often to ask Slurm whether the control job still runs while waiting for it.
    control_check_s: float = 15.0
    #: Uncounted relaunches in a row of a step that could not reach the quorum service.
    max_unreached: int = 3
    #: "fthsdp" (native worker) or "torchft" (foreign trainer; the supervisor reports for it).
    mode: str = "fthsdp"
    progress_regex: str | None = None
    progress_file: str | None = None
    #: torchft mode: seconds without progress after which the step is hung; 0 = never.
    progress_timeout_s: float = 0.0
    health_checks: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, run_dir: Path, replica: int, command: list[str]) -> SupervisorConfig:
        env = os.environ
        nodelist = env.get("SLURM_JOB_NODELIST_HET_GROUP_0") or env.get("SLURM_JOB_NODELIST", "")
        control_wait_s = _seconds(env, CONTROL_WAIT_ENV, "300", "seconds >= 0")
        progress_timeout_s = _seconds(env, PROGRESS_TIMEOUT_ENV, "0", "seconds >= 0 (0: off)")
        return cls(
            run_dir=run_dir,
            replica=replica,
            command=command,
            job_id=env.get("SLURM_JOB_ID"),
            restarts=int(env.get("SLURM_RESTART_COUNT", "0") or 0),
            nodes=hostlist.expand(nodelist, "SLURM_JOB_NODELIST") if nodelist else [],
            control_wait_s=control_wait_s,
            mode=env.get("FTHSDP_TRAIN_MODE") or "fthsdp",
            progress_regex=env.get("FTHSDP_PROGRESS_REGEX") or None,
            progress_file=env.get("FTHSDP_PROGRESS_FILE") or None,
            progress_timeout_s=progress_timeout_s,
            health_checks=tuple(c for c in env.get("FTHSDP_HEALTH_CHECKS", "").split(",") if c),
        )


def _seconds(env: Mapping[str, str], name: str, default: str, allowed: str) -> float:
    """A finite, non-negative number of seconds from the environment; InputError otherwise."""
    raw = env.get(name) or default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise InputError(name, raw, allowed)
    return value


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


def failure_of(code: int) -> tuple[str | None, int]:
    """The report's failure class for a step's exit code (a signal counts as a process fault)."""
    if code == ExitCode.NODE_FAULT:
        return "node", code
    if code == ExitCode.BAD_ENV:
        return None, code
    return "process", code


class CoordinatorUnreachable(RuntimeError):
    pass


def _http(
    method: str, url: str, body: bytes | None, headers: dict[str, str], timeout: float
) -> Any:
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise CoordinatorUnreachable(f"{method} {url}: HTTP {exc.code}") from None
    except (OSError, ValueError) as exc:
        raise CoordinatorUnreachable(f"{method} {url}: {exc}") from None


class Supervisor:
    def __init__(
        self,
        config: SupervisorConfig,
        backend: SlurmBackend | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.config = config
        self.backend = backend or make_backend()
        self.sleep = sleep
        self.launch = 0
        self.child: subprocess.Popen[bytes] | None = None
        self.stopping = False
        self.unreached = 0
        #: The node fault the watchdog found in the last foreign step (torchft mode).
        self.node_fault: tuple[str, list[str]] | None = None
        #: Why the last foreign step was stopped as hung, or None.
        self.hung: str | None = None
        self._control_job: str | None = None
        try:
            from slurm.rundir import read_run

            record = read_run(config.run_dir)
            self._control_job = record.control.job_id if record.control else None
        except InputError:
            pass  # not a submitted run (no jobs.json): nothing to ask Slurm about

    def incarnation(self) -> str:
        c = self.config
        return f"{c.job_id or 'local'}.{c.restarts}.{self.launch}"

    def _forward(self, signum: int, _frame: FrameType | None) -> None:
        # Slurm is stopping this job (scancel, or the requeue we asked for): never requeue it
        # ourselves afterwards.
        self.stopping = True
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)
        else:
            raise SystemExit(EXIT_FOR_REQUEUE)  # waiting between steps: leave now

    def run_step(self) -> int:
        c = self.config
        env = dict(os.environ)
        env.update(
            FTHSDP_REPLICA=str(c.replica),
            FTHSDP_RUN_DIR=str(c.run_dir),
            FTHSDP_LAUNCH=str(self.launch),
            FTHSDP_INCARNATION=self.incarnation(),
        )
        if c.mode == "torchft":
            return self.run_foreign_step(env)
        self.child = subprocess.Popen(c.command, env=env)
        return self.child.wait()

    def run_foreign_step(self, env: dict[str, str]) -> int:
        """Launch a foreign torchft trainer's step and report for it (module docstring)."""
        from runtime.control.foreign_step import ForeignLaunch, ForeignStep
        from runtime.foreign import GroupEndpoints, launch_env, progress_path
        from runtime.rendezvous import RendezvousError, node_address, pick_port
        from slurm.contract import dump_dir

        c = self.config
        found = lighthouse_url(c.run_dir)
        if found is None:
            return int(ExitCode.NO_QUORUM_SERVICE)  # the control file went away: wait again
        try:
            host = node_address(c.nodes[0]) if c.nodes else "127.0.0.1"
        except (RendezvousError, SlurmOutputError, EnvironmentProblem) as exc:
            log.error("replica %d: no rendezvous address: %s", c.replica, exc)
            return int(ExitCode.BAD_ENV)
        endpoints = GroupEndpoints(found, host, pick_port(self.incarnation()))
        env.update(launch_env(endpoints))
        dump_dir(c.run_dir, c.replica).mkdir(parents=True, exist_ok=True)
        progress = progress_path(c.progress_file, c.run_dir, c.replica) if c.progress_file else None
        launch = ForeignLaunch(
            command=list(c.command),
            env=env,
            progress_regex=c.progress_regex,
            progress_file=progress,
            progress_timeout_s=c.progress_timeout_s,
            health_checks=c.health_checks,
        )
        client = self._report_client()
        report = None
        if client is not None:
            launch_no, restarts = self.launch, c.restarts

            def report(**fields: Any) -> None:
                client.status(launch=launch_no, restarts=restarts, **fields)

        step = ForeignStep(launch, report)
        self.child = step.start()
        code = step.wait()
        if client is not None:
            client.close(timeout_s=c.http_timeout_s)  # sent before any fatal report
        self.node_fault = (step.fault.reason, step.fault.evidence) if step.fault else None
        self.hung = step.hung
        return code

    def _report_client(self) -> ReportClient | None:
        """This launch's status report client, or None when the run has no secret."""
        from runtime.report_sender import ReportClient

        c = self.config
        secret = c.run_dir / "secret"
        if not secret.exists():
            return None
        return ReportClient(
            lambda: coordinator_url(c.run_dir),
            read_secret(secret),
            c.replica,
            # Not the fatal report's incarnation: its seq 0 would read as a stale duplicate.
            f"progress:{self.incarnation()}",
            job_id=c.job_id,
            nodes=list(c.nodes),
            min_interval_s=0.0,  # the foreign step paces its reports itself
        )

    def report_failure(self, url: str, code: int) -> None:
        c = self.config
        failure, exit_code = failure_of(code)
        fault = self.node_fault if code == ExitCode.NODE_FAULT else None
        report = ReplicaReport(
            replica=c.replica,
            incarnation=f"supervisor:{self.incarnation()}",
            seq=0,
            kind="fatal",
            job_id=c.job_id,
            nodes=c.nodes,
            failure=failure,  # type: ignore[arg-type]
            exit_code=exit_code,
            last_error=fault[0] if fault else (self.hung or f"step exited with {code}"),
            failed_node=c.nodes[0] if fault and c.nodes else None,
            evidence=[e[:500] for e in fault[1][:16]] if fault else [],
            launch=self.launch,
            restarts=c.restarts,
        )
        body = report.to_json()
        secret = read_secret(c.run_dir / "secret")
        signed = sign(secret, replica_key_id(c.replica), "POST", "/v1/reports", body)
        headers = {"Content-Type": "application/json", **signed}
        _http("POST", f"{url}/v1/reports", body, headers, c.http_timeout_s)

    def directive(self, url: str) -> tuple[str, float]:
        c = self.config
        query = f"job={c.job_id or ''}&restarts={c.restarts}&launch={self.launch}"
        got = _http(
            "GET", f"{url}/v1/replicas/{c.replica}/directive?{query}", None, {}, c.http_timeout_s
        )
        return str(got["directive"]), float(got.get("delay_s", 0.0))

    def decide(self, code: int) -> tuple[str, float]:
        """Report the failure and get a directive; `requeue-self` if the coordinator is away."""
        url = coordinator_url(self.config.run_dir)
        if url is None:
            return "requeue-self", 0.0
        deadline = time.monotonic() + self.config.decision_wait_s
        reported = False
        while True:
            try:
                if not reported:
                    self.report_failure(url, code)
                    reported = True
                directive, delay = self.directive(url)
                if directive != "continue":
                    return directive, delay
            except CoordinatorUnreachable as exc:
                log.warning("coordinator: %s", exc)
                url = coordinator_url(self.config.run_dir) or url  # it may have moved
            if time.monotonic() >= deadline:
                return "requeue-self", 0.0
            self.sleep(1.0)

    def control_job_ended(self) -> str | None:
        """How the run's control job ended ("FAILED", "gone", ...), or None while it is queued,
        running, or Slurm cannot tell."""
        job = self._control_job
        if not job:
            return None
        try:
            infos = [i for i in self.backend.jobs([job]) if i.base_id == job]
        except (SlurmCommandError, SlurmOutputError, EnvironmentProblem) as exc:
            log.warning("cannot ask Slurm about control job %s: %s", job, exc)
            return None
        if not infos:
            return "gone"
        from slurm.rundir import TERMINAL_STATES

        state = infos[0].state.upper()
        return state if state in TERMINAL_STATES else None

    def wait_for_control(self) -> bool:
        """Wait, with backoff, until the control plane is up; False (after one line on stderr)
        when the control job ended first or `control_wait_s` passed."""
        c = self.config
        start = time.monotonic()
        next_check = start + min(c.control_check_s, 5.0)
        told = False
        delay = 0.2
        while True:
            why = control_plane_problem(c.run_dir, self._control_job)
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
                ended = self.control_job_ended()
                if ended is not None:
                    job = self._control_job
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

    def run(self) -> int:
        """Run the step until it succeeds or a directive says to stop; returns the exit code."""
        previous = signal.signal(signal.SIGTERM, self._forward)
        try:
            while self.launch < self.config.max_launches:
                if not self.wait_for_control():
                    return EXIT_NO_CONTROL_PLANE
                code = self.run_step()
                if code == 0:
                    return 0
                if self.stopping:
                    return EXIT_FOR_REQUEUE
                if (
                    code == ExitCode.NO_QUORUM_SERVICE
                    and self.unreached < self.config.max_unreached
                ):
                    # The worker gave up on the quorum service: not a failure of this replica.
                    self.unreached += 1
                    log.warning(
                        "replica %d step could not reach the quorum service; waiting for the "
                        "control plane, then launching again (not counted)",
                        self.config.replica,
                    )
                    self.launch += 1
                    continue
                self.unreached = 0
                directive, delay = self.decide(code)
                log.warning(
                    "replica %d step exited %d; directive %s", self.config.replica, code, directive
                )
                if directive == "relaunch":
                    self.sleep(delay)
                    self.launch += 1
                    continue
                if directive == "exit":
                    return 0
                if directive == "requeue-self" and not self._requeue_self():
                    return EXIT_FOR_REQUEUE
                self.sleep(self.config.requeue_wait_s)  # Slurm stops this job when it requeues
                return EXIT_FOR_REQUEUE
            return EXIT_FOR_REQUEUE
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _requeue_self(self) -> bool:
        job = self.config.job_id
        if not job:
            return False
        try:
            self.backend.requeue(job)
            self.backend.release(job)
        except SlurmCommandError as exc:
            log.error("could not requeue own job %s: %s", job, exc)
            return False
        return True
