"""`prolog_epilog.fabric`: InfiniBand facts from sysfs trees and from ibstat agree."""

from __future__ import annotations

import pytest
from health_harness import FIX

from prolog_epilog.fabric import parse_ibstat, parse_rate, read_sysfs


@pytest.mark.parametrize(
    ("case", "states"),
    [
        (
            "healthy",
            {
                "mlx5_0": ("ACTIVE", "LinkUp", 400.0, "InfiniBand"),
                "mlx5_4": ("ACTIVE", "LinkUp", 100.0, "Ethernet"),
            },
        ),
        ("down_polling", {"mlx5_2": ("DOWN", "Polling", 10.0, "InfiniBand")}),
        ("roce_only", {"mlx5_1": ("ACTIVE", "LinkUp", 200.0, "Ethernet")}),
        ("wrong_rate", {"mlx5_3": ("ACTIVE", "LinkUp", 200.0, "InfiniBand")}),
    ],
)
def test_sysfs_trees(case, states):
    ports = {p.device: p for p in read_sysfs(FIX / "sysfs" / case)}
    for dev, (state, phys, rate, layer) in states.items():
        p = ports[dev]
        assert (p.state, p.phys_state, p.rate_gbps, p.link_layer) == (state, phys, rate, layer)


def test_sysfs_files_without_newline_parse_like_with():
    ports = {p.device: p for p in read_sysfs(FIX / "sysfs" / "healthy")}
    assert ports["mlx5_0"] == ports["mlx5_0"].__class__(
        **{**ports["mlx5_1"].__dict__, "device": "mlx5_0"}
    )
    assert ports["mlx5_1"].counters["link_downed"] == 0


def test_ibstat_matches_sysfs_facts():
    ports = parse_ibstat((FIX / "ibstat_healthy.txt").read_text())
    assert [(p.device, p.state, p.phys_state, p.rate_gbps, p.link_layer) for p in ports] == [
        ("mlx5_0", "ACTIVE", "LinkUp", 400.0, "InfiniBand"),
        ("mlx5_1", "ACTIVE", "LinkUp", 400.0, "InfiniBand"),
        ("mlx5_2", "ACTIVE", "LinkUp", 100.0, "Ethernet"),
    ]
    down = parse_ibstat((FIX / "ibstat_down.txt").read_text())
    assert (down[1].state, down[1].phys_state) == ("DOWN", "Polling")
    assert parse_rate("400 Gb/sec (4X NDR)") == 400.0 and parse_rate("garbage") is None
