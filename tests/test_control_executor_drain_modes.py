"""The executor's two drain modes, and the order a replica's actions run in.

Mode `request` writes the drain request into the replica job's Comment and journals the drain
`requested`, never `done`; mode `direct` drains, and a drain that Slurm refuses for lack of
rights (`slurm_update error: Invalid user id`, what the dev cluster's `nobody` gets on every
release) is journaled `failed` with Slurm's message and then asked for as a request. The
coordinator runs a decision's actions in order, so the comment is set before the job is
requeued (its Epilog, which reads it, runs when the requeue ends the job).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

from runtime.control.executor import SlurmExecutor, drain_request
from runtime.control.journal.schema import StoredAction
from runtime.control.policy import Drain, PolicyConfig
from slurm.drain_request import parse
from slurm.records import JobInfo, NodeInfo, SlurmCommandError

REFUSED = "slurm_update error: Invalid user id"
DRAIN = Drain("node2", "fthsdp: straggler: node2 2.0x", 1, "101", "straggler")


class OwnerBackend:
    """A job owner's view of Slurm: its own jobs change, node updates are refused (or not)."""

    def __init__(self, may_drain: bool = False, comment_error: str | None = None) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.may_drain = may_drain
        self.comment_error = comment_error

    def submit(self, script: Path, args: Sequence[str] = ()) -> str:
        raise NotImplementedError

    def requeue(self, job_id: str) -> None:
        self.calls.append(("requeue", job_id))

    def release(
        self, job_id: str, exclude: Sequence[str] = (), *, forget: Sequence[str] = ()
    ) -> None:
        self.calls.append(("release", job_id, *exclude))

    def cancel(self, job_ids: Iterable[str]) -> None:
        self.calls.append(("cancel", *job_ids))

    def drain(self, node: str, reason: str) -> bool:
        if not self.may_drain:
            argv = ["scontrol", "update", f"NodeName={node}", "State=DRAIN"]
            raise SlurmCommandError(argv, 1, REFUSED)
        self.calls.append(("drain", node, reason))
        return True

    def resume(self, node: str) -> bool:
        return False

    def set_comment(self, job_id: str, text: str) -> None:
        if self.comment_error:
            raise SlurmCommandError(
                ["scontrol", "update", f"JobId={job_id}"], 1, self.comment_error
            )
        self.calls.append(("comment", job_id, text))

    def jobs(self, job_ids: Iterable[str] = (), name: str | None = None) -> list[JobInfo]:
        return [JobInfo(j, "x", "RUNNING", "node2", 0, "") for j in job_ids]

    def nodes(self, names: Iterable[str] = ()) -> list[NodeInfo]:
        return [NodeInfo(n, "allocated") for n in names]  # every node answers


def carry(executor: SlurmExecutor, action: Drain, action_id: int = 7) -> list[tuple[str, str]]:
    attempts: list[tuple[str, str]] = []

    async def record(_: int, outcome: str, detail: str) -> None:
        attempts.append((outcome, detail))

    stored = StoredAction(action_id, 1, action, "decided", 0)
    asyncio.run(executor.carry_out(stored, False, record))
    return attempts


def test_request_mode_writes_the_comment_and_journals_requested() -> None:
    backend = OwnerBackend()
    attempts = carry(SlurmExecutor(backend, drain_mode="request"), DRAIN)
    assert [o for o, _ in attempts] == ["started", "requested"]
    ((what, job, text),) = backend.calls
    assert (what, job) == ("comment", "101")
    request = parse(text)
    assert request is not None
    assert (request.seq, request.node, request.kind) == (7, "node2", "straggler")
    assert request.detail == "straggler: node2 2.0x"
    assert text in attempts[-1][1]


def test_direct_mode_refused_for_rights_fails_then_requests() -> None:
    backend = OwnerBackend(may_drain=False)
    attempts = carry(SlurmExecutor(backend, retries=1, drain_mode="direct"), DRAIN)
    assert [o for o, _ in attempts] == ["started", "failed", "requested"]
    assert REFUSED in attempts[1][1]
    assert [c[0] for c in backend.calls] == ["comment"]


def test_direct_mode_with_rights_drains() -> None:
    backend = OwnerBackend(may_drain=True)
    attempts = carry(SlurmExecutor(backend, drain_mode="direct"), DRAIN)
    assert [o for o, _ in attempts] == ["started", "done"]
    assert backend.calls == [("drain", "node2", DRAIN.reason)]


@pytest.mark.parametrize(
    ("action", "backend", "why"),
    [
        (Drain("node2", "fthsdp: fault: x", 1), OwnerBackend(), "job id"),
        (DRAIN, OwnerBackend(comment_error="Access/permission denied"), "permission denied"),
    ],
    ids=["no job id", "comment refused"],
)
def test_a_request_that_cannot_be_made_is_failed_never_requested(
    action: Drain, backend: OwnerBackend, why: str
) -> None:
    attempts = carry(SlurmExecutor(backend, retries=2, drain_mode="request"), action)
    assert [o for o, _ in attempts] == ["started", "failed"]
    assert why in attempts[-1][1]


def test_the_detail_is_made_printable_and_bounded() -> None:
    action = Drain("node2", 'fthsdp: fault: \x1b[31mred\x1b[0m "quoted"\n' + "x" * 300, 1, "1")
    request = drain_request(action, 10**9 + 3)
    assert request.seq == 3
    assert request.detail.isprintable() and '"' not in request.detail
    assert len(request.detail) <= 160


def test_the_coordinator_requests_the_drain_before_the_requeue(tmp_path: Path) -> None:
    """A node fault as seen by a coordinator in request mode: comment, requeue, release off the
    node, in that order; the journal has the drain `requested` and the mode at start."""
    from control_harness import fatal

    from runtime.control.coordinator import Coordinator
    from runtime.control.policy import ReportReceived
    from runtime.control.settings import CoordinatorConfig

    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    backend = OwnerBackend()
    config = CoordinatorConfig(
        run_dir=run, policy=PolicyConfig(replicas=2), job_ids={0: "100", 1: "101"},
        poll_jobs=False, drain="request",
    )  # fmt: skip

    async def scenario() -> Coordinator:
        coord = Coordinator(config, backend)
        await coord.start()
        try:
            report = fatal(1, "101", "node2")
            await coord.submit(ReportReceived(report, coord.clock()))
            for _ in range(200):
                if not coord.journal.actions(("decided", "started")):
                    break
                await asyncio.sleep(0.02)
        finally:
            await coord.stop()
        return coord

    coord = asyncio.run(scenario())
    assert [c[0] for c in backend.calls] == ["comment", "requeue", "release"]
    assert backend.calls[-1] == ("release", "101", "node2")
    journal = type(coord.journal).in_run_dir(run)
    try:
        by_type = {type(s.action).__name__: s.status for s in journal.actions()}
        notes = [s.action for s in journal.actions() if type(s.action).__name__ == "Note"]
    finally:
        journal.close()
    assert by_type["Drain"] == "requested"
    assert by_type["Requeue"] == "done"
    assert any("drain mode request" in getattr(n, "text", "") for n in notes)
