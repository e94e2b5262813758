"""Straggler detection and the evict-or-tolerate decision, as pure functions over plain data.

In FT-HSDP every step waits for the slowest participating replica, so one replica on a thermally
throttled GPU or a degraded link slows the whole run without ever failing: a gray failure. The
textbook's rule is to treat a severe straggler as a hard failure once the time it costs exceeds
what a recovery costs; per-replica requeue makes that recovery cheap (the other replicas keep
training), so evicting a straggler is often the right call. This module decides *when*.

Detection (`observe`) compares each replica's own compute time per step (forward, backward and
the local reduce-scatter, without the cross-replica wait, so a replica waiting for the straggler
does not look slow itself) with the median of the other replicas' latest compute times, and with
its own recent pace (the median of its last `own_window` normal samples; a sample slower
against its peers than the replica stood among them at its start is not normal, so a slowdown
that creeps in is never learned as the pace). A sample is slow only when it is `factor` times
slower than both: a replica that got no slower while its peers sped up
(or whose peers share one busy CPU, as on the dev cluster) is not a straggler, and a replica
without `min_own_samples` of its own pace is no evidence yet. A replica
becomes a *suspect* when it is `factor` times slower, and a *straggler* once that has held for a
sustained window (`window_steps` steps or `window_s` seconds, whichever comes first) with at
least `min_fraction_above` of the episode's samples at or above `factor`. Hysteresis in level
and time: an episode survives ratios down to `clear_factor`, and ends only after
`clear_samples` consecutive samples below it; a flagged straggler is cleared the same way.
Several guards keep bad data from ever triggering:

* only monotonic receive times are used (the report's wall-clock `sent_at` is ignored); time that
  runs backwards, or a gap between two samples longer than `max_gap_s`, restarts the episode;
* samples without a compute time, peers whose latest sample is older than `max_age_s`, and too
  few peers (`min_peers`) count as no evidence at all;
* healing (catch-up) steps are ignored, for the replica itself and as a peer, and so are the
  first `ignore_after_heal_steps` steps after healing or after a new incarnation (warm-up);
* a duplicate or late (reordered) report, one whose step is not past the replica's latest, is
  dropped;
* while another replica is recovering (starting, healing, or within `recovery_hold_s` of
  training again), samples are no evidence and no eviction is decided: a replacement's start
  and catch-up load the machine and the network, and every step waits for it anyway.

The slow *node* is the node of the replica's slowest rank: ranks are laid out in blocks over the
replica's nodes (Slurm's default block distribution), `tasks_per_node` ranks on each.

The decision (`decide`) evicts only when the measured run-wide slowdown times the expected
remaining time exceeds the measured cost of a requeue (the median of this run's own past
requeues, else the configured estimate); within a per-run cap; never when that would leave fewer
than `min_replicas` participating, or while another eviction is still in flight. An eviction is
the control plane's tier-2 path (requeue the replica's job) with the drain reason
`fthsdp: straggler: <node> <factor>x`, or with the node only excluded for this run.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from slurm.backend import drain_reason

VerdictState = Literal["ok", "suspect", "straggler"]
EvictionMode = Literal["drain", "exclude", "report"]
DecisionAction = Literal["evict", "report"]

#: Ratios kept per episode (the median is taken over these); bounds memory on long episodes.
_MAX_EPISODE_RATIOS = 512


@dataclass(frozen=True)
class StragglerConfig:
    """Detection thresholds. Defaults follow issue 8: 1.5x for 50 steps or 5 minutes."""

    factor: float = 1.5
    clear_factor: float = 1.25
    window_steps: int = 50
    window_s: float = 300.0
    #: The time-based window also needs this many samples (a few slow reports are not a trend).
    min_window_samples: int = 5
    #: Share of an episode's samples that must be at or above `factor` for it to count: robust
    #: both to one huge outlier and to a ratio that flaps around the threshold.
    min_fraction_above: float = 0.75
    #: Consecutive samples below `clear_factor` that end an episode or clear a straggler.
    clear_samples: int = 3
    #: A peer's latest sample older than this (monotonic seconds) is not used for the median.
    max_age_s: float = 120.0
    #: Two samples of one replica further apart than this break its episode (missing data).
    max_gap_s: float = 120.0
    min_peers: int = 1
    ignore_after_heal_steps: int = 1
    #: The replica's own recent pace: the median of its last this many normal samples ...
    own_window: int = 20
    #: ... once it has at least this many; before that its samples are no evidence.
    min_own_samples: int = 3
    #: A replica that trains again after a recovery holds detection and eviction this long.
    recovery_hold_s: float = 60.0

    def __post_init__(self) -> None:
        if not self.factor > 1.0:
            raise ValueError(f"factor must be > 1, got {self.factor}")
        if not 1.0 <= self.clear_factor <= self.factor:
            raise ValueError(f"clear_factor must be in [1, factor], got {self.clear_factor}")
        if self.window_steps < 1 or self.window_s <= 0 or self.clear_samples < 1:
            raise ValueError("window_steps, window_s and clear_samples must be positive")
        if self.own_window < 1 or not 1 <= self.min_own_samples <= self.own_window:
            raise ValueError("own_window >= 1 and 1 <= min_own_samples <= own_window")
        if not self.recovery_hold_s >= 0:
            raise ValueError(f"recovery_hold_s must be >= 0, got {self.recovery_hold_s}")


@dataclass(frozen=True)
class TimingSample:
    """The timing part of one leader report, stamped with the coordinator's monotonic clock."""

    replica: int
    step: int
    received_at: float
    compute_s: float | None
    incarnation: str = ""
    healing: bool = False
    step_time_s: float | None = None
    allreduce_wait_s: float | None = None
    nodes: tuple[str, ...] = ()
    rank_compute_s: tuple[float, ...] = ()
    tasks_per_node: int | None = None

    @classmethod
    def from_report(cls, report: Any, received_at: float) -> TimingSample:
        """From a `runtime.protocol.ReplicaReport` (duck-typed to stay import-light)."""
        return cls(
            replica=report.replica,
            step=report.step,
            received_at=received_at,
            compute_s=report.compute_s,
            incarnation=report.incarnation,
            healing=report.healing,
            step_time_s=report.step_time_s,
            allreduce_wait_s=report.allreduce_wait_s,
            nodes=tuple(report.nodes),
            rank_compute_s=tuple(report.rank_compute_s),
        )

    @property
    def usable(self) -> bool:
        c = self.compute_s
        return not self.healing and c is not None and c > 0 and c == c and c != float("inf")


