"""Slurm away is not a verdict on an action: the executor retries it until Slurm answers.

A requeue that fails because slurmctld cannot be reached (stopped for an upgrade, restarting,
its host rebooting) stays pending, retried with the backoff for as long as the run lives, and
ends done (or skipped, when Slurm then shows it moot); only an answer from Slurm that refuses the
action uses up the attempts and fails it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

from runtime.control import executor as executor_module
from runtime.control.executor import SlurmExecutor, unreachable
from runtime.control.journal.schema import StoredAction
from runtime.control.policy import Action, Release, Requeue
from slurm.records import JobInfo, JobNotSettled, NodeInfo, SlurmCommandError

AWAY = "scontrol: error: Unable to contact slurm controller (connect failure)"


class FlakySlurm:
    """Unreachable for the first `away` calls; then `state` for the job, and requeues work."""

    def __init__(self, away: int, refuse: str | None = None, state: str = "RUNNING") -> None:
        self.away = away
        self.refuse = refuse
        self.state = state
        self.calls: list[str] = []

    def _call(self, what: str) -> None:
        self.calls.append(what)
        if self.away > 0:
            self.away -= 1
            raise SlurmCommandError(["scontrol", what], 1, AWAY)

    def submit(self, script: Path, args: Sequence[str] = ()) -> str:
        raise NotImplementedError

    def requeue(self, job_id: str) -> None:
        self._call("requeue")
        if self.refuse:
            raise SlurmCommandError(["scontrol", "requeue", job_id], 1, self.refuse)

    def release(
        self, job_id: str, exclude: Sequence[str] = (), *, forget: Sequence[str] = ()
    ) -> None:
        self._call("release")

    def cancel(self, job_ids: Iterable[str]) -> None:
        self._call("cancel")

    def drain(self, node: str, reason: str) -> bool:
        raise NotImplementedError

    def resume(self, node: str) -> bool:
        raise NotImplementedError

    def set_comment(self, job_id: str, text: str) -> None:
        raise NotImplementedError

    def jobs(self, job_ids: Iterable[str] = (), name: str | None = None) -> list[JobInfo]:
        self._call("jobs")
        return [JobInfo(j, "x", self.state, "node2", 0, "") for j in job_ids]

    def nodes(self, names: Iterable[str] = ()) -> list[NodeInfo]:
        return [NodeInfo("node2", "allocated")]


def carry(executor: SlurmExecutor, action: Action) -> list[str]:
    outcomes: list[str] = []

    async def record(_: int, outcome: str, detail: str) -> None:
        outcomes.append(outcome)

    asyncio.run(
        asyncio.wait_for(
            executor.carry_out(StoredAction(3, 1, action, "decided", 0), False, record), 30
        )
    )
    return outcomes


REQUEUE = Requeue(1, "101", 0)


def test_unreachable_is_told_from_a_refusal() -> None:
    assert unreachable(SlurmCommandError(["scontrol"], 1, AWAY))
    assert unreachable(SlurmCommandError(["scontrol"], -1, "timed out after 20 s"))
    assert not unreachable(SlurmCommandError(["scontrol"], 1, "Invalid job id specified"))


def test_slurm_away_longer_than_the_attempts_is_waited_out() -> None:
    slurm = FlakySlurm(away=12)
    outcomes = carry(SlurmExecutor(slurm, retries=3, backoff_s=0.001, backoff_max_s=0.01), REQUEUE)
    assert outcomes[0] == "started" and outcomes[-1] == "done", outcomes
    assert outcomes.count("retry") == 12 and "failed" not in outcomes
    assert slurm.calls[-1] == "requeue"


def test_an_action_moot_once_slurm_answers_is_skipped() -> None:
    # While Slurm was away the job was requeued by someone else: it is pending now.
    slurm = FlakySlurm(away=6, state="PENDING")
    outcomes = carry(SlurmExecutor(slurm, retries=2, backoff_s=0.001, backoff_max_s=0.01), REQUEUE)
    assert outcomes[-1] == "skipped", outcomes
    assert "requeue" not in slurm.calls


def test_a_refusal_from_slurm_still_fails_after_the_attempts() -> None:
    slurm = FlakySlurm(away=2, refuse="slurm_requeue error: Socket busy temporarily")
    outcomes = carry(SlurmExecutor(slurm, retries=3, backoff_s=0.001, backoff_max_s=0.01), REQUEUE)
    assert outcomes[-1] == "failed", outcomes
    assert outcomes.count("retry") == 2 + 2  # Slurm away twice, then two refusals retried


class RequeuedMeanwhile(FlakySlurm):
    """RUNNING when first read; the requeue is refused because Slurm just requeued the job
    itself; the next read shows `after` (the job's state, restarts)."""

    def __init__(self, after: tuple[str, int]) -> None:
        super().__init__(away=0)
        self.after = after
        self.reads = 0

    def requeue(self, job_id: str) -> None:
        self.calls.append("requeue")
        raise SlurmCommandError(["scontrol", "requeue", job_id], 1, "Job is pending execution")

    def jobs(self, job_ids: Iterable[str] = (), name: str | None = None) -> list[JobInfo]:
        self.reads += 1
        state, restarts = ("RUNNING", 0) if self.reads == 1 else self.after
        return [JobInfo(j, "x", state, "node2", restarts, "") for j in job_ids]


def test_a_requeue_slurm_made_itself_meanwhile_is_moot_only_once_read_so() -> None:
    slurm = RequeuedMeanwhile(("PENDING", 1))
    outcomes = carry(SlurmExecutor(slurm, retries=1, backoff_s=0.001), REQUEUE)
    assert outcomes == ["started", "skipped"], outcomes
    # Read still running: the refusal stands.
    slurm = RequeuedMeanwhile(("RUNNING", 0))
    outcomes = carry(SlurmExecutor(slurm, retries=1, backoff_s=0.001), REQUEUE)
    assert outcomes[-1] == "failed", outcomes


class StillCompleting(FlakySlurm):
    """A requeued job whose old steps end late (slurmctld was away): `release` finds it still
    COMPLETING for its first `late` calls, as `CommandBackend.release` reports it."""

    def __init__(self, late: int) -> None:
        super().__init__(away=0, state="PENDING")
        self.late = late

    def release(
        self, job_id: str, exclude: Sequence[str] = (), *, forget: Sequence[str] = ()
    ) -> None:
        self._call("release")
        if self.late > 0:
            self.late -= 1
            raise JobNotSettled(job_id, 30.0)


def test_a_release_of_a_job_still_completing_is_not_done_until_it_settles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Its begin time would be overwritten when the job completes (Slurm holds it back ~120 s):
    # the release waits, using up no attempt, and is done only once made on the settled job.
    monkeypatch.setattr(executor_module, "HOLD_POLL_S", 0.01)
    slurm = StillCompleting(late=3)
    details: list[tuple[str, str]] = []

    async def record(_: int, outcome: str, detail: str) -> None:
        details.append((outcome, detail))

    action = StoredAction(3, 1, Release(1, "101", 0.0, ("node3",)), "decided", 0)
    run = SlurmExecutor(slurm, retries=1, backoff_s=0.001).carry_out(action, False, record)
    asyncio.run(asyncio.wait_for(run, 30))
    assert [o for o, _ in details] == ["started", "retry", "done"], details
    assert "still completing" in details[1][1]
    assert slurm.calls == ["release"] * 4
