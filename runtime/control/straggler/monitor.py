"""The straggler monitor: per-replica detector state and the run's eviction bookkeeping.

The detector (`detect`) and the decision (`evict`) are pure; this is the state they are
folded into as reports arrive: which replica incarnations were evicted, how many evictions the
run took, and how long this run's own requeues took (the measured cost a decision weighs). It
does no I/O: the coordinator (through `service`) and the local launcher feed it and act on what
it decides.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from runtime.control.straggler.detect import (
    DetectorState,
    StragglerConfig,
    StragglerVerdict,
    TimingSample,
    observe,
    stragglers,
    verdicts,
)
from runtime.control.straggler.evict import (
    EvictionConfig,
    RunContext,
    StragglerDecision,
    decide,
)

if TYPE_CHECKING:
    from runtime.protocol import ReplicaReport


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

    def observe(self, report: ReplicaReport, received_at: float) -> None:
        self.observe_sample(TimingSample.from_report(report, received_at))

    def observe_sample(self, sample: TimingSample, evidence: bool = True) -> None:
        """Fold in one sample; `evidence=False` while another replica is recovering."""
        received_at = sample.received_at
        pending = self._requeued_at.get(sample.replica)
        if pending is not None and sample.incarnation != pending[0] and not sample.healing:
            if received_at >= pending[1]:
                self.requeue_costs.append(received_at - pending[1])
            del self._requeued_at[sample.replica]
        self.state = observe(self.state, sample, self.detect, evidence, owned=True)

    def note_requeue(self, replica: int, at: float) -> None:
        """The replica's job was requeued (for any reason) at monotonic time `at`."""
        track = self.state.tracks.get(replica)
        self._requeued_at[replica] = (track.latest.incarnation if track else "", at)

    def requeue_pending(self, replica: int) -> bool:
        """Whether a requeue of the replica was noted and its new incarnation not seen yet."""
        return replica in self._requeued_at

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