@dataclass(frozen=True)
class Episode:
    """A run of samples in which the replica was slower than `clear_factor` x its peers."""

    start_step: int
    start_t: float
    last_step: int
    last_t: float
    ratios: tuple[float, ...]
    below: int = 0  # consecutive samples below clear_factor

    @property
    def median_ratio(self) -> float:
        return statistics.median(self.ratios)

    def fraction_above(self, factor: float) -> float:
        return sum(r >= factor for r in self.ratios) / len(self.ratios)


@dataclass(frozen=True)
class ReplicaTrack:
    latest: TimingSample
    episode: Episode | None = None
    flagged: bool = False
    #: Samples up to and including this step are warm-up after healing or a new incarnation.
    ignore_until_step: int = -1
    last_ratio: float | None = None
    peer_median_s: float | None = None
    #: Compute times of the replica's latest normal samples (outside any episode).
    own: tuple[float, ...] = ()
    own_pace_s: float | None = None
    #: Compute time / the peers' median over the incarnation's first normal samples: where it
    #: stands among them when healthy (fixed once `own_window` samples are known).
    rel: tuple[float, ...] = ()


@dataclass(frozen=True)
class DetectorState:
    tracks: Mapping[int, ReplicaTrack] = field(default_factory=dict)
    #: The latest monotonic time seen; a smaller `received_at` later means the clock jumped back.
    clock: float = float("-inf")


@dataclass(frozen=True)
class StragglerVerdict:
    replica: int
    state: VerdictState
    #: Median of the replica's compute time / the median of its peers over the episode.
    factor: float | None = None
    compute_s: float | None = None
    peer_median_s: float | None = None
    since_step: int | None = None
    duration_s: float | None = None
    steps: int | None = None
    slow_rank: int | None = None
    slow_node: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "replica": self.replica,
            "state": self.state,
            "factor": None if self.factor is None else round(self.factor, 3),
            "compute_s": self.compute_s,
            "peer_median_s": self.peer_median_s,
            "since_step": self.since_step,
            "duration_s": None if self.duration_s is None else round(self.duration_s, 3),
            "steps": self.steps,
            "slow_rank": self.slow_rank,
            "slow_node": self.slow_node,
        }


def slowest_rank_node(
    nodes: Sequence[str], rank_compute_s: Sequence[float], tasks_per_node: int | None = None
) -> tuple[int | None, str | None]:
    """(slowest rank, its node) under block distribution; node None when the layout is unknown.

    A one-node replica's slow node is that node even without per-rank times.
    """
    rank: int | None = None
    if rank_compute_s:
        rank = max(range(len(rank_compute_s)), key=lambda r: rank_compute_s[r])
    if len(nodes) == 1:
        return rank, nodes[0]
    if rank is None or not nodes:
        return rank, None
    per_node = tasks_per_node
    if per_node is None:
        if len(rank_compute_s) % len(nodes):
            return rank, None
        per_node = len(rank_compute_s) // len(nodes)
    index = rank // per_node if per_node > 0 else len(nodes)
    return rank, nodes[index] if index < len(nodes) else None


