"""The supervisor's own exit codes, and the failure class it reports for a step's exit code.

The worker's exit codes (`runtime.protocol.ExitCode`) say how a step ended; the supervisor maps
them to the failure class of its fatal report (`failure_of`) and leaves with one of its own codes
when it stops supervising without a clean end: 75 so that Slurm's requeue takes over, 3 when the
control plane never came up (nothing counted, nothing requeued).
"""

from __future__ import annotations

from runtime.protocol import ExitCode

#: The supervisor's own exit code when it leaves so that the job is requeued.
EXIT_FOR_REQUEUE = 75
#: ... when the control plane never came up (nothing counted, nothing requeued).
EXIT_NO_CONTROL_PLANE = int(ExitCode.NO_QUORUM_SERVICE)


def failure_of(code: int) -> tuple[str | None, int]:
    """The report's failure class for a step's exit code (a signal counts as a process fault)."""
    if code == ExitCode.NODE_FAULT:
        return "node", code
    if code == ExitCode.BAD_ENV:
        return None, code
    return "process", code
