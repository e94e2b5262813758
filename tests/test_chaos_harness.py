"""The chaos campaign's schedule, figures and requeue attribution (`tests/chaos_harness.py`),
without Slurm."""

from __future__ import annotations

import pytest
from chaos_harness import (
    ANY_REPLICA,
    CONTROL_DOWN,
    FAILS,
    KINDS,
    REQUEUES,
    Fault,
    Outcome,
    figures,
    lowest_after,
    plan,
    stall_s,
    unattributed_requeues,
    with_protected,
)


def test_a_schedule_is_its_seed_alone() -> None:
    kinds = list(KINDS)
    assert plan(7, 8, kinds, 3, protected=0) == plan(7, 8, kinds, 3, protected=0)
    assert plan(7, 8, kinds, 3, protected=0) != plan(8, 8, kinds, 3, protected=0)


@pytest.mark.parametrize("seed", range(20))
def test_every_kind_comes_and_the_protected_replica_never_moves(seed: int) -> None:
    n = len(KINDS) + 1
    faults = plan(seed, n, list(KINDS), 3, protected=0, delay_steps=(5, 9), strikes=6)
    assert {f.kind for f in faults} == set(KINDS)
    assert [f.index for f in faults] == list(range(n))
    for f in faults:
        assert 5 <= f.after_steps <= 9
        if f.kind == CONTROL_DOWN:  # whichever replica shares the control job's node then
            assert f.replica == ANY_REPLICA
        else:
            assert 0 <= f.replica < 3
        if f.kind in REQUEUES:
            assert f.replica != 0, f
        if f.kind == "second":
            assert f.other is not None and f.other != f.replica
        else:
            assert f.other is None


def _failures(faults: list[Fault], movable: tuple[int, ...] = (1, 2)) -> dict[int, int]:
    """Failures per replica, a power loss of the control job's node counted against every
    replica it may take with it."""
    counts: dict[int, int] = {}
    for f in faults:
        struck = movable if f.kind == CONTROL_DOWN else (f.replica, f.other)
        for k in struck:
            if k is not None and (f.kind in FAILS or f.kind == CONTROL_DOWN):
                counts[k] = counts.get(k, 0) + 1
    return counts


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("strikes", [1, 2, 3])
def test_no_replica_fails_more_often_than_the_run_allows(seed: int, strikes: int) -> None:
    kinds = ["xid79", "kill", "down", "control", "slurmctld", "second"]
    try:
        faults = plan(seed, 6, kinds, 3, protected=0, strikes=strikes)
    except ValueError as exc:  # too few strikes for 6 faults of these kinds: said so
        assert strikes < 3 and f"failed {strikes}x" in str(exc), exc
        return
    assert max(_failures(faults).values()) <= strikes, faults


@pytest.mark.parametrize("seed", range(40))
def test_every_kind_fits_the_campaigns_strikes(seed: int) -> None:
    """The campaign's full set, one fault of each kind, within the 5 failures per replica its
    run allows (`tests/test_story_chaos.py`)."""
    faults = plan(seed, len(KINDS), list(KINDS), 3, protected=0, strikes=5)
    assert {f.kind for f in faults} == set(KINDS)
    assert max(_failures(faults).values()) <= 5, faults


def test_a_power_loss_of_the_control_node_is_refused_past_the_strikes() -> None:
    with pytest.raises(ValueError, match=r"fault 1 \(control-down\): a replica it may strike"):
        plan(1, 2, [CONTROL_DOWN], 3, protected=0, strikes=1)


@pytest.mark.parametrize(
    ("protected", "expected"),
    [
        (0, [(1, None), (2, 0), (ANY_REPLICA, None)]),
        (1, [(0, None), (2, 1), (ANY_REPLICA, None)]),
        (2, [(1, None), (0, 2), (ANY_REPLICA, None)]),
    ],
)  # fmt: skip
def test_the_protected_replica_is_the_one_chosen_when_the_run_starts(
    protected: int, expected: list[tuple[int, int | None]]
) -> None:
    drawn = [Fault(0, "xid79", 10, 1), Fault(1, "second", 10, 2, 0),
             Fault(2, CONTROL_DOWN, 10, ANY_REPLICA)]  # fmt: skip
    moved = with_protected(drawn, protected, 3)
    assert [(f.replica, f.other) for f in moved] == expected
    assert [(f.index, f.kind, f.after_steps) for f in moved] == [
        (f.index, f.kind, f.after_steps) for f in drawn
    ]
    with pytest.raises(ValueError, match="protected replica 3"):
        with_protected(drawn, 3, 3)


def test_a_limit_that_is_never_reached_changes_no_draw() -> None:
    kinds = list(KINDS)
    for seed in range(40):
        free = plan(seed, 6, kinds, 3, protected=0)
        if max(_failures(free).values()) <= 3:
            assert plan(seed, 6, kinds, 3, protected=0, strikes=3) == free


