"""`[train] mode = "torchft"`: the spec's checks, the rendered script (golden), hostile values.

Regenerate the golden files after an intended change with
`FTHSDP_UPDATE_GOLDEN=1 pytest tests/test_slurm_render_foreign.py` and read the diff.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from render_harness import run_body, srun_calls

from slurm.errors import InputError
from slurm.render import foreign_env, render_run, write_scripts
from slurm.spec import load_spec, parse_spec

ROOT = Path(__file__).resolve().parent.parent
SPECS = Path(__file__).with_name("specs")
GOLDEN = Path(__file__).with_name("golden")
TORCHTITAN = ROOT / "examples" / "torchtitan" / "torchtitan.toml"


def _spec(**train: Any) -> Any:
    data: dict[str, Any] = {
        "job": {"name": "byo", "run_dir": "/tmp/byo-run"},
        "replicas": {"count": 2, "tasks_per_node": 1},
        "train": {"command": "python t.py", **train},
    }
    return parse_spec(data)


@pytest.mark.parametrize("case", ["torchft"])
def test_torchft_scripts_match_golden(case: str) -> None:
    scripts = render_run(load_spec(SPECS / f"{case}.toml"))
    folder = GOLDEN / case
    if os.environ.get("FTHSDP_UPDATE_GOLDEN"):
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("*.sbatch"):
            old.unlink()
        for s in scripts:
            (folder / s.filename).write_text(s.text)
    assert sorted(s.filename for s in scripts) == sorted(p.name for p in folder.glob("*.sbatch"))
    for s in scripts:
        assert s.text == (folder / s.filename).read_text(), f"{case}/{s.filename} changed"
        r = subprocess.run(["bash", "-n"], input=s.text, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


def test_native_mode_is_the_default_and_renders_nothing_foreign() -> None:
    spec = _spec()
    assert spec.train.mode == "fthsdp"
    text = render_run(spec, [0], control=False)[0].text
    assert "TORCHFT_" not in text and "REPLICA_GROUP_ID" not in text and "--label" not in text


def test_torchft_replica_lines() -> None:
    spec = _spec(mode="torchft", progress_file="{dump_dir}/progress.jsonl")
    lines = render_run(spec, [1], control=False)[0].text.splitlines()
    for line in [
        "export FTHSDP_TRAIN_MODE=torchft",
        "export REPLICA_GROUP_ID=1",
        "export NUM_REPLICA_GROUPS=2",
        "export FTHSDP_NUM_REPLICA_GROUPS=2",
        "export FTHSDP_DUMP_DIR=/tmp/byo-run/dump/replica-01",
        "export FTHSDP_PROGRESS_FILE='{dump_dir}/progress.jsonl'",
        "export TORCHFT_QUORUM_TIMEOUT_SEC=10",
    ]:
        assert line in lines, line
    (trainer,) = [line for line in lines if " -m fthsdp_cli replica " in line]
    assert " -- srun " in trainer and " --label bash -c " in trainer


@pytest.mark.parametrize(
    ("train", "field", "allowed"),
    [
        ({"mode": "pytorch"}, "train.mode", "one of fthsdp, torchft"),
        ({"mode": "torchft"}, "train.progress_regex", "exactly one of"),
        (
            {"mode": "torchft", "progress_regex": "s(?P<step>\\d+)", "progress_file": "p.jsonl"},
            "train.progress_regex",
            "exactly one of",
        ),
        ({"mode": "torchft", "progress_regex": "step: (\\d+"}, "train.progress_regex", "regex"),
        ({"mode": "torchft", "progress_regex": "step: (\\d+)"}, "train.progress_regex", "step"),
        ({"mode": "torchft", "progress_regex": "a\n(?P<step>1)"}, "train.progress_regex", "LF"),
        ({"progress_regex": "(?P<step>\\d+)"}, "train.progress_regex", 'mode = "torchft"'),
        ({"progress_file": "p.jsonl"}, "train.progress_file", 'mode = "torchft"'),
        ({"mode": "torchft", "progress_file": "{home}/p"}, "train.progress_file", "{dump_dir}"),
        ({"mode": "torchft", "progress_file": "{dump_dir"}, "train.progress_file", "a path"),
        ({"mode": "torchft", "progress_file": " "}, "train.progress_file", "one-line"),
        ({"progress_timeout_s": 900}, "train.progress_timeout_s", 'mode = "torchft"'),
        (
            {"mode": "torchft", "progress_regex": "s(?P<step>\\d+)", "progress_timeout_s": 30},
            "train.progress_timeout_s",
            "0 (off) or seconds above train.join_timeout_s=60",
        ),
        (
            {"mode": "torchft", "progress_regex": "s(?P<step>\\d+)", "progress_timeout_s": -1},
            "train.progress_timeout_s",
            "0 (off)",
        ),
        (
            {
                "mode": "torchft",
                "progress_regex": "s(?P<step>\\d+)",
                "progress_timeout_s": float("inf"),
            },
            "train.progress_timeout_s",
            "0 (off)",
        ),
    ],
)
def test_bad_torchft_fields_name_field_and_allowed(
    train: dict[str, Any], field: str, allowed: str
) -> None:
    with pytest.raises(InputError) as err:
        _spec(**train)
    assert err.value.field == field
    assert allowed in err.value.allowed


def test_bad_regex_through_the_cli_is_one_line_and_exit_2(tmp_path: Path) -> None:
    spec = tmp_path / "bad.toml"
    spec.write_text(
        '[job]\nname = "b"\nrun_dir = "r"\n[replicas]\ncount = 1\ntasks_per_node = 1\n'
        '[train]\ncommand = "x"\nmode = "torchft"\nprogress_regex = "step (\\\\d+)"\n'
    )
    r = subprocess.run(
        [sys.executable, "-m", "fthsdp_cli", "render", str(spec)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    assert "train.progress_regex" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


HOSTILE_REGEX = "step: (?P<step>\\d+)$(touch {d}/pwned-regex)`touch {d}/pwned-tick`'\"; x"
HOSTILE_FILE = "{{dump_dir}}/$(touch {d}/pwned-file)'; touch {d}/pwned-q;'.jsonl"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("source", ["progress_regex", "progress_file"])
def test_hostile_progress_values_render_inert(tmp_path: Path, source: str) -> None:
    d = str(tmp_path)
    value = (HOSTILE_REGEX if source == "progress_regex" else HOSTILE_FILE).format(d=d)
    data: dict[str, Any] = {
        "job": {"name": "inj", "run_dir": str(tmp_path / "run")},
        "replicas": {"count": 2, "tasks_per_node": 2},
        "train": {"command": "echo train", "mode": "torchft", source: value},
    }
    spec = parse_spec(data)
    paths = write_scripts(render_run(spec, [1], control=False), tmp_path / "scripts")
    var = "FTHSDP_PROGRESS_REGEX" if source == "progress_regex" else "FTHSDP_PROGRESS_FILE"
    r = run_body(paths[0], tmp_path, dump=[var, "REPLICA_GROUP_ID", "FTHSDP_TRAIN_MODE"])
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.glob("pwned*")) == []
    ((argv, env),) = srun_calls(tmp_path)
    assert env[var] == value  # byte for byte
    assert env["REPLICA_GROUP_ID"] == "1" and env["FTHSDP_TRAIN_MODE"] == "torchft"
    assert "--label" in argv and argv[argv.index("echo train") - 1] == "-c"


def test_torchtitan_recipe_renders_in_dry_run() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "fthsdp_cli", "render", str(TORCHTITAN)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "# ==> replica-01.sbatch <==" in r.stdout
    assert "--module torchft.llama3 --config llama3_torchft_debugmodel" in r.stdout
    assert "--fault_tolerance.replica_id=$REPLICA_GROUP_ID" in r.stdout
    assert "--fault_tolerance.group_size=$NUM_REPLICA_GROUPS" in r.stdout
    assert "--rdzv_endpoint=$FTHSDP_RDZV_ENDPOINT" in r.stdout
    assert "export FTHSDP_TRAIN_MODE=torchft" in r.stdout


@pytest.mark.parametrize(
    ("train", "hung_after_s"),
    [
        ({}, 0.0),  # native mode: the worker reports itself and the coordinator sees silence
        ({"mode": "torchft", "progress_regex": "s(?P<step>\\d+)"}, 600.0),
        ({"mode": "torchft", "progress_regex": "s(?P<step>\\d+)", "join_timeout_s": 900}, 1800.0),
        ({"mode": "torchft", "progress_regex": "s(?P<step>\\d+)", "progress_timeout_s": 0}, 0.0),
        ({"mode": "torchft", "progress_regex": "s(?P<step>\\d+)", "progress_timeout_s": 90}, 90.0),
    ],
)
def test_progress_timeout_in_effect(train: dict[str, Any], hung_after_s: float) -> None:
    spec = _spec(**train)
    assert spec.train.hung_after_s == hung_after_s
    if spec.train.mode == "torchft":
        env = dict(foreign_env(spec, 0))
        assert float(env["FTHSDP_PROGRESS_TIMEOUT_S"]) == hung_after_s
