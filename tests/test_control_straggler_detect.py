"""Detection tables: synthetic runs of leader reports in, the step a replica is flagged out.

Each scenario builds the timing reports of a small run (every replica reports every step, at the
time the step ends: all replicas wait for the slowest one, as in FT-HSDP) and feeds them to the
pure detector in arrival order. The default window is 50 steps or 5 minutes.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import replace

import pytest

from runtime.control.straggler.detect import (
    DetectorState,
    StragglerConfig,
    TimingSample,
    observe,
    slowest_rank_node,
    stragglers,
    verdicts,
)


def observe_all(
    samples: Iterable[TimingSample],
    config: StragglerConfig | None = None,
    state: DetectorState | None = None,
) -> DetectorState:
    """Fold `samples` into `state` (a fresh one by default), in order."""
    state = state or DetectorState()
    for sample in samples:
        state = observe(state, sample, config)
    return state


# factor(replica, step) -> compute multiplier; None means "no compute time in that report".
Slowness = Callable[[int, int], float | None]
Healing = Callable[[int, int], bool]


def _never(replica: int, step: int) -> bool:
    return False


def run(
    replicas: int,
    steps: int,
    slow: Slowness,
    *,
    healing: Healing = _never,
    base_s: float = 0.1,
    noise: float = 0.05,
    seed: int = 0,
    config: StragglerConfig | None = None,
    clock: Callable[[int, float], float] | None = None,
    report_every: int = 1,
) -> dict[int, int]:
    """Feed a synthetic run (each replica reporting every `report_every` steps); return
    {replica: first step it was a straggler}."""
    rng = random.Random(seed)
    config = config or StragglerConfig()
    state = DetectorState()
    t = 1000.0
    first: dict[int, int] = {}
    for step in range(steps):
        computes: dict[int, float | None] = {}
        for r in range(replicas):
            f = slow(r, step)
            computes[r] = None if f is None else base_s * f * (1 + rng.uniform(-noise, noise))
        t += max((c or base_s) for c in computes.values()) + 0.01
        for r in range(replicas if step % report_every == 0 else 0):
            received = clock(step, t) if clock else t
            sample = TimingSample(
                replica=r,
                step=step,
                received_at=received + 0.001 * r,
                compute_s=computes[r],
                incarnation=f"inc{r}",
                healing=healing(r, step),
                nodes=(f"node{2 * r + 1}", f"node{2 * r + 2}"),
                rank_compute_s=(computes[r] or 0.0, (computes[r] or 0.0) * 0.5, 0.05, 0.05),
            )
            state = observe(state, sample, config)
        for v in stragglers(state):
            first.setdefault(v.replica, step)
    return first


def slow_from(replica: int, start: int, factor: float, end: int = 10**9) -> Slowness:
    return lambda r, s: factor if r == replica and start <= s < end else 1.0


def ramp(r: int, s: int, replica: int, start: int, end: int, factor: float) -> float:
    """`replica` slows linearly from 1x at step `start` to `factor` at `end`, then stays."""
    if r != replica or s < start:
        return 1.0
    return 1.0 + (factor - 1.0) * min(1.0, (s - start) / (end - start))


DETECTION_TABLE: list[tuple[str, dict[str, object], dict[int, tuple[int, int]]]] = [
    # name, run kwargs, {replica: (earliest step, latest step) it is first flagged}
    ("noise only", {"replicas": 4, "steps": 400, "slow": lambda r, s: 1.0, "noise": 0.3}, {}),
    ("short 3x spike", {"replicas": 4, "steps": 300, "slow": slow_from(2, 100, 3.0, 130)}, {}),
    (
        "sustained 2x",
        {"replicas": 4, "steps": 300, "slow": slow_from(1, 100, 2.0)},
        {1: (149, 150)},
    ),
    (
        "sustained 2x, two replicas",
        {"replicas": 2, "steps": 300, "slow": slow_from(0, 10, 2.0)},
        {0: (59, 60)},
    ),
    (
        "two slow replicas of four",
        {"replicas": 4, "steps": 300, "slow": lambda r, s: 2.0 if r in (0, 3) and s >= 50 else 1.0},
        {0: (99, 100), 3: (99, 100)},
    ),
    (
        # Two of three slow: the median of the others is no reference, so nobody is flagged.
        "two slow replicas of three",
        {"replicas": 3, "steps": 300, "slow": lambda r, s: 2.0 if r in (0, 1) and s >= 50 else 1.0},
        {},
    ),
    (
        "slow while another heals",
        {
            "replicas": 3,
            "steps": 300,
            "slow": lambda r, s: (
                2.0 if r == 2 and s >= 100 else (5.0 if r == 0 and 100 <= s < 140 else 1.0)
            ),
            "healing": lambda r, s: r == 0 and 100 <= s < 140,
        },
        {2: (149, 150)},
    ),
    (
        "slow only while catching up, then warm-up",
        {
            "replicas": 3,
            "steps": 300,
            "slow": lambda r, s: 6.0 if r == 1 and 100 <= s < 103 else 1.0,
            "healing": lambda r, s: r == 1 and s in (100, 101),
        },
        {},
    ),
    (
        "just below the factor, forever",
        {"replicas": 4, "steps": 400, "slow": slow_from(3, 10, 1.4), "noise": 0.02},
        {},
    ),
    (
        "one 50x outlier, then 1.3x for good",
        {
            "replicas": 4,
            "steps": 300,
            "slow": lambda r, s: (50.0 if s == 100 else 1.3) if r == 2 and s >= 100 else 1.0,
            "noise": 0.02,
        },
        {},
    ),
    (
        # Slow from its first step: it never learned a pace of its own, so its peers are the
        # reference; flagged within the window of its first steps (plus the warm-up samples).
        "slow from the first step, no own pace",
        {"replicas": 4, "steps": 300, "slow": slow_from(1, 0, 2.0)},
        {1: (50, 54)},
    ),
    (
        "slow from the first step, two replicas",
        {"replicas": 2, "steps": 300, "slow": slow_from(0, 0, 3.0)},
        {0: (50, 54)},
    ),
    (
        # A replica that trails from its start for three reports (one per 10 steps) spanning the
        # window: with no pace of its own, its peers alone need more reports than that.
        "trails its peers for three sparse reports from its start",
        {
            "replicas": 3,
            "steps": 200,
            "slow": slow_from(2, 0, 2.5, end=60),
            "report_every": 10,
            "config": StragglerConfig(window_steps=20),
        },
        {},
    ),
    (
        "slow from the first step, sparse reports",
        {
            "replicas": 3,
            "steps": 200,
            "slow": slow_from(2, 0, 2.5),
            "report_every": 10,
            "config": StragglerConfig(window_steps=20),
        },
        {2: (80, 80)},
    ),
    (
        # A slower part that stands 1.3x behind from the start learns that as its pace.
        "1.3x behind from the first step",
        {"replicas": 4, "steps": 400, "slow": slow_from(2, 0, 1.3), "noise": 0.1},
        {},
    ),
    (
        "slow from the start and noisy peers",
        {"replicas": 4, "steps": 300, "slow": slow_from(3, 0, 2.0), "noise": 0.3},
        {3: (50, 60)},
    ),
    (
        # Its peers got twice as fast; it did not get slower: not a straggler.
        "peers speed up, its own pace unchanged",
        {
            "replicas": 4,
            "steps": 300,
            "slow": lambda r, s: 2.0 if r == 1 or s < 100 else 1.0,
        },
        {},
    ),
    (
        "slow against its own pace but not against its peers",
        {"replicas": 4, "steps": 300, "slow": lambda r, s: 2.0 if s >= 100 else 1.0},
        {},
    ),
    (
        # Throttling that creeps in (1x to 3x over 100 steps) is not learned as its new pace.
        "gradual slowdown to 3x",
        {"replicas": 4, "steps": 300, "slow": lambda r, s: ramp(r, s, 1, 100, 200, 3.0)},
        {1: (120, 200)},
    ),
    (
        "missing timing data never triggers",
        {"replicas": 3, "steps": 300, "slow": lambda r, s: None if r == 1 else 1.0},
        {},
    ),
    (
        "straggler whose reports lack compute time",
        {"replicas": 3, "steps": 300, "slow": lambda r, s: None if r == 1 and s >= 50 else 1.0},
        {},
    ),
    (
        "slow steps: the 5-minute window comes first",
        {"replicas": 3, "steps": 60, "slow": slow_from(0, 5, 2.0), "base_s": 10.0},
        {0: (19, 21)},
    ),
]


@pytest.mark.parametrize(
    ("name", "kwargs", "expected"), DETECTION_TABLE, ids=[row[0] for row in DETECTION_TABLE]
)
def test_detection_table(
    name: str, kwargs: dict[str, object], expected: dict[int, tuple[int, int]]
) -> None:
    first = run(**kwargs)  # type: ignore[arg-type]
    assert set(first) == set(expected), f"{name}: flagged {first}, expected {expected}"
    for replica, (lo, hi) in expected.items():
        assert lo <= first[replica] <= hi, f"{name}: replica {replica} flagged at {first[replica]}"


@pytest.mark.parametrize("seed", range(5))
def test_noise_with_occasional_spikes_never_triggers(seed: int) -> None:
    rng = random.Random(seed)
    spikes = {(rng.randrange(4), rng.randrange(500)) for _ in range(40)}
    first = run(4, 500, lambda r, s: 2.5 if (r, s) in spikes else 1.0, noise=0.2, seed=seed)
    assert first == {}


def test_clock_jump_back_restarts_the_window() -> None:
    # The monotonic clock goes back by an hour at step 130 (coordinator moved host): the episode
    # that started at step 100 is dropped, so the 2x replica is flagged 50 steps after the jump.
    def clock(step: int, t: float) -> float:
        return t - 3600.0 if step >= 130 else t

    first = run(4, 300, slow_from(1, 100, 2.0), clock=clock)
    assert first == {1: 179}


def test_clock_jump_forward_is_a_gap_not_a_window() -> None:
    # A jump forward of 10 minutes would satisfy the 5-minute window in one sample; it is a gap.
    def clock(step: int, t: float) -> float:
        return t + 600.0 if step >= 103 else t

    first = run(4, 300, slow_from(1, 100, 2.0), clock=clock)
    assert first == {1: 152}


def test_wall_clock_is_never_used() -> None:
    # Samples carry only the coordinator's monotonic receive time; a report's wall clock
    # (`sent_at`) does not reach the detector, so a jumping wall clock cannot change anything.
    assert "sent_at" not in TimingSample.__dataclass_fields__


def _sample(replica: int, step: int, t: float, compute: float, **kw: object) -> TimingSample:
    return TimingSample(
        replica=replica,
        step=step,
        received_at=t,
        compute_s=compute,
        incarnation=str(kw.pop("incarnation", "a")),
        **kw,  # type: ignore[arg-type]
    )


#: Replica 1 trains at its peers' pace for this many steps before it slows down: its own pace.
HEALTHY_STEPS = 10


def _slow_stream(steps: range, factor: float = 2.0) -> list[TimingSample]:
    out = []
    for s in steps:
        f = factor if s >= HEALTHY_STEPS else 1.0
        out += [_sample(0, s, s * 0.3, 0.1), _sample(1, s, s * 0.3 + 0.01, 0.1 * f)]
    return out


def test_hysteresis_holds_above_clear_factor_and_clears_below() -> None:
    config = StragglerConfig()
    state = observe_all(_slow_stream(range(0, 60)), config)
    assert [v.replica for v in stragglers(state)] == [1]
    # Back to 1.3x: above clear_factor (1.25), so it stays a straggler.
    state = observe_all(_slow_stream(range(60, 80), 1.3), config, state)
    assert [v.replica for v in stragglers(state)] == [1]
    # Healthy again: cleared after clear_samples (3) consecutive samples.
    state = observe_all(_slow_stream(range(80, 82), 1.0), config, state)
    assert [v.replica for v in stragglers(state)] == [1]
    state = observe_all(_slow_stream(range(82, 83), 1.0), config, state)
    assert stragglers(state) == []
    assert verdicts(state)[1].state == "ok"


def test_ratio_flapping_around_the_factor_does_not_trigger() -> None:
    samples = []
    for s in range(300):
        f = (1.55 if s % 2 else 1.3) if s >= HEALTHY_STEPS else 1.0
        samples += [_sample(0, s, s * 0.3, 0.1), _sample(1, s, s * 0.3 + 0.01, 0.1 * f)]
    state = observe_all(samples)
    assert stragglers(state) == []
    assert verdicts(state)[1].state == "suspect"


def test_duplicate_and_late_reports_do_not_advance_the_window() -> None:
    state = observe_all(_slow_stream(range(0, 20)))
    dup = _sample(1, 19, 6.0, 0.2)
    late = _sample(1, 14, 6.0, 0.2)
    for i in range(200):
        state = observe(state, replace(dup, received_at=6.0 + i * 0.02))
        state = observe(state, replace(late, received_at=6.01 + i * 0.02))
    v = verdicts(state)[1]
    assert v.state == "suspect"
    assert (v.since_step, v.steps) == (10, 9)


def test_stale_peers_are_no_reference() -> None:
    # Replica 0 goes silent; replica 1 reports slow times for 10 minutes after 0's last report
    # is older than max_age_s: there is nothing to compare with, so nothing is flagged.
    state = observe_all([_sample(0, 0, 0.0, 0.1), _sample(1, 0, 0.0, 0.2)])
    state = observe_all([_sample(1, s, 121.0 + s, 0.2) for s in range(1, 600)], state=state)
    assert stragglers(state) == []


def test_new_incarnation_resets_and_warms_up() -> None:
    state = observe_all(_slow_stream(range(0, 60)))
    assert [v.replica for v in stragglers(state)] == [1]
    # The replica was restarted elsewhere (a new incarnation): its old verdict is gone and its
    # first steps (warm-up) are not evidence even if slow.
    state = observe(state, _sample(1, 61, 61 * 0.3, 0.5, incarnation="b"))
    state = observe(state, _sample(1, 62, 62 * 0.3, 0.5, incarnation="b"))
    assert stragglers(state) == []
    assert verdicts(state)[1].state == "ok"


def test_verdict_names_the_slow_rank_and_node() -> None:
    samples = []
    for s in range(60):
        samples.append(_sample(0, s, s * 0.3, 0.1, nodes=("node1",)))
        samples.append(
            _sample(
                1,
                s,
                s * 0.3 + 0.01,
                0.2 if s >= HEALTHY_STEPS else 0.1,
                nodes=("node3", "node4"),
                rank_compute_s=(0.1, 0.1, 0.1, 0.2),
            )
        )
    (v,) = stragglers(observe_all(samples))
    assert (v.replica, v.slow_rank, v.slow_node) == (1, 3, "node4")
    assert v.factor == pytest.approx(2.0)
    assert (v.since_step, v.steps) == (HEALTHY_STEPS, 59 - HEALTHY_STEPS)


@pytest.mark.parametrize(
    ("nodes", "ranks", "per_node", "expected"),
    [
        (("n1", "n2"), (0.1, 0.1, 0.3, 0.1), None, (2, "n2")),
        (("n1", "n2"), (0.4, 0.1, 0.3, 0.1), None, (0, "n1")),
        (("n1",), (), None, (None, "n1")),
        (("n1", "n2"), (), None, (None, None)),
        (("n1", "n2"), (0.1, 0.1, 0.3), None, (2, None)),  # layout not divisible: unknown
        (("n1", "n2"), (0.1, 0.1, 0.3), 2, (2, "n2")),
        (("n1", "n2"), (0.1, 0.1, 0.1, 0.1, 0.9), 2, (4, None)),  # rank beyond the nodes
        ((), (0.1, 0.2), None, (1, None)),
    ],
)
def test_slowest_rank_node(
    nodes: tuple[str, ...],
    ranks: tuple[float, ...],
    per_node: int | None,
    expected: tuple[int | None, str | None],
) -> None:
    assert slowest_rank_node(nodes, ranks, per_node) == expected


@pytest.mark.parametrize(
    "kwargs",
    [{"factor": 1.0}, {"clear_factor": 2.0}, {"clear_factor": 0.9}, {"window_steps": 0}],
)
def test_config_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        StragglerConfig(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("slow_from", "hold", "flagged"),
    [
        # Slowed at step 100 while another replica recovers (100-180): the window starts after.
        (100, range(100, 180), 229),
        # The run's start is a hold too (every replica starting): its normal samples still
        # teach each replica's own pace, so a slowdown inside the hold is caught after it.
        (20, range(0, 30), 79),
    ],
    ids=["slowed-during-a-recovery", "slowed-during-the-start"],
)
def test_no_evidence_while_another_replica_recovers(
    slow_from: int, hold: range, flagged: int
) -> None:
    config = StragglerConfig()
    state = DetectorState()
    first = None
    for s in range(300):
        for r in range(2):
            compute = 0.2 if r == 1 and s >= slow_from else 0.1
            sample = _sample(r, s, s * 0.3 + 0.01 * r, compute)
            state = observe(state, sample, config, evidence=s not in hold)
        if first is None and stragglers(state):
            first = s
    assert first == flagged


def _reference_median(
    state: DetectorState, replica: int, now: float, config: StragglerConfig
) -> float | None:
    """The peers' median by a pass over every track: what the indexed median must equal."""
    import statistics

    peers = [
        t.latest.compute_s
        for r, t in state.tracks.items()
        if r != replica
        and t.latest.usable
        and t.latest.step > t.ignore_until_step
        and 0 <= now - t.latest.received_at <= config.max_age_s
        and t.latest.compute_s is not None
    ]
    return statistics.median(peers) if peers and len(peers) >= config.min_peers else None


