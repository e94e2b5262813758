"""`fthsdp check` and the entry points, end to end on a simulated node (no Slurm needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prolog_epilog.entrypoints import run_mode
from prolog_epilog.simulated_hardware import dev_config_toml, write_node_inputs

REPO = Path(__file__).resolve().parent.parent


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(dev_config_toml(tmp_path) + "[checks.gpu-count]\nexpected = 8\n")
    return path


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "fthsdp_cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


@pytest.mark.timeout(60)
def test_check_json_contract_and_exit_codes(tmp_path: Path) -> None:
    write_node_inputs(tmp_path, "node1")
    cfg = _config(tmp_path)
    ok = _cli("check", "--config", str(cfg), "--node", "node1", "--json")
    assert ok.returncode == 0, ok.stderr
    data = json.loads(ok.stdout)
    assert set(data) == {"healthy", "checks", "drain_reason"} and data["healthy"] is True
    assert [c["name"] for c in data["checks"]] == [
        "gpu-count",
        "ecc",
        "nvlink",
        "infiniband",
        "xid",
    ]
    assert all(set(c) >= {"name", "status", "detail"} for c in data["checks"])
    write_node_inputs(tmp_path, "node1", faults=["nvlink"])
    bad = _cli("check", "--config", str(cfg), "--node", "node1", "--only", "nvlink")
    assert bad.returncode == 1 and "inactive" in bad.stdout
    usage = _cli("check", "--only", "bogus")
    assert usage.returncode == 2 and "bogus" in usage.stderr


@pytest.mark.timeout(60)
def test_check_points_at_other_inputs(tmp_path: Path) -> None:
    fix = REPO / "tests" / "fixtures" / "health"
    r = _cli(
        "check",
        "--only",
        "infiniband,xid",
        "--json",
        "--sysfs-root",
        str(fix / "sysfs" / "down_polling"),
        "--kernel-log",
        str(fix / "kern_log_syslog.txt"),
    )
    data = json.loads(r.stdout)
    assert r.returncode == 1 and data["drain_reason"].startswith("fthsdp: infiniband: mlx5_2/1")


@pytest.mark.timeout(60)
def test_prolog_mode_without_slurm_reports_and_logs_json(tmp_path: Path) -> None:
    write_node_inputs(tmp_path, "node1", faults=["ecc"])
    code, record = run_mode(
        "prolog",
        str(_config(tmp_path)),
        node="node1",
        drain=False,
        env={"SLURMD_NODENAME": "node1"},
    )
    assert code == 1 and record["healthy"] is False and record["action"]["action"] == "none"
    line = (tmp_path / "health-node1.jsonl").read_text().splitlines()[-1]
    assert json.loads(line)["drain_reason"].startswith("fthsdp: ecc: GPU2")


def test_bad_config_fails_open(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[general\n")
    code, record = run_mode("prolog", str(bad), node="node1", env={})
    assert code == 0 and "config" in record["error"]
