"""The replica supervisor: a process fault relaunches the step in place, a node fault exits for
the coordinator's requeue, and with no coordinator the job requeues itself."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from control_harness import ControlProcess, action_status, calls, live_run  # noqa: F401

# Fails the first launch with the given code, succeeds on the next one.
STEP = 'echo "$FTHSDP_LAUNCH $FTHSDP_INCARNATION" >> "$1"; [ "$FTHSDP_LAUNCH" != 0 ] || exit "$2"'


def supervise(env: dict[str, str], run_dir: Path, code: int) -> subprocess.CompletedProcess[str]:
    env = dict(env, SLURM_JOB_ID="101", SLURM_RESTART_COUNT="0", SLURM_JOB_NODELIST="node2")
    argv = [sys.executable, "-m", "fthsdp_cli", "replica", "--run-dir", str(run_dir)]
    argv += ["--replica", "1", "--decision-wait", "3", "--requeue-wait", "0.5", "--"]
    argv += ["bash", "-c", STEP, "step", str(run_dir / "launches"), str(code)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.timeout(120)
def test_process_fault_relaunches_in_place(
    live_run: tuple[Path, Path, dict[str, str], ControlProcess],  # noqa: F811
) -> None:
    run_dir, root, env, proc = live_run
    proc.start()
    r = supervise(env, run_dir, 10)
    assert r.returncode == 0, r.stderr
    assert (run_dir / "launches").read_text().splitlines() == ["0 101.0.0", "1 101.0.1"]
    assert calls(root, "scontrol requeue") == []


@pytest.mark.timeout(120)
def test_node_fault_exits_for_the_coordinators_requeue(
    live_run: tuple[Path, Path, dict[str, str], ControlProcess],  # noqa: F811
) -> None:
    run_dir, _, env, proc = live_run
    proc.start()
    r = supervise(env, run_dir, 11)
    assert r.returncode == 75, r.stderr
    assert (run_dir / "launches").read_text().splitlines() == ["0 101.0.0"]
    assert action_status(run_dir, "Requeue", "101") in (["decided"], ["started"], ["done"])


@pytest.mark.timeout(120)
def test_unreachable_coordinator_falls_back_to_self_requeue(
    live_run: tuple[Path, Path, dict[str, str], ControlProcess],  # noqa: F811
) -> None:
    run_dir, root, env, _ = live_run  # the control plane is never started
    r = supervise(env, run_dir, 10)
    assert r.returncode == 75, r.stderr
    assert calls(root, "scontrol requeue") == ["scontrol requeue 101"]
    assert calls(root, "scontrol update JobId=101 StartTime=now")


@pytest.mark.timeout(60)
def test_sigterm_from_slurm_never_requeues(
    live_run: tuple[Path, Path, dict[str, str], ControlProcess],  # noqa: F811
) -> None:
    run_dir, root, env, _ = live_run  # no coordinator: a failure would requeue itself
    env = dict(env, SLURM_JOB_ID="101")
    argv = [sys.executable, "-m", "fthsdp_cli", "replica", "--run-dir", str(run_dir)]
    argv += ["--replica", "1", "--", "sleep", "30"]
    proc = subprocess.Popen(argv, env=env)
    try:
        time.sleep(1.5)  # let it start its step
        proc.send_signal(signal.SIGTERM)  # what scancel does to the batch script
        assert proc.wait(20) == 75
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert calls(root, "scontrol requeue") == []
