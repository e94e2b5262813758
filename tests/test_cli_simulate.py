"""`fthsdp simulate` through click's CliRunner on the real group: JSON contract, table, plot,
and bad input -> exit 2 naming the field."""

from __future__ import annotations

import builtins
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fthsdp_cli.main import cli

QUICK = ["--runs", "4", "--days", "2"]


def _run(*args: str) -> Any:
    return CliRunner().invoke(cli, ["simulate", *args])


def test_json_has_the_contract_fields() -> None:
    result = _run(*QUICK, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert 0.3 < data["sync"]["ettr"] < 0.6
    assert 0.7 < data["fthsdp"]["ettr"] < 0.9
    assert data["sync"]["recovery_s_mean"] > 0
    assert data["fthsdp"]["stall_s_mean"] > 0
    assert data["params"]["gpus"] == 98_304
    assert data["params"]["replicas"] == 12
    assert data["params"]["runs"] == 4


def test_sweep_gives_one_record_per_replica_count() -> None:
    result = _run(*QUICK, "--sweep-replicas", "1,4,12", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [rec["replicas"] for rec in data] == [1, 4, 12]
    assert [rec["params"]["replicas"] for rec in data] == [1, 4, 12]
    assert len({rec["sync"]["ettr"] for rec in data}) == 1  # sync does not depend on R
    assert data[0]["fthsdp"]["ettr"] < data[2]["fthsdp"]["ettr"]


@pytest.mark.parametrize(
    ("args", "key", "expected"),
    [
        # --mtbf-minutes is the job's MTBF at the size given
        (["--gpus", "8192", "--replicas", "4", "--mtbf-minutes", "60"], "job_mtbf_s", 3600.0),
        (["--failures-per-1000-nodes-day", "2.3"], "failures_per_1000_nodes_day", 2.3),
        (["--checkpoint-interval-s", "600"], "checkpoint_interval_s", 600.0),
    ],
)
def test_options_reach_the_model(args: list[str], key: str, expected: float) -> None:
    result = _run(*QUICK, *args, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["params"][key] == pytest.approx(expected)


def test_table_by_default() -> None:
    result = _run(*QUICK, "--sweep-replicas", "2,12")
    assert result.exit_code == 0, result.output
    assert "sync" in result.stdout and "FT-HSDP" in result.stdout
    assert "98,304 GPUs" in result.stdout


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--gpus", "0"], "gpus"),
        (["--gpus", "100"], "gpus"),  # not whole nodes
        (["--gpus-per-node", "-8"], "gpus_per_node"),
        (["--replicas", "7"], "replicas"),  # does not divide 12,288 nodes
        (["--replicas", "0"], "replicas"),
        (["--mtbf-minutes", "-5"], "mtbf_minutes"),
        (["--mtbf-minutes", "10", "--failures-per-1000-nodes-day", "2"], "mtbf_minutes"),
        (["--failures-per-1000-nodes-day", "-1"], "failures_per_1000_nodes_day"),
        (["--days", "0"], "days"),
        (["--runs", "0"], "runs"),
        (["--checkpoint-interval-s", "0"], "checkpoint_interval_s"),
        (["--checkpoint-write-s", "-1"], "checkpoint_write_s"),
        (["--sweep-replicas", "1,x"], "sweep_replicas"),
        (["--sweep-replicas", "1,5"], "replicas"),
        (["--preset", "nope"], "preset"),
    ],
)
def test_bad_input_exits_2_naming_the_option(args: list[str], field: str) -> None:
    result = _run(*args)
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"Error: --{field.replace('_', '-')}:"), result.output
    assert "_" not in result.output.split(";")[1], result.output  # no Python field names
    assert "Traceback" not in result.output


def test_plot_writes_a_png(tmp_path: Path) -> None:
    out = tmp_path / "ettr.png"
    result = _run(*QUICK, "--sweep-replicas", "1,2,12", "--plot", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    out = tmp_path / "ettr.png"
    result = _run(*QUICK, "--plot", str(out))
    assert result.exit_code == 3
    assert "matplotlib" in result.output and "fthsdp[plot]" in result.output
    assert not out.exists()
