"""`fthsdp cluster inject NODE --fault slow[=FACTOR]`: the gray-failure fault on a dev node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fthsdp_cli.main import cli
from runtime.control.inject import heal, inject, node_faults
from runtime.control.straggler.steptiming import SlowFault
from slurm.contract import SLOW_FILE as SLOW_FILE_ENV
from slurm.errors import InputError


def test_slow_fault_reaches_the_ranks_on_that_node_only(tmp_path: Path) -> None:
    assert inject(tmp_path, "node3", "slow=2.5") == ["slow=2.5"]
    env = {SLOW_FILE_ENV: f"{tmp_path}/{{node}}/slow"}
    on3 = SlowFault.from_env({**env, "SLURMD_NODENAME": "node3"})
    on4 = SlowFault.from_env({**env, "SLURMD_NODENAME": "node4"})
    assert on3.factor(now=0.0) == 2.5
    assert on4.factor(now=0.0) == 1.0
    # Re-injecting replaces the factor; the default factor is 2.
    assert inject(tmp_path, "node3", "slow") == ["slow=2"]
    assert on3.factor(now=5.0) == 2.0
    heal(tmp_path, "node3")
    assert on3.factor(now=10.0) == 1.0
    assert node_faults(tmp_path, "node3") == []


def test_slow_accumulates_with_hardware_faults(tmp_path: Path) -> None:
    inject(tmp_path, "node1", "ecc")
    assert inject(tmp_path, "node1", "slow=3") == ["ecc", "slow=3"]
    assert json.loads((tmp_path / "node1" / "faults.json").read_text()) == ["ecc", "slow=3"]
    assert inject(tmp_path, "node1", "ib") == ["ecc", "slow=3", "ib"]
    assert (tmp_path / "node1" / "slow").read_text().strip() == "3"


@pytest.mark.parametrize("fault", ["slow=0.5", "slow=x", "ecc=2", "fast", "slow=1000"])
def test_bad_faults_are_refused(tmp_path: Path, fault: str) -> None:
    with pytest.raises(InputError):
        inject(tmp_path, "node1", fault)


def test_cli_inject_slow_and_refusal(tmp_path: Path) -> None:
    from prolog_epilog import dev_health
    from slurm import devcluster

    cfg = dev_health.with_health(devcluster.DevClusterConfig(directory=tmp_path, nodes=2))
    (tmp_path / devcluster.CONFIG_FILE).write_text(cfg.to_json())
    runner = CliRunner()
    args = ["cluster", "inject", "--dir", str(tmp_path), "--hardware-root", str(tmp_path / "hw")]
    ok = runner.invoke(cli, [*args, "node2", "--fault", "slow=2"])
    assert ok.exit_code == 0, ok.output
    assert "slow=2" in ok.output
    assert (tmp_path / "hw" / "node2" / "slow").read_text().strip() == "2"
    bad = runner.invoke(cli, [*args, "node2", "--fault", "slow=zero"])
    assert bad.exit_code == 2
    assert "--fault" in bad.output
