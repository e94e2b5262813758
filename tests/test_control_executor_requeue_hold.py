"""A Requeue waits while the job's node may be dead, and Slurm's own requeue makes it moot.

Requeued while its node does not answer, a job stays COMPLETING there until Slurm sets the node
DOWN; on 22.05 it then starts elsewhere with no GRES, on 24.11 and 26.05 it is requeued again,
held back ~120 s (seen on the dev cluster, docs/design-facts.md). So the executor requeues only
a job whose nodes Slurm shows answering, and for a silent replica only once a step of the job
ran on each node (proof that Slurm's view is not a ping cycle stale) or Slurm has had twice its
detection time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import pytest
from control_harness import RecordingBackend

from runtime.control import executor as executor_module
from runtime.control.executor import SlurmExecutor, detection_s, requeue_hold
from runtime.control.journal.schema import StoredAction
from runtime.control.policy import Requeue
from slurm import hostlist
from slurm.records import JobInfo, NodeInfo
from slurm.slurm_config import SlurmConfig

NOW = 1000.0


def running(nodes: str = "node2", restarts: int = 0) -> JobInfo:
    return JobInfo("101", "r01", "RUNNING", nodes, restarts, "")


UP = NodeInfo("node2", "allocated")
UP3 = NodeInfo("node3", "mixed", ("DRAIN",))  # drained, but its slurmd answers
NOT_RESPONDING = NodeInfo("node2", "allocated", ("NOT_RESPONDING",))
DOWN = NodeInfo("node2", "down", ("NOT_RESPONDING",))


@pytest.mark.parametrize(
    ("job", "nodes", "last_heard", "answered", "held"),
    [
        (running(), [UP], None, (), None),
        (running(), [UP], NOW - 30, (), "no step runs on node2 and Slurm has had less than 80s"),
        (running(), [UP], NOW - 30, ("node2",), None),
        (running(), [UP], NOW - 45, (), "no step runs on node2"),
        (running(), [UP], NOW - 85, (), None),
        (running("node[2-3]"), [UP, UP3], NOW - 5, ("node2",), "no step runs on node3 and"),
        (running("node[2-3]"), [UP, UP3], NOW - 5, ("node2", "node3"), None),
        (running(), [NOT_RESPONDING], None, (), "node2 is ALLOCATED+NOT_RESPONDING"),
        (running(), [NOT_RESPONDING], NOW - 5, ("node2",), "node2 is ALLOCATED+NOT_RESPONDING"),
        (running(), [DOWN], NOW - 100, (), "node2 is DOWN+NOT_RESPONDING"),
        (running(), [], None, (), "node2 not in Slurm's node list"),
        (running("node[2-3]"), [UP, UP3], None, (), None),
        (running("node[2-3]"), [UP], None, (), "node3 not in Slurm's node list"),
        (running(""), [UP], None, (), "runs on no node Slurm names"),
    ],
)
def test_what_holds_a_requeue(
    job: JobInfo,
    nodes: list[NodeInfo],
    last_heard: float | None,
    answered: tuple[str, ...],
    held: str | None,
) -> None:
    names = hostlist.expand(job.nodes, "job nodes") if job.nodes else []
    why = requeue_hold(job, names, nodes, last_heard, NOW, 40.0, answered)
    if held is None:
        assert why is None
    else:
        assert why is not None and held in why, why


def config(**settings: str) -> SlurmConfig:
    return SlurmConfig("22.05.8", settings)


@pytest.mark.parametrize(
    ("cfg", "seconds"),
    [
        (config(SlurmdTimeout="10 sec", MessageTimeout="10 sec"), 2 * 10 / 3 + 10 + 5),
        (config(SlurmdTimeout="300 sec", MessageTimeout="10 sec"), 200 + 10 + 5),
        (config(SlurmdTimeout="0 sec", MessageTimeout="30 sec"), 100 + 30 + 5),
        (config(), 200 + 10 + 5),  # not printed: Slurm's defaults
        (None, 200 + 10 + 5),  # unreadable: the same
    ],
)
def test_how_long_slurm_may_take_to_see_a_dead_node(
    cfg: SlurmConfig | None, seconds: float
) -> None:
    assert detection_s(cfg) == pytest.approx(seconds)


class DyingNodeSlurm(RecordingBackend):
    """A job on node2, which stops answering: Slurm shows it NOT_RESPONDING for `polls` reads,
    then DOWN with the job requeued by Slurm itself (restart count 1, PENDING)."""

    def __init__(self, polls: int) -> None:
        super().__init__()
        self.polls = polls

    def jobs(self, job_ids: Iterable[str] = (), name: str | None = None) -> list[JobInfo]:
        if self.polls > 0:
            return [running()]
        return [JobInfo("101", "r01", "PENDING", "", 1, "")]

    def nodes(self, names: Iterable[str] = ()) -> list[NodeInfo]:
        self.polls -= 1
        return [NOT_RESPONDING]


def carry(executor: SlurmExecutor, action: Requeue) -> list[tuple[str, str]]:
    attempts: list[tuple[str, str]] = []

    async def record(_: int, outcome: str, detail: str) -> None:
        attempts.append((outcome, detail))

    stored = StoredAction(3, 1, action, "decided", 0)
    asyncio.run(asyncio.wait_for(executor.carry_out(stored, False, record), 30))
    return attempts


def test_a_requeue_on_a_dead_node_is_left_to_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(executor_module, "HOLD_POLL_S", 0.01)
    slurm = DyingNodeSlurm(polls=3)
    attempts = carry(SlurmExecutor(slurm, retries=2), Requeue(1, "101", 0, NOW))
    assert slurm.calls == []  # never asked to requeue: Slurm did
    outcomes = [o for o, _ in attempts]
    # Waiting uses up no attempt, and is journaled once while the reason stays the same.
    assert outcomes == ["started", "retry", "skipped"], attempts
    assert "waiting: node2 is ALLOCATED+NOT_RESPONDING" in attempts[1][1]
    assert "already requeued (restart count 1)" in attempts[2][1]


class LiveNodeSlurm(DyingNodeSlurm):
    def nodes(self, names: Iterable[str] = ()) -> list[NodeInfo]:
        return [UP]


def test_a_silent_replica_on_a_live_node_is_requeued_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Slurm shows the node answering and a step of the job runs there: the node is alive and
    its trainer is what stopped, so the requeue goes ahead without waiting out detection."""
    monkeypatch.setattr(executor_module, "HOLD_POLL_S", 0.01)
    monkeypatch.setattr(executor_module.time, "time", lambda: NOW + 1)
    slurm = LiveNodeSlurm(polls=99)
    ex = SlurmExecutor(slurm, retries=2)
    ex.detect_s, ex.probe_s = 20.0, 5.0
    attempts = carry(ex, Requeue(1, "101", 0, NOW))
    assert [o for o, _ in attempts] == ["started", "done"], attempts
    assert slurm.probes == [("node2", None)]
    assert slurm.calls == [("requeue", "101")]