def _peer_median(
    tracks: Mapping[int, ReplicaTrack], replica: int, now: float, config: StragglerConfig
) -> float | None:
    peers = [
        t.latest.compute_s
        for r, t in tracks.items()
        if r != replica
        and t.latest.usable
        and t.latest.step > t.ignore_until_step
        and 0 <= now - t.latest.received_at <= config.max_age_s
        and t.latest.compute_s is not None
    ]
    if len(peers) < config.min_peers:
        return None
    return statistics.median(peers)


def _own_pace(track: ReplicaTrack, config: StragglerConfig) -> float | None:
    """The replica's own recent compute time per step; None until enough samples are known."""
    if len(track.own) < config.min_own_samples:
        return None
    return statistics.median(track.own)


def _learn_pace(
    track: ReplicaTrack,
    old: ReplicaTrack,
    sample: TimingSample,
    median: float | None,
    config: StragglerConfig,
) -> ReplicaTrack:
    """While other replicas recover: a sample still teaches the replica's own pace, unless it is
    `clear_factor` slower than the pace already known or than its standing among its peers
    (a slowdown that starts meanwhile is not absorbed as the new normal), or an episode is
    open."""
    own = _own_pace(old, config)
    compute = sample.compute_s
    if compute is None or old.episode is not None:
        return track
    if own is not None and compute >= config.clear_factor * own:
        return track
    return _learn_normal(track, old, compute, median, config)


def _learn_normal(
    track: ReplicaTrack,
    old: ReplicaTrack,
    compute_s: float,
    median: float | None,
    config: StragglerConfig,
) -> ReplicaTrack:
    """Teach the replica's own pace a sample taken outside any episode, unless the sample is
    `clear_factor` slower against its peers than the replica stood among them at its start.

    A moving reference follows a slowdown that creeps in (a GPU throttling by degrees, each step
    a little slower than the median of the last ones) until it is the new normal and never
    flagged. The standing among its peers over the incarnation's first `own_window` samples
    is fixed, and still lets a replica that always ran behind them (a slower part, a busier
    shared CPU) learn its own pace."""
    if median is not None and median > 0:
        rel = compute_s / median
        start = statistics.median(old.rel) if old.rel else 1.0
        if rel >= config.clear_factor * max(1.0, start):
            return track
        if len(old.rel) < config.own_window:
            track = replace(track, rel=(*old.rel, rel))
    return replace(track, own=(*old.own, compute_s)[-config.own_window :])


def _sustained(ep: Episode, config: StragglerConfig) -> bool:
    if ep.fraction_above(config.factor) < config.min_fraction_above:
        return False
    # A window of N steps is N slow steps, the first and the last included.
    if ep.last_step - ep.start_step + 1 >= config.window_steps:
        return True
    return ep.last_t - ep.start_t >= config.window_s and len(ep.ratios) >= config.min_window_samples


def _advance(
    track: ReplicaTrack, sample: TimingSample, ratio: float, config: StragglerConfig
) -> ReplicaTrack:
    """Move one replica's episode and flag by one usable sample with a known ratio."""
    ep = track.episode
    if ep is not None and sample.received_at - ep.last_t > config.max_gap_s:
        ep = None  # missing data: the trend is not known to have held through the gap
    flagged = track.flagged
    if ratio >= config.clear_factor:
        if ep is None:
            if ratio >= config.factor:
                ep = Episode(
                    sample.step, sample.received_at, sample.step, sample.received_at, (ratio,)
                )
        else:
            ratios = (*ep.ratios, ratio)[-_MAX_EPISODE_RATIOS:]
            ep = replace(
                ep, last_step=sample.step, last_t=sample.received_at, ratios=ratios, below=0
            )
    elif ep is not None:
        below = ep.below + 1
        ep = (
            None
            if below >= config.clear_samples
            else replace(ep, last_step=sample.step, last_t=sample.received_at, below=below)
        )
    if ep is None:
        flagged = False
    elif not flagged and _sustained(ep, config):
        flagged = True
    return replace(track, latest=sample, episode=ep, flagged=flagged, last_ratio=ratio)


