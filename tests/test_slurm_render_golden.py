"""Golden files pin the rendered scripts: a template change shows up as a diff in review.

Regenerate after an intended change with
`FTHSDP_UPDATE_GOLDEN=1 pytest tests/test_slurm_render_golden.py` and read the diff.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm.render import render_run
from slurm.spec import load_spec

SPECS = Path(__file__).with_name("specs")
GOLDEN = Path(__file__).with_name("golden")
CASES = ["basic", "helper", "cpu", "block"]


@pytest.mark.parametrize("case", CASES)
def test_rendered_scripts_match_golden(case: str) -> None:
    scripts = render_run(load_spec(SPECS / f"{case}.toml"))
    folder = GOLDEN / case
    if os.environ.get("FTHSDP_UPDATE_GOLDEN"):
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("*.sbatch"):
            old.unlink()
        for s in scripts:
            (folder / s.filename).write_text(s.text)
    expected = sorted(p.name for p in folder.glob("*.sbatch"))
    assert sorted(s.filename for s in scripts) == expected
    for s in scripts:
        assert s.text == (folder / s.filename).read_text(), f"{case}/{s.filename} changed"


@pytest.mark.parametrize("case", CASES)
def test_golden_scripts_pass_bash_n(case: str) -> None:
    for path in sorted((GOLDEN / case).glob("*.sbatch")):
        r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
        assert r.returncode == 0, f"{path.name}: {r.stderr}"


def test_replica_job_lines() -> None:
    spec = load_spec(SPECS / "basic.toml")
    text = render_run(spec, [3], control=False)[0].text
    for line in [
        "#SBATCH --job-name=llama-ft-r03",
        "#SBATCH --requeue",
        "#SBATCH --dependency=singleton",
        "#SBATCH --output=/shared/runs/llama-ft/logs/replica-03-%j.out",
        "#SBATCH --gres=gpu:h100:8",
        "#SBATCH --switches=1@00:10:00",
        "#SBATCH --exclusive",
        "#SBATCH --comment=fthsdp-health:gpu-count,ecc,xid",
        "export FTHSDP_REPLICA_ID=3",
        "export FTHSDP_CONTROL_FILE=/shared/runs/llama-ft/control.json",
        "export HF_HOME='/shared/hf cache'",
    ]:
        assert line in text.splitlines(), line
    assert "hetjob" not in text and "--het-group" not in text


def test_helper_makes_a_het_job_with_per_replica_constraint() -> None:
    spec = load_spec(SPECS / "helper.toml")
    for k, constraint in enumerate(["bldg_a", "bldg_b", "'bldg_a|bldg_c'"]):
        lines = render_run(spec, [k], control=False)[0].text.splitlines()
        het = lines.index("#SBATCH hetjob")
        assert f"#SBATCH --constraint={constraint}" in lines[:het]
        assert "#SBATCH --partition=cpu" in lines[het:]
        assert "#SBATCH --gres=gpu:4" in lines[:het]
        srun = [line for line in lines if line.startswith("srun ")]
        assert srun[0].startswith("srun --het-group=1 ") and srun[0].endswith("&")
        # The trainer's srun runs under the replica supervisor (`fthsdp replica ... -- srun`).
        trainer = [line for line in lines if " -m fthsdp_cli replica " in line]
        assert len(trainer) == 1 and " -- srun --het-group=0 " in trainer[0]


def test_replica_ids_are_zero_padded_to_the_count() -> None:
    spec = load_spec(SPECS / "cpu.toml", ["replicas.count=1000"])
    last = render_run(spec, [999], control=False)[0]
    assert last.filename == "replica-999.sbatch"
    assert last.job_name == "cpu-r999"
    assert render_run(spec, [7], control=False)[0].filename == "replica-007.sbatch"


def test_render_and_submit_paths_import_no_torch() -> None:
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from fthsdp_cli.main import cli\n"
        f"r = CliRunner().invoke(cli, ['render', {str(SPECS / 'helper.toml')!r}])\n"
        "assert r.exit_code == 0, r.output\n"
        "import slurm.submit, slurm.backend, slurm.rundir, runtime.protocol\n"
        "import fthsdp_cli.commands.status\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    root = Path(__file__).resolve().parent.parent
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
        check=False,
    )
    assert r.returncode == 0, r.stderr
