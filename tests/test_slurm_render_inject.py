"""Hostile values render inert: the rendered script, run by bash, executes none of them.

Names cannot carry shell syntax at all (validation refuses them); free text (env values, the
train and helper commands) is shlex-quoted, so the script hands it on as data. srun is replaced by
a PATH shim that records its arguments, so the test sees exactly what the trainer would receive.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from render_harness import run_body, srun_calls

from slurm.errors import InputError
from slurm.render import render_run, write_scripts
from slurm.spec import parse_spec

HOSTILE = [
    "$(touch {d}/pwned-subst)",
    "`touch {d}/pwned-backtick`",
    "x; touch {d}/pwned-semicolon",
    "x' ; touch {d}/pwned-squote ; echo '",
    'x" ; touch {d}/pwned-dquote ; echo "',
    "line1\ntouch {d}/pwned-newline\n",
    "${{IFS}}touch${{IFS}}{d}/pwned-ifs",
    "a && touch {d}/pwned-and || touch {d}/pwned-or",
    "\\'$(touch {d}/pwned-escape)",
    "$'\\x74ouch' {d}/pwned-ansi",
    "cr\r; touch {d}/pwned-cr\r",
]


def hostile_spec(tmp_path: Path, helper: bool) -> tuple[Any, dict[str, str]]:
    d = str(tmp_path)
    values = {f"EVIL{k}": v.format(d=d) for k, v in enumerate(HOSTILE)}
    data: dict[str, Any] = {
        "job": {"name": "inj", "run_dir": str(tmp_path / "run"), "env": values},
        "replicas": {"count": 2, "tasks_per_node": 2},
        "train": {"command": f"echo train; touch {d}/pwned-train-ran-in-body"},
    }
    if helper:
        data["replicas"]["helper"] = {"command": f"touch {d}/pwned-helper-ran-in-body"}
    return parse_spec(data), values


@pytest.mark.timeout(60)
@pytest.mark.parametrize("helper", [False, True])
def test_hostile_env_and_commands_render_inert(tmp_path: Path, helper: bool) -> None:
    spec, values = hostile_spec(tmp_path, helper)
    paths = write_scripts(render_run(spec, [1], control=False), tmp_path / "scripts")
    # The trainer srun runs under `python -m fthsdp_cli replica ... -- srun ...`; the harness's
    # python stub records the supervisor's argv and runs the srun after `--`.
    r = run_body(paths[0], tmp_path, dump=[*values, "FTHSDP_REPLICA_ID", "FTHSDP_RUN_DIR"])
    assert r.returncode == 0, r.stderr
    pwned = sorted(p.name for p in tmp_path.glob("pwned*"))
    assert pwned == [], f"injected commands ran: {pwned}"
    calls = srun_calls(tmp_path)
    trainer = [c for c in calls if spec.train.command in c[0]]
    assert len(trainer) == 1
    argv, env = trainer[0]
    # Each value reached the job environment byte for byte.
    for name, value in values.items():
        assert env[name] == value, name
    assert env["FTHSDP_REPLICA_ID"] == "1"
    assert env["FTHSDP_RUN_DIR"] == str(tmp_path / "run")
    supervisor = (tmp_path / "py-args").read_text().split("\0")[:6]
    assert supervisor == [
        "-m",
        "fthsdp_cli",
        "replica",
        "--run-dir",
        str(tmp_path / "run"),
        "--replica",
    ]
    # The command reaches srun as one argument after `bash -c`, untouched.
    assert argv[argv.index(spec.train.command) - 1] == "-c"
    if helper:
        # The helper srun is backgrounded and killed when training ends; if it got to run,
        # it too received its command as one argument.
        for argv, _ in calls:
            if argv[0] == "--het-group=1":
                assert argv[-2:] == ["-c", spec.replicas.helper.command]


@pytest.mark.timeout(60)
def test_hostile_values_inert_in_control_script(tmp_path: Path) -> None:
    spec, values = hostile_spec(tmp_path, helper=False)
    (path,) = write_scripts(render_run(spec, []), tmp_path / "scripts")
    # The control body ends by exec'ing python; stub it like srun.
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "python").write_text('#!/bin/bash\nprintf "%s\\0" "$@" > "$FTHSDP_TEST_OUT/py-args"\n')
    (shim / "python").chmod(0o755)
    r = run_body(path, tmp_path, dump=list(values))
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.glob("pwned*")) == []
    assert (tmp_path / "py-args").read_text().split("\0")[:-1] == [
        "-m",
        "fthsdp_cli",
        "control",
        "--run-dir",
        str(tmp_path / "run"),
        "--lighthouse-port",
        "0",
        "--coordinator-port",
        "0",
        "--restart-in-place",
    ]


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("job", "name", "x$(id)"),
        ("job", "name", "x`id`"),
        ("job", "name", "x;id"),
        ("job", "name", "x\nid"),
        ("job", "name", "x'y"),
        ("job", "run_dir", "/tmp/$(id)"),
        ("job", "run_dir", "/tmp/a\nb"),
        ("job", "partition", "gpu;id"),
        ("job", "account", 'a"b'),
        ("replicas", "constraint", "a`id`"),
        ("replicas", "mem", "1G;id"),
        ("replicas", "exclude", "node$(id)"),
    ],
)
def test_shell_syntax_in_names_is_refused(section: str, key: str, value: str) -> None:
    data: dict[str, Any] = {
        "job": {"name": "ok", "run_dir": "/r"},
        "replicas": {"count": 1},
        "train": {"command": "x"},
    }
    data[section][key] = value
    with pytest.raises(InputError) as info:
        parse_spec(data)
    assert info.value.field == f"{section}.{key}"
