"""Worker-side timing: compute excludes the cross-replica wait; the slow fault stretches compute."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from runtime.control.straggler.steptiming import (
    SLOW_FACTOR_ENV,
    SLOW_FILE_ENV,
    SlowFault,
    StepTimer,
    parse_factor,
    rank_timing_every,
)


def test_compute_excludes_waiting() -> None:
    timer = StepTimer()
    timer.begin()
    start = time.monotonic()
    with timer.waiting():
        time.sleep(0.05)
    with timer.waiting():
        time.sleep(0.05)
    assert timer.wait_s == pytest.approx(0.1, abs=0.03)
    assert timer.compute_s(start, now=start + 0.25) == pytest.approx(0.15, abs=0.03)
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
