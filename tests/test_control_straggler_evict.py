"""Decision table: a straggler verdict and the run's situation in, evict or report out.

The gain of an eviction is the straggler's excess compute time per step times the steps left;
the cost is the median of this run's measured requeues, else the configured estimate.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from runtime.control.straggler.detect import StragglerVerdict
from runtime.control.straggler.evict import (
    EvictionConfig,
    RunContext,
    decide,
    evidence,
    requeue_cost,
    run_slowdown,
)
from runtime.control.straggler.service import recovering_replicas

# Replica 1 computes in 0.4 s against its peers' 0.2 s; the run steps in 0.45 s (0.05 s of
# allreduce), so without it the run would step in 0.25 s: slowdown 0.8.
SLOW = StragglerVerdict(
    replica=1,
    state="straggler",
    factor=2.0,
    compute_s=0.4,
    peer_median_s=0.2,
    since_step=100,
    steps=50,
    slow_rank=5,
    slow_node="node4",
)
CTX = RunContext(participants=3, remaining_steps=10_000, run_step_time_s=0.45)

DECISION_TABLE: list[tuple[str, StragglerVerdict, RunContext, EvictionConfig, str, str]] = [
    # name, verdict, context, config, action, expected text in reason (evict) or why (report)
    ("pays: long run left", SLOW, CTX, EvictionConfig(), "evict", "fthsdp: straggler: node4 2.0x"),
    (
        "does not pay near the end",
        SLOW,
        replace(CTX, remaining_steps=100),
        EvictionConfig(),
        "report",
        "does not pay: 20s lost <= 120s",
    ),
    (
        "measured requeue cost overrides the estimate",
        SLOW,
        replace(CTX, remaining_steps=1000, past_requeue_costs_s=(30.0, 25.0, 500.0)),
        EvictionConfig(requeue_cost_estimate_s=1e9),
        "evict",
        "straggler: node4",
    ),
    (
        "measured requeue cost too high",
        SLOW,
        replace(CTX, remaining_steps=1000, past_requeue_costs_s=(300.0,)),
        EvictionConfig(requeue_cost_estimate_s=1.0),
        "report",
        "does not pay: 200s lost <= 300s",
    ),
    (
        "eviction cap reached",
        SLOW,
        replace(CTX, evictions_so_far=2),
        EvictionConfig(max_evictions=2),
        "report",
        "cap reached (2/2)",
    ),
    (
        "would go below min_replicas",
        SLOW,
        replace(CTX, participants=2),
        EvictionConfig(min_replicas=2),
        "report",
        "leave 1 < min_replicas=2",
    ),
    (
        "exactly min_replicas after eviction is fine",
        SLOW,
        replace(CTX, participants=3),
        EvictionConfig(min_replicas=2),
        "evict",
        "straggler: node4",
    ),
    (
        "another replica is recovering",
        SLOW,
        replace(CTX, recovering=(0,)),
        EvictionConfig(),
        "report",
        "holding off: replica 0 is recovering",
    ),
    (
        "another eviction in flight",
        SLOW,
        replace(CTX, eviction_in_flight=True),
        EvictionConfig(),
        "report",
        "in flight",
    ),
    ("report-only mode", SLOW, CTX, EvictionConfig(mode="report"), "report", "mode=report"),
    (
        "slow node unknown",
        replace(SLOW, slow_node=None),
        CTX,
        EvictionConfig(),
        "report",
        "slow node unknown",
    ),
    (
        "remaining time unknown",
        SLOW,
        replace(CTX, remaining_steps=None),
        EvictionConfig(),
        "report",
        "remaining time unknown",
    ),
    (
        "only a suspect",
        replace(SLOW, state="suspect"),
        CTX,
        EvictionConfig(),
        "report",
        "not a straggler",
    ),
    (
        "no timing to measure the slowdown",
        replace(SLOW, peer_median_s=None),
        CTX,
        EvictionConfig(),
        "report",
        "slowdown or remaining time unknown",
    ),
]


@pytest.mark.parametrize(
    ("name", "verdict", "ctx", "config", "action", "text"),
    DECISION_TABLE,
    ids=[row[0] for row in DECISION_TABLE],
)
def test_decision_table(
    name: str,
    verdict: StragglerVerdict,
    ctx: RunContext,
    config: EvictionConfig,
    action: str,
    text: str,
) -> None:
    d = decide(verdict, ctx, config)
    assert d.action == action, d.why
    assert d.replica == verdict.replica
    if action == "evict":
        assert text in d.reason
        assert d.reason.startswith("fthsdp: straggler: ")
        assert d.node == "node4"
        assert d.gain_s is not None and d.cost_s is not None and d.gain_s > d.cost_s
    else:
        assert text in d.why
        assert d.reason == ""
        assert d.drain is False


def test_gain_is_excess_time_per_step_times_steps_left() -> None:
    d = decide(SLOW, CTX, EvictionConfig())
    assert d.slowdown == pytest.approx(0.8)
    assert d.remaining_s == pytest.approx(10_000 * 0.25)
    assert d.gain_s == pytest.approx(10_000 * 0.2)
    assert d.cost_s == 120.0


@pytest.mark.parametrize(("mode", "drain"), [("drain", True), ("exclude", False)])
def test_drain_or_exclude(mode: str, drain: bool) -> None:
    d = decide(SLOW, CTX, EvictionConfig(mode=mode))  # type: ignore[arg-type]
    assert d.action == "evict"
    assert d.drain is drain
    assert d.reason == "fthsdp: straggler: node4 2.0x"


@pytest.mark.parametrize(
    ("verdict", "text"),
    [
        (
            replace(SLOW, duration_s=12.4),
            "2.0x over 50 steps in 12s (compute 0.400s, peers 0.200s, since step 100)",
        ),
        (StragglerVerdict(replica=1, state="straggler", factor=3.0), "3.0x"),
    ],
)
def test_a_decision_carries_what_its_verdict_rests_on(verdict: StragglerVerdict, text: str) -> None:
    assert evidence(verdict) == text
    assert decide(verdict, CTX, EvictionConfig()).evidence == text


def test_slowdown_without_run_step_time_uses_compute_bound() -> None:
    assert run_slowdown(SLOW, None) == pytest.approx(1.0)
    assert run_slowdown(SLOW, 0.45) == pytest.approx(0.8)
    assert run_slowdown(replace(SLOW, compute_s=None), 0.45) is None


def test_requeue_cost_is_the_median_of_the_runs_own() -> None:
    config = EvictionConfig(requeue_cost_estimate_s=77.0)
    assert requeue_cost(RunContext(participants=3), config) == 77.0
    ctx = RunContext(participants=3, past_requeue_costs_s=(10.0, 40.0, 1000.0))
    assert requeue_cost(ctx, config) == 40.0


@pytest.mark.parametrize("kwargs", [{"mode": "kill"}, {"max_evictions": -1}, {"min_replicas": 0}])
def test_eviction_config_rejects_nonsense(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        EvictionConfig(**kwargs)  # type: ignore[arg-type]


# (replica, phase, phase_since, handled) of each replica at wall time 1000 s, hold 60 s.
RECOVERING_TABLE: list[tuple[str, list[tuple[int, str, float, bool]], tuple[int, ...]]] = [
    ("all training for long", [(0, "training", 0.0, False), (2, "training", 0.0, False)], ()),
    ("another starts", [(0, "starting", 990.0, False), (2, "training", 0.0, False)], (0,)),
    ("another heals", [(0, "healing", 990.0, False), (2, "training", 0.0, False)], (0,)),
    ("another is requeued", [(0, "requeued", 990.0, True), (2, "pending", 995.0, False)], (0, 2)),
    ("another relaunches", [(0, "restarting", 999.0, True)], (0,)),
    ("a failure being handled", [(0, "training", 0.0, True)], (0,)),
    ("training again for 30 s: warming up", [(0, "training", 970.0, False)], (0,)),
    ("training again for 61 s", [(0, "training", 939.0, False)], ()),
    ("the replica itself is not counted", [(1, "healing", 990.0, False)], ()),
    (
        "finished or left out is not recovering",
        [(0, "done", 999.0, False), (2, "out", 999.0, True), (3, "ended", 999.0, False)],
        (),
    ),
]


@pytest.mark.parametrize(
    ("name", "rows", "expected"), RECOVERING_TABLE, ids=[row[0] for row in RECOVERING_TABLE]
)
def test_recovering_replicas_table(
    name: str, rows: list[tuple[int, str, float, bool]], expected: tuple[int, ...]
) -> None:
    assert recovering_replicas(rows, 1, 1000.0, 60.0) == expected, name