def observe(
    state: DetectorState,
    sample: TimingSample,
    config: StragglerConfig | None = None,
    evidence: bool = True,
) -> DetectorState:
    """Fold one sample into the detector state (returns a new state; the old one is unchanged).

    With `evidence=False` (another replica is recovering) the sample only becomes the replica's
    latest and, unless it is slow against it, teaches the replica's own pace: it never advances
    an episode.
    """
    config = config or StragglerConfig()
    tracks = dict(state.tracks)
    clock = state.clock
    if sample.received_at < clock:
        # The monotonic clock went backwards (e.g. the coordinator moved host): no time-based
        # evidence survives it, and nothing may trigger from it.
        tracks = {r: replace(t, episode=None, flagged=False) for r, t in tracks.items()}
    clock = sample.received_at
    old = tracks.get(sample.replica)
    same = old is not None and old.latest.incarnation == sample.incarnation
    if same and old is not None and sample.step <= old.latest.step:
        # A duplicate or a late (reordered) report: nothing new, and never a trigger.
        return DetectorState(tracks, clock)
    if old is None or old.latest.incarnation != sample.incarnation:
        track = ReplicaTrack(
            latest=sample, ignore_until_step=sample.step + config.ignore_after_heal_steps
        )
        if old is None and not sample.healing:
            track = replace(track, ignore_until_step=-1)
        tracks[sample.replica] = track
        return DetectorState(tracks, clock)
    if sample.healing:
        tracks[sample.replica] = replace(
            old, latest=sample, ignore_until_step=sample.step + config.ignore_after_heal_steps
        )
        return DetectorState(tracks, clock)
    if not evidence or not sample.usable or sample.step <= old.ignore_until_step:
        # No evidence either way; keep the episode (the gap rule ends it if data stays away).
        track = replace(old, latest=sample)
        if not evidence and sample.usable and sample.step > old.ignore_until_step:
            median = _peer_median(tracks, sample.replica, sample.received_at, config)
            track = _learn_pace(track, old, sample, median, config)
        tracks[sample.replica] = track
        return DetectorState(tracks, clock)
    assert sample.compute_s is not None
    median = _peer_median(tracks, sample.replica, sample.received_at, config)
    own = _own_pace(old, config)
    if median is None or median <= 0 or own is None or own <= 0:
        track = replace(old, latest=sample, last_ratio=None, peer_median_s=median, own_pace_s=own)
    else:
        # Slow against the others *and* against its own recent pace: the smaller ratio counts.
        ratio = min(sample.compute_s / median, sample.compute_s / own)
        track = replace(_advance(old, sample, ratio, config), peer_median_s=median, own_pace_s=own)
    if track.episode is None:
        track = _learn_normal(track, old, sample.compute_s, median, config)
    tracks[sample.replica] = track
    return DetectorState(tracks, clock)


def observe_all(
    samples: Iterable[TimingSample],
    config: StragglerConfig | None = None,
    state: DetectorState | None = None,
) -> DetectorState:
    state = state or DetectorState()
    for sample in samples:
        state = observe(state, sample, config)
    return state


def verdicts(state: DetectorState) -> list[StragglerVerdict]:
    """One verdict per known replica, by replica id."""
    return [_verdict(replica, state.tracks[replica]) for replica in sorted(state.tracks)]


def _verdict(replica: int, t: ReplicaTrack) -> StragglerVerdict:
    ep = t.episode
    if ep is None:
        return StragglerVerdict(replica, "ok", t.last_ratio, t.latest.compute_s, t.peer_median_s)
    rank, node = slowest_rank_node(t.latest.nodes, t.latest.rank_compute_s, t.latest.tasks_per_node)
    return StragglerVerdict(
        replica=replica,
        state="straggler" if t.flagged else "suspect",
        factor=ep.median_ratio,
        compute_s=t.latest.compute_s,
        peer_median_s=t.peer_median_s,
        since_step=ep.start_step,
        duration_s=ep.last_t - ep.start_t,
        steps=ep.last_step - ep.start_step,
        slow_rank=rank,
        slow_node=node,
    )


def stragglers(state: DetectorState) -> list[StragglerVerdict]:
    """The flagged replicas' verdicts, by replica id (asked after every report: only the
    flagged tracks are turned into verdicts)."""
    flagged = [k for k, t in state.tracks.items() if t.flagged and t.episode is not None]
    return [_verdict(k, state.tracks[k]) for k in sorted(flagged)]


# -- decision ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvictionConfig:
    mode: EvictionMode = "drain"
    max_evictions: int = 2
    min_replicas: int = 1
    #: Used until this run has measured a requeue of its own (fault -> replacement participating).
    requeue_cost_estimate_s: float = 120.0

    def __post_init__(self) -> None:
        if self.mode not in ("drain", "exclude", "report"):
            raise ValueError(f"mode must be drain, exclude or report, got {self.mode!r}")
        if self.max_evictions < 0 or self.min_replicas < 1 or self.requeue_cost_estimate_s < 0:
            raise ValueError("max_evictions >= 0, min_replicas >= 1, requeue cost >= 0")