@pytest.mark.parametrize("seed", range(20))
def test_the_indexed_peer_median_is_the_full_pass(seed: int) -> None:
    """Random reports (missing compute times, healing, new incarnations, duplicates, equal
    times, stale peers, a clock that jumps back): the index gives the full pass's median."""
    from runtime.control.straggler.detect import _peer_median

    rng = random.Random(seed)
    config = StragglerConfig(max_age_s=rng.choice([5.0, 50.0, 120.0]), min_peers=rng.randint(1, 3))
    state = DetectorState()
    steps: dict[int, int] = {}
    now = 100.0
    for _ in range(400):
        r = rng.randrange(8)
        now += rng.choice([0.0, 0.01, 0.5, 3.0, 40.0]) if rng.random() > 0.01 else -30.0
        steps[r] = steps.get(r, 0) + rng.choice([1, 1, 1, 0, -1])
        sample = TimingSample(
            replica=r,
            step=steps[r],
            received_at=now,
            compute_s=rng.choice([None, 0.1, 0.2, 0.2, rng.uniform(0.05, 2.0)]),
            incarnation=f"i{r}.{rng.random() < 0.03}",
            healing=rng.random() < 0.05,
        )
        for k in range(8):
            probe = now + rng.choice([0.0, 1.0, 60.0])
            assert _peer_median(state, k, probe, config) == _reference_median(
                state, k, probe, config
            ), (seed, k)
        state = observe(state, sample, config, evidence=rng.random() > 0.1)


