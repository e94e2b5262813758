"""The replica supervisor's launch loop: run the step until it succeeds or a directive says stop.

Before each launch it waits for the control plane (`control_plane`); a step that exits 3 itself
(the worker gave up on the quorum service) is treated the same way: wait, then launch again,
uncounted (at most `max_unreached` times in a row). A failed step is reported and a directive
asked for (`coordinator_link`): relaunch in place after a delay, exit for good, or wait for Slurm
to requeue the job; with the coordinator away the supervisor requeues its own job through
`slurm.backend`. A SIGTERM from Slurm is forwarded to the step and the supervisor never requeues
the job itself afterwards. The step gets `FTHSDP_REPLICA`, `FTHSDP_RUN_DIR`, `FTHSDP_LAUNCH` and
`FTHSDP_INCARNATION` so the worker's reports can name the same launch; in torchft mode the launch
goes through `torchft_mode`.

The run's Lighthouse sits behind an authenticated gate (`runtime.control.lighthouse_gate`): the
supervisor runs a forwarder on 127.0.0.1 for its whole life that proves the replica's key to the
gate, and each step's Manager is pointed at it (`FTHSDP_LIGHTHOUSE_FORWARDER`, and
`TORCHFT_LIGHTHOUSE` for a foreign trainer).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from runtime.control.lighthouse_forwarder import ForwarderThread, LighthouseForwarder
from runtime.control.supervisor.config import SupervisorConfig
from runtime.control.supervisor.control_plane import (
    ControlJobWatch,
    ControlPlaneWait,
    lighthouse_url,
)
from runtime.control.supervisor.coordinator_link import CoordinatorLink, FailedStep
from runtime.control.supervisor.exits import EXIT_FOR_REQUEUE, EXIT_NO_CONTROL_PLANE
from runtime.control.supervisor.torchft_mode import ForeignSteps
from runtime.protocol import ExitCode, replica_key_id
from runtime.warm_handoff import Handoff, write_handoff
from slurm import contract
from slurm.backend import SlurmBackend, SlurmCommandError, make_backend
from slurm.rundir import read_secret

log = logging.getLogger("fthsdp.supervisor")


@dataclass
class WarmStep:
    """A warm spare slot's step, already running and waiting for `handoff` to name its replica:
    the supervisor's first launch adopts it instead of starting one."""

    child: subprocess.Popen[bytes]
    handoff: Path


class Supervisor:
    def __init__(
        self,
        config: SupervisorConfig,
        backend: SlurmBackend | None = None,
        sleep: Callable[[float], None] = time.sleep,
        warm: WarmStep | None = None,
    ) -> None:
        self.config = config
        self.warm = warm
        self.backend = backend or make_backend()
        self.sleep = sleep
        self.launch = 0
        self.child: subprocess.Popen[bytes] | None = None
        self.stopping = False
        self.unreached = 0
        self.control = ControlPlaneWait(config, self.backend, sleep)
        self.coordinator = CoordinatorLink(config, sleep)
        self.foreign = ForeignSteps(config)
        self.forwarder: ForwarderThread | None = None

    def start_forwarder(self) -> str | None:
        """Start the local forwarder to the gated Lighthouse; its URL, or None when the run has
        no secret (a hand-made run directory: the step then uses the control file's address)."""
        c = self.config
        path = c.run_dir / "secret"
        if not path.exists():
            return None
        run_dir = c.run_dir
        forwarder = LighthouseForwarder(
            read_secret(path), replica_key_id(c.replica), lambda: lighthouse_url(run_dir)
        )
        self.forwarder = ForwarderThread(forwarder)
        found = self.forwarder.start()
        self.foreign.lighthouse = found
        log.info("replica %d reaches the Lighthouse through %s", c.replica, found)
        return found

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

    def _control_ended(self, _how: str) -> None:
        """The control job ended for good: stop the step, which waits for it in vain."""
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)

    def _started(self, child: subprocess.Popen[bytes]) -> None:
        self.child = child

    def run_step(self) -> int:
        c = self.config
        env = dict(os.environ)
        env.update(
            {
                contract.REPLICA: str(c.replica),
                contract.REPLICA_ID: str(c.replica),
                contract.RUN_DIR: str(c.run_dir),
                contract.LAUNCH: str(self.launch),
                contract.INCARNATION: self.incarnation(),
            }
        )
        if self.forwarder is not None:
            env[contract.LIGHTHOUSE_FORWARDER] = self.forwarder.forwarder.url
        if self.warm is not None:
            return self._adopt_warm(env)
        if c.mode == "torchft":
            return self.foreign.run(env, self.launch, self.incarnation(), self._started)
        self.child = subprocess.Popen(c.command, env=env)
        return self.child.wait()

    def _adopt_warm(self, env: dict[str, str]) -> int:
        """Name the warm step's replica in its handoff file and wait for it like a launch."""
        warm, self.warm = self.warm, None
        assert warm is not None
        handoff = Handoff(
            self.config.replica,
            self.launch,
            env[contract.INCARNATION],
            env.get(contract.LIGHTHOUSE_FORWARDER),
        )
        if warm.child.poll() is None:
            write_handoff(warm.handoff, handoff)
            log.info("replica %d takes over the warm step in this slot", self.config.replica)
        self.child = warm.child
        return warm.child.wait()

    def decide(self, code: int) -> tuple[str, float]:
        """Report the failed step and get a directive; `requeue-self` if the coordinator is away."""
        step = FailedStep(
            code, self.launch, self.incarnation(), self.foreign.node_fault, self.foreign.hung
        )
        return self.coordinator.decide(step)

    def run(self) -> int:
        """Run the step until it succeeds or a directive says to stop; returns the exit code."""
        previous = signal.signal(signal.SIGTERM, self._forward)
        self.start_forwarder()
        watch = ControlJobWatch(self.config, self.backend, on_ended=self._control_ended)
        watch.start()
        try:
            while self.launch < self.config.max_launches:
                if not self.control.wait():
                    return EXIT_NO_CONTROL_PLANE
                code = self.run_step()
                if code == 0:
                    return 0
                if watch.ended is not None:
                    # stopped because the run's control plane is gone for good: no failure
                    return EXIT_NO_CONTROL_PLANE
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
            watch.stop()
            if self.forwarder is not None:
                self.forwarder.stop()

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