@pytest.mark.parametrize(
    ("faults", "kinds", "replicas", "message"),
    [
        (3, ["xid79", "meteor"], 3, "unknown chaos kinds ['meteor']"),
        (0, ["xid79"], 3, "at least one fault"),
        (2, [], 3, "at least one fault"),
        (2, ["kill"], 1, "two replicas"),
    ],
)  # fmt: skip
def test_a_bad_schedule_is_refused(
    faults: int, kinds: list[str], replicas: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        plan(1, faults, kinds, replicas)


def _trace(points: list[tuple[float, int, int]]) -> list[tuple[float, dict[int, dict[str, int]]]]:
    return [(t, {0: {"step": a}, 1: {"step": b}}) for t, a, b in points]


@pytest.mark.parametrize(
    ("points", "start", "end", "healthy", "expected"),
    [
        # Steady progress, one poll a second: the stall is one poll interval.
        ([(0, 1, 1), (1, 2, 2), (2, 3, 3), (3, 4, 4)], 0, 3, [0, 1], 1.0),
        # Both stopped from t=1 to t=5.
        ([(0, 1, 1), (1, 2, 2), (3, 2, 2), (5, 3, 3)], 0, 5, [0, 1], 4.0),
        # One healthy replica moving is progress; the struck one's stop is not the stall.
        ([(0, 1, 1), (1, 2, 1), (2, 3, 1), (3, 4, 1)], 0, 3, [0], 1.0),
        ([(0, 1, 1), (1, 2, 1), (2, 3, 1), (3, 4, 1)], 0, 3, [1], 3.0),
        # Polls outside the window are not counted; the window's own ends are.
        ([(-5, 0, 0), (1, 1, 1), (9, 2, 2), (20, 9, 9)], 0, 10, [0, 1], 8.0),
    ],
)  # fmt: skip
def test_the_stall_is_the_longest_time_without_a_new_step(
    points: list[tuple[float, int, int]],
    start: float,
    end: float,
    healthy: list[int],
    expected: float,
) -> None:
    assert stall_s(_trace(points), start, end, healthy) == expected


@pytest.mark.parametrize(
    ("points", "expected"),
    [
        # Polls before the fault do not count; the lowest after it does.
        ([(-1, 3, 3), (1, 9, 8), (2, 7, 7), (3, 12, 12)], 7),
        # The control plane away: status has no steps, which is no loss.
        ([(1, None, None), (2, None, None), (3, 12, 11)], 12),
        # Nothing seen after the fault: the step before it.
        ([(-1, 3, 3)], 10),
        # One replica's step unknown (requeued), the other's counts.
        ([(1, None, 8)], 8),
    ],
)  # fmt: skip
def test_the_lowest_step_after_a_fault_counts_only_polls_that_saw_one(
    points: list[tuple[float, int | None, int | None]], expected: int
) -> None:
    trace = [(t, {0: {"step": a}, 1: {"step": b}}) for t, a, b in points]
    assert lowest_after(trace, 0.0, 10) == expected


JOBS = {0: "10", 1: "11", 2: "12"}
SAID = "requeue(s) in the journal, faults that requeue it:"


@pytest.mark.parametrize(
    ("requeued", "faults", "problems"),
    [
        ([], [Fault(0, "kill", 10, 1), Fault(1, "control", 10, 0)], []),
        (["11"], [Fault(0, "xid79", 10, 1)], []),
        (["11", "11"], [Fault(0, "xid79", 10, 1), Fault(1, "second", 10, 1, 2)], []),
        # A power loss may be requeued by Slurm itself: the coordinator's call is then moot.
        ([], [Fault(0, "down", 10, 2)], []),
        (["12"], [Fault(0, "down", 10, 2)], []),
        # An Xid's requeue missing, a requeue nobody asked for, one too many.
        ([], [Fault(0, "xid79", 10, 1)], [f"job 11: 0 {SAID} 1-1"]),
        (["10"], [Fault(0, "kill", 10, 0)], [f"job 10: 1 {SAID} 0-0"]),
        (["11", "11"], [Fault(0, "xid79", 10, 1)], [f"job 11: 2 {SAID} 1-1"]),
        # ECC errors and a straggler are drained and requeued by the coordinator.
        (["11", "12"], [Fault(0, "ecc", 10, 1), Fault(1, "slow", 10, 2)], []),
        ([], [Fault(0, "slow", 10, 2)], [f"job 12: 0 {SAID} 1-1"]),
        # The control node's power loss: the replica beside it is Slurm's to requeue, and a
        # control job alone on its node takes no replica with it.
        ([], [Fault(0, CONTROL_DOWN, 10, 1)], []),
        (["11"], [Fault(0, CONTROL_DOWN, 10, 1)], []),
        (["11"], [Fault(0, CONTROL_DOWN, 10, ANY_REPLICA)], [f"job 11: 1 {SAID} 0-0"]),
    ],
)  # fmt: skip
def test_every_requeue_is_attributed_to_its_fault(
    requeued: list[str], faults: list[Fault], problems: list[str]
) -> None:
    assert unattributed_requeues(requeued, faults, JOBS) == problems


def test_figures_per_kind() -> None:
    outcomes = [
        Outcome(Fault(0, "xid79", 10, 1), 0.0, 20.0, 1.5, 100, 100),
        Outcome(Fault(1, "xid79", 10, 2), 0.0, 30.0, 2.5, 200, 198),
        Outcome(Fault(2, "kill", 10, 1), 0.0, None, None, 300, 300),
    ]
    assert figures(outcomes) == {
        "xid79": {"injected": 2, "survived": 2, "steps_lost": 1.0, "stall_s": 2.0,
                  "recovered_s": 25.0},
        "kill": {"injected": 1, "survived": 0, "steps_lost": 0, "stall_s": None,
                 "recovered_s": None},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("node", "control", "beside"),
    [
        ("node2", "node2", True),
        ("node2", "node1", False),
        ("node2", None, False),
        (None, None, False),
    ],
)
def test_a_fault_beside_the_control_job_is_one_on_its_node(
    node: str | None, control: str | None, beside: bool
) -> None:
    outcome = Outcome(Fault(0, "down", 10, 1), 0.0, node=node, control_node=control)
    assert outcome.beside_control is beside
    assert outcome.to_dict()["beside_control"] is beside
