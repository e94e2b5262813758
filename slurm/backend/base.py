"""The narrow interface through which fthsdp acts on Slurm, and the drain reasons it writes.

Everything that submits, requeues, drains or queries goes through `SlurmBackend`, so the recovery
path (failure -> report -> policy -> Slurm action) has exactly one place where it touches Slurm,
and tests can swap the class rather than patch subprocess calls. A drain reason fthsdp writes is
`drain_reason(check, detail)`: it starts with `DRAIN_PREFIX`, which is how fthsdp knows the
drains that are its own to resume.

The records and errors the interface speaks in (`JobInfo`, `NodeInfo`, `SlurmCommandError`, ...)
live in `slurm.records`, beside the parsers that build them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

from slurm.records import DRAIN_PREFIX, JobInfo, NodeInfo

#: sinfo shows 20 characters of a reason by default; scontrol shows it all.
REASON_MAX = 120


class SlurmBackend(Protocol):
    """What fthsdp needs from Slurm, and nothing more."""

    def submit(self, script: Path, args: Sequence[str] = ()) -> str: ...
    def requeue(self, job_id: str) -> None: ...
    def step_runs(
        self, job_id: str, node: str, timeout: float, het_group: int | None = None
    ) -> bool: ...
    def release(
        self, job_id: str, exclude: Sequence[str] = (), *, forget: Sequence[str] = ()
    ) -> None: ...
    def cancel(self, job_ids: Iterable[str]) -> None: ...
    def drain(self, node: str, reason: str) -> bool: ...
    def resume(self, node: str) -> bool: ...
    def set_comment(self, job_id: str, text: str) -> None: ...
    def jobs(self, job_ids: Iterable[str] = (), name: str | None = None) -> list[JobInfo]: ...
    def nodes(self, names: Iterable[str] = ()) -> list[NodeInfo]: ...


def drain_reason(check: str, detail: str) -> str:
    """`fthsdp: <check>: <detail>`, single-line and short so sinfo shows the check's name."""
    text = f"{DRAIN_PREFIX} {check}: {detail}".replace("\n", " ").replace('"', "'")
    return text[:REASON_MAX]
