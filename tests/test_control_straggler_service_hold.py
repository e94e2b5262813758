"""Which reports `StragglerService` counts as evidence, by table: none while another replica
recovers, and none from anyone, the replacement itself included, for `recovery_hold_s` after a
replica trains again (a replacement's first steps on a busy machine are slow, not its node)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from runtime.control.policy import PolicyConfig, ReplicaState, RunState
from runtime.control.straggler.detect import StragglerConfig
from runtime.control.straggler.service import StragglerService

HOLD = 60.0
CONFIG = PolicyConfig(replicas=3, min_replicas=2, report_timeout_s=600.0)


def _state(**replicas: ReplicaState) -> RunState:
    state = RunState.new(CONFIG)
    for k in range(3):
        state.replicas[k] = replace(state.replicas[k], phase="training", phase_since=0.0)
    for name, r in replicas.items():
        state.replicas[int(name[1:])] = r
    return state


def _back(k: int, since: float) -> ReplicaState:
    """Replica k training again since `since`, after one requeue."""
    return ReplicaState(replica=k, phase="training", phase_since=since, requeues=1)


@pytest.mark.parametrize(
    ("replicas", "reporter", "at", "evidence"),
    [
        ({}, 0, 100.0, True),  # all training from the first start: judged at once
        ({"r1": ReplicaState(replica=1, phase="starting")}, 0, 100.0, False),  # another starts
        ({"r1": ReplicaState(replica=1, phase="healing")}, 1, 100.0, True),  # its own heal only
        ({"r1": ReplicaState(replica=1, phase="healing")}, 0, 100.0, False),
        ({"r1": _back(1, 90.0)}, 1, 100.0, False),  # the replacement's own first steps
        ({"r1": _back(1, 90.0)}, 0, 100.0, False),  # its peers', while it warms up
        ({"r1": _back(1, 90.0)}, 1, 90.0 + HOLD, True),  # the hold is over
        ({"r1": _back(1, 90.0)}, 0, 90.0 + HOLD + 1, True),
        ({"r1": _back(1, 90.0)}, 0, 80.0, True),  # a report from before it came back
        ({"r1": ReplicaState(replica=1, phase="training", phase_since=90.0)}, 0, 100.0, True),
    ],
)
def test_evidence(
    replicas: dict[str, ReplicaState], reporter: int, at: float, evidence: bool
) -> None:
    service = StragglerService(min_replicas=2, detect=StragglerConfig(recovery_hold_s=HOLD))
    service._refresh(_state(**replicas), at)
    assert (not service._no_evidence(reporter, at)) is evidence