@dataclass(frozen=True)
class RunContext:
    """What the decision needs to know about the run right now."""

    #: Replicas currently participating (training or healing; not requeued, pending or out).
    participants: int
    evictions_so_far: int = 0
    #: An eviction (or any requeue) is still in flight: act on one straggler at a time.
    eviction_in_flight: bool = False
    #: Durations of this run's past requeues, fault -> replacement participating (seconds).
    past_requeue_costs_s: tuple[float, ...] = ()
    #: Steps left in the run, when the run has a step budget.
    remaining_steps: int | None = None
    #: The run's current step time (everyone waits for the straggler); median over replicas.
    run_step_time_s: float | None = None
    #: Other replicas recovering now (starting, healing, or training again for less than
    #: `recovery_hold_s`): their recovery loads the machines and every step waits for them.
    recovering: tuple[int, ...] = ()


@dataclass(frozen=True)
class StragglerDecision:
    replica: int
    action: DecisionAction
    node: str | None
    factor: float | None
    #: Drain the node (mode "drain"); else the node is only excluded for this run.
    drain: bool = False
    reason: str = ""
    why: str = ""
    slowdown: float | None = None
    remaining_s: float | None = None
    gain_s: float | None = None
    cost_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def requeue_cost(ctx: RunContext, config: EvictionConfig) -> float:
    """The run's own measured requeue cost (median), else the configured estimate."""
    if ctx.past_requeue_costs_s:
        return float(statistics.median(ctx.past_requeue_costs_s))
    return config.requeue_cost_estimate_s


def run_slowdown(verdict: StragglerVerdict, run_step_time_s: float | None) -> float | None:
    """Fraction by which the straggler lengthens the run's steps: (T_now - T_normal) / T_normal.

    The excess is the straggler's compute time over its peers' median; `T_now` is the run's
    measured step time, but never less than the straggler's compute (a replica's reported step
    time may leave out the time it waited for the straggler at the quorum), and `T_normal` is
    `T_now` minus the excess.
    """
    if verdict.compute_s is None or verdict.peer_median_s is None:
        return None
    excess = max(0.0, verdict.compute_s - verdict.peer_median_s)
    step = max(run_step_time_s or 0.0, verdict.compute_s)
    return excess / (step - excess) if step > excess else None


def decide(
    verdict: StragglerVerdict, ctx: RunContext, config: EvictionConfig | None = None
) -> StragglerDecision:
    """Evict a straggler when that pays, else report it; `verdict` must be a straggler's."""
    config = config or EvictionConfig()
    factor = verdict.factor
    node = verdict.slow_node
    base = StragglerDecision(verdict.replica, "report", node, factor)

    def report(why: str, **kw: Any) -> StragglerDecision:
        return replace(base, why=why, **kw)

    if verdict.state != "straggler":
        return report(f"not a straggler ({verdict.state})")
    if config.mode == "report":
        return report("eviction disabled (mode=report)")
    if node is None:
        return report("slow node unknown (no per-rank times or layout)")
    if ctx.recovering:
        who = ", ".join(map(str, ctx.recovering))
        return report(f"holding off: replica {who} is recovering")
    if ctx.eviction_in_flight:
        return report("another eviction or requeue is in flight")
    if ctx.evictions_so_far >= config.max_evictions:
        return report(f"eviction cap reached ({ctx.evictions_so_far}/{config.max_evictions})")
    if ctx.participants - 1 < config.min_replicas:
        return report(
            f"evicting would leave {ctx.participants - 1} < min_replicas={config.min_replicas}"
        )
    slowdown = run_slowdown(verdict, ctx.run_step_time_s)
    cost = requeue_cost(ctx, config)
    if slowdown is None or ctx.remaining_steps is None:
        return report("slowdown or remaining time unknown", slowdown=slowdown, cost_s=cost)
    step_s = max(ctx.run_step_time_s or 0.0, verdict.compute_s or 0.0)
    normal_step_s = step_s / (1.0 + slowdown)
    remaining_s = max(0, ctx.remaining_steps) * normal_step_s
    gain = slowdown * remaining_s
    base = replace(base, slowdown=slowdown, remaining_s=remaining_s, gain_s=gain, cost_s=cost)
    if gain <= cost:
        return report(f"does not pay: {gain:.0f}s lost <= {cost:.0f}s requeue")
    shown = factor if factor is not None else 1.0 + slowdown
    return replace(
        base,
        action="evict",
        drain=config.mode == "drain",
        reason=drain_reason("straggler", f"{node} {shown:.1f}x"),
        why=f"pays: {gain:.0f}s lost > {cost:.0f}s requeue",
    )


# -- the coordinator's side -------------------------------------------------------------------


