"""`runtime.checkpoint`: the durable checkpoint's cadence, its run-loss model, and pruning."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from runtime.checkpoint import COMPLETE_MARKER, DurableCheckpointer, cadence, latest_complete
from runtime.sim.params import SimParams
from runtime.sim.reliability import (
    SECONDS_PER_DAY,
    RunFailureModel,
    run_loss_mtbf_s,
    young_daly_interval_s,
)

MODEL = RunFailureModel(nodes=48, failures_per_1000_nodes_day=2.3, run_losses_per_day=0.1)


def test_default_cadence_is_young_daly_against_the_run_loss_mtbf() -> None:
    c = cadence(None, stage_s=2.0, write_s=0.0, step_s=0.5, model=MODEL, replicas=3)
    mtbf = MODEL.run_loss_mtbf_s(3)
    assert c.interval_s == pytest.approx(young_daly_interval_s(2.0, mtbf))
    assert c.interval_steps == math.ceil(c.interval_s / 0.5)
    assert "Young/Daly" in c.line()


@pytest.mark.parametrize(
    ("every_s", "stage_s", "write_s", "step_s", "interval_s", "steps"),
    [
        (60.0, 2.0, 0.0, 0.5, 60.0, 120),  # fixed: the model is not asked
        (60.0, 2.0, 90.0, 0.5, 90.0, 180),  # never shorter than the last write took
        (60.0, 2.0, 0.0, 0.0, 60.0, 1),  # no step time measured yet: the next step
        (0.4, 0.1, 0.0, 1.0, 0.4, 1),  # at least one step apart
    ],
)
def test_fixed_cadence(
    every_s: float, stage_s: float, write_s: float, step_s: float, interval_s: float, steps: int
) -> None:
    c = cadence(every_s, stage_s, write_s, step_s, MODEL, replicas=3)
    assert (c.interval_s, c.interval_steps) == (interval_s, steps)


def test_no_failures_expected_means_no_further_save() -> None:
    none = RunFailureModel(nodes=4, failures_per_1000_nodes_day=0.0, run_losses_per_day=0.0)
    c = cadence(None, 1.0, 0.0, 0.5, none, replicas=2)
    assert math.isinf(c.interval_s) and "no further" in c.line()


def test_run_loss_mtbf_grows_with_replicas_and_is_bounded_by_correlated_loss() -> None:
    rate = 48 * 2.3 / 1000 / SECONDS_PER_DAY
    one = run_loss_mtbf_s(rate, 1, 120.0)
    assert one == pytest.approx(1 / rate)  # one replica: every failure loses the run
    three = run_loss_mtbf_s(rate, 3, 120.0)
    assert three > 1e6 * one
    assert MODEL.run_loss_mtbf_s(3) == pytest.approx(SECONDS_PER_DAY / 0.1, rel=1e-6)


def test_simulator_uses_the_same_run_loss_formula() -> None:
    p = SimParams()
    expected = run_loss_mtbf_s(
        p.nodes * p.node_failure_rate_per_s,
        p.replicas,
        p.replica_restart_s(),
        p.rack_failures_per_day / SECONDS_PER_DAY,
        p.rack_span_replicas,
    )
    assert p.job_loss_mtbf_s() == expected


def test_cadence_switches() -> None:
    root = Path("/nonexistent")
    assert DurableCheckpointer(root, 0, None).enabled  # default: Young/Daly
    assert not DurableCheckpointer(root, 0, 0.0).enabled
    steps_only = DurableCheckpointer(root, 4, 0.0)
    assert [s for s in range(1, 13) if steps_only._due(s)] == [4, 8, 12]
    timed = DurableCheckpointer(root, 0, None)
    assert timed._due(1)  # the first committed step measures what a save costs


def test_prune_keeps_the_newest_complete_and_any_write_still_running(tmp_path: Path) -> None:
    for step, complete in ((1, True), (2, False), (3, True), (4, True), (5, False)):
        d = tmp_path / f"step_{step:08d}"
        d.mkdir()
        if complete:
            (d / COMPLETE_MARKER).write_text(str(step))
    DurableCheckpointer(tmp_path, 0, None, keep=2)._prune()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step_00000003",
        "step_00000004",
        "step_00000005",
    ]
    assert latest_complete(tmp_path) == tmp_path / "step_00000004"
