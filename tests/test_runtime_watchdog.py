"""`runtime.watchdog`: the node watchdog's verdicts, on fakes and on the simulated node."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runtime.watchdog import NodeWatchdog, verdict_of


@dataclass
class _Check:
    name: str
    status: str
    detail: str


@dataclass
class _Suite:
    healthy: bool
    checks: list[_Check]
    drain_reason: str | None


def test_verdict_of_suite() -> None:
    assert verdict_of(_Suite(True, [_Check("xid", "pass", "")], None)) is None
    bad = _Suite(
        False,
        [_Check("xid", "fail", "Xid 79 on GPU 3"), _Check("ecc", "pass", "")],
        "fthsdp: xid: 79",
    )
    assert verdict_of(bad) == ("fthsdp: xid: 79", ["xid: Xid 79 on GPU 3"])


@pytest.mark.timeout(20)
def test_watchdog_reports_node_fault_once() -> None:
    calls: list[dict[str, Any]] = []
    faults: list[tuple[str, list[str]]] = []

    def run_checks(**kwargs: Any) -> _Suite:
        calls.append(kwargs)
        healthy = len(calls) < 3
        return _Suite(
            healthy,
            [_Check("ecc", "pass" if healthy else "fail", "2 DBE")],
            None if healthy else "fthsdp: ecc: uncorrectable",
        )

    dog = NodeWatchdog(
        ["xid", "gpu-count", "ecc", "nvlink"],
        lambda r, e: faults.append((r, e)),
        interval_s=0.05,
        run_checks=run_checks,
        options={"gpu_source": "smi"},
    )
    dog.start()
    deadline = time.monotonic() + 10
    while not faults and time.monotonic() < deadline:
        time.sleep(0.05)
    dog.stop()
    assert faults == [("fthsdp: ecc: uncorrectable", ["ecc: 2 DBE"])]
    assert calls[0]["only"] == ["xid", "gpu-count", "ecc"]  # only the cheap checks
    assert calls[0]["gpu_source"] == "smi"
    assert dog.verdict == faults[0]


@pytest.mark.timeout(60)
def test_watchdog_on_simulated_node_sees_xid(tmp_path: Path) -> None:
    """The real prolog_epilog checks on the dev cluster's simulated hardware: healthy, then an
    Xid 79 (GPU fell off the bus) becomes a node-fault verdict naming the check."""
    from prolog_epilog.simulated_hardware import dev_config_toml, write_node_inputs
    from runtime.watchdog import check_options

    write_node_inputs(tmp_path, "node1", gpus=8)
    config = tmp_path / "health.toml"
    config.write_text(dev_config_toml(tmp_path))
    options = check_options({"FTHSDP_HEALTH_CONFIG": str(config), "SLURMD_NODENAME": "node1"})
    dog = NodeWatchdog(["xid", "gpu-count", "ecc"], lambda r, e: None, options=options)
    dog._since = time.time() - 5
    assert dog.check_once() is None
    write_node_inputs(tmp_path, "node1", gpus=8, faults=["xid79"])
    found = dog.check_once()
    assert found is not None
    reason, evidence = found
    assert reason.startswith("fthsdp:")
    assert any("xid" in e.lower() or "gpu-count" in e for e in evidence), evidence
