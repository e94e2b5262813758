"""Straggler detection, as pure functions over plain data.

Detection (`observe`) compares each replica's own compute time per step (forward, backward and
the local reduce-scatter, without the cross-replica wait, so a replica waiting for the straggler
does not look slow itself) with the median of the other replicas' latest compute times, and with
its own recent pace (the median of its last `own_window` normal samples; a sample slower
against its peers than the replica stood among them at its start is not normal, so a slowdown
that creeps in is never learned as the pace). A sample is slow only when it is `factor` times
slower than both: a replica that got no slower while its peers sped up
(or whose peers share one busy CPU, as on the dev cluster) is not a straggler. A replica that
has not learned a pace of its own after `min_own_samples` samples was `clear_factor` slower than
its peers from its first steps (a node degraded from the moment it was allocated): its peers
alone are then the reference, so it is caught within the window of its first steps (and, with
its peers as the only reference, at least `min_window_samples` reports). A replica
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
  and catch-up load the machine and the network, and every step waits for it anyway; nor are
  a replacement's own samples within its `recovery_hold_s` (`runtime.control.straggler.service`).

The slow *node* is the node of the replica's slowest rank: ranks are laid out in blocks over the
replica's nodes (Slurm's default block distribution), `tasks_per_node` ranks on each.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from runtime.protocol import ReplicaReport

VerdictState = Literal["ok", "suspect", "straggler"]
#: Ratios kept per episode (the median is taken over these); bounds memory on long episodes.
_MAX_EPISODE_RATIOS = 512


@dataclass(frozen=True)
class StragglerConfig:
    """Detection thresholds. Defaults follow issue 8: 1.5x for 50 steps or 5 minutes."""

    factor: float = 1.5
    clear_factor: float = 1.25
    window_steps: int = 50
    window_s: float = 300.0
    #: The time-based window also needs this many samples (a few slow reports are not a trend),
    #: and so does the window of steps of a replica judged by its peers alone.
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
    def from_report(cls, report: ReplicaReport, received_at: float) -> TimingSample:
        """The timing fields of one leader report."""
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
    #: Usable samples of this incarnation compared with its peers so far.
    seen: int = 0


@dataclass(frozen=True)
class DetectorState:
    tracks: Mapping[int, ReplicaTrack] = field(default_factory=dict)
    #: The latest monotonic time seen; a smaller `received_at` later means the clock jumped back.
    clock: float = float("-inf")
    #: The replicas whose latest sample can be a peer's reference (`_candidate`): replica ->
    #: (compute_s, received_at), with both values also kept sorted, so that the peers' median
    #: is found without a pass over every replica on every report (`_peer_median`).
    peers: Mapping[int, tuple[float, float]] = field(default_factory=dict)
    computes: Sequence[float] = ()
    times: Sequence[float] = ()
    #: The replicas whose track is flagged with an open episode (what `stragglers` reports),
    #: kept by `observe` so that the question asked after every report needs no pass over
    #: every track.
    flagged: frozenset[int] = frozenset()
    #: Samples received before this time have left the peer index (`_expired`): a replica
    #: that stopped reporting would otherwise send every other replica's report to a pass
    #: over every track, since the index's oldest sample would stay too old for good.
    horizon: float = float("-inf")


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


def _candidate(t: ReplicaTrack) -> tuple[float, float] | None:
    """(compute_s, received_at) when the track's latest sample may serve as a peer's reference
    (usable and past its warm-up; its age is judged when asked), else None."""
    s = t.latest
    if s.usable and s.step > t.ignore_until_step and s.compute_s is not None:
        return s.compute_s, s.received_at
    return None


def _indexed(
    state: DetectorState,
    tracks: Mapping[int, ReplicaTrack],
    clock: float,
    replica: int,
    owned: bool = False,
) -> DetectorState:
    """The new state: `tracks` (where only `replica` changed its sample or warm-up) with the
    peer index and the flagged set of `state` brought up to date for `replica`; `owned`: the
    index's containers are updated in place (see `observe`)."""
    track = tracks.get(replica)
    flagged = state.flagged
    now_flagged = track is not None and track.flagged and track.episode is not None
    if now_flagged != (replica in flagged):
        flagged = flagged | {replica} if now_flagged else flagged - {replica}
    new = _candidate(track) if track is not None else None
    old = state.peers.get(replica)
    if new == old:
        return DetectorState(
            tracks, clock, state.peers, state.computes, state.times, flagged, state.horizon
        )
    peers = state.peers if owned and isinstance(state.peers, dict) else dict(state.peers)
    computes = _own_list(state.computes, owned)
    times = _own_list(state.times, owned)
    if old is not None:
        del peers[replica]
        del computes[bisect.bisect_left(computes, old[0])]
        del times[bisect.bisect_left(times, old[1])]
    if new is not None:
        peers[replica] = new
        bisect.insort(computes, new[0])
        bisect.insort(times, new[1])
    if owned:
        return DetectorState(tracks, clock, peers, computes, times, flagged, state.horizon)
    return DetectorState(
        tracks, clock, peers, tuple(computes), tuple(times), flagged, state.horizon
    )


