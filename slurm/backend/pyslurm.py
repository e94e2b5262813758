"""`PyslurmBackend`: the `SlurmBackend` over pyslurm's RPC bindings, for sites whose pyslurm
matches their Slurm, and the probe that says whether it does.

pyslurm talks to slurmctld directly instead of forking a command per action, which matters
only for a coordinator that acts on many replicas at once. It is never picked on its own:
`slurm.backend.select.make_backend()` uses it only when `FTHSDP_BACKEND=pyslurm` asks for it and
`pyslurm_usable()` says it imports and was built for the running Slurm. `import pyslurm` can kill
the process when no slurm.conf is found (docs/design-facts.md, Slurm fact 9), so the probe imports
it in a child process first and this module imports it only inside methods.

Actions (requeue, make-eligible-now, cancel, drain, resume) use pyslurm's RPCs; drain and resume
keep the command backend's checks (one node name, its reason re-read right before acting).
Submission and queries stay on Slurm's commands (inherited from `CommandBackend`): sbatch is
what parses `#SBATCH` lines and `hetjob` separators, and the JSON queries are already parsed
into the same `JobInfo` / `NodeInfo` records, so both backends report identically.

Not exercised by the test-suite here: pyslurm on the package index is built for Slurm 25.11 (and
the old 17.11 and 18.08), while the Slurm releases installable here are Debian's 22.05, 24.11 and
26.05, so no pyslurm release matches a Slurm that the tests can run. Only `versions_match` is
tested.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

from slurm.backend.commands import RELEASE_DELAY_S, CommandBackend
from slurm.records import JobNotSettled, SlurmCommandError


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

    def release(
        self,
        job_id: str,
        exclude: Sequence[str] = (),
        settle: float = 30.0,
        *,
        forget: Sequence[str] = (),
    ) -> None:
        """Make a requeued job eligible now (begin time = now), and release a hold if any.

        Waits, like `CommandBackend.release`, until the job is back to PENDING: an earlier
        update is overwritten when the requeue completes. Exclusions go through scontrol.
        """
        deadline = time.monotonic() + settle
        settled = self._wait_settled(job_id, deadline)
        if exclude or forget:
            self._exclude(job_id, exclude, forget)
        p = _pyslurm()
        job = p.Job(int(job_id))
        self._rpc(
            ["update", job_id, f"begin_time=now+{RELEASE_DELAY_S}"],
            job.modify,
            p.JobSubmitDescription(begin_time=f"now+{RELEASE_DELAY_S}"),
        )
        with contextlib.suppress(Exception):  # not held: nothing to release
            job.release()
        if not settled:
            raise JobNotSettled(job_id, settle)

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


def versions_match(pyslurm_version: str, slurm_version: str) -> bool:
    """pyslurm X.Y.* is built for Slurm X.Y (e.g. pyslurm 23.2.2 for Slurm 23.02.7)."""

    def major_minor(text: str) -> tuple[int, int] | None:
        m = re.search(r"(\d+)\.(\d+)", text)
        return (int(m.group(1)), int(m.group(2))) if m else None

    a, b = major_minor(pyslurm_version), major_minor(slurm_version)
    return a is not None and a == b


def pyslurm_usable() -> bool:
    """True if pyslurm imports in a child process without killing it (docs/design-facts.md, Slurm
    fact 9) and was built for the Slurm that `sinfo --version` reports."""
    probe = "import pyslurm; print(getattr(pyslurm, '__version__', '') or pyslurm.version())"
    try:
        r = subprocess.run(
            [sys.executable, "-c", probe],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
            env=os.environ.copy(),
        )
        if r.returncode != 0:
            return False
        v = subprocess.run(
            ["sinfo", "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except (subprocess.TimeoutExpired, OSError):
        return False
    return v.returncode == 0 and versions_match(r.stdout.strip(), v.stdout.strip())
