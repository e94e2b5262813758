"""A recording stand-in for `CommandBackend` in submission tests: hands out job ids, keeps a
queue, fails the n-th submit on request and answers node queries from a given table."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from slurm.backend import JobInfo, NodeInfo, SlurmCommandError


class RecordingBackend:
    """Hands out job ids, records calls, and answers queries from a table it is given."""

    def __init__(self, fail_at: int | None = None, nodes: list[NodeInfo] | None = None) -> None:
        self.submitted: list[tuple[Path, list[str]]] = []
        self.cancelled: list[str] = []
        self.queue: list[JobInfo] = []
        self.fail_at = fail_at
        self._nodes = nodes

    def submit(self, script: Path, args: Sequence[str] = ()) -> str:
        if self.fail_at is not None and len(self.submitted) == self.fail_at:
            raise SlurmCommandError(["sbatch", str(script)], 1, "Batch job submission failed")
        self.submitted.append((script, list(args)))
        job_id = str(100 + len(self.submitted))
        self.queue.append(JobInfo(job_id, script.name, "PENDING", "", 0, "None"))
        return job_id

    def cancel(self, job_ids: Iterable[str]) -> None:
        self.cancelled += list(job_ids)

    def jobs(self, job_ids: Iterable[str] = (), name: str | None = None) -> list[JobInfo]:
        wanted = set(job_ids)
        return [j for j in self.queue if not wanted or j.base_id in wanted]

    def nodes(self, names: Iterable[str] = ()) -> list[NodeInfo]:
        if self._nodes is None:
            raise SlurmCommandError(["sinfo"], 1, "Unable to contact slurm controller")
        return self._nodes

    def requeue(self, job_id: str) -> None: ...
    def release(
        self, job_id: str, exclude: Sequence[str] = (), *, forget: Sequence[str] = ()
    ) -> None: ...
    def drain(self, node: str, reason: str) -> bool:
        return False

    def resume(self, node: str) -> bool:
        return False

    def set_comment(self, job_id: str, text: str) -> None:
        pass
