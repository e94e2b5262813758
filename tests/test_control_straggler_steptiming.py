"""Worker-side timing: compute excludes the cross-replica wait; the slow fault stretches compute."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from runtime.control.straggler.steptiming import (
    SLOW_FACTOR_ENV,
    SlowFault,
    StepTimer,
    parse_factor,
    rank_timing_every,
)
from slurm.contract import SLOW_FILE as SLOW_FILE_ENV


def test_compute_excludes_waiting() -> None:
    # No wall-clock tolerance a loaded machine could overrun: each wait is bracketed by the
    # test's own clock readings, so the timer must report at least the slept 0.1 s and at
    # most what the brackets saw, however late the sleeps wake up.
    timer = StepTimer()
    timer.begin()
    start = time.monotonic()
    bracketed = 0.0
    for _ in range(2):
        t0 = time.monotonic()
        with timer.waiting():
            time.sleep(0.05)
        bracketed += time.monotonic() - t0
    assert 0.1 <= timer.wait_s <= bracketed
    # A step that ran 0.15 s past its waits computed for those 0.15 s and what the brackets
    # held beyond the waits themselves.
    end = start + bracketed + 0.15
    assert timer.compute_s(start, now=end) == pytest.approx(bracketed + 0.15 - timer.wait_s)
    assert timer.compute_s(start, now=end) >= 0.15
    timer.begin()
    assert timer.wait_s == 0.0
    assert timer.compute_s(start, now=start) == 0.0  # never negative


@pytest.mark.parametrize(
    ("text", "factor"), [("2", 2.0), ("1.5\n", 1.5), ("slow=3", 3.0), ("1", 1.0)]
)
def test_parse_factor(text: str, factor: float) -> None:
    assert parse_factor(text) == factor


@pytest.mark.parametrize("text", ["0.5", "abc", "", "slow=", "1000"])
def test_parse_factor_refuses_nonsense(text: str) -> None:
    with pytest.raises(ValueError):
        parse_factor(text)


def test_static_factor_from_env() -> None:
    slow = SlowFault.from_env({SLOW_FACTOR_ENV: "2"})
    assert slow.active and slow.factor() == 2.0
    assert slow.delay_s(0.1) == pytest.approx(0.1)
    healthy = SlowFault.from_env({})
    assert not healthy.active and healthy.delay_s(0.1) == 0.0
    with pytest.raises(ValueError):
        SlowFault.from_env({SLOW_FACTOR_ENV: "fast"})


def test_file_factor_is_reread_so_faults_come_and_go(tmp_path: Path) -> None:
    path = tmp_path / "slow"
    slow = SlowFault.from_env({SLOW_FILE_ENV: str(path)})
    assert slow.active
    assert slow.factor(now=0.0) == 1.0  # no file: healthy
    path.write_text("slow=2.5\n")
    assert slow.factor(now=0.5) == 1.0  # cached until reread_s has passed
    assert slow.factor(now=1.0) == 2.5
    path.write_text("garbage")
    assert slow.factor(now=2.0) == 1.0
    path.unlink()
    assert slow.factor(now=3.0) == 1.0


def test_rank_timing_every() -> None:
    assert rank_timing_every({}) == 10
    assert rank_timing_every({"FTHSDP_RANK_TIMING_EVERY": "3"}) == 3
    assert rank_timing_every({"FTHSDP_RANK_TIMING_EVERY": "0"}) == 1
    assert rank_timing_every({"FTHSDP_RANK_TIMING_EVERY": "x"}) == 10
