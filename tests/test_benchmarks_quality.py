"""benchmarks/quality.py's arithmetic: the seeded kill steps, the ledger replay of a run's
trained samples, and the verdict against static HSDP's spread."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from benchmarks import quality


@pytest.mark.parametrize("seed", range(20))
def test_kill_schedule_three_spaced_kills_from_the_seed(seed: int) -> None:
    kills = quality.kill_schedule(seed, 300)
    assert kills == quality.kill_schedule(seed, 300)
    steps = [s for _, s in kills]
    assert len(kills) == 3 and steps == sorted(steps)
    assert steps[0] >= 30 and steps[-1] < 210
    assert all(b - a >= 30 for a, b in itertools.pairwise(steps))
    assert all(0 <= r < quality.REPLICAS for r, _ in kills)


def test_trained_units_follow_the_ledger() -> None:
    # step 1 leaves slot 1's unit [64, 80) pending; step 2 gives it to slot 0 (a contributor of
    # the last step comes first) and fresh units to slots 2 and 1, in that order
    assert quality.trained_units("012,02,012") == [
        [[0, 16], [16, 32], [32, 48]],
        [[48, 64], [80, 96]],
        [[64, 80], [112, 128], [96, 112]],
    ]
    assert quality.trained_units("012,012") == quality.static_units(2)


def _run(seed: int, final: float) -> dict[str, Any]:
    return {"seed": seed, "curve": [[0, 0.0, 2.3, 0.1], [4, 1.0, final, 0.9]], "faults": []}


def test_verdict_compares_the_mean_paired_difference_with_static_std() -> None:
    static = [_run(s, v) for s, v in enumerate([0.10, 0.12, 0.11])]  # std 0.01
    close = [_run(s, v + 0.005) for s, v in enumerate([0.10, 0.12, 0.11])]
    far = [_run(s, v + 0.05) for s, v in enumerate([0.10, 0.12, 0.11])]
    got = quality.analyse({"static": static, "kills3": close, "straggler": far}, 4)
    assert got["marks"] == [1, 2, 3, 4]
    assert got["table"]["static"]["4"]["loss"]["std"] == pytest.approx(0.01)
    assert got["diffs"]["kills3"]["loss"]["mean"] == pytest.approx(0.005)
    assert got["diffs"]["kills3"]["loss_inside"]
    assert not got["diffs"]["straggler"]["loss_inside"]
