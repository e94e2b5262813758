"""Lookups of single jobs in Slurm that arrive together, asked in one call.

A mass failure (a leaf switch, a power distribution unit) makes every leader behind it send its
fatal report at once, and each fatal report is checked against Slurm's allocation of its job
before anything is decided. One `squeue` a report is a storm of calls that slurmctld serves one
at a time (22.05's `squeue --json` even returns every job of the cluster to each of them), and
the coordinator's thread pool runs only a few at once. So a lookup that arrives while a call is
out waits for the next call, which asks for every job waiting then; a lone lookup is sent at once,
as before.

A job that a batched answer does not list is asked alone before it is read as gone: `squeue`
answers a list holding one id slurmctld has purged with an error for the whole list (which
`CommandBackend.jobs` reads as "none of them"), and a fatal report must never be refused because
another job in its batch had aged out.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence

from slurm.records import JobInfo

#: Most job ids in one call (a squeue argument list stays short).
MAX_BATCH = 200


class JobLookup:
    """`jobs(job_id)` for many callers at once, in as few `fetch` calls as they allow."""

    def __init__(
        self, fetch: Callable[[list[str]], Sequence[JobInfo]], max_batch: int = MAX_BATCH
    ) -> None:
        self._fetch = fetch
        self._max_batch = max_batch
        self._waiting: dict[str, list[asyncio.Future[list[JobInfo]]]] = {}
        self._runner: asyncio.Task[None] | None = None
        #: `fetch` calls made so far, and the ids they asked for in all.
        self.calls = 0
        self.asked = 0

    async def jobs(self, job_id: str) -> list[JobInfo]:
        """Slurm's records of `job_id` (every component of a het job); [] if it is not queued.
        Whatever `fetch` raises for the call that asked for it is raised here."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[JobInfo]] = loop.create_future()
        self._waiting.setdefault(job_id, []).append(future)
        if self._runner is None or self._runner.done():
            self._runner = loop.create_task(self._run())
        return await future

    async def _ask(self, ids: list[str]) -> list[JobInfo]:
        self.calls += 1
        self.asked += len(ids)
        loop = asyncio.get_running_loop()
        return list(await loop.run_in_executor(None, self._fetch, ids))

    async def _run(self) -> None:
        batch: dict[str, list[asyncio.Future[list[JobInfo]]]] = {}
        try:
            while self._waiting:
                ids = list(itertools.islice(self._waiting, self._max_batch))
                batch = {job_id: self._waiting.pop(job_id) for job_id in ids}
                await self._answer(batch)
        except asyncio.CancelledError:  # the coordinator is closing: nobody is left waiting
            for futures in [*batch.values(), *self._waiting.values()]:
                for future in futures:
                    future.cancel()
            self._waiting.clear()
            raise

    async def _answer(self, batch: dict[str, list[asyncio.Future[list[JobInfo]]]]) -> None:
        ids = list(batch)
        try:
            infos = await self._ask(ids)
        except Exception as exc:  # every caller of this call gets what it raised
            for futures in batch.values():
                _settle(futures, exc)
            return
        found: dict[str, list[JobInfo]] = {}
        for info in infos:
            if info.base_id in batch:
                found.setdefault(info.base_id, []).append(info)
        # A lone id's answer is its own; in a batch, an unlisted id is asked again alone.
        missing = [j for j in ids if j not in found] if len(ids) > 1 else []
        for job_id in batch.keys() - set(missing):
            _settle(batch[job_id], found.get(job_id, []))
        alone = await asyncio.gather(*(self._ask([j]) for j in missing), return_exceptions=True)
        for job_id, answer in zip(missing, alone, strict=True):
            if isinstance(answer, BaseException):
                _settle(batch[job_id], answer)
            else:
                _settle(batch[job_id], [i for i in answer if i.base_id == job_id])


def _settle(
    futures: list[asyncio.Future[list[JobInfo]]], outcome: list[JobInfo] | BaseException
) -> None:
    """Hand `outcome` to every caller still waiting (one that went away is skipped)."""
    for future in futures:
        if future.done():
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(list(outcome))
