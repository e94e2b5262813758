"""`fthsdp run --local` runs a `[train] mode = "torchft"` spec: local processes, the same
environment as on Slurm, a killed group restarted and healed from its peer."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPEC = """
[job]
name = "byo-local"
run_dir = "{run_dir}"

[replicas]
count = 2
tasks_per_node = 1

[train]
mode = "torchft"
command = "{python} examples/torchft_trainer.py --steps 60 --step-sleep 0.1"
progress_regex = 'step: (?P<step>\\d+)  loss:'
min_replicas = 1
allreduce_timeout_s = 10
quorum_timeout_s = 20
join_timeout_s = 30
"""


def _fthsdp(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fthsdp_cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_local_torchft_run_restarts_a_killed_group_which_heals(tmp_path: Path) -> None:
    """examples/torchft.toml as shipped (only its run folder moved), with one group killed."""
    run_dir = tmp_path / "run"
    r = _fthsdp(
        "run",
        "--local",
        "examples/torchft.toml",
        "--set",
        f"job.run_dir={run_dir}",
        "--kill-replica",
        "1",
        "--at-step",
        "15",
        "--json",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout)
    groups = {g["replica"]: g for g in summary["groups"]}
    assert groups[0]["restarts"] == 0 and groups[0]["exit_codes"] == [0]
    assert groups[1]["restarts"] == 1 and groups[1]["exit_codes"] == [-9, 0]
    assert groups[0]["step"] == groups[1]["step"] == 200

    def steps(name: str) -> list[int]:
        text = (run_dir / "logs" / name).read_text()
        return [int(s) for s in re.findall(r"(?m)^step: (\d+)  loss:", text)]

    first, second = steps("g1_i0_t0.out"), steps("g1_i1_t0.out")
    assert first[-1] >= 15
    # The restarted group took its peer's state: it went on past where it died, never from 1.
    assert second[0] > first[-1] and second == sorted(second), (first[-3:], second[:3])


def test_native_only_options_are_refused_in_torchft_mode(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.format(run_dir=tmp_path / "run", python=sys.executable))
    r = _fthsdp("run", "--local", str(spec), "--steps", "10", timeout=60)
    assert r.returncode == 2, r.stderr
    assert "--steps" in r.stderr and "Traceback" not in r.stderr
