"""`runtime.control.keeper`: the control plane restarted in place when its process dies.

The decision is a table; the process tests run a real keeper over a stand-in control plane (a
Python child that starts a grandchild in a session of its own, as the Lighthouse is started).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from runtime.control.keeper import KeeperPolicy, decide, exit_code, how_it_ended

ROOT = Path(__file__).resolve().parent.parent
POLICY = KeeperPolicy(max_restarts=3, window_s=600.0, base_delay_s=1.0, max_delay_s=4.0)


@pytest.mark.parametrize(
    ("returncode", "recent", "expected"),
    [
        (0, 0, ("end", 0.0)),  # every replica finished
        (2, 0, ("end", 0.0)),  # bad input, an unreadable journal: a restart cannot help
        (-9, 0, ("restart", 1.0)),  # SIGKILL
        (-11, 1, ("restart", 2.0)),  # a crash, the second time: backoff doubles
        (1, 2, ("restart", 4.0)),  # a traceback
        (3, 2, ("restart", 4.0)),  # an environment problem (a port, a slow Lighthouse)
        (-9, 3, ("end", 0.0)),  # out of restarts in the window
    ],
)
def test_decide(returncode: int, recent: int, expected: tuple[str, float]) -> None:
    assert decide(returncode, recent, POLICY) == expected


def test_delay_is_capped() -> None:
    big = KeeperPolicy(max_restarts=20, base_delay_s=1.0, max_delay_s=30.0)
    assert decide(-9, 10, big) == ("restart", 30.0)


def test_exit_codes_as_a_shell_reports_them() -> None:
    assert (exit_code(-9), exit_code(0), exit_code(2)) == (137, 0, 2)
    assert how_it_ended(-9) == "killed by SIGKILL" and how_it_ended(3) == "exit 3"


CHILD = """
import os, subprocess, sys, time
from pathlib import Path
from runtime.control.keeper import die_with_parent
die_with_parent()
out = Path(sys.argv[1])
n = len(list(out.glob("child-*")))
grand = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                         start_new_session=True)
(out / f"grand-{n}").write_text(str(grand.pid))
(out / f"child-{n}").write_text(str(os.getpid()))
if (out / f"exit-{n}").exists():
    sys.exit(int((out / f"exit-{n}").read_text()))
time.sleep(600)
"""

KEEPER = """
import sys
from runtime.control.keeper import Keeper, KeeperPolicy
policy = KeeperPolicy(max_restarts=3, base_delay_s=0.1, max_delay_s=0.2)
sys.exit(Keeper([sys.executable, sys.argv[1], sys.argv[2]], policy).run())
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _wait(pred: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def keeper(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", KEEPER, str(child), str(out)],
        env=env,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        yield proc, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for f in out.glob("*-*"):  # nothing outlives the test, whatever failed
            if f.name.startswith(("grand-", "child-")):
                pid = int(f.read_text())
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)


def _pid(out: Path, name: str) -> int:
    _wait(lambda: (out / name).exists(), name)
    _wait(lambda: (out / name).read_text(), name)
    return int((out / name).read_text())


@pytest.mark.timeout(60)
def test_a_killed_control_plane_is_restarted_and_what_it_left_is_stopped(
    keeper: tuple[subprocess.Popen[bytes], Path],
) -> None:
    proc, out = keeper
    first, grand = _pid(out, "child-0"), _pid(out, "grand-0")
    (out / "exit-1").write_text("0")  # the second incarnation finishes the run
    os.kill(first, signal.SIGKILL)
    second = _pid(out, "child-1")
    assert second != first
    _wait(lambda: not _alive(grand), "the old Lighthouse stand-in to stop")
    assert proc.wait(30) == 0
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    assert "ended (killed by SIGKILL); restarting it in 0.1s (restart 1 of 3" in stderr, stderr
    assert not _alive(_pid(out, "grand-1"))


@pytest.mark.timeout(60)
def test_sigterm_ends_the_keeper_with_its_child_and_restarts_nothing(
    keeper: tuple[subprocess.Popen[bytes], Path],
) -> None:
    proc, out = keeper
    child = _pid(out, "child-0")
    proc.send_signal(signal.SIGTERM)  # Slurm cancelling the job
    assert proc.wait(30) == 128 + signal.SIGTERM
    assert not _alive(child) and not (out / "child-1").exists()


@pytest.mark.timeout(60)
def test_the_control_plane_dies_with_its_keeper(
    keeper: tuple[subprocess.Popen[bytes], Path],
) -> None:
    proc, out = keeper
    child = _pid(out, "child-0")
    proc.kill()
    proc.wait(10)
    _wait(lambda: not _alive(child), "the control plane to die with its keeper")


@pytest.mark.timeout(60)
def test_out_of_restarts_ends_with_the_last_exit(tmp_path: Path) -> None:
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    out = tmp_path / "out"
    out.mkdir()
    for n in range(4):
        (out / f"exit-{n}").write_text("3")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", KEEPER, str(child), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == 3, done.stderr
    assert len(list(out.glob("child-*"))) == 4
    assert "after 3 restarts in 600s; not restarting it again" in done.stderr
    for f in out.glob("grand-*"):
        assert not _alive(int(f.read_text()))
