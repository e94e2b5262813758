"""The report's timeline logic (`runtime.report.timeline`): records in, marks, segments, faults,
step rate and effective time out, each a table of cases."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.control.policy import Directive, Drain, JobObserved, Release, ReportReceived, Requeue
from runtime.protocol import ReplicaReport
from runtime.report.timeline import (
    LOST,
    Action,
    Fault,
    Mark,
    Segment,
    effective_time,
    followed_by,
    journal_facts,
    merge_faults,
    progress_facts,
    segments,
    step_rate,
    thin,
)


def rec(t: float, event: str, inc: str = "a", **fields: Any) -> dict[str, Any]:
    return {"t": t, "event": event, "incarnation": inc, **fields}


def commit(t: float, step: int, inc: str = "a", healing: bool = False) -> dict[str, Any]:
    return rec(t, "commit", inc, step=step, healing=healing)


@pytest.mark.parametrize(
    ("records", "run_over", "marks", "faults"),
    [
        pytest.param(
            [rec(0, "start"), rec(1, "joined"), commit(2, 0), commit(3, 1), rec(4, "done")],
            True,
            [(0, "pending"), (1, "healing"), (2, "training"), (3, "training"), (4, "done")],
            [],
            id="clean run",
        ),
        pytest.param(
            [rec(0, "start"), commit(1, 0), commit(2, 1), rec(5, "start", "b"), commit(6, 3, "b")],
            False,
            [
                (0, "pending"),
                (1, "training"),
                (2, "training"),
                (2, "down"),
                (5, "pending"),
                (6, "training"),
            ],
            [(2, 1, LOST)],
            id="killed, restarted as a new incarnation",
        ),
        pytest.param(
            [rec(0, "start"), commit(1, 0), rec(2, "fatal", step=0, error="boom", exit_code=11)],
            False,
            [(0, "pending"), (1, "training"), (2, "down")],
            [(2, 0, "boom (exit 11)")],
            id="fatal record",
        ),
        pytest.param(
            [rec(0, "start"), commit(1, 0)],
            True,
            [(0, "pending"), (1, "training"), (1, "down")],
            [(1, 0, LOST)],
            id="records stop and the run is over",
        ),
        pytest.param(
            [rec(0, "start"), commit(1, 0)],
            False,
            [(0, "pending"), (1, "training")],
            [],
            id="live: records stop, the run goes on",
        ),
        pytest.param(
            [rec(0, "start"), commit(1, 0, healing=True), commit(2, 1)],
            False,
            [(0, "pending"), (1, "healing"), (2, "training")],
            [],
            id="a healing commit",
        ),
    ],
)
def test_progress_facts(
    records: list[dict[str, Any]],
    run_over: bool,
    marks: list[tuple[float, str]],
    faults: list[tuple[float, int | None, str]],
) -> None:
    facts = progress_facts(3, records, run_over)
    assert [(m.t, m.state) for m in facts.marks] == marks
    assert [(f.t, f.step, f.cause) for f in facts.faults] == faults
    assert all(f.replica == 3 and f.source == "progress" for f in facts.faults)


def test_progress_metrics_keep_the_last_value_of_a_redone_step() -> None:
    records = [
        rec(0, "metrics", step=0, metrics={"loss": 2.0}),
        rec(1, "metrics", step=1, metrics={"loss": 1.5, "lr": 0.1}),
        rec(2, "metrics", step=1, metrics={"loss": 1.25}),
    ]
    facts = progress_facts(0, records, False)
    assert facts.metrics == {"loss": {0: 2.0, 1: 1.25}, "lr": {1: 0.1}}


@pytest.mark.parametrize(
    ("marks", "until", "expected"),
    [
        pytest.param([], 10, [], id="no marks"),
        pytest.param(
            [(0, "pending"), (2, "training"), (5, "training"), (7, "down")],
            10,
            [(0, 2, "pending"), (2, 7, "training"), (7, 10, "down")],
            id="equal neighbours merge, the last runs to until",
        ),
        pytest.param(
            [(5, "training"), (0, "pending")],
            8,
            [(0, 5, "pending"), (5, 8, "training")],
            id="sorted by time",
        ),
        pytest.param(
            [(0, "training"), (4, "done"), (6, "down")],
            10,
            [(0, 4, "training")],
            id="done ends the lane",
        ),
        pytest.param(
            [(0, "training"), (12, "down")],
            10,
            [(0, 10, "training")],
            id="marks after until are ignored",
        ),
        pytest.param(
            [(0, "pending"), (0, "training")],
            3,
            [(0, 3, "training")],
            id="a zero-length segment is dropped",
        ),
    ],
)
def test_segments(
    marks: list[tuple[float, str]], until: float, expected: list[tuple[float, float, str]]
) -> None:
    got = segments([Mark(t, s) for t, s in marks], until)  # type: ignore[arg-type]
    assert [(g.start, g.end, g.state) for g in got] == expected


def _fault(t: float, replica: int, source: str, cause: str = "x") -> Fault:
    return Fault(t, replica, None, cause, source)


@pytest.mark.parametrize(
    ("progress", "journal", "kept"),
    [
        pytest.param(
            [_fault(10, 1, "progress")],
            [_fault(12, 1, "journal")],
            [(12, 1, "journal")],
            id="the journal's fault replaces the progress one",
        ),
        pytest.param(
            [_fault(10, 1, "progress")],
            [_fault(12, 0, "journal")],
            [(10, 1, "progress"), (12, 0, "journal")],
            id="other replica: both",
        ),
        pytest.param(
            [_fault(10, 1, "progress")],
            [_fault(100, 1, "journal")],
            [(10, 1, "progress"), (100, 1, "journal")],
            id="far apart: both",
        ),
        pytest.param(
            [],
            [_fault(10, 1, "journal", "a"), _fault(10.5, 1, "journal", "a")],
            [(10, 1, "journal")],
            id="a resent fatal report is one fault",
        ),
        pytest.param(
            [],
            [_fault(10, 1, "journal", "a"), _fault(10.5, 1, "journal", "b")],
            [(10, 1, "journal"), (10.5, 1, "journal")],
            id="different causes: two faults",
        ),
    ],
)
def test_merge_faults(
    progress: list[Fault], journal: list[Fault], kept: list[tuple[float, int, str]]
) -> None:
    assert [(f.t, f.replica, f.source) for f in merge_faults(progress, journal)] == kept


def _act(t: float, replica: int = 1) -> Action:
    return Action(t, replica, "requeue", f"requeue at {t}", "done")


@pytest.mark.parametrize(
    ("at", "others", "actions", "answered"),
    [
        pytest.param(10, [], [_act(10), _act(40)], [10, 40], id="decided with the report, later"),
        pytest.param(10, [], [_act(8.5), _act(9.5)], [9.5], id="a second before it, not more"),
        pytest.param(10, [30], [_act(12), _act(29.5), _act(31)], [12], id="up to the next fault"),
        pytest.param(10, [], [_act(12, replica=0)], [], id="another replica's"),
        pytest.param(10, [], [_act(700)], [], id="too late"),
    ],
)
def test_followed_by(
    at: float, others: list[float], actions: list[Action], answered: list[float]
) -> None:
    fault = _fault(at, 1, "journal")
    faults = [fault, *(_fault(t, 1, "journal") for t in others)]
    assert [a.t for a in followed_by(fault, faults, actions)] == answered


@pytest.mark.parametrize(
    ("commits", "expected"),
    [
        pytest.param([], [], id="none"),
        pytest.param([(0.0, 0)], [], id="one step"),
        pytest.param([(float(i), i) for i in range(7)], [(1.5, 1.0), (4.5, 4 / 3)], id="two bins"),
        pytest.param(
            [(0.0, 0), (0.1, 0), (1.0, 1), (1.5, 1), (2.0, 2), (3.0, 3)],
            [(1.5, 4 / 3)],
            id="a step committed by two replicas counts once, at its first commit",
        ),
    ],
)
def test_step_rate(commits: list[tuple[float, int]], expected: list[tuple[float, float]]) -> None:
    got = step_rate(commits)
    assert [t for t, _ in got] == pytest.approx([t for t, _ in expected])
    assert [r for _, r in got] == pytest.approx([r for _, r in expected])


def test_effective_time() -> None:
    lanes = {
        0: [Segment(0, 10, "training")],
        1: [Segment(0, 2, "pending"), Segment(2, 4, "training"), Segment(4, 6, "down")],
    }
    eff = effective_time(lanes, 0, 10)
    assert eff.training_s == {0: 10, 1: 2}
    assert eff.down_s == {0: 0, 1: 2}
    assert eff.pending_s == {0: 0, 1: 2}
    assert eff.fraction == pytest.approx(12 / 20)
    assert effective_time({}, 0, 0).fraction == 0.0


#: Replica 1's leader reports a node fault (Xid 79 on node2) at step 7 of its job 11.
XID_FATAL = ReplicaReport(
    replica=1,
    incarnation="a1",
    seq=9,
    kind="fatal",
    job_id="11",
    nodes=["node2"],
    step=7,
    failure="node",
    failed_node="node2",
    exit_code=11,
    last_error="fthsdp: xid: Xid 79\nmore",
)


def test_journal_facts() -> None:
    events = [
        (1, JobObserved(1, "11", 0, "RUNNING", 1.0, ("node2",))),
        (2, ReportReceived(XID_FATAL, 5.0)),
        (3, JobObserved(1, "11", 1, "PENDING", 7.0)),
        (5, ReportReceived(ReplicaReport(0, "w0", 1, step=4, healing=True), 8.0)),
        (6, ReportReceived(ReplicaReport(0, "w0", 2, step=5), 8.5)),
        (4, JobObserved(1, "40", 0, "NODE_FAIL", 9.0, ("node4",))),
    ]
    actions = [
        (2, Drain("node2", "fthsdp: xid: Xid 79", 1), "done"),
        (2, Requeue(1, "11", 0), "done"),
        (2, Release(1, "11"), "done"),
        (2, Directive(1, "requeue", ("11", 0, 0)), "done"),
        (3, Directive(1, "relaunch", ("11", 1, 0)), "decided"),
        (99, Requeue(1, "11", 1), "done"),  # its event was compacted away: no time
    ]
    facts = journal_facts(events, actions)
    assert [(m.t, m.state) for m in facts.marks[1]] == [
        (5.0, "down"),
        (7.0, "pending"),
        (9.0, "down"),
    ]
    assert [(f.t, f.step, f.cause) for f in facts.faults] == [
        (5.0, 7, "node fault on node2, exit 11: fthsdp: xid: Xid 79")
    ]
    assert facts.actions == [
        Action(5.0, 1, "drain", "drain node2: fthsdp: xid: Xid 79", "done"),
        Action(5.0, 1, "requeue", "requeue job 11", "done"),
        Action(7.0, 1, "relaunch", "relaunch (told to its supervisor)", "decided"),
    ]
    assert facts.reported == {0: [Mark(8.0, "healing"), Mark(8.5, "training")]}
    assert facts.reported_commits == {0: [(8.0, 4), (8.5, 5)]}
    assert facts.jobs == {1: ["11", "40"]}
    assert facts.nodes == {1: ["node2", "node4"]}


@pytest.mark.parametrize(
    ("n", "limit", "kept"),
    [
        (0, 4, []),
        (3, 4, [0, 1, 2]),
        (4, 4, [0, 1, 2, 3]),
        (9, 4, [0, 3, 6, 8]),
        (10, 5, [0, 2, 4, 6, 8, 9]),
    ],
)
def test_thin(n: int, limit: int, kept: list[int]) -> None:
    assert [s for s, _ in thin([(i, float(i)) for i in range(n)], limit)] == kept
