"""The lines `fthsdp events` prints for journal records: a table of stored payloads in, text out."""

from __future__ import annotations

import json

import pytest

from runtime.control.journal.describe import (
    JournalEntry,
    describe_action,
    describe_event,
    entries_from_rows,
)
from runtime.control.policy import (
    Action,
    Drain,
    Event,
    JobObserved,
    OperatorRequeue,
    ReportReceived,
    Requeue,
    Tick,
    action_to_dict,
    event_to_dict,
)
from runtime.protocol import ReplicaReport

STATUS = ReplicaReport(replica=1, incarnation="w1", seq=7, job_id="101", step=40)
FATAL = ReplicaReport(
    replica=2,
    incarnation="w2",
    seq=3,
    kind="fatal",
    job_id="102",
    step=12,
    failure="node",
    failed_node="node4",
    exit_code=3,
    last_error="ECC error",
)


@pytest.mark.parametrize(
    ("event", "text"),
    [
        (ReportReceived(STATUS, 1.0), "status report seq 7 step 40 job 101"),
        (
            ReportReceived(FATAL, 1.0),
            "fatal report seq 3 step 12 job 102 failure=node node=node4 exit=3: ECC error",
        ),
        (JobObserved(0, "100", 2, "RUNNING", 1.0), "job 100 RUNNING restarts 2"),
        (
            OperatorRequeue(1, 1.0, "node3", "bad fan"),
            "operator requeue (drain node3): bad fan",
        ),
        (Tick(1.0), "Tick"),
    ],
)
def test_describe_event(event: Event, text: str) -> None:
    assert describe_event(json.loads(json.dumps(event_to_dict(event)))) == text


@pytest.mark.parametrize(
    ("action", "text"),
    [
        (Requeue(1, "101", 0), "Requeue job_id=101 restarts=0"),
        (
            Drain("node4", "fthsdp: xid 79", 2, "104"),
            "Drain node=node4 reason=fthsdp: xid 79 job_id=104 kind=fault",
        ),
    ],
)
def test_describe_action(action: Action, text: str) -> None:
    assert describe_action(json.dumps(action_to_dict(action))) == text


def test_entries_are_sorted_skip_ticks_and_survive_unreadable_payloads() -> None:
    requeue = json.dumps(action_to_dict(Requeue(1, "101", 0)))
    entries = entries_from_rows(
        events=[
            (3.0, "ReportReceived", 1, json.dumps(event_to_dict(ReportReceived(STATUS, 3.0)))),
            (1.0, "Tick", None, json.dumps(event_to_dict(Tick(1.0)))),
            (2.0, "JobObserved", 0, "{not json"),
        ],
        actions=[(3.0, "Requeue", 1, requeue, "decided", None)],
        attempts=[(4.0, "Requeue", 1, "failed", "scontrol: busy", requeue)],
        rejections=[(0.5, "10.0.0.9", "/report", 401, "bad signature")],
    )
    assert [(e.at, e.kind) for e in entries] == [
        (0.5, "rejected"),
        (2.0, "JobObserved"),
        (3.0, "ReportReceived"),
        (3.0, "decide Requeue"),
        (4.0, "slurm Requeue"),
    ]
    assert entries[0] == JournalEntry(
        0.5, "rejected", None, "401 /report from 10.0.0.9: bad signature"
    )
    assert entries[1].text.startswith("unreadable record (")
    assert entries[4].text == "Requeue job_id=101 restarts=0: failed (scontrol: busy)"
