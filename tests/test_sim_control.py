"""The control plane in the scale model: what a configuration asks of its one coordinator (tables
over `runtime.sim.control`), and `fthsdp simulate` warning when one coordinator cannot hold it."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from fthsdp_cli.main import cli
from runtime.sim import PRESETS
from runtime.sim.control import MEASURED_REPORT_COST_S, control_load
from slurm.errors import InputError

QUICK = ["--runs", "2", "--days", "1"]


@pytest.mark.parametrize(
    ("replicas", "per_replica", "interval", "cost", "rate", "fits", "min_interval"),
    [
        # the paper's job: 12 leaders once a second is nothing
        (12, 1, 1.0, 0.002, 12.0, True, 0.048),
        # 1,000 small replicas at 1 ms per report: half the coordinator, just fits
        (1000, 1, 1.0, 0.0005, 1000.0, True, 1.0),
        # ... at 2 ms per report it does not; every 4 s it does
        (1000, 1, 1.0, 0.002, 1000.0, False, 4.0),
        (1000, 1, 4.0, 0.002, 250.0, True, 4.0),
        # 12 replicas with a watchdog report from each of their 1,024 nodes
        (12, 1024, 1.0, 0.002, 12288.0, False, 49.152),
    ],
)
def test_control_load(
    replicas: int,
    per_replica: int,
    interval: float,
    cost: float,
    rate: float,
    fits: bool,
    min_interval: float,
) -> None:
    load = control_load(replicas, per_replica, interval, cost)
    assert load.reports_per_s == pytest.approx(rate)
    assert load.fits is fits
    assert load.min_interval_s == pytest.approx(min_interval)
    assert (load.warning() is None) is fits
    if not fits:
        text = load.warning()
        assert text is not None and f"{rate:,.0f} reports/s" in text
        # the interval it suggests does fit
        assert control_load(replicas, per_replica, load.min_interval_s, cost).fits


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((0, 1, 1.0), "replicas"),
        ((1, 0, 1.0), "reporters_per_replica"),
        ((1, 1, 0.0), "report_interval_s"),
        ((1, 1, float("inf")), "report_interval_s"),
    ],
)
def test_control_load_refuses(args: tuple[int, int, float], field: str) -> None:
    with pytest.raises(InputError) as err:
        control_load(*args)
    assert err.value.field == field


def test_the_measured_coordinator_holds_1000_reports_per_second_but_not_with_headroom() -> None:
    """control_load measured one coordinator answering 1,000 reports/s with room to spare (the
    p50 stays in milliseconds), yet beyond the half kept for bursts: the simulator says so and
    names the interval that keeps the headroom."""
    load = control_load(1000, 1, 1.0)
    assert load.report_cost_s == MEASURED_REPORT_COST_S
    assert 0.5 < load.utilisation < 1.0
    text = load.warning()
    assert text is not None and f"{MEASURED_REPORT_COST_S * 1000:.2f} ms per report" in text
    assert control_load(1000, 1, load.min_interval_s).fits
    assert load.min_interval_s < 2.0


def test_paper_preset_fits_one_coordinator() -> None:
    load = PRESETS["paper-100k"].control_load()
    assert load.reporters == 12 and load.fits


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["simulate", *QUICK, *args])
    return result.exit_code, result.stdout, result.stderr


def test_simulate_warns_when_one_coordinator_cannot_hold_it() -> None:
    code, out, err = _run("--reporters-per-replica", "1024", "--report-cost-s", "0.002", "--json")
    assert code == 0, err
    data = json.loads(out)  # the warning goes to stderr: the JSON stays parseable
    assert data["control_plane"]["reports_per_s"] == pytest.approx(12 * 1024)
    assert data["control_plane"]["fits"] is False
    assert "warning" in err and "12,288 reporters" in err and "R=12" in err


def test_simulate_is_quiet_when_it_fits() -> None:
    code, out, err = _run("--report-interval-s", "2", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["control_plane"]["fits"] is True
    assert data["params"]["report_interval_s"] == 2.0
    assert "warning" not in err


def test_simulate_sweep_warns_only_for_the_counts_that_do_not_fit() -> None:
    code, _, err = _run(
        "--gpus",
        "8192",
        "--replicas",
        "2",
        "--sweep-replicas",
        "2,1024",
        "--report-cost-s",
        "0.002",
        "--json",
    )
    assert code == 0, err
    assert "R=1024" in err and "R=2:" not in err


def test_simulate_refuses_a_bad_interval() -> None:
    code, _, err = _run("--report-interval-s", "0")
    assert code == 2
    assert "report-interval-s" in err.replace("_", "-")
