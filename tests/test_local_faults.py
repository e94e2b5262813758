"""The local fault injector's kills at chosen steps: each one once, in order, only when due."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import runtime.local.faults as faults_module
from runtime.local.config import LaunchConfig
from runtime.local.faults import FaultInjector
from runtime.local.replicas import LocalReplica


def replicas(n: int) -> list[LocalReplica]:
    # no processes: healthy_others() asks only the ones a replica has
    return [LocalReplica(r, state="training", last_commit_t=time.time()) for r in range(n)]


def injector(tmp_path: Path, **faults: object) -> tuple[FaultInjector, list[tuple[int, int]]]:
    cfg = LaunchConfig(run_dir=tmp_path, command=["true"], replicas=3, **faults)  # type: ignore[arg-type]
    killed: list[tuple[int, int]] = []

    def inject(rs: LocalReplica, kind: str) -> None:
        assert kind == "injected"
        killed.append((rs.replica, rs.step))
        rs.state = "dead"

    return FaultInjector(cfg, inject), killed


def advance(rs: list[LocalReplica], step: int) -> None:
    for r in rs:
        if r.state == "training":
            r.step, r.last_commit_t = step, time.time()


def test_schedule_kills_each_once_at_its_step(tmp_path: Path) -> None:
    faults, killed = injector(tmp_path, kill_schedule=((1, 5), (0, 10), (2, 12)))
    rs = replicas(3)
    for step in range(20):
        advance(rs, step)
        faults.tick(rs, run_ending=False)
        for r in rs:
            r.state = "training"  # restarted at once
    assert killed == [(1, 5), (0, 10), (2, 12)]
    assert faults.pending_kills == []


def test_kill_waits_while_the_victim_is_out_and_fires_when_it_trains(tmp_path: Path) -> None:
    faults, killed = injector(tmp_path, kill_schedule=((1, 3), (1, 6)))
    rs = replicas(3)
    for step in range(10):
        advance(rs, step)
        faults.tick(rs, run_ending=False)
    assert killed == [(1, 3)]  # replica 1 stayed dead: its second kill is not due yet
    rs[1].state, rs[1].step, rs[1].last_commit_t = "training", 10, time.time()
    faults.tick(rs, run_ending=False)
    assert killed == [(1, 3), (1, 10)]


def test_no_kill_without_a_healthy_other(tmp_path: Path) -> None:
    faults, killed = injector(tmp_path, kill_schedule=((0, 2),))
    rs = replicas(3)
    rs[1].state = rs[2].state = "starting"
    advance(rs, 5)
    faults.tick(rs, run_ending=False)
    assert killed == []
    rs[2].state, rs[2].last_commit_t = "training", time.time()
    faults.tick(rs, run_ending=False)
    assert killed == [(0, 5)]


def test_single_kill_and_schedule_together(tmp_path: Path) -> None:
    faults, killed = injector(tmp_path, kill_replica=2, kill_at_step=4, kill_schedule=((0, 8),))
    rs = replicas(3)
    for step in range(12):
        advance(rs, step)
        faults.tick(rs, run_ending=False)
        for r in rs:
            r.state = "training"
    assert killed == [(2, 4), (0, 8)]


def test_jittered_kills_land_inside_the_step_at_seeded_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a jitter, a due kill waits a delay drawn from the seed in [0, jitter), then lands
    once, the listed kills in their order; the same seed draws the same delays."""
    clock = [100.0]
    monkeypatch.setattr(faults_module.time, "monotonic", lambda: clock[0])
    delays: list[list[float]] = []
    for _ in range(2):
        faults, killed = injector(tmp_path, kill_schedule=((1, 2), (2, 4)), kill_jitter_s=0.5)
        rs = replicas(3)
        advance(rs, 4)  # both kills are due from now on
        landed: list[float] = []
        start = clock[0]
        for _ in range(150):
            before = len(killed)
            faults.tick(rs, run_ending=False)
            if len(killed) > before:  # the next one's delay counts from here
                landed.append(round(clock[0] - start, 6))
                start = clock[0]
            for r in rs:
                r.state = "training"
            clock[0] += 0.01
        assert [r for r, _ in killed] == [1, 2] and faults.pending_kills == []
        assert all(0 <= d < 0.5 + 0.01 for d in landed), landed
        delays.append(landed)
    assert delays[0] == delays[1]
