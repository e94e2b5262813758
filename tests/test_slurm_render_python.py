"""`[control].python`: a path puts its installation first on every script's PATH."""

from __future__ import annotations

from pathlib import Path

from slurm.render import python_bin, render_run
from slurm.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent


def test_a_path_puts_its_folder_first_on_path() -> None:
    spec = load_spec(ROOT / "examples" / "torchft.toml", ["control.python=/opt/fthsdp/bin/python"])
    for script in render_run(spec):
        assert 'export PATH=/opt/fthsdp/bin:"$PATH"\n' in script.text, script.filename
        assert "/opt/fthsdp/bin/python -m fthsdp_cli" in script.text


def test_a_bare_name_leaves_path_alone() -> None:
    assert python_bin("python") is None
    spec = load_spec(ROOT / "examples" / "torchft.toml")
    assert all("export PATH=" not in s.text for s in render_run(spec))
