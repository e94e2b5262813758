"""The supervisor's talk with the coordinator after a failed step: report it, ask what next.

The supervisor sends a signed fatal report of its own (the worker's leader may have died before
it could; the coordinator treats both reports of one death as one failure, keyed by job, restart
count and launch number), then asks for the replica's directive until it is something other than
`continue`. If the coordinator cannot be reached within `decision_wait_s` (or `control.json`
names none), the answer is `requeue-self`: the supervisor falls back to exit-for-requeue and
requeues its own job (a coordinator that comes back sees the restart count rise without its own
action and does not requeue it again).
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.control.supervisor.config import SupervisorConfig
from runtime.control.supervisor.control_plane import coordinator_url
from runtime.control.supervisor.exits import failure_of
from runtime.protocol import ExitCode, ReplicaReport, replica_key_id, sign
from slurm.rundir import read_secret

log = logging.getLogger("fthsdp.supervisor")


class CoordinatorUnreachable(RuntimeError):
    pass


@dataclass(frozen=True)
class FailedStep:
    """One launch's failed end, as the supervisor reports it."""

    code: int
    launch: int
    #: The launch's incarnation (`job.restarts.launch`).
    incarnation: str
    #: The node fault the watchdog found in a foreign step (torchft mode): reason, evidence.
    node_fault: tuple[str, list[str]] | None = None
    #: Why a foreign step was stopped as hung, or None.
    hung: str | None = None


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


class CoordinatorLink:
    """One replica's fatal reports and directive requests (module docstring)."""

    def __init__(self, config: SupervisorConfig, sleep: Callable[[float], None] = time.sleep):
        self.config = config
        self.sleep = sleep

    def report_failure(self, url: str, step: FailedStep) -> None:
        c = self.config
        code = step.code
        failure, exit_code = failure_of(code)
        fault = step.node_fault if code == ExitCode.NODE_FAULT else None
        report = ReplicaReport(
            replica=c.replica,
            incarnation=f"supervisor:{step.incarnation}",
            seq=0,
            kind="fatal",
            job_id=c.job_id,
            nodes=c.nodes,
            failure=failure,  # type: ignore[arg-type]
            exit_code=exit_code,
            last_error=fault[0] if fault else (step.hung or f"step exited with {code}"),
            failed_node=c.nodes[0] if fault and c.nodes else None,
            evidence=[e[:500] for e in fault[1][:16]] if fault else [],
            launch=step.launch,
            restarts=c.restarts,
        )
        body = report.to_json()
        secret = read_secret(c.run_dir / "secret")
        signed = sign(secret, replica_key_id(c.replica), "POST", "/v1/reports", body)
        headers = {"Content-Type": "application/json", **signed}
        _http("POST", f"{url}/v1/reports", body, headers, c.http_timeout_s)

    def directive(self, url: str, launch: int) -> tuple[str, float]:
        c = self.config
        query = f"job={c.job_id or ''}&restarts={c.restarts}&launch={launch}"
        got = _http(
            "GET", f"{url}/v1/replicas/{c.replica}/directive?{query}", None, {}, c.http_timeout_s
        )
        return str(got["directive"]), float(got.get("delay_s", 0.0))

    def decide(self, step: FailedStep) -> tuple[str, float]:
        """Report the failure and get a directive; `requeue-self` if the coordinator is away."""
        url = coordinator_url(self.config.run_dir)
        if url is None:
            return "requeue-self", 0.0
        deadline = time.monotonic() + self.config.decision_wait_s
        reported = False
        while True:
            try:
                if not reported:
                    self.report_failure(url, step)
                    reported = True
                directive, delay = self.directive(url, step.launch)
                if directive != "continue":
                    return directive, delay
            except CoordinatorUnreachable as exc:
                log.warning("coordinator: %s", exc)
                url = coordinator_url(self.config.run_dir) or url  # it may have moved
            if time.monotonic() >= deadline:
                return "requeue-self", 0.0
            self.sleep(1.0)
