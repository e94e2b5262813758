"""A foreign torchft trainer's launch under the replica supervisor (`[train] mode = "torchft"`).

The trainer reports nothing, so the supervisor gives each launch the Lighthouse
(`TORCHFT_LIGHTHOUSE`: the supervisor's forwarder to the gate that `control.json` names) and a
free rendezvous port on the group's first node (`MASTER_ADDR`, `MASTER_PORT`,
`FTHSDP_RDZV_ENDPOINT`), and speaks for the group itself (`runtime.control.foreign_step`):
progress read from the trainer's output or file, its node watched, leftovers of a dead step
killed. The last step's node fault and hung reason are kept for the supervisor's fatal report.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runtime.control.supervisor.config import SupervisorConfig
from runtime.control.supervisor.control_plane import coordinator_url, lighthouse_url
from runtime.protocol import ExitCode
from slurm.backend import SlurmOutputError
from slurm.errors import EnvironmentProblem
from slurm.rundir import read_secret

if TYPE_CHECKING:
    from runtime.report_sender import ReportClient

log = logging.getLogger("fthsdp.supervisor")


class ForeignSteps:
    """The launches of one replica's foreign trainer (module docstring)."""

    def __init__(self, config: SupervisorConfig) -> None:
        self.config = config
        #: The node fault the watchdog found in the last foreign step.
        self.node_fault: tuple[str, list[str]] | None = None
        #: Why the last foreign step was stopped as hung, or None.
        self.hung: str | None = None
        #: The supervisor's forwarder to the gated Lighthouse, when it runs one.
        self.lighthouse: str | None = None

    def run(
        self,
        env: dict[str, str],
        launch_no: int,
        incarnation: str,
        started: Callable[[subprocess.Popen[bytes]], None],
    ) -> int:
        """Launch a foreign torchft trainer's step and report for it (module docstring);
        `started` gets the step's process as soon as it runs."""
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
        endpoints = GroupEndpoints(self.lighthouse or found, host, pick_port(incarnation))
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
        client = self._report_client(incarnation)
        report = None
        if client is not None:
            restarts = c.restarts

            def report(**fields: Any) -> None:
                client.status(launch=launch_no, restarts=restarts, **fields)

        step = ForeignStep(launch, report)
        started(step.start())
        code = step.wait()
        if client is not None:
            client.close(timeout_s=c.http_timeout_s)  # sent before any fatal report
        self.node_fault = (step.fault.reason, step.fault.evidence) if step.fault else None
        self.hung = step.hung
        return code

    def _report_client(self, incarnation: str) -> ReportClient | None:
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
            f"progress:{incarnation}",
            job_id=c.job_id,
            nodes=list(c.nodes),
            min_interval_s=0.0,  # the foreign step paces its reports itself
        )
