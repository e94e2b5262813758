"""A healthy replica's stall over a failure's outage, from its commit times."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.local.summary import healthy_stalls, outage_stall

STEP = 0.2


def steady(t0: float, t1: float) -> list[float]:
    """Commits every STEP from t0 up to t1."""
    n = round((t1 - t0) / STEP)
    return [round(t0 + k * STEP, 6) for k in range(n + 1)]


@pytest.mark.parametrize(
    ("commits", "t0", "t1", "stall"),
    [
        # the survivors commit the step the dead replica had contributed to, then wait 2.4 s at
        # the next quorum: the wait is the stall, not the normal gap that holds the kill
        ([*steady(0, 1.0), *steady(3.4, 6.0)], 0.9, 5.0, 2.2),
        # the wait lands in the gap that holds the kill
        ([*steady(0, 1.0), *steady(3.4, 6.0)], 1.1, 5.0, 2.2),
        # no wait at all
        (steady(0, 6.0), 1.1, 5.0, 0.0),
        # a hiccup at the return (the rejoining replica voted a step down) counts: it is inside
        ([*steady(0, 4.0), *steady(4.9, 6.0)], 1.1, 5.0, 0.7),
        # after the outage: not this failure's
        ([*steady(0, 5.2), *steady(8.0, 9.0)], 1.1, 5.0, 0.0),
        # nothing committed after the outage: no figure
        (steady(0, 4.0), 1.1, 5.0, None),
    ],
)
def test_outage_stall(commits: list[float], t0: float, t1: float, stall: float | None) -> None:
    got = outage_stall(commits, t0, t1, STEP)
    assert (got is None) == (stall is None)
    if stall is not None and got is not None:
        assert got == pytest.approx(stall, abs=1e-6)


def test_healthy_stalls_leave_out_the_victim_and_a_replica_killed_in_the_outage() -> None:
    failures: list[dict[str, Any]] = [
        {"replica": 0, "t_kill": 1.1, "t_rejoin": 5.0},
        {"replica": 2, "t_kill": 3.7, "t_rejoin": 7.0},
    ]
    commits = {
        0: [*steady(0, 1.0), *steady(5.0, 9.0)],
        1: [*steady(0, 1.0), *steady(3.4, 9.0)],
        2: [*steady(0, 3.6), *steady(7.0, 9.0)],
    }
    # failure 0: replica 1 waited 2.2 s; replica 2 was killed during it. Failure 1: replica 0
    # was still away when it came, so only replica 1, which did not wait
    assert healthy_stalls(failures, commits, STEP) == [pytest.approx(2.2), pytest.approx(0.0)]
