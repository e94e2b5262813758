"""`runtime.watchdog`: the node watchdog's verdicts, on fakes and on the simulated node."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
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


@pytest.mark.timeout(60)
def test_a_followed_kernel_log_wakes_the_xid_check_on_a_driver_line(tmp_path: Path) -> None:
    """With a periodic pass a minute away, only the follower can see the Xid: a line of another
    subsystem runs no check, a driver line runs the Xid check alone, and the fault fires once."""
    pytest.importorskip("inotify_simple")
    kern = tmp_path / "kern.log"
    kern.write_text("[  1.0] boot\n")
    calls: list[list[str]] = []
    faults: list[tuple[str, list[str]]] = []
    seen = threading.Event()

    def fake_checks(only: list[str], **_: object) -> SimpleNamespace:
        calls.append(list(only))
        seen.set()
        bad = "NVRM: Xid" in kern.read_text()
        checks = [SimpleNamespace(name="xid", status="fail" if bad else "pass", detail="Xid 79")]
        return SimpleNamespace(healthy=not bad, checks=checks, drain_reason="fthsdp: xid: 79")

    dog = NodeWatchdog(
        ["xid", "ecc"],
        lambda r, e: faults.append((r, e)),
        interval_s=60,
        run_checks=fake_checks,
        options={"kernel_log": kern},
    )
    assert dog.follower is not None
    dog.start()
    try:
        time.sleep(0.3)  # the follower's watch is in place (a miss only slows the test)
        with kern.open("a") as f:
            f.write("[  2.0] usb 1-1: new device\n")
        assert not seen.wait(1.0), calls
        t0 = time.monotonic()
        with kern.open("a") as f:
            f.write("[  3.0] NVRM: Xid (PCI:0000:9b:00): 79, pid=1, GPU has fallen off the bus.\n")
        deadline = t0 + 10
        while not faults and time.monotonic() < deadline:
            time.sleep(0.02)
        took = time.monotonic() - t0
    finally:
        dog.stop()
    assert faults == [("fthsdp: xid: 79", ["xid: Xid 79"])]
    assert calls == [["xid"]]
    assert took < 5.0  # a minute before the periodic pass; ~0.1 s unloaded