def describe(verdict: StragglerVerdict) -> str:
    """One short line for `fthsdp status`: `straggler 2.0x node4 (52 steps)`."""
    if verdict.state == "ok":
        return "ok"
    text = f"{verdict.state} {verdict.factor or 0.0:.1f}x"
    if verdict.slow_node:
        text += f" {verdict.slow_node}"
    if verdict.steps is not None:
        text += f" ({verdict.steps} steps, {verdict.duration_s or 0.0:.0f}s)"
    return text


class StragglerMonitor:
    """Detector state plus the run's eviction bookkeeping, held by the coordinator.

    The coordinator feeds every accepted report (`observe`, with its monotonic receive time),
    tells the monitor when a replica's job was requeued for another reason (`note_requeue`, so
    the run's own requeue cost is measured: requeue -> the new incarnation's first participating
    step), and asks for `decisions` after each report. While a requeue is pending no other
    eviction is decided. A decision is returned once per change (a straggler that
    keeps being reported is not re-announced on every report), and a replica incarnation is
    evicted at most once. This class does no I/O; the coordinator acts on the decisions.
    """

    def __init__(
        self,
        detect: StragglerConfig | None = None,
        evict: EvictionConfig | None = None,
        total_steps: int | None = None,
    ) -> None:
        self.detect = detect or StragglerConfig()
        self.evict = evict or EvictionConfig()
        self.total_steps = total_steps
        self.state = DetectorState()
        self.evictions = 0
        self.evicted: set[tuple[int, str]] = set()
        self.requeue_costs: list[float] = []
        self._requeued_at: dict[int, tuple[str, float]] = {}
        self._announced: dict[int, tuple[str, str, str]] = {}

    def observe(self, report: Any, received_at: float) -> None:
        self.observe_sample(TimingSample.from_report(report, received_at))

    def observe_sample(self, sample: TimingSample, evidence: bool = True) -> None:
        """Fold in one sample; `evidence=False` while another replica is recovering."""
        received_at = sample.received_at
        pending = self._requeued_at.get(sample.replica)
        if pending is not None and sample.incarnation != pending[0] and not sample.healing:
            if received_at >= pending[1]:
                self.requeue_costs.append(received_at - pending[1])
            del self._requeued_at[sample.replica]
        self.state = observe(self.state, sample, self.detect, evidence)

    def note_requeue(self, replica: int, at: float) -> None:
        """The replica's job was requeued (for any reason) at monotonic time `at`."""
        track = self.state.tracks.get(replica)
        self._requeued_at[replica] = (track.latest.incarnation if track else "", at)

    def verdicts(self) -> list[StragglerVerdict]:
        return verdicts(self.state)

    def context(
        self, participants: int, in_flight: bool, recovering: tuple[int, ...] = ()
    ) -> RunContext:
        latest = [t.latest for t in self.state.tracks.values()]
        steps = [s.step for s in latest]
        times = [s.step_time_s for s in latest if s.step_time_s is not None and not s.healing]
        remaining = None
        if self.total_steps is not None and steps:
            remaining = max(0, self.total_steps - max(steps))
        return RunContext(
            participants=participants,
            evictions_so_far=self.evictions,
            eviction_in_flight=in_flight or bool(self._requeued_at),
            past_requeue_costs_s=tuple(self.requeue_costs),
            remaining_steps=remaining,
            run_step_time_s=statistics.median(times) if times else None,
            recovering=recovering,
        )

    def decisions(
        self,
        participants: int,
        now: float,
        in_flight: bool = False,
        recovering: tuple[int, ...] = (),
    ) -> list[StragglerDecision]:
        """New decisions for the current stragglers; at most one eviction, counted as taken
        (and its requeue noted at monotonic time `now`). `recovering`: the replicas recovering
        now; a straggler waits while any replica other than itself is."""
        out = []
        for v in stragglers(self.state):
            track = self.state.tracks[v.replica]
            key = (v.replica, track.latest.incarnation)
            if key in self.evicted:
                continue
            others = tuple(k for k in recovering if k != v.replica)
            d = decide(v, self.context(participants, in_flight, others), self.evict)
            summary = (track.latest.incarnation, d.action, d.why.split(":")[0])
            if self._announced.get(v.replica) == summary:
                continue
            self._announced[v.replica] = summary
            if d.action == "evict":
                self.evicted.add(key)
                self.evictions += 1
                self.note_requeue(v.replica, now)
            out.append(d)
        return out


# -- coordinator glue -------------------------------------------------------------------------

#: Policy phases in which a replica is doing useful work (for ETTR) / counts as participating.
_PRODUCTIVE = ("training",)
_PARTICIPATING = ("training", "healing")
_IN_FLIGHT = ("requeued", "pending", "starting", "restarting")
#: Phases in which a replica is recovering (or not yet up): other replicas' samples are no
#: evidence and no eviction is decided meanwhile.
_RECOVERING = ("pending", "starting", "restarting", "requeued", "healing")
#: Phases of a replica that will not train again (nothing to wait for).
_FINISHED = ("done", "out", "ended")


