"""The warm slot's agent without Slurm: a warm step whose node fails its check before any
replica is assigned fails the slot (the pool replaces it), one that crashes otherwise leaves the
slot waiting cold, a slot the pool dropped stops its waiting step, and stale handoff files of an
earlier start of the slot job are gone before the step starts."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from runtime.control.spares import main, warm_agent
from runtime.warm_handoff import Handoff, handoff_path, ready_path, write_handoff
from slurm.rundir import Pool, Slot, write_pool


def _run_dir(tmp_path: Path, *slots: str) -> Path:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    write_pool(run, Pool(1, tuple(Slot(s) for s in slots)))
    return run


@pytest.mark.timeout(60)
def test_a_warm_step_that_dies_unassigned_fails_the_slot(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    run = _run_dir(tmp_path, "77")
    handoff = handoff_path(run, "77")
    write_handoff(handoff, Handoff(0, 0, "old.0.0"))  # an earlier start of this slot job
    ready_path(handoff).write_text("{}")
    step = "import os, sys; print('warming', os.path.exists(sys.argv[1])); sys.exit(11)"
    code = warm_agent(run, "77", [sys.executable, "-c", step, str(handoff)], poll_s=0.01)
    assert code == 1
    out, err = capfd.readouterr()
    assert "warming False" in out  # its output came through, and no stale handoff was there
    assert "the warm step ended (11) before a replica came: leaving" in err
    assert "the node failed its check: the pool replaces this slot" in err
    assert not ready_path(handoff).exists()


@pytest.mark.timeout(60)
def test_a_warm_step_that_crashes_leaves_the_slot_waiting_cold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    import runtime.control.spares as spares

    run = _run_dir(tmp_path, "77")
    cold: list[str] = []

    def waits_cold(run_dir: Path, job_id: str, **_: float) -> int:
        cold.append(job_id)
        return 7

    monkeypatch.setattr(spares, "agent", waits_cold)
    code = warm_agent(run, "77", [sys.executable, "-c", "raise SystemExit(3)"], poll_s=0.01)
    assert (code, cold) == (7, ["77"])
    assert "this slot waits cold from now on" in capfd.readouterr().err


@pytest.mark.timeout(60)
def test_a_slot_the_pool_dropped_stops_its_waiting_step(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    run = _run_dir(tmp_path, "78")
    started = time.monotonic()
    code = warm_agent(
        run, "77", [sys.executable, "-c", "import time; time.sleep(120)"], poll_s=0.01,
        unlisted_grace_s=0.2,
    )  # fmt: skip
    assert code == 0 and time.monotonic() - started < 30
    assert "job 77 is not in the pool: leaving" in capfd.readouterr().err


def test_warm_goes_with_a_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                  capfd: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    assert main(["agent", "--run-dir", str(tmp_path), "--warm"]) == 2
    assert main(["agent", "--run-dir", str(tmp_path), "--", "srun", "x"]) == 2
    assert "--warm goes with the step's command" in capfd.readouterr().err