def test_a_node_slurm_shows_up_but_runs_no_step_holds_the_requeue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Slurm's view is stale (its ping has not failed yet) and no step starts on the node: the
    requeue waits, re-asking the node, until Slurm has had twice its detection time; then it
    goes ahead, since Slurm has plainly seen the node alive."""
    monkeypatch.setattr(executor_module, "HOLD_POLL_S", 0.01)
    clock = iter([NOW + 5, NOW + 10, NOW + 25, NOW + 41])
    monkeypatch.setattr(executor_module.time, "time", lambda: next(clock))
    slurm = LiveNodeSlurm(polls=99)
    slurm.silent = {"node2"}
    ex = SlurmExecutor(slurm, retries=2)
    ex.detect_s, ex.probe_s = 20.0, 5.0
    attempts = carry(ex, Requeue(1, "101", 0, NOW))
    # Three polls inside the wait are one journal line; the fourth is past it.
    assert [o for o, _ in attempts] == ["started", "retry", "done"], attempts
    assert "no step runs on node2 and Slurm has had less than 40s" in attempts[1][1]
    assert slurm.probes == [("node2", None)] * 3
    assert slurm.calls == [("requeue", "101")]


def test_each_het_component_is_probed_in_its_own_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica job is heterogeneous: each node is asked through the leader's id and the
    offset of the component that runs there (srun refuses a component's own id)."""
    monkeypatch.setattr(executor_module, "HOLD_POLL_S", 0.01)
    monkeypatch.setattr(executor_module.time, "time", lambda: NOW + 1)

    class HetSlurm(LiveNodeSlurm):
        def jobs(self, job_ids: Iterable[str] = (), name: str | None = None) -> list[JobInfo]:
            if self.calls:
                return [JobInfo("101", "r01", "PENDING", "", 1, "", "101", 0)]
            return [
                JobInfo("101", "r01", "RUNNING", "node2", 0, "", "101", 0),
                JobInfo("102", "r01", "RUNNING", "node3", 0, "", "101", 1),
            ]

        def nodes(self, names: Iterable[str] = ()) -> list[NodeInfo]:
            return [UP, NodeInfo("node3", "allocated")]

    slurm = HetSlurm(polls=99)
    ex = SlurmExecutor(slurm, retries=2)
    ex.detect_s, ex.probe_s = 20.0, 5.0
    attempts = carry(ex, Requeue(1, "101", 0, NOW))
    assert [o for o, _ in attempts] == ["started", "done"], attempts
    assert slurm.probes == [("node2", 0), ("node3", 1)]
