"""A requeued control job is held by Slurm behind a begin time ~100 s ahead; the replicas'
supervisors, as the job's owner, release it instead of waiting that out."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

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


class Sequenced(Slurm):
    """Slurm answering each `jobs` call with the next of `answers`."""

    def __init__(self, answers: list[list[JobInfo] | Exception]) -> None:
        super().__init__([])
        self.answers = answers

    def jobs(self, job_ids: Iterable[str] = (), name: str | None = None) -> list[JobInfo]:
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def _watch(tmp_path: Path, answers: list[list[JobInfo] | Exception]) -> tuple[Any, list[str]]:
    from runtime.control.supervisor.config import SupervisorConfig
    from runtime.control.supervisor.control_plane import ControlJobWatch
    from slurm.rundir import JobRecord, RunRecord, write_run

    control = JobRecord("control", "50", "run-control", "c")
    write_run(RunRecord("run", str(tmp_path), NOW, control))  # no control.json: not answering
    ended: list[str] = []
    config = SupervisorConfig(run_dir=tmp_path, replica=1, command=["true"])
    # each check asks Slurm twice: once whether the job is held, once whether it ended
    doubled = [a for answer in answers for a in (answer, answer)]
    return ControlJobWatch(config, Sequenced(doubled), on_ended=ended.append), ended


GONE: list[JobInfo] = []
SLURM_AWAY = SlurmCommandError(["squeue"], 1, "Unable to contact slurm controller")


@pytest.mark.parametrize(
    ("answers", "ended"),
    [
        ([[job("FAILED", NOW)], [job("FAILED", NOW)]], "FAILED"),
        ([GONE, GONE], "gone"),  # Slurm forgot it: it ended long ago
        ([[job("CANCELLED", NOW)], [job("PENDING", NOW + 100)], [job("CANCELLED", NOW)]], None),
        ([[job("NODE_FAIL", NOW)], [job("PENDING", NOW + 100)], [job("RUNNING", NOW)]], None),
        ([SLURM_AWAY, SLURM_AWAY, SLURM_AWAY], None),  # nothing read, nothing done
        ([[job("FAILED", NOW)], SLURM_AWAY, [job("FAILED", NOW)]], None),  # not in a row
        ([[job("RUNNING", NOW)], [job("RUNNING", NOW)]], None),
    ],
)
def test_the_step_stops_only_once_slurm_twice_in_a_row_shows_the_control_job_ended(
    tmp_path: Path, answers: list[list[JobInfo] | Exception], ended: str | None
) -> None:
    watch, called = _watch(tmp_path, answers)
    for _ in answers:
        watch.check()
    assert watch.ended == ended
    assert called == ([ended] if ended else [])
    if ended is not None:
        watch.check()  # once ended, nothing more is called
        assert called == [ended]


def test_an_answering_control_plane_is_never_second_guessed(tmp_path: Path) -> None:
    watch, called = _watch(tmp_path, [[job("FAILED", NOW)]] * 3)
    import runtime.control.supervisor.control_plane as cp

    real = cp.control_plane_problem
    cp.control_plane_problem = lambda *_a, **_k: None  # type: ignore[assignment]
    try:
        for _ in range(3):
            watch.check()
    finally:
        cp.control_plane_problem = real
    assert watch.ended is None and called == []


@pytest.mark.timeout(30)
def test_a_supervisor_stops_its_step_when_the_control_job_ended(tmp_path: Path) -> None:
    import subprocess
    import sys

    from runtime.control.supervisor.config import SupervisorConfig
    from runtime.control.supervisor.loop import Supervisor

    config = SupervisorConfig(run_dir=tmp_path, replica=1, command=["true"])
    sup = Supervisor(config, Slurm([]))
    sup.child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        sup._control_ended("FAILED")
        assert sup.child.wait(20) == -15  # SIGTERM
    finally:
        if sup.child.poll() is None:
            sup.child.kill()
