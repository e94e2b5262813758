"""Lookups of single jobs that come together share one Slurm call; none is misread because of
another job in its batch."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

from runtime.control.job_lookup import JobLookup
from slurm.records import JobInfo, SlurmCommandError

UNREACHABLE = "Unable to contact slurm controller (connect failure)"


def info(job_id: str, offset: int = 0) -> JobInfo:
    """Component `offset` of het job `job_id` (its leader is the job's own record)."""
    return JobInfo(
        job_id=str(int(job_id) + offset),
        name="r",
        state="RUNNING",
        nodes=f"node{job_id}-{offset}",
        restarts=0,
        reason="None",
        het_job_id=job_id,
        het_offset=offset,
    )


class FakeSqueue:
    """squeue over a fixed queue: `purged` ids make a list that holds them fail as a whole
    ("Invalid job id", read as no jobs, as `CommandBackend.jobs` does); `down` refuses every
    call; each call takes `delay_s`, like a process start and slurmctld's answer."""

    def __init__(
        self,
        queued: Sequence[str],
        purged: Sequence[str] = (),
        down: bool = False,
        delay_s: float = 0.02,
        down_for: Sequence[str] = (),
    ) -> None:
        self.queued = {j: [info(j), info(j, 1)] for j in queued}
        self.purged = set(purged)
        self.down = down
        self.down_for = set(down_for)
        self.delay_s = delay_s
        self.calls: list[list[str]] = []
        self._lock = threading.Lock()

    def __call__(self, ids: list[str]) -> list[JobInfo]:
        with self._lock:
            self.calls.append(list(ids))
        time.sleep(self.delay_s)
        if self.down or (len(ids) == 1 and ids[0] in self.down_for):
            raise SlurmCommandError(["squeue"], 1, UNREACHABLE)
        if self.purged & set(ids):
            return []
        return [i for j in ids for i in self.queued.get(j, [])]


async def look_up(lookup: JobLookup, ids: Sequence[str]) -> list[list[JobInfo] | BaseException]:
    return await asyncio.gather(*(lookup.jobs(j) for j in ids), return_exceptions=True)


def test_a_lone_lookup_is_one_call_for_its_job_alone() -> None:
    squeue = FakeSqueue(["7"])
    (got,) = asyncio.run(look_up(JobLookup(squeue), ["7"]))
    assert got == squeue.queued["7"]
    assert squeue.calls == [["7"]]


def test_a_hundred_lookups_at_once_make_two_calls_and_each_gets_its_own_job() -> None:
    ids = [str(100 + k) for k in range(100)]
    squeue = FakeSqueue(ids)
    lookup = JobLookup(squeue)
    got = asyncio.run(look_up(lookup, ids))
    assert got == [squeue.queued[j] for j in ids]
    # All hundred arrive before the first call goes out: one call asks for every one of them.
    assert len(squeue.calls) == 1 and sorted(squeue.calls[0]) == sorted(ids)
    assert lookup.calls == 1 and lookup.asked == 100


def test_lookups_arriving_while_a_call_is_out_wait_for_the_next_one() -> None:
    ids = [str(200 + k) for k in range(30)]
    squeue = FakeSqueue(ids, delay_s=0.05)
    lookup = JobLookup(squeue)

    async def staggered() -> list[list[JobInfo]]:
        first = asyncio.ensure_future(lookup.jobs(ids[0]))
        await asyncio.sleep(0.01)  # the first call is out
        rest = [asyncio.ensure_future(lookup.jobs(j)) for j in ids[1:]]
        return [await first, *[await r for r in rest]]

    got = asyncio.run(staggered())
    assert got == [squeue.queued[j] for j in ids]
    assert squeue.calls[0] == [ids[0]]
    assert len(squeue.calls) == 2 and sorted(squeue.calls[1]) == sorted(ids[1:])


@pytest.mark.parametrize(
    ("queued", "purged", "asked", "expect_alone"),
    [
        # One purged id fails the whole list: every id is asked alone, and each reads its own.
        (["1", "2", "3"], ["9"], ["1", "2", "9", "3"], {"1", "2", "9", "3"}),
        # An id not in the queue (finished and gone) is asked alone before it is read as gone.
        (["1", "2"], [], ["1", "5", "2"], {"5"}),
        # Every id listed: nothing is asked twice.
        (["1", "2", "3"], [], ["1", "2", "3"], set()),
    ],
)
def test_an_id_a_batch_does_not_list_is_asked_alone(
    queued: list[str], purged: list[str], asked: list[str], expect_alone: set[str]
) -> None:
    squeue = FakeSqueue(queued, purged)
    got = asyncio.run(look_up(JobLookup(squeue), asked))
    for job_id, answer in zip(asked, got, strict=True):
        assert answer == squeue.queued.get(job_id, []), job_id
    alone = {c[0] for c in squeue.calls[1:] if len(c) == 1}
    assert alone == expect_alone
    assert sorted(squeue.calls[0]) == sorted(asked)


def test_a_refused_call_reaches_every_caller_of_it_and_the_next_lookup_asks_again() -> None:
    squeue = FakeSqueue(["1", "2"], down=True)
    lookup = JobLookup(squeue)
    got = asyncio.run(look_up(lookup, ["1", "2"]))
    assert all(isinstance(g, SlurmCommandError) for g in got), got
    squeue.down = False
    (again,) = asyncio.run(look_up(lookup, ["2"]))
    assert again == squeue.queued["2"]


def test_a_refused_lone_ask_fails_only_its_own_caller() -> None:
    # "5" is missing from the batch's answer, and slurmctld then refuses the call for it alone.
    squeue = FakeSqueue(["1", "2"], down_for=["5"])
    got = asyncio.run(look_up(JobLookup(squeue), ["1", "5", "2"]))
    assert got[0] == squeue.queued["1"] and got[2] == squeue.queued["2"]
    assert isinstance(got[1], SlurmCommandError)


def test_a_batch_holds_at_most_max_batch_ids() -> None:
    ids = [str(k) for k in range(1, 26)]
    squeue = FakeSqueue(ids)
    got = asyncio.run(look_up(JobLookup(squeue, max_batch=10), ids))
    assert got == [squeue.queued[j] for j in ids]
    assert [len(c) for c in squeue.calls] == [10, 10, 5]


def test_a_caller_that_goes_away_leaves_the_others_answered() -> None:
    squeue = FakeSqueue(["1", "2", "3"], delay_s=0.05)
    lookup = JobLookup(squeue)

    async def one_leaves() -> list[list[JobInfo]]:
        tasks = [asyncio.ensure_future(lookup.jobs(j)) for j in ("1", "2", "3")]
        await asyncio.sleep(0.01)
        tasks[1].cancel()  # its client hung up
        return [await tasks[0], await tasks[2]]

    assert asyncio.run(one_leaves()) == [squeue.queued["1"], squeue.queued["3"]]


def test_the_same_job_asked_twice_at_once_is_asked_once() -> None:
    squeue = FakeSqueue(["4"])
    got = asyncio.run(look_up(JobLookup(squeue), ["4", "4"]))
    assert got == [squeue.queued["4"], squeue.queued["4"]]
    assert squeue.calls == [["4"]]


def test_a_mass_failures_fatal_reports_check_their_jobs_in_one_squeue(tmp_path: Path) -> None:
    """The coordinator's allocation lookups (one per fatal report) go through `JobLookup`: a
    hundred at once are one call to its backend, and each gets its own job's nodes."""
    from control_harness import RecordingBackend

    from runtime.control.coordinator import Coordinator
    from runtime.control.policy import PolicyConfig
    from runtime.control.settings import CoordinatorConfig

    ids = [str(500 + k) for k in range(100)]

    asked: list[list[str]] = []

    class Counting(RecordingBackend):
        def jobs(self, job_ids: Iterable[str] = (), name: str | None = None) -> list[JobInfo]:
            asked.append(list(job_ids))
            time.sleep(0.02)
            return super().jobs(job_ids, name)

    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    config = CoordinatorConfig(
        run_dir=run,
        policy=PolicyConfig(replicas=100),
        poll_jobs=False,
        job_ids=dict(enumerate(ids)),
    )
    backend = Counting({j: f"n{j}" for j in ids})
    coord = Coordinator(config, backend)  # type: ignore[arg-type]

    async def at_once() -> list[tuple[str, ...] | None]:
        return await asyncio.gather(*(coord.allocation(j) for j in ids))

    try:
        got = asyncio.run(at_once())
    finally:
        coord.journal.close()
    assert got == [(f"n{j}",) for j in ids]
    assert len(asked) == 1 and sorted(asked[0]) == sorted(ids)
