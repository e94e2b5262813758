"""The supervisor's talk with the coordinator after a failed step: report it, ask what next.

The supervisor sends a signed fatal report of its own (the worker's leader may have died before
it could; the coordinator treats both reports of one death as one failure, keyed by job, restart
count and launch number), then asks for the replica's directive until it is something other than
`continue`. Both requests are signed with the replica's key, and only an answer signed back under
that key for the request's own nonce, with every field in range (`runtime.protocol`), counts as
the coordinator's: anything else (an unsigned or forged answer, `delay_s: NaN`, a directive for
another launch) is treated as no answer at all. If the coordinator cannot be reached within
`decision_wait_s` (or `control.json` names none), the answer is `requeue-self`: the supervisor
falls back to exit-for-requeue and requeues its own job (a coordinator that comes back sees the
restart count rise without its own action and does not requeue it again).
"""

from __future__ import annotations

import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from runtime.control.supervisor.config import SupervisorConfig
from runtime.control.supervisor.control_plane import coordinator_url
from runtime.control.supervisor.exits import failure_of
from runtime.protocol import (
    MAX_REPORT_BYTES,
    NONCE_HEADER,
    DirectiveAnswer,
    ExitCode,
    ReplicaReport,
    SignatureError,
    derive_key,
    replica_key_id,
    sign,
    verify_answer,
)
from slurm.errors import InputError
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


def _signed_call(
    secret: bytes,
    key_id: str,
    method: str,
    url: str,
    path: str,
    body: bytes,
    timeout: float,
) -> bytes:
    """The verified answer body of the signed request `method path`; `CoordinatorUnreachable`
    for no answer, an error status, or an answer not signed for this very request."""
    signed = sign(secret, key_id, method, path, body)
    headers = {"Content-Type": "application/json", **signed} if body else signed
    req = urllib.request.Request(url + path, data=body or None, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            answer = resp.read(MAX_REPORT_BYTES + 1)
            answer_headers = resp.headers
    except urllib.error.HTTPError as exc:
        raise CoordinatorUnreachable(f"{method} {url}{path}: HTTP {exc.code}") from None
    except (OSError, ValueError) as exc:
        raise CoordinatorUnreachable(f"{method} {url}{path}: {exc}") from None
    if len(answer) > MAX_REPORT_BYTES:
        raise CoordinatorUnreachable(f"{method} {url}{path}: answer over {MAX_REPORT_BYTES} bytes")
    try:
        key = derive_key(secret, key_id)
        verify_answer(key, method, path, signed[NONCE_HEADER], answer, answer_headers)
    except SignatureError as exc:
        raise CoordinatorUnreachable(f"{method} {url}{path}: {exc}, ignored") from None
    return answer


class CoordinatorLink:
    """One replica's fatal reports and directive requests (module docstring)."""

    def __init__(self, config: SupervisorConfig, sleep: Callable[[float], None] = time.sleep):
        self.config = config
        self.sleep = sleep

    def _secret(self) -> bytes:
        """The run secret; one that cannot be read or trusted leaves nothing to talk with."""
        path = self.config.run_dir / "secret"
        try:
            return read_secret(path)
        except (OSError, InputError) as exc:
            raise CoordinatorUnreachable(f"no usable run secret: {exc}") from None

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
        key_id = replica_key_id(c.replica)
        body = report.to_json()
        _signed_call(self._secret(), key_id, "POST", url, "/v1/reports", body, c.http_timeout_s)

    def directive(self, url: str, launch: int) -> tuple[str, float]:
        """The coordinator's signed, checked directive for this launch (module docstring)."""
        c = self.config
        query = f"job={c.job_id or ''}&restarts={c.restarts}&launch={launch}"
        path = f"/v1/replicas/{c.replica}/directive?{query}"
        key_id = replica_key_id(c.replica)
        raw = _signed_call(self._secret(), key_id, "GET", url, path, b"", c.http_timeout_s)
        try:
            got = DirectiveAnswer.from_answer(raw, c.restarts, launch)
        except (ValueError, RecursionError) as exc:
            raise CoordinatorUnreachable(f"GET {url}{path}: answer refused ({exc})") from None
        return got.directive, got.delay_s

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
