"""The Slurm executor: carries out the policy's Slurm actions through `slurm.backend`.

The policy decides a Drain, Requeue, Release or Cancel; the coordinator journals it; this module
does it. `SlurmExecutor.execute` is one blocking attempt that turns an action into backend calls
(skipping what Slurm already shows done, so a resumed action is never repeated) and returns the
outcome for the journal. `SlurmExecutor.carry_out` runs it in a worker thread with bounded
retries and exponential backoff on transient failures, recording every attempt through the
callback it is given (the coordinator's journal). The spare pool uses `execute` for its plain
requeue fallback, so there is one place that knows how an action becomes Slurm commands.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from runtime.control.journal.schema import StoredAction
from runtime.control.policy import Action, Cancel, Drain, Release, Requeue
from slurm.backend import SlurmBackend, SlurmCommandError
from slurm.errors import EnvironmentProblem, InputError
from slurm.records import lead_record

log = logging.getLogger("fthsdp.coordinator")

#: Records one attempt at a journaled action: (action id, outcome, detail), once durable.
AttemptRecorder = Callable[[int, str, str], Awaitable[None]]

#: Failures worth retrying: Slurm busy or restarting, a command that timed out.
_RETRYABLE = (
    "Unable to contact",
    "Socket timed out",
    "Connection refused",
    "temporarily",
    "timed out",
)


def retryable(exc: SlurmCommandError) -> bool:
    return exc.returncode == -1 or any(t in exc.stderr for t in _RETRYABLE)


class SlurmExecutor:
    """Carries out Slurm actions through one backend, with `retries` attempts per action and a
    backoff of `backoff_s` doubling up to `backoff_max_s` between them."""

    def __init__(
        self,
        backend: SlurmBackend,
        retries: int = 5,
        backoff_s: float = 1.0,
        backoff_max_s: float = 30.0,
    ) -> None:
        self.backend = backend
        self.retries = retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s

    async def carry_out(self, stored: StoredAction, resumed: bool, record: AttemptRecorder) -> None:
        """Run one journaled action with retries and backoff, each attempt recorded."""
        loop = asyncio.get_running_loop()
        action = stored.action
        await record(stored.id, "started", "resumed after restart" if resumed else "")
        for attempt in range(self.retries):
            try:
                outcome, detail = await loop.run_in_executor(None, self.execute, action, resumed)
            except (InputError, EnvironmentProblem) as exc:
                # Refused before Slurm was asked (a bad node name, Slurm not usable):
                # retrying cannot help.
                await record(stored.id, "failed", str(exc))
                log.error("giving up on %s: %s", action, exc)
                break
            except SlurmCommandError as exc:
                if attempt + 1 >= self.retries or not retryable(exc):
                    await record(stored.id, "failed", str(exc))
                    log.error("giving up on %s: %s", action, exc)
                    break
                await record(stored.id, "retry", str(exc))
                delay = min(self.backoff_s * 2**attempt, self.backoff_max_s)
                await asyncio.sleep(delay)
            else:
                await record(stored.id, outcome, detail)
                break

    def execute(self, action: Action, resumed: bool) -> tuple[str, str]:
        """Carry out one Slurm action (in a worker thread); returns (outcome, detail)."""
        b = self.backend
        if isinstance(action, Drain):
            ok = b.drain(action.node, action.reason)
            return ("done", "drained") if ok else ("skipped", "drained by someone else")
        if isinstance(action, Requeue):
            current = lead_record(b.jobs([action.job_id]), action.job_id)
            if current and current.restarts > action.restarts:
                return ("skipped", f"already requeued (restart count {current.restarts})")
            if current and current.state.upper() == "PENDING":
                return ("skipped", "job is pending, nothing to requeue")
            b.requeue(action.job_id)
            return ("done", "requeued" + (" (after restart)" if resumed else ""))
        if isinstance(action, Release):
            # The backend waits for the requeued job to settle back to PENDING first.
            b.release(action.job_id, exclude=action.exclude)
            excluded = f", off {','.join(action.exclude)}" if action.exclude else ""
            return ("done", f"eligible now{excluded}")
        if isinstance(action, Cancel):
            b.cancel([action.job_id])
            return ("done", "cancelled")
        return ("skipped", f"not a Slurm action: {action}")