def test_owned_state_and_flagged_index_match_the_pure_detector() -> None:
    """The monitor's in-place updates (`owned=True`) give the states the pure detector gives,
    and `stragglers` (from the flagged set `observe` keeps) lists what a pass over every
    track finds, through an episode that is flagged, cleared, and a clock that runs back."""
    rng = random.Random(3)
    pure, owned = DetectorState(), DetectorState()
    t = 100.0
    for step in range(260):
        t = t - 500.0 if step == 200 else t + 0.2  # the monotonic clock jumps back once
        for r in range(5):
            slow = 2.5 if r == 2 and (60 <= step < 150 or step >= 210) else 1.0
            sample = TimingSample(r, step, t + 0.001 * r, 0.1 * slow * rng.uniform(0.95, 1.05))
            pure = observe(pure, sample)
            owned = observe(owned, sample, owned=True)
            assert owned.tracks == pure.tracks
            assert list(owned.computes) == list(pure.computes)
            assert list(owned.times) == list(pure.times)
            assert dict(owned.peers) == dict(pure.peers)
            scan = sorted(k for k, v in pure.tracks.items() if v.flagged and v.episode)
            assert [v.replica for v in stragglers(owned)] == scan
            assert stragglers(owned) == stragglers(pure)
    assert [v.replica for v in stragglers(pure)] == [2]


