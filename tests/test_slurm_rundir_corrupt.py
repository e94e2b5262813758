"""Corrupt or wrong-shaped run files: one line naming the file and the problem, exit 2.

A run directory's `jobs.json`, `control.json` and `spec.json` are what `status`, `requeue`,
`cancel`, the control plane and the replica jobs act on. Each file is broken in each way a crash, a
full disk or a hand edit leaves it (missing, empty, truncated, not JSON, the wrong shape, a field of
the wrong type), and every command that reads it must answer with one line and exit 2, never a
traceback and never a half-read record. A command that does not read the file must not be stopped by
it (`cancel` works with a corrupt `control.json`): those cases reach Slurm, which here is an empty
`SLURM_CONF` (exit 3).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fthsdp_cli.main import cli
from slurm.errors import InputError
from slurm.rundir import (
    JobRecord,
    RunRecord,
    check_run_files,
    read_job_ids,
    read_run,
    read_spec_data,
    write_run,
)
from slurm.spec import load_spec

SPECS = Path(__file__).with_name("specs")


def make_run(run: Path) -> None:
    """A valid run directory as submit and the control plane leave it."""
    run.mkdir(parents=True, exist_ok=True)
    spec = load_spec(SPECS / "cpu.toml", [f"job.run_dir={run}"])
    (run / "spec.json").write_text(json.dumps(spec.to_dict()))
    write_run(
        RunRecord(
            "cpu",
            str(run),
            1.0,
            JobRecord("control", "10", "cpu-control", "control.sbatch"),
            (
                JobRecord("replica", "11", "cpu-r00", "replica-00.sbatch", 0),
                JobRecord("replica", "12", "cpu-r01", "replica-01.sbatch", 1),
            ),
        )
    )
    (run / "control.json").write_text(
        json.dumps(
            {
                "coordinator": "http://127.0.0.1:1",
                "lighthouse": "http://127.0.0.1:2",
                "pid": 1,
                "host": "h",
                "started_at": 1.0,
                "job_id": "10",
            }
        )
    )
    (run / "secret").write_text("ab" * 32)
    (run / "secret").chmod(0o600)


def _edit(name: str, change: Callable[[Any], None]) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        path = run / name
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data))

    return apply


def _write(name: str, text: str) -> Callable[[Path], None]:
    return lambda run: (run / name).write_text(text)


def _remove(name: str) -> Callable[[Path], None]:
    return lambda run: (run / name).unlink()


def _set(path: list[Any], value: Any) -> Callable[[Any], None]:
    def change(data: Any) -> None:
        for key in path[:-1]:
            data = data[key]
        data[path[-1]] = value

    return change


#: (file, case) -> how to break it.
BREAKS: dict[tuple[str, str], Callable[[Path], None]] = {
    ("jobs.json", "missing"): _remove("jobs.json"),
    ("jobs.json", "empty"): _write("jobs.json", ""),
    ("jobs.json", "truncated"): _write("jobs.json", '{"name": "cpu", "run_'),
    ("jobs.json", "not json"): _write("jobs.json", "control=10\n"),
    ("jobs.json", "wrong shape"): _write("jobs.json", '["x"]'),
    ("jobs.json", "wrong shape list"): _write("jobs.json", "[]"),
    ("jobs.json", "wrong types"): _edit("jobs.json", _set(["replicas", 0, "job_id"], 11)),
    ("jobs.json", "wrong types replicas"): _edit("jobs.json", _set(["replicas"], "11,12")),
    ("jobs.json", "hostile job id"): _edit("jobs.json", _set(["replicas", 1, "job_id"], "-u")),
    ("control.json", "missing"): _remove("control.json"),
    ("control.json", "empty"): _write("control.json", ""),
    ("control.json", "truncated"): _write("control.json", '{"coordinator": "http://1'),
    ("control.json", "not json"): _write("control.json", "\x00\x01"),
    ("control.json", "wrong shape"): _write("control.json", '["x"]'),
    ("control.json", "wrong types"): _edit("control.json", _set(["coordinator"], 5)),
    ("spec.json", "missing"): _remove("spec.json"),
    ("spec.json", "empty"): _write("spec.json", ""),
    ("spec.json", "truncated"): _write("spec.json", '{"job": {"name": "cpu"'),
    ("spec.json", "not json"): _write("spec.json", "count = 3\n"),
    ("spec.json", "wrong shape"): _write("spec.json", "[]"),
    ("spec.json", "wrong types"): _edit("spec.json", _set(["replicas", "count"], "three")),
    ("spec.json", "wrong types train"): _edit("spec.json", _set(["train", "steps"], [1])),
    ("spec.json", "wrong section"): _edit("spec.json", _set(["train"], 7)),
}

#: Which files each command reads (a broken one is exit 2; a missing optional one is fine).
READS = {
    "status": {"jobs.json", "control.json", "spec.json"},
    "requeue": {"jobs.json", "control.json"},
    "cancel": {"jobs.json"},
}
REQUIRED = {"jobs.json"}


def _args(command: str, run: Path) -> list[str]:
    if command == "requeue":
        return ["requeue", str(run), "--replica", "0"]
    return [command, str(run)]


def _expected(command: str, name: str, case: str) -> int:
    if name not in READS[command]:
        return 3  # not read: the command goes on to Slurm (an empty SLURM_CONF here)
    if case == "missing" and name not in REQUIRED:
        return 3
    return 2


CASES = [(c, f, k) for c in READS for (f, k) in BREAKS]


@pytest.mark.parametrize(("command", "name", "case"), CASES, ids=[" ".join(c) for c in CASES])
def test_command_answers_a_broken_run_file(
    command: str, name: str, case: str, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    make_run(run)
    BREAKS[(name, case)](run)
    empty = tmp_path / "empty.conf"
    empty.write_text("")
    r = CliRunner().invoke(cli, _args(command, run), env={"SLURM_CONF": str(empty)})
    want = _expected(command, name, case)
    assert r.exit_code == want, r.output
    assert isinstance(r.exception, SystemExit), r.exception
    lines = r.output.strip().splitlines()
    assert len(lines) == 1, r.output
    if want == 2:
        assert name in lines[0], lines[0]
    else:
        assert "SLURM_CONF" in lines[0], lines[0]


CONTROL_CASES = [
    (f, k)
    for (f, k) in BREAKS
    if f in ("jobs.json", "spec.json") and (f, k) != ("jobs.json", "missing")
]


@pytest.mark.parametrize(("name", "case"), CONTROL_CASES, ids=[" ".join(c) for c in CONTROL_CASES])
def test_control_plane_refuses_a_broken_run_file(name: str, case: str, tmp_path: Path) -> None:
    """The control job stops at once (exit 2, one line) instead of crash-looping."""
    run = tmp_path / "run"
    make_run(run)
    BREAKS[(name, case)](run)
    r = CliRunner().invoke(
        cli, ["control", "--run-dir", str(run), "--no-lighthouse", "--no-poll", "--bind", "x"]
    )
    assert r.exit_code == 2, r.output
    lines = [line for line in r.output.strip().splitlines() if line.startswith("Error")]
    assert len(lines) == 1 and name in lines[0], r.output


def test_loaders_accept_what_fthsdp_writes(tmp_path: Path) -> None:
    run = tmp_path / "run"
    make_run(run)
    record = check_run_files(run)
    assert record.job_ids == ["10", "11", "12"]
    assert read_job_ids(run) == {0: "11", 1: "12"}
    spec = read_spec_data(run)
    assert spec is not None and spec["replicas"]["count"] == 2
    # The hand-made forms the control plane also takes: job ids by replica, a partial spec.
    (run / "jobs.json").write_text('{"replicas": {"0": "100", "1": "101"}}')
    (run / "spec.json").write_text('{"replicas": {"count": 2}, "train": {"min_replicas": 1}}')
    assert read_job_ids(run) == {0: "100", 1: "101"}
    assert read_spec_data(run) == {"replicas": {"count": 2}, "train": {"min_replicas": 1}}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "empty"),
        ("[1]", "must be an object"),
        ('{"name": "x", "run_dir": "/r", "replicas": [{"role": "replica"}]}', "lacks"),
        (
            '{"name": "x", "run_dir": "/r", "replicas": [{"role": "replica", "job_id": "1", '
            '"job_name": "a", "script": "s", "replica": 0}, {"role": "replica", "job_id": "2", '
            '"job_name": "b", "script": "s", "replica": 0}]}',
            "listed twice",
        ),
        ('{"name": "x", "run_dir": "/r", "control": {"role": "replica"}}', "lacks"),
    ],
)
def test_read_run_names_the_file_and_problem(tmp_path: Path, text: str, problem: str) -> None:
    (tmp_path / "jobs.json").write_text(text)
    with pytest.raises(InputError) as info:
        read_run(tmp_path)
    message = str(info.value)
    assert str(tmp_path / "jobs.json") in message and problem in message
    assert "\n" not in message


REPLICA_CASES = [k for (f, k) in BREAKS if f == "control.json" and k != "missing"]


@pytest.mark.parametrize("case", REPLICA_CASES)
def test_replica_refuses_a_broken_control_file(case: str, tmp_path: Path) -> None:
    """A replica job stops with one line instead of requeuing itself over and over."""
    run = tmp_path / "run"
    make_run(run)
    BREAKS[("control.json", case)](run)
    r = CliRunner().invoke(cli, ["replica", "--run-dir", str(run), "--replica", "0", "true"])
    assert r.exit_code == 2, r.output
    lines = [line for line in r.output.strip().splitlines() if line.startswith("Error")]
    assert len(lines) == 1 and "control.json" in lines[0], r.output
