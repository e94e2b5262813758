"""`SlurmBackend` over pyslurm's RPC bindings, for sites whose pyslurm matches their Slurm.

pyslurm talks to slurmctld directly instead of forking a command per action, which matters
only for a coordinator that acts on many replicas at once. It exists on the package index only
for some Slurm versions (docs/design-facts.md, Slurm fact 9), and `import pyslurm` can kill the
process when no slurm.conf is found, so this module imports pyslurm inside methods and is itself
imported only by `slurm.backend.default_backend()` after `pyslurm_usable()` has imported it safely
in a child process and compared its version with the running Slurm's.

Actions (requeue, make-eligible-now, cancel, drain, resume) use pyslurm's RPCs; drain and resume
keep the command backend's checks (one node name, its reason re-read right before acting).
Submission and queries stay on Slurm's commands (inherited from `CommandBackend`): sbatch is
what parses `#SBATCH` lines and `hetjob` separators, and the JSON queries are already parsed
into the same `JobInfo` / `NodeInfo` records, so both backends report identically.

Not exercised by the test-suite here: no pyslurm build for Slurm 22.05 exists.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Sequence
from typing import Any

from slurm.backend import RELEASE_DELAY_S, CommandBackend, SlurmCommandError


def _pyslurm() -> Any:
    import pyslurm

    return pyslurm


class PyslurmBackend(CommandBackend):
    """RPC actions through pyslurm; submission and queries through Slurm's commands."""

    def _rpc(self, what: list[str], fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:  # pyslurm raises RPCError (and others) with errno text
            raise SlurmCommandError(["pyslurm", *what], 1, str(exc)) from exc

    def requeue(self, job_id: str) -> None:
        p = _pyslurm()
        self._rpc(["requeue", job_id], p.Job(int(job_id)).requeue)

    def release(self, job_id: str, exclude: Sequence[str] = (), settle: float = 30.0) -> None:
        """Make a requeued job eligible now (begin time = now), and release a hold if any.

        Waits, like `CommandBackend.release`, until the job is back to PENDING: an earlier
        update is overwritten when the requeue completes. Exclusions go through scontrol.
        """
        deadline = time.monotonic() + settle
        while not self._settled(job_id) and time.monotonic() < deadline:
            time.sleep(0.2)
        if exclude:
            self._exclude(job_id, exclude)
        p = _pyslurm()
        job = p.Job(int(job_id))
        self._rpc(
            ["update", job_id, f"begin_time=now+{RELEASE_DELAY_S}"],
            job.modify,
            p.JobSubmitDescription(begin_time=f"now+{RELEASE_DELAY_S}"),
        )
        with contextlib.suppress(Exception):  # not held: nothing to release
            job.release()

    def cancel(self, job_ids: Iterable[str]) -> None:
        p = _pyslurm()
        for job_id in job_ids:
            self._rpc(["cancel", job_id], p.Job(int(job_id)).cancel)

    def _update_node(self, node: str, state: str, reason: str | None) -> None:
        """Drain or resume through pyslurm; `drain`/`resume` (inherited) have already checked
        the name and re-read the node's reason, exactly as for the command backend."""
        p = _pyslurm()
        change = p.Node(state=state, reason=reason) if reason else p.Node(state=state)
        self._rpc([state.lower(), node], p.Node(node).modify, change)
