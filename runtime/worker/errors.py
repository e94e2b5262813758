"""The failure a worker cannot continue from, with the exit code of its class.

Every part of the worker raises it; the facade turns it into the classified final report and
the process's exit code (`runtime.protocol.ExitCode`), which the supervisor acts on.
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.protocol import ExitCode


class FatalWorkerError(RuntimeError):
    """A failure the worker cannot continue from; carries the exit code for its class."""

    def __init__(self, message: str, exit_code: ExitCode, evidence: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.evidence = list(evidence)
