"""`prolog_epilog.simulated_hardware`: the dev cluster's simulated node and its faults, through
the real checks."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

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


def test_faults_go_in_while_the_nodes_nvidia_smi_is_run(tmp_path: Path) -> None:
    """A check may start nvidia-smi at the moment a fault is injected. Rewritten in place, the
    script is busy both ways (ETXTBSY): the exec fails, or the write does and leaves the node
    half broken (new GPU list, no Xid line). Every file is replaced whole by rename instead."""
    inputs = write_node_inputs(tmp_path, "node1")
    errors: list[OSError] = []
    done = threading.Event()

    def run_smi() -> None:
        while not done.is_set():
            try:
                subprocess.run(
                    [str(inputs.nvidia_smi), "-L"], capture_output=True, timeout=30, check=False
                )
            except OSError as exc:
                errors.append(exc)

    runners = [threading.Thread(target=run_smi) for _ in range(2)]
    for t in runners:
        t.start()
    writes = 0
    try:
        end = time.monotonic() + 5
        while time.monotonic() < end:
            try:
                write_node_inputs(tmp_path, "node1", faults=("xid79",) if writes % 2 else ())
            except OSError as exc:
                errors.append(exc)
            writes += 1
    finally:
        done.set()
        for t in runners:
            t.join(timeout=60)
    assert errors == [], errors[:3]
    assert writes > 10
    last = write_node_inputs(tmp_path, "node1", faults=("xid79",))
    assert ": 79," in last.kernel_log.read_text()
    assert last.nvidia_smi.stat().st_mode & 0o777 == 0o755
    assert (last.smi_dir / "q.txt").stat().st_mode & 0o777 == 0o644
    assert not [p for p in last.root.rglob(".*") if p.is_file()], "a temporary file was left"