def _expired(state: DetectorState, cut: float, owned: bool) -> DetectorState:
    """`state` with the peer index's samples received before `cut` left out (the horizon moved
    to `cut`). A replica that stopped reporting costs one pass here, when its sample ages out,
    and its next sample puts it back (`_indexed`)."""
    times = state.times
    if not times or times[0] >= cut:
        return state
    peers = state.peers if owned and isinstance(state.peers, dict) else dict(state.peers)
    computes = _own_list(state.computes, owned)
    for r in [r for r, (_c, t) in peers.items() if t < cut]:
        compute, _t = peers.pop(r)
        del computes[bisect.bisect_left(computes, compute)]
    kept = list(times[bisect.bisect_left(times, cut) :])
    return replace(
        state,
        peers=peers,
        computes=computes if owned else tuple(computes),
        times=kept if owned else tuple(kept),
        horizon=max(state.horizon, cut),
    )


def _reindexed(state: DetectorState, tracks: Mapping[int, ReplicaTrack]) -> DetectorState:
    """The peer index built anew from `tracks` (every candidate, the horizon reset): after the
    clock ran back, samples that left the index may be fresh again."""
    peers = {r: c for r, t in tracks.items() if (c := _candidate(t)) is not None}
    computes = sorted(c for c, _t in peers.values())
    times = sorted(t for _c, t in peers.values())
    return DetectorState(tracks, state.clock, peers, computes, times, state.flagged)


def _own_list(values: Sequence[float], owned: bool) -> list[float]:
    """`values` itself when it is an owned list (updated in place), else a copy."""
    return values if owned and isinstance(values, list) else list(values)


def _without(values: Sequence[float], value: float | None) -> tuple[float, float]:
    """(smallest, largest) of `values` with one `value` left out (None: none left out)."""
    lo, hi = 0, len(values) - 1
    if value is not None and values[lo] == value:
        lo += 1
    elif value is not None and values[hi] == value:
        hi -= 1
    return values[lo], values[hi]


def _peer_median(
    state: DetectorState, replica: int, now: float, config: StragglerConfig
) -> float | None:
    """The median of the other replicas' latest compute times that are no older than
    `max_age_s`; None with fewer than `min_peers` of them. From the sorted index when every
    other candidate is fresh (the usual case), else by a pass over the tracks."""
    if now - config.max_age_s < state.horizon:
        return _scan(state, replica, now, config)  # asked of a time before samples left
    own = state.peers.get(replica)
    n = len(state.computes) - (own is not None)
    if n <= 0:
        return None
    oldest, _ = _without(state.times, own[1] if own else None)
    _, newest = _without(state.times, own[1] if own else None)
    if now < newest or now - oldest > config.max_age_s:
        return _scan(state, replica, now, config)
    if n < config.min_peers:
        return None
    skip = bisect.bisect_left(state.computes, own[0]) if own else n + 1

    def at(k: int) -> float:
        return state.computes[k if k < skip else k + 1]

    mid = n // 2
    return at(mid) if n % 2 else (at(mid - 1) + at(mid)) / 2


def _scan(state: DetectorState, replica: int, now: float, config: StragglerConfig) -> float | None:
    """The peers' median by a pass over every track (samples that left the index included)."""
    candidates = (_candidate(t) for r, t in state.tracks.items() if r != replica)
    peers = [c[0] for c in candidates if c is not None and 0 <= now - c[1] <= config.max_age_s]
    if len(peers) < config.min_peers or not peers:
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


def _sustained(ep: Episode, config: StragglerConfig, peers_only: bool = False) -> bool:
    """Whether the episode is a straggler. Judged by its peers alone (no pace of its own yet),
    a replica also needs `min_window_samples` reports for the window of steps: a replica that
    starts last on a busy machine can trail its peers for the few reports of a short window."""
    if ep.fraction_above(config.factor) < config.min_fraction_above:
        return False
    # A window of N steps is N slow steps, the first and the last included.
    if ep.last_step - ep.start_step + 1 >= config.window_steps:
        return not peers_only or len(ep.ratios) >= config.min_window_samples
    return ep.last_t - ep.start_t >= config.window_s and len(ep.ratios) >= config.min_window_samples


