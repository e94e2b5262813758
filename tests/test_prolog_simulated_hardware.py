"""`prolog_epilog.simulated_hardware`: the dev cluster's simulated node and its faults, through
the real checks."""

from __future__ import annotations

import pytest
from health_harness import sim_config

from prolog_epilog import run_checks
from prolog_epilog.simulated_hardware import write_node_inputs


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("faults", "failing"),
    [
        ((), []),
        (("xid79",), ["gpu-count", "xid"]),
        (("ecc",), ["ecc"]),
        (("nvlink",), ["nvlink"]),
        (("ib",), ["infiniband"]),
    ],
)
def test_simulated_node_faults(tmp_path, faults, failing):
    write_node_inputs(tmp_path, "node1", faults=faults)
    res = run_checks(config=sim_config(tmp_path))
    assert [c.name for c in res.checks if c.status == "fail"] == failing
    assert res.healthy is (not failing)
    if failing:
        assert res.drain_reason.startswith(f"fthsdp: {'xid' if 'xid' in failing else failing[0]}:")


@pytest.mark.timeout(30)
def test_simulated_ecc_fault_is_cheap_for_watchdog(tmp_path):
    write_node_inputs(tmp_path, "node1", faults=["ecc"])
    cfg = sim_config(tmp_path)
    res = run_checks(["xid", "gpu-count", "ecc"], cfg)
    # Cheap because it runs the subset and nothing else; what that costs in seconds is a
    # figure of benchmarks/healthcheck.py ("watchdog subset"), not a bound a busy machine breaks.
    assert [c.name for c in res.checks] == ["xid", "gpu-count", "ecc"]
    assert res.by_name()["ecc"].status == "fail" and "GPU2" in res.drain_reason
