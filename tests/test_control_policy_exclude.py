"""Table tests: a replica requeued for a node keeps that node off its requeued job, always.

The coordinator may not be allowed to drain (a job's owner may not: `slurm.privileges`), and a
drain it asks of root's Epilog happens only when the job ends, if the site's policy accepts it.
So every requeue with a suspect node releases the job with that node in `exclude`, whether or
not a Drain is decided this time; and each Drain carries the job and the kind of request it
becomes. The nodes drained under a replica before ride along as `forget`: the backend lets the
job back on those Slurm shows in service again.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from runtime.control.policy import (
    Drain,
    Event,
    JobObserved,
    Note,
    OperatorRequeue,
    PolicyConfig,
    Release,
    ReportReceived,
    RunState,
    StragglerEviction,
    Tick,
    step,
)
from runtime.protocol import ReplicaReport

JOBS = {0: "100", 1: "101", 2: "102"}
CFG = PolicyConfig(replicas=3, min_replicas=1, max_restarts_per_replica=5, report_timeout_s=30.0)


def status(k: int, seq: int, at: float, nodes: list[str] | None = None, **kw: object) -> Event:
    rep = ReplicaReport(
        replica=k, incarnation=f"{k}a", seq=seq, job_id=JOBS[k],
        nodes=nodes or [f"node{k + 1}"], **kw,  # type: ignore[arg-type]
    )  # fmt: skip
    return ReportReceived(rep, at)


def node_fault(k: int, seq: int, at: float, node: str, error: str = "boom", **kw: object) -> Event:
    rep = ReplicaReport(
        replica=k, incarnation=f"{k}a", seq=seq, kind="fatal", job_id=JOBS[k], failure="node",
        failed_node=node, last_error=error, **kw,  # type: ignore[arg-type]
    )  # fmt: skip
    return ReportReceived(rep, at)


WARM = [status(0, 1, 1.0), status(1, 1, 1.0), status(2, 1, 1.0)]
#: A replica whose nodes are not known yet: the failed node is taken as named.
NO_NODES = ReportReceived(ReplicaReport(replica=1, incarnation="1a", seq=1, job_id="101"), 1.0)
TWO_NODES = [status(0, 1, 1.0), status(1, 1, 1.0, ["node2", "node3"]), status(2, 1, 1.0)]


def run(events: list[Event], cfg: PolicyConfig = CFG) -> list[object]:
    state = RunState.new(cfg, JOBS)
    out: list[object] = []
    for ev in events:
        state, actions = step(state, ev)
        out += [a for a in actions if isinstance(a, Drain | Release)]
    return out


CASES: list[tuple[str, list[Event], PolicyConfig, list[object]]] = [
    (
        "node fault: drain and exclusion",
        [*WARM, node_fault(1, 2, 5.0, "node2")],
        CFG,
        [Drain("node2", "fthsdp: fault: boom", 1, "101"), Release(1, "101", 0.0, ("node2",))],
    ),
    (
        "the same drain already decided (a second requeue): no Drain, still excluded",
        [
            *WARM,
            node_fault(1, 2, 5.0, "node2"),
            node_fault(1, 1, 9.0, "node2", restarts=1, launch=0),
        ],
        CFG,
        [
            Drain("node2", "fthsdp: fault: boom", 1, "101"),
            Release(1, "101", 0.0, ("node2",)),
            Release(1, "101", 0.0, ("node2",)),
        ],
    ),
    (
        "a fault on a second node: the first may come back once Slurm has it in service",
        [
            *WARM,
            node_fault(1, 2, 5.0, "node2"),
            node_fault(1, 1, 9.0, "node4", restarts=1, launch=0, nodes=["node4"]),
        ],
        CFG,
        [
            Drain("node2", "fthsdp: fault: boom", 1, "101"),
            Release(1, "101", 0.0, ("node2",)),
            Drain("node4", "fthsdp: fault: boom", 1, "101"),
            Release(1, "101", 0.0, ("node4",), ("node2",)),
        ],
    ),
    (
        "Slurm requeued the job itself (node down): the nodes avoided before may come back",
        [
            *WARM,
            node_fault(1, 2, 5.0, "node2"),
            JobObserved(1, "101", 1, "RUNNING", 10.0, ("node4",)),
            JobObserved(1, "101", 2, "PENDING", 20.0),
        ],
        CFG,
        [
            Drain("node2", "fthsdp: fault: boom", 1, "101"),
            Release(1, "101", 0.0, ("node2",)),
            Release(1, "101", forget=("node2",)),
        ],
    ),
    (
        "worker names its host: the one Slurm node is drained and excluded",
        [*WARM, node_fault(1, 2, 5.0, "vm-host")],
        CFG,
        [Drain("node2", "fthsdp: fault: boom", 1, "101"), Release(1, "101", 0.0, ("node2",))],
    ),
    (
        "a node the multi-node replica does not hold: neither drained nor excluded",
        [*TWO_NODES, node_fault(1, 2, 5.0, "node9")],
        CFG,
        [Release(1, "101", 0.0)],
    ),
    (
        "multi-node replica: only the named node",
        [*TWO_NODES, node_fault(1, 2, 5.0, "node3")],
        CFG,
        [Drain("node3", "fthsdp: fault: boom", 1, "101"), Release(1, "101", 0.0, ("node3",))],
    ),
    (
        "a node name Slurm would refuse in ExcNodeList is not excluded",
        [NO_NODES, node_fault(1, 2, 5.0, "bad name")],
        CFG,
        [Drain("bad name", "fthsdp: fault: boom", 1, "101"), Release(1, "101", 0.0)],
    ),
    (
        "silent replica: kind silent, excluded",
        [*WARM, status(0, 2, 40.0), status(2, 2, 40.0), Tick(45.0)],
        CFG,
        [
            Drain("node2", "fthsdp: silent: no report for 44s", 1, "101", "silent"),
            Release(1, "101", 0.0, ("node2",)),
        ],
    ),
    (
        "silent replica with drain_on_silence off: no node, no exclusion",
        [*WARM, status(0, 2, 40.0), status(2, 2, 40.0), Tick(45.0)],
        replace(CFG, drain_on_silence=False),
        [Release(1, "101", 0.0)],
    ),
    (
        "hung trainer escalated to its node: kind hung",
        [*WARM, node_fault(1, 2, 5.0, "node2", "hung: no progress for 600s (step 7)")],
        CFG,
        [
            Drain("node2", "fthsdp: fault: hung: no progress for 600s (step 7)", 1, "101", "hung"),
            Release(1, "101", 0.0, ("node2",)),
        ],
    ),
    (
        "health check's reason: kind fault",
        [*WARM, node_fault(1, 2, 5.0, "node2", "fthsdp: xid: Xid 79")],
        CFG,
        [
            Drain("node2", "fthsdp: fault: xid: Xid 79", 1, "101"),
            Release(1, "101", 0.0, ("node2",)),
        ],
    ),
    (
        "operator requeue --drain: kind operator, excluded",
        [*WARM, OperatorRequeue(2, 9.0, "node3", "bad fan")],
        CFG,
        [
            Drain("node3", "fthsdp: manual: bad fan", 2, "102", "operator"),
            Release(2, "102", 0.0, ("node3",)),
        ],
    ),
    (
        "operator requeue without --drain: nothing excluded",
        [*WARM, OperatorRequeue(2, 9.0)],
        CFG,
        [Release(2, "102", 0.0)],
    ),
    (
        "straggler, mode drain: kind straggler, excluded",
        [*WARM, StragglerEviction(1, 5.0, "node2", "node2 2.0x")],
        CFG,
        [
            Drain("node2", "fthsdp: straggler: node2 2.0x", 1, "101", "straggler"),
            Release(1, "101", 0.0, ("node2",)),
        ],
    ),
    (
        "straggler drained and excluded: the node once",
        [*WARM, StragglerEviction(1, 5.0, "node2", "node2 2.0x", exclude="node2")],
        CFG,
        [
            Drain("node2", "fthsdp: straggler: node2 2.0x", 1, "101", "straggler"),
            Release(1, "101", 0.0, ("node2",)),
        ],
    ),
    (
        "left out after too many failures: drain requested, no release",
        [*WARM, *(node_fault(1, 2 + n, 5.0 + n, "node2", restarts=n, launch=0) for n in range(3))],
        replace(CFG, max_restarts_per_replica=1),
        [
            Drain("node2", "fthsdp: fault: boom", 1, "101"),
            Release(1, "101", 0.0, ("node2",)),
        ],
    ),
]


@pytest.mark.parametrize(("name", "events", "cfg", "expected"), CASES, ids=[c[0] for c in CASES])
def test_requeue_keeps_the_suspect_node_off(
    name: str, events: list[Event], cfg: PolicyConfig, expected: list[object]
) -> None:
    assert run(events, cfg) == expected


def test_unknown_node_is_noted() -> None:
    state = RunState.new(CFG, JOBS)
    for ev in [*TWO_NODES, node_fault(1, 2, 5.0, "node9")]:
        state, actions = step(state, ev)
    assert any(isinstance(a, Note) and "node9" in a.text for a in actions)