def _advance(
    track: ReplicaTrack,
    sample: TimingSample,
    ratio: float,
    config: StragglerConfig,
    peers_only: bool = False,
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
    elif not flagged and _sustained(ep, config, peers_only):
        flagged = True
    return replace(track, latest=sample, episode=ep, flagged=flagged, last_ratio=ratio)


def observe(
    state: DetectorState,
    sample: TimingSample,
    config: StragglerConfig | None = None,
    evidence: bool = True,
    owned: bool = False,
) -> DetectorState:
    """Fold one sample into the detector state (returns a new state; the old one is unchanged).

    With `evidence=False` (another replica is recovering) the sample only becomes the replica's
    latest and, unless it is slow against it, teaches the replica's own pace: it never advances
    an episode.

    `owned=True` is for a caller that keeps only the state returned (the monitor): the old
    state's containers are then updated in place and shared with the new one. Copying the
    tracks and the peer index costs O(replicas) a sample, most of a report's detection time
    at a thousand replicas.
    """
    config = config or StragglerConfig()
    tracks = state.tracks if owned and isinstance(state.tracks, dict) else dict(state.tracks)
    clock = state.clock
    if sample.received_at < clock:
        # The monotonic clock went backwards (e.g. the coordinator moved host): no time-based
        # evidence survives it, and nothing may trigger from it.
        tracks = {r: replace(t, episode=None, flagged=False) for r, t in tracks.items()}
        state = _reindexed(replace(state, flagged=frozenset()), tracks)
    clock = sample.received_at
    state = _expired(state, clock - config.max_age_s, owned)
    old = tracks.get(sample.replica)
    same = old is not None and old.latest.incarnation == sample.incarnation
    if same and old is not None and sample.step <= old.latest.step:
        # A duplicate or a late (reordered) report: nothing new, and never a trigger.
        return _indexed(state, tracks, clock, sample.replica, owned)
    if old is None or old.latest.incarnation != sample.incarnation:
        track = ReplicaTrack(
            latest=sample, ignore_until_step=sample.step + config.ignore_after_heal_steps
        )
        if old is None and not sample.healing:
            track = replace(track, ignore_until_step=-1)
        tracks[sample.replica] = track
        return _indexed(state, tracks, clock, sample.replica, owned)
    if sample.healing:
        tracks[sample.replica] = replace(
            old, latest=sample, ignore_until_step=sample.step + config.ignore_after_heal_steps
        )
        return _indexed(state, tracks, clock, sample.replica, owned)
    if not evidence or not sample.usable or sample.step <= old.ignore_until_step:
        # No evidence either way; keep the episode (the gap rule ends it if data stays away).
        track = replace(old, latest=sample)
        if not evidence and sample.usable and sample.step > old.ignore_until_step:
            median = _peer_median(state, sample.replica, sample.received_at, config)
            track = _learn_pace(track, old, sample, median, config)
        tracks[sample.replica] = track
        return _indexed(state, tracks, clock, sample.replica, owned)
    assert sample.compute_s is not None
    median = _peer_median(state, sample.replica, sample.received_at, config)
    own = _own_pace(old, config)
    seen = old.seen + (median is not None and median > 0)
    if median is None or median <= 0 or (own is None and seen <= config.min_own_samples):
        track = replace(old, latest=sample, last_ratio=None, peer_median_s=median, own_pace_s=own)
    else:
        # Slow against the others *and* against its own recent pace: the smaller ratio counts.
        # A replica that never learned a pace of its own was slow against its peers from its
        # first samples on (a node degraded from allocation): its peers are the reference.
        ratio = sample.compute_s / median
        if own is not None and own > 0:
            ratio = min(ratio, sample.compute_s / own)
        advanced = _advance(old, sample, ratio, config, peers_only=own is None)
        track = replace(advanced, peer_median_s=median, own_pace_s=own)
    track = replace(track, seen=seen)
    if track.episode is None:
        track = _learn_normal(track, old, sample.compute_s, median, config)
    tracks[sample.replica] = track
    return _indexed(state, tracks, clock, sample.replica, owned)


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
    return [_verdict(k, state.tracks[k]) for k in sorted(state.flagged)]


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
