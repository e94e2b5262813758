"""`fthsdp cancel` cancels only what still runs and names what had finished (pure part; the dev
cluster run of the README, `tests/test_story_readme.py`, cancels twice for real)."""

from __future__ import annotations

import pytest

from slurm.cancel import cancel_order


@pytest.mark.parametrize(
    ("live", "cancel", "finished"),
    [
        ({"11", "12", "10"}, ["11", "12", "10"], []),
        ({"12"}, ["12"], ["11", "10"]),
        (set(), [], ["11", "12", "10"]),  # a second call: nothing left
        ({"10", "99"}, ["10"], ["11", "12"]),  # a job not of this run is never cancelled
    ],
)
def test_cancel_order(live: set[str], cancel: list[str], finished: list[str]) -> None:
    # replicas first, then the control job, so none outlives its control plane
    assert cancel_order(["11", "12", "10"], live) == (cancel, finished)
