"""`prolog_epilog.checks.infiniband`: port state, rate and counters to a verdict."""

from __future__ import annotations

import pytest
from health_harness import FIX, sec

from prolog_epilog.checks import infiniband
from prolog_epilog.fabric import read_sysfs


@pytest.mark.parametrize(
    ("case", "over", "status"),
    [
        ("healthy", {"min_rate_gbps": 400.0}, "pass"),
        ("down_polling", {}, "fail"),
        ("roce_only", {}, "skip"),
        ("roce_only", {"check_roce": True, "min_rate_gbps": 200.0}, "pass"),
        ("wrong_rate", {"min_rate_gbps": 400.0}, "fail"),
        ("wrong_rate", {}, "pass"),
        ("healthy", {"expected_ports": 6}, "fail"),
    ],
)
def test_infiniband_table(case, over, status):
    assert (
        infiniband.judge(read_sysfs(FIX / "sysfs" / case), sec("infiniband", **over)).status
        == status
    )


def test_infiniband_saturated_counters_reported():
    ports = read_sysfs(FIX / "sysfs" / "down_polling")
    res = infiniband.judge(
        [p for p in ports if p.device != "mlx5_2"]
        + [
            p.__class__(**{**p.__dict__, "state": "ACTIVE", "phys_state": "LinkUp"})
            for p in ports
            if p.device == "mlx5_2"
        ],
        sec("infiniband"),
    )
    assert res.status == "warn" and "link_downed=255 (saturated)" in res.detail
