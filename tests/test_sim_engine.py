"""The Monte Carlo model: the paper's headline figures from components, degenerate cases, and the
state transitions of one failure (tables over `_Lockstep._hit`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from runtime.sim.engine import ModeRuns, _Lockstep, compare, simulate_mode
from runtime.sim.params import PRESETS, SimParams

PAPER = PRESETS["paper-100k"].with_changes(runs=20)


@pytest.fixture(scope="module")
def paper() -> dict[str, Any]:
    return compare(PAPER)[0].record(PAPER)


def test_paper_preset_reproduces_headline_ettr(paper: dict[str, Any]) -> None:
    assert 0.40 <= paper["sync"]["ettr"] <= 0.48  # paper: 44 %
    assert 0.76 <= paper["fthsdp"]["ettr"] <= 0.84  # paper: 80 %


def test_paper_preset_stall_per_failure(paper: dict[str, Any]) -> None:
    sync_stall = paper["sync"]["stall_s_mean"]
    ft_stall = paper["fthsdp"]["stall_s_mean"]
    assert isinstance(sync_stall, float) and isinstance(ft_stall, float)
    assert 7.5 * 60 <= sync_stall <= 12.5 * 60  # paper: ~10 min
    assert 2.25 * 60 <= ft_stall <= 3.75 * 60  # paper: ~3 min
    assert paper["sync"]["recovery_s_mean"] > paper["fthsdp"]["recovery_s_mean"]


@pytest.mark.parametrize(
    ("change", "sync_moves", "ft_moves"),
    [
        # Components drive the outcome: slower full allocation hurts only synchronous training,
        ({"alloc_full_s": 480.0}, True, False),
        # the quorum timeout only FT-HSDP (the synchronous job has no peers to wait for),
        ({"quorum_stall_s": 0.0}, False, True),
        # and a slower first step both (everyone waits for a joining replica's first step).
        ({"first_step_s": 360.0}, True, True),
    ],
)
def test_outcomes_follow_component_costs(
    change: dict[str, float], sync_moves: bool, ft_moves: bool
) -> None:
    base = PAPER.with_changes(runs=8, days=10)
    before = compare(base)[0]
    after = compare(base.with_changes(**change))[0]
    d_sync = before.sync.ettr.mean() - after.sync.ettr.mean()
    d_ft = before.fthsdp.ettr.mean() - after.fthsdp.ettr.mean()
    assert bool(abs(d_sync) > 0.02) is sync_moves, d_sync
    assert bool(abs(d_ft) > 0.02) is ft_moves, d_ft


def test_no_failures_gives_ettr_one_minus_checkpoint_cost() -> None:
    quiet = PAPER.with_changes(failures_per_1000_nodes_day=0.0, runs=3, days=2)
    for runs in (simulate_mode(quiet, 1, stream=0), simulate_mode(quiet, 12, stream=1)):
        assert np.all(runs.ettr == 1.0)  # Young/Daly: no failures -> never checkpoint
        assert runs.failures.sum() == 0
    paced = quiet.with_changes(checkpoint_interval_s=600.0, checkpoint_write_s=20.0)
    runs = simulate_mode(paced, 12, stream=1)
    assert runs.ettr == pytest.approx(np.full(3, 600 / 620), abs=2e-4)
    assert runs.summary()["stall_s_mean"] is None


def test_one_replica_ft_hsdp_equals_sync_within_noise() -> None:
    p = PAPER.with_changes(runs=20, days=10)
    c = compare(p, [1])[0]
    s, f = c.sync.summary(), c.fthsdp.summary()
    noise = (s["ettr_ci95"][1] - s["ettr"]) + (f["ettr_ci95"][1] - f["ettr"])
    assert abs(s["ettr"] - f["ettr"]) <= 1.5 * noise
    assert c.sync.failures.sum() != c.fthsdp.failures.sum()  # independent streams, not a copy


def test_throughput_while_a_replica_is_out_is_r_minus_one_over_r() -> None:
    # No stalls at all: the only loss is capacity while one replica of four is out.
    p = SimParams(
        gpus=4 * 64,
        gpus_per_node=8,
        replicas=4,
        failures_per_1000_nodes_day=1000.0 / 32 * 20,  # 20 failures a day for 32 nodes
        detection_s=60.0,
        alloc_partial_s=540.0,
        catchup_s=300.0,
        quorum_stall_s=0.0,
        first_step_s=20.0,
        step_s=20.0,
        checkpoint_write_s=0.0,
        days=20,
        runs=10,
    )
    runs = simulate_mode(p, 4, stream=3)
    outage = p.replica_restart_s()
    measured_loss = 1.0 - runs.ettr.mean()
    failures_per_s = runs.failures.sum() / runs.failures.size / p.horizon_s
    assert measured_loss == pytest.approx(failures_per_s * outage / 4, rel=0.05)


def test_same_seed_same_result_other_seed_differs() -> None:
    p = PAPER.with_changes(runs=4, days=3)
    a, b = compare(p)[0], compare(p)[0]
    c = compare(p.with_changes(seed=1))[0]
    assert np.array_equal(a.fthsdp.useful_s, b.fthsdp.useful_s)
    assert not np.array_equal(a.fthsdp.useful_s, c.fthsdp.useful_s)


@pytest.mark.parametrize(("span", "low", "high"), [(1, 0.0, 0.1), (2, 0.45, 0.55)])
def test_rack_failures_spanning_every_replica_lose_the_job(
    span: int, low: float, high: float
) -> None:
    # Rack-aligned replicas (span 1) survive a rack event; a rack striped over both replicas of
    # a two-replica job takes both out at once: the second hit loses the state every time.
    p = PAPER.with_changes(
        replicas=2,
        failures_per_1000_nodes_day=0.0,
        rack_failures_per_day=24.0,
        rack_span_replicas=span,
        runs=4,
        days=3,
    )
    runs = simulate_mode(p, 2, stream=2)
    assert runs.failures.sum() > 100
    assert low <= runs.job_losses.sum() / runs.failures.sum() <= high


# ---- one failure, state by state ----------------------------------------------------------------

SMALL = SimParams(
    gpus=64,
    gpus_per_node=8,
    replicas=4,
    detection_s=10.0,
    alloc_partial_s=20.0,
    alloc_full_s=100.0,
    checkpoint_load_s=30.0,
    catchup_s=5.0,
    quorum_stall_s=7.0,
    runs=1,
)


def _state(replicas: int, up: list[bool], vuln_from: list[float], since: float = 50.0) -> _Lockstep:
    sim = _Lockstep(SMALL, replicas, "fthsdp", np.random.default_rng(0))
    sim.t[:] = 1000.0
    sim.since[:] = since
    sim.useful[:] = 900.0
    sim.up[0] = up
    sim.vuln_from[0] = vuln_from
    sim.down_until[0] = [math.inf if u else 2000.0 for u in up]
    return sim


@pytest.mark.parametrize(
    ("replicas", "up", "vuln_from", "hit", "expect"),
    [
        # a training replica with healthy peers: it restarts alone, the peers stall for the quorum
        (
            4,
            [True] * 4,
            [math.inf] * 4,
            2,
            {
                "failures": 1,
                "absorbed": 0,
                "job_losses": 0,
                "partial": True,
                "stall": 7.0,
                "lost": 0.0,
            },
        ),
        # a replica still being detected/allocated: the allocation in progress absorbs the failure
        (
            4,
            [True, True, False, True],
            [math.inf, math.inf, 1010.0, math.inf],
            2,
            {
                "failures": 0,
                "absorbed": 1,
                "job_losses": 0,
                "partial": False,
                "stall": 0.0,
                "lost": 0.0,
            },
        ),
        # a replica already running its restart (NCCL init, fetch): its recovery starts over,
        # the peers do not stall (it was not in their quorum)
        (
            4,
            [True, True, False, True],
            [math.inf, math.inf, 990.0, math.inf],
            2,
            {
                "failures": 1,
                "absorbed": 0,
                "job_losses": 0,
                "partial": True,
                "stall": 0.0,
                "lost": 0.0,
            },
        ),
        # the last healthy replica: the state is lost, everyone restarts from the checkpoint
        (
            4,
            [False, False, True, False],
            [990.0, 1200.0, math.inf, 1200.0],
            2,
            {
                "failures": 1,
                "absorbed": 0,
                "job_losses": 1,
                "partial": False,
                "stall": 0.0,
                "lost": 50.0,
            },
        ),
        # synchronous training is the one-replica case of the same rule
        (
            1,
            [True],
            [math.inf],
            0,
            {
                "failures": 1,
                "absorbed": 0,
                "job_losses": 1,
                "partial": False,
                "stall": 0.0,
                "lost": 50.0,
            },
        ),
    ],
)
def test_one_failure_transitions(
    replicas: int, up: list[bool], vuln_from: list[float], hit: int, expect: dict[str, Any]
) -> None:
    sim = _state(replicas, up, vuln_from)
    sim._hit(np.array([0]), np.array([hit]))
    assert sim.failures[0] == expect["failures"]
    assert sim.absorbed[0] == expect["absorbed"]
    assert sim.job_losses[0] == expect["job_losses"]
    assert sim.stall_until[0] == pytest.approx(1000.0 + expect["stall"] if expect["stall"] else 0.0)
    assert sim.lost[0] == expect["lost"]
    assert sim.useful[0] == 900.0 - expect["lost"]
    assert not sim.up[0, hit]
    if expect["partial"]:
        assert sim.down_until[0, hit] == pytest.approx(1000.0 + SMALL.replica_restart_s())
        assert sim.vuln_from[0, hit] == pytest.approx(1000.0 + 10.0 + 20.0)
    if expect["job_losses"]:
        restart = 1000.0 + SMALL.with_changes(replicas=replicas).job_restart_s()
        assert np.allclose(sim.down_until[0], restart)
        assert not sim.up[0].any()
        assert sim.since[0] == 0.0


def test_rejoin_stalls_peers_for_the_slow_first_step() -> None:
    sim = _state(4, [True, True, False, True], [math.inf, math.inf, 990.0, math.inf])
    sim.episode_start[0, 2] = 700.0
    sim.t[:] = 2000.0
    sim._rejoin(np.array([True]))
    assert sim.up[0].all()
    assert sim.stall_until[0] == pytest.approx(2000.0 + SMALL.first_step_excess_s)
    assert sim.recoveries[0] == 1
    assert sim.recovery_s[0] == pytest.approx(2000.0 + SMALL.first_step_excess_s - 700.0)


def test_summary_fields(paper: dict[str, Any]) -> None:
    for mode in ("sync", "fthsdp"):
        s = paper[mode]
        lo, hi = s["ettr_ci95"]
        assert lo <= s["ettr"] <= hi
        assert s["failures_per_day"] == pytest.approx(80.0, rel=0.25)
    assert isinstance(compare(PAPER.with_changes(runs=2, days=1))[0].sync, ModeRuns)