def recovering_replicas(
    phases: Iterable[tuple[int, str, float, bool]], replica: int, at: float, hold_s: float
) -> tuple[int, ...]:
    """The replicas other than `replica` that are recovering at wall time `at`, from
    (replica, phase, phase_since, handled) rows: starting, healing, requeued, a failure being
    handled, or training again for less than `hold_s`."""
    out = []
    for k, phase, since, handled in phases:
        if k == replica or phase in _FINISHED:
            continue  # finished or left out: nothing to wait for
        warming = phase == "training" and 0 <= at - since < hold_s
        if phase in _RECOVERING or handled or warming:
            out.append(k)
    return tuple(sorted(out))


class StragglerService:
    """What the coordinator holds for stragglers and metrics, behind three small hooks.

    `on_report` feeds the monitor (a report without nodes gets the replica's job nodes the
    policy state knows from squeue) and turns its eviction decisions into the policy's
    `StragglerEviction` events (the tier-2 path: drain + requeue); `on_actions` tells the monitor
    about the policy's other requeues (their cost is measured); `view` adds the verdicts, the
    replicas' timings, ETTR so far and the requeue counts to the coordinator's state view (which
    `fthsdp status` and `/metrics` read).
    """

    def __init__(
        self,
        min_replicas: int,
        total_steps: int | None = None,
        detect: StragglerConfig | None = None,
        evict: EvictionConfig | None = None,
        past_evictions: int = 0,
    ) -> None:
        evict = evict or EvictionConfig(min_replicas=min_replicas)
        self.monitor = StragglerMonitor(detect, evict, total_steps)
        self.monitor.evictions = past_evictions
        self.decisions: dict[int, StragglerDecision] = {}
        self.phase_seconds: dict[int, dict[str, float]] = {}
        self._phase_at: dict[int, tuple[str, float]] = {}
        # Which replicas may be recovering, kept up to date from the replicas that changed
        # (`note_changed`) so that a report does not look at every replica: `_unsettled` are
        # recovering whatever the time (starting, healing, requeued, handled); `_warming` are
        # training since the given wall time (recovering within `recovery_hold_s` of it).
        self._unsettled: set[int] = set()
        self._warming: dict[int, float] = {}
        self._noted: Any = None
        self._dirty: set[int] = set()
        self._dirty_all = True
        self._last_at = float("-inf")

    def note_changed(self, old: Any, new: Any, replicas: Iterable[int] | None) -> None:
        """The policy state went from `old` to `new`; only `replicas` (None: any) changed. Lets
        `on_report` look at the replicas that may be recovering instead of at every replica
        (a state it was not told about is looked at in full)."""
        if replicas is None or old is not self._noted:
            self._dirty_all = True
        else:
            self._dirty.update(replicas)
        self._noted = new

    def _refresh(self, state: Any, at: float) -> None:
        """Bring `_unsettled` and `_warming` up to `state` at wall time `at` (in full for a
        state it was not told about, or when time ran backwards)."""
        full = self._dirty_all or state is not self._noted or at < self._last_at
        todo: Iterable[int] = list(state.replicas) if full else self._dirty
        if full:
            self._unsettled.clear()
            self._warming.clear()
        for k in todo:
            self._unsettled.discard(k)
            self._warming.pop(k, None)
            r = state.replicas.get(k)
            if r is None or r.phase in _FINISHED:
                continue
            if r.phase in _RECOVERING or r.handled is not None:
                self._unsettled.add(k)
            elif r.phase == "training":
                self._warming[k] = r.phase_since
        self._dirty = set()
        self._dirty_all = False
        self._noted = state
        self._last_at = at

    def _others_recovering(self, replica: int, at: float) -> bool:
        """Whether a replica other than `replica` is recovering (after `_refresh`)."""
        if len(self._unsettled) > 1 or (self._unsettled and replica not in self._unsettled):
            return True
        hold = self.monitor.detect.recovery_hold_s
        expired = []
        found = False
        for k, since in self._warming.items():
            if at - since >= hold:
                expired.append(k)  # settled for good: time only runs forward here
            elif k != replica and at - since >= 0:
                found = True
                break
        for k in expired:
            del self._warming[k]
        return found

    def _recovering(self, state: Any, at: float) -> tuple[int, ...]:
        """`recovering_replicas` of every replica (after `_refresh`): only the candidates."""
        rows = []
        for k in self._unsettled | set(self._warming):
            r = state.replicas[k]
            rows.append((k, r.phase, r.phase_since, r.handled is not None))
        return recovering_replicas(rows, -1, at, self.monitor.detect.recovery_hold_s)

    def on_report(self, report: Any, state: Any, now: float, at: float) -> list[Any]:
        """Observe one accepted report (monotonic `now`); the policy events to submit."""
        from runtime.control.policy import StragglerEviction

        sample = TimingSample.from_report(report, now)
        known = state.replicas.get(report.replica)
        if not sample.nodes and known is not None and known.nodes:
            # A leader that does not know its nodes (ranks given RANK/MASTER_ADDR instead of
            # Slurm's step variables) still runs where squeue says the replica's job runs.
            sample = replace(sample, nodes=tuple(known.nodes))
        self._refresh(state, at)
        evidence = not self._others_recovering(report.replica, at)
        self.monitor.observe_sample(sample, evidence=evidence)
        if not stragglers(self.monitor.state):
            return []  # nothing to decide: skip the counts over every replica
        recovering = self._recovering(state, at)  # every replica, for decisions
        reps = state.replicas.values()
        participants = sum(1 for r in reps if r.phase in _PARTICIPATING)
        in_flight = any(r.phase in _IN_FLIGHT or r.handled is not None for r in reps)
        events = []
        for d in self.monitor.decisions(participants, now, in_flight, recovering):
            self.decisions[d.replica] = d
            if d.action == "evict":
                detail = d.reason.split("straggler: ", 1)[-1]
                node = d.node if d.drain else None
                exclude = d.node if not d.drain else None
                events.append(StragglerEviction(d.replica, at, node, detail, exclude))
        return events

    def on_actions(self, actions: Iterable[Any], now: float) -> None:
        from runtime.control.policy import Requeue

        for a in actions:
            if isinstance(a, Requeue) and a.replica not in self.monitor._requeued_at:
                self.monitor.note_requeue(a.replica, now)

    def account(self, state: Any, now: float, replicas: Iterable[int] | None = None) -> None:
        """Accumulate each replica's time per policy phase (monotonic), for ETTR.

        `replicas`: only these changed since the last call (None: any may have). A replica's
        phase is constant between its changes, so accounting it only then (and for every
        replica when the figures are read) adds up the same seconds."""
        pairs = (
            state.replicas.items()
            if replicas is None
            else ((k, state.replicas[k]) for k in replicas if k in state.replicas)
        )
        for k, r in pairs:
            last = self._phase_at.get(k)
            if last is not None:
                spent = self.phase_seconds.setdefault(k, {})
                spent[last[0]] = spent.get(last[0], 0.0) + max(0.0, now - last[1])
            self._phase_at[k] = (r.phase, now)

    def ettr(self) -> float | None:
        total = sum(sum(p.values()) for p in self.phase_seconds.values())
        if total <= 0:
            return None
        good = sum(p.get(n, 0.0) for p in self.phase_seconds.values() for n in _PRODUCTIVE)
        return good / total

    def view(self, data: dict[str, Any]) -> dict[str, Any]:
        """Extend the coordinator's state view (a dict from `RunState.to_dict`) in place."""
        by_replica = {v.replica: v for v in self.monitor.verdicts()}
        tracks = self.monitor.state.tracks
        for row in data.get("replicas", []):
            k = row["replica"]
            v = by_replica.get(k)
            row["straggler"] = v.state if v else None
            row["straggler_factor"] = v.factor if v else None
            row["straggler_text"] = describe(v) if v else None
            t = tracks.get(k)
            if t is not None:
                row["compute_s"] = t.latest.compute_s
                row["allreduce_wait_s"] = t.latest.allreduce_wait_s
                row["step_time_s"] = t.latest.step_time_s
                row["healing"] = t.latest.healing
                row["own_pace_s"] = t.own_pace_s
                row["peer_median_s"] = t.peer_median_s
        reps = data.get("replicas", [])
        evictions = self.monitor.evictions
        requeues = sum(int(r.get("requeues", 0)) for r in reps)
        data["stragglers"] = [v.to_dict() for v in by_replica.values() if v.state != "ok"]
        data["straggler_decisions"] = [d.to_dict() for _, d in sorted(self.decisions.items())]
        data["evictions"] = evictions
        data["requeue_costs_s"] = list(self.monitor.requeue_costs)
        data["requeues_by_reason"] = {
            "relaunch": sum(int(r.get("relaunches", 0)) for r in reps),
            "slurm": sum(int(r.get("slurm_requeues", 0)) for r in reps),
            "straggler": evictions,
            "fault": max(0, requeues - evictions),
        }
        data["ettr"] = self.ettr()
        config = data.get("config", {})
        data.setdefault("replicas_configured", config.get("replicas"))
        data.setdefault("min_replicas", config.get("min_replicas"))
        return data