@pytest.mark.parametrize("owned", [False, True])
def test_a_replica_that_stops_reporting_leaves_the_peer_index(
    owned: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a silent replica's last sample is older than `max_age_s`, the others' reports still
    take their peers' median from the index: the silent sample costs one pass when it ages out,
    not a pass over every track on every report. It comes back with its next sample."""
    from runtime.control.straggler import detect

    scans = 0
    full_pass = detect._scan

    def counted(*args: object, **kwargs: object) -> float | None:
        nonlocal scans
        scans += 1
        return full_pass(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(detect, "_scan", counted)
    config = StragglerConfig(max_age_s=30.0)
    state, replicas = DetectorState(), 50
    now = 0.0
    for step in range(1, 121):  # a report a second from each; replica 0 stops after step 10
        for r in range(0 if step <= 10 else 1, replicas):
            now = step + r / 1000
            sample = TimingSample(r, step, now, 0.1 + r / 10_000, "i")
            state = observe(state, sample, config, owned=owned)
    assert 0 not in state.peers
    assert scans <= 1, scans
    probe = now + 0.5
    assert detect._peer_median(state, 7, probe, config) == _reference_median(
        state, 7, probe, config
    )
    state = observe(state, TimingSample(0, 11, now + 1, 0.1, "i"), config, owned=owned)
    assert 0 in state.peers and len(state.computes) == len(state.times) == replicas
