"""The simulator's closed forms against the textbook's worked numbers (ml-systems vol. 2, ch. 7)."""

from __future__ import annotations

import math

import pytest

from runtime.sim.params import PRESETS, power_law_interpolate
from runtime.sim.reliability import cluster_mtbf_hours, mtbf_from_rate_s, young_daly_interval_s
from slurm.errors import InputError


@pytest.mark.parametrize(
    ("gpu_mtbf_h", "gpus", "expected_h"),
    [
        (50_000, 8, 6_250),  # table 7.1
        (50_000, 64, 781.25),
        (50_000, 1_000, 50),
        (50_000, 10_000, 5),
        (50_000, 25_000, 2),
    ],
)
def test_cluster_mtbf_is_component_mtbf_over_n(
    gpu_mtbf_h: float, gpus: int, expected_h: float
) -> None:
    assert cluster_mtbf_hours(gpu_mtbf_h, gpus) == pytest.approx(expected_h)


@pytest.mark.parametrize(
    ("write_s", "mtbf_s", "expected_s", "tol_s"),
    [
        # The textbook's cases; its figures are Young's first order (991 s, 1.6 h, 24 min), which
        # Daly's higher-order terms shorten by the write time and a little more.
        (37, 3.69 * 3600, 967.0, 1.0),  # worked example: 10,000 GPUs, 3.69 h, 37 s
        (15 * 60, 5 * 3600, 1.42 * 3600, 0.05 * 3600),  # figure 7.3
        (150, 2 * 3600, 22.9 * 60, 60),  # figure 7.25
        (0, 1000, 0.0, 0.0),
        (300, 100, 100.0, 0.0),  # write time >= 2 MTBF: the MTBF itself
    ],
)
def test_young_daly_interval(
    write_s: float, mtbf_s: float, expected_s: float, tol_s: float
) -> None:
    assert young_daly_interval_s(write_s, mtbf_s) == pytest.approx(expected_s, abs=tol_s)


def test_mtbf_is_the_inverse_rate() -> None:
    assert mtbf_from_rate_s(1 / 1080) == pytest.approx(1080)
    assert mtbf_from_rate_s(0.0) == math.inf


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: cluster_mtbf_hours(0, 8), "component_mtbf_hours"),
        (lambda: cluster_mtbf_hours(50_000, 0), "components"),
        (lambda: young_daly_interval_s(-1, 100), "checkpoint_write_s"),
        (lambda: young_daly_interval_s(10, 0), "mtbf_s"),
        (lambda: power_law_interpolate(0, ((1, 1.0), (2, 2.0))), "gpus"),
    ],
)
def test_bad_analytic_inputs_name_the_field(call: object, field: str) -> None:
    with pytest.raises(InputError) as err:
        call()  # type: ignore[operator]
    assert err.value.field == field


def test_nccl_init_passes_through_the_paper_anchors_and_stays_positive_below() -> None:
    p = PRESETS["paper-100k"]
    assert p.nccl_init_s(16_384) == pytest.approx(17.0)
    assert p.nccl_init_s(98_304) == pytest.approx(200.0)
    sizes = [1_024, 8_192, 16_384, 32_768, 65_536, 98_304]
    costs = [p.nccl_init_s(n) for n in sizes]
    assert all(c > 0 for c in costs)
    assert costs == sorted(costs)
    assert 17.0 < p.nccl_init_s(49_152) < 200.0


def test_paper_preset_failure_rate_is_one_every_18_minutes() -> None:
    p = PRESETS["paper-100k"]
    assert p.job_mtbf_s == pytest.approx(18 * 60)
    # The rate is stored per node, so a smaller job fails proportionally less often.
    assert p.with_changes(gpus=49_152, replicas=6).job_mtbf_s == pytest.approx(36 * 60)


def test_young_daly_interval_per_mode() -> None:
    p = PRESETS["paper-100k"]
    # Synchronous: every failure loses the state -> Young/Daly with the job MTBF.
    x = 20 / (2 * 18 * 60)
    daly = math.sqrt(2 * 20 * 18 * 60) * (1 + math.sqrt(x) / 3 + x / 9) - 20
    assert p.checkpoint_interval_for(1) == pytest.approx(daly)
    # FT-HSDP: the state is lost only when every replica is out at once -> far longer interval.
    assert p.checkpoint_interval_for(12) > 100 * p.checkpoint_interval_for(1)
    assert p.with_changes(checkpoint_interval_s=300.0).checkpoint_interval_for(12) == 300.0
    assert p.with_changes(failures_per_1000_nodes_day=0.0).checkpoint_interval_for(1) == math.inf


@pytest.mark.parametrize(
    ("write_s", "mtbf_s", "expected"),
    [(10.0, 3600.0, 261.70), (1.0, 100.0, 13.48), (300.0, 100.0, 100.0)],
)
def test_young_daly(write_s: float, mtbf_s: float, expected: float) -> None:
    assert young_daly_interval_s(write_s, mtbf_s) == pytest.approx(expected, abs=0.01)
