"""A run directory someone else controls is refused at submit, at a local run and when the
control plane or a supervisor starts (one line, exit 2), and a run file that is not the user's
own, or that others could rewrite, is refused before anything acts on it.

The owners are real: root runs these tests and gives folders and files to `nobody` with chown.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from submit_harness import RecordingBackend

from fthsdp_cli.main import cli
from runtime.control.supervisor.control_plane import control_plane_problem, coordinator_url
from slurm.errors import InputError
from slurm.rundir import (
    PoolFileError,
    RunFileError,
    check_run_dir,
    create_secret,
    read_control,
    read_pool,
    read_run,
    read_secret,
    read_spec_data,
    write_control_file,
)
from slurm.spec import load_spec
from slurm.submit import submit_run

SPECS = Path(__file__).with_name("specs")
NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="gives folders to nobody: needs root")


def _folder(path: Path, mode: int, uid: int | None = None) -> Path:
    path.mkdir(exist_ok=True)
    os.chmod(path, mode)
    if uid is not None:
        os.chown(path, uid, uid)
    return path


@pytest.mark.parametrize(
    ("layout", "problem"),
    [
        # (the parent folder's mode and owner, the run folder's; None: not made yet)
        (((0o755, None), (0o777, NOBODY)), "run is owned by uid 65534, not by this user"),
        (((0o755, None), (0o700, NOBODY)), "run is owned by uid 65534"),
        (((0o755, None), (0o777, None)), "run is writable by group or others (mode 0777)"),
        (((0o755, None), (0o770, None)), "run is writable by group or others (mode 0770)"),
        (((0o777, None), (0o700, None)), "up is writable by group or others (mode 0777)"),
        (((0o777, None), None), "up is writable by group or others"),
        (((0o755, NOBODY), (0o700, None)), "up is owned by uid 65534, neither root nor this user"),
        (((0o1777, NOBODY), (0o700, None)), "up is owned by uid 65534"),
        (((0o755, None), (0o700, None)), None),
        (((0o755, None), (0o755, None)), None),
        (((0o1777, None), (0o700, None)), None),  # like /tmp
        (((0o1777, None), None), None),
    ],
    ids=["nobody-0777", "nobody-0700", "mine-0777", "group-writable", "parent-0777",
         "parent-0777-not-made", "parent-nobody", "sticky-parent-nobody", "private", "0755",
         "sticky-parent", "sticky-parent-not-made"],
)  # fmt: skip
def test_a_run_dir_someone_else_controls_is_refused(
    tmp_path: Path, layout: tuple[tuple[int, int | None], tuple[int, int | None] | None],
    problem: str | None,
) -> None:  # fmt: skip
    up = _folder(tmp_path / "up", layout[0][0], layout[0][1])
    run = up / "run"
    if layout[1] is not None:
        _folder(run, *layout[1])
    if problem is None:
        check_run_dir(run)
        return
    with pytest.raises(InputError, match="RUN_DIR") as caught:
        check_run_dir(run)
    assert problem in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_link_to_a_private_run_dir_is_judged_by_its_target(tmp_path: Path) -> None:
    run = _folder(tmp_path / "run", 0o700)
    (tmp_path / "link").symlink_to(run)
    check_run_dir(tmp_path / "link")
    os.chown(run, NOBODY, NOBODY)
    with pytest.raises(InputError, match="owned by uid 65534"):
        check_run_dir(tmp_path / "link")


@pytest.fixture
def nobodys_run(tmp_path: Path) -> Path:
    """`nobody` made the run folder, mode 0777, and the user is about to use it."""
    return _folder(tmp_path / "run", 0o777, NOBODY)


def test_submit_into_nobodys_folder_is_refused(nobodys_run: Path) -> None:
    spec = load_spec(SPECS / "cpu.toml", [f"job.run_dir={nobodys_run}"])
    backend = RecordingBackend()
    with pytest.raises(InputError, match=r"job\.run_dir") as caught:
        submit_run(spec, backend)
    assert "owned by uid 65534" in str(caught.value)
    assert backend.submitted == []
    assert list(nobodys_run.iterdir()) == []  # not a file written into it


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SLURM_CONF="")
    return subprocess.run(
        [sys.executable, "-m", "fthsdp_cli", *args],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "argv",
    [
        ["submit", str(SPECS / "cpu.toml"), "--set", "job.run_dir={run}"],
        ["control", "--run-dir", "{run}", "--bind", "127.0.0.1", "--no-lighthouse"],
        ["replica", "--run-dir", "{run}", "--replica", "0", "--", "true"],
        ["run", str(SPECS / "cpu.toml"), "--local", "--run-dir", "{run}", "--steps", "1"],
        ["status", "{run}"],
    ],
    ids=["submit", "control", "replica", "run", "status"],
)
def test_commands_refuse_nobodys_folder_in_one_line(nobodys_run: Path, argv: list[str]) -> None:
    r = _cli(*[a.format(run=nobodys_run) for a in argv])
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "owned by uid 65534" in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def _private_run(tmp_path: Path) -> Path:
    run = _folder(tmp_path / "run", 0o700)
    spec = load_spec(SPECS / "cpu.toml", [f"job.run_dir={run}"])
    submit_run(spec, RecordingBackend())
    write_control_file(run, {"coordinator": "http://127.0.0.1:9", "lighthouse": None})
    return run


READERS: dict[str, Callable[[Path], Any]] = {
    "control.json": read_control,
    "jobs.json": read_run,
    "spec.json": read_spec_data,
    "secret": lambda run: read_secret(run / "secret"),
}


@pytest.mark.parametrize("name", sorted(READERS))
@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda p: os.chown(p, NOBODY, NOBODY), "owned by uid 65534, not by this user"),
        (lambda p: os.chmod(p, 0o666), "has mode 0666"),
        (lambda p: os.chmod(p, 0o620), "has mode 0620"),
    ],
    ids=["another-uid", "world-writable", "group-writable"],
)
def test_a_run_file_not_the_users_own_is_refused(
    tmp_path: Path, name: str, change: Callable[[Path], None], problem: str
) -> None:
    run = _private_run(tmp_path)
    READERS[name](run)  # trusted as written
    change(run / name)
    with pytest.raises(RunFileError, match=problem) as caught:
        READERS[name](run)
    assert str(run / name) in str(caught.value)


def test_a_readable_secret_is_refused(tmp_path: Path) -> None:
    run = _private_run(tmp_path)
    os.chmod(run / "secret", 0o640)
    with pytest.raises(RunFileError, match="has mode 0640; it must be 0600"):
        read_secret(run / "secret")
    os.chmod(run / "spec.json", 0o644)  # others may read the spec, just not write it
    read_spec_data(run)


def test_spares_json_of_another_uid_is_refused(tmp_path: Path) -> None:
    run = _folder(tmp_path / "run", 0o700)
    (run / "spares.json").write_text("{}")
    os.chown(run / "spares.json", NOBODY, NOBODY)
    with pytest.raises(PoolFileError, match="owned by uid 65534"):
        read_pool(run)


def test_a_fifo_in_place_of_a_run_file_is_refused_without_blocking(tmp_path: Path) -> None:
    run = _folder(tmp_path / "run", 0o700)
    os.mkfifo(run / "control.json", 0o600)
    t0 = time.monotonic()
    with pytest.raises(RunFileError, match="not a plain file"):
        read_control(run)
    assert time.monotonic() - t0 < 5


def test_a_supervisor_ignores_a_control_json_another_uid_wrote(tmp_path: Path) -> None:
    # A control.json of another owner names no coordinator: the supervisor waits, and after a
    # failed step requeues itself rather than asking whoever it names.
    run = _private_run(tmp_path)
    assert coordinator_url(run) == "http://127.0.0.1:9"
    os.chown(run / "control.json", NOBODY, NOBODY)
    assert coordinator_url(run) is None
    problem = control_plane_problem(run)
    assert problem is not None and "owned by uid 65534" in problem
    r = CliRunner().invoke(cli, ["replica", "--run-dir", str(run), "--replica", "0", "--", "true"])
    assert r.exit_code == 2 and "owned by uid 65534" in r.output


def test_a_private_secret_round_trips(tmp_path: Path) -> None:
    path = _folder(tmp_path / "run", 0o700) / "secret"
    made = create_secret(path)
    assert read_secret(path) == made
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
