"""A requeued control job is held by Slurm behind a begin time ~100 s ahead; the replicas'
supervisors, as the job's owner, release it instead of waiting that out."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

from runtime.control.supervisor.control_plane import held_by_requeue, release_held_control_job
from slurm.records import JobInfo, NodeInfo, SlurmCommandError

NOW = 1_800_000_000.0


def job(state: str, eligible: float, job_id: str = "50") -> JobInfo:
    return JobInfo(job_id, "run-control", state, "", 1, "BeginTime", eligible_time=int(eligible))


@pytest.mark.parametrize(
    ("info", "held"),
    [
        (job("PENDING", NOW + 110), True),  # just requeued: Slurm's begin time ahead
        (job("PENDING", NOW + 2), False),  # released already (now + 2)
        (job("PENDING", NOW - 30), False),  # eligible, waiting for resources
        (job("RUNNING", NOW + 110), False),
        (job("COMPLETING", NOW + 110), False),
    ],
)
def test_held_by_requeue(info: JobInfo, held: bool) -> None:
    assert held_by_requeue(info, NOW) is held


class Slurm:
    def __init__(self, infos: list[JobInfo] | Exception) -> None:
        self.infos = infos
        self.released: list[str] = []

    def submit(self, script: Path, args: Sequence[str] = ()) -> str:
        raise NotImplementedError

    def requeue(self, job_id: str) -> None:
        raise NotImplementedError

    def release(
        self, job_id: str, exclude: Sequence[str] = (), *, forget: Sequence[str] = ()
    ) -> None:
        self.released.append(job_id)

    def cancel(self, job_ids: Iterable[str]) -> None:
        raise NotImplementedError

    def drain(self, node: str, reason: str) -> bool:
        raise NotImplementedError

    def resume(self, node: str) -> bool:
        raise NotImplementedError

    def jobs(self, job_ids: Iterable[str] = (), name: str | None = None) -> list[JobInfo]:
        if isinstance(self.infos, Exception):
            raise self.infos
        return self.infos

    def nodes(self, names: Iterable[str] = ()) -> list[NodeInfo]:
        return []


def test_a_held_control_job_is_released() -> None:
    slurm = Slurm([job("PENDING", NOW + 100)])
    assert release_held_control_job(slurm, "50", NOW)
    assert slurm.released == ["50"]


@pytest.mark.parametrize(
    "infos",
    [
        [job("RUNNING", NOW)],
        [],  # gone: nothing read, nothing done
        [job("PENDING", NOW + 100, job_id="51")],  # another job's record
        SlurmCommandError(["squeue"], 1, "Unable to contact slurm controller"),
    ],
)
def test_only_what_was_read_as_held_is_released(infos: list[JobInfo] | Exception) -> None:
    slurm = Slurm(infos)
    assert not release_held_control_job(slurm, "50", NOW)
    assert slurm.released == []
