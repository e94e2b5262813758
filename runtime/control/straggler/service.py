"""The straggler glue to the coordinator: reports in, policy eviction events out.

The monitor knows replicas only by their timing; the coordinator knows them by their policy
phase (training, healing, requeued, ...). This module maps one onto the other: which replicas
are recovering (samples are then no evidence and no eviction is decided), how many
participate, which policy requeues the monitor should time, each replica's time per phase
(ETTR), and the straggler columns of the coordinator's state view.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from runtime.control.policy import (
    FINISHED_PHASES,
    Action,
    ReplicaState,
    Requeue,
    RunState,
    StragglerEviction,
)
from runtime.control.straggler.detect import StragglerConfig, TimingSample, describe, stragglers
from runtime.control.straggler.evict import EvictionConfig, StragglerDecision
from runtime.control.straggler.monitor import StragglerMonitor
from runtime.protocol import ReplicaReport

#: Policy phases in which a replica is doing useful work (for ETTR) / counts as participating.
_PRODUCTIVE = ("training",)
_PARTICIPATING = ("training", "healing")
_IN_FLIGHT = ("requeued", "pending", "starting", "restarting")
#: Phases in which a replica is recovering (or not yet up): other replicas' samples are no
#: evidence and no eviction is decided meanwhile.
_RECOVERING = ("pending", "starting", "restarting", "requeued", "healing")


def recovering_replicas(
    phases: Iterable[tuple[int, str, float, bool]], replica: int, at: float, hold_s: float
) -> tuple[int, ...]:
    """The replicas other than `replica` that are recovering at wall time `at`, from
    (replica, phase, phase_since, handled) rows: starting, healing, requeued, a failure being
    handled, or training again for less than `hold_s`."""
    out = []
    for k, phase, since, handled in phases:
        if k == replica or phase in FINISHED_PHASES:
            continue  # finished or left out: nothing to wait for
        warming = phase == "training" and 0 <= at - since < hold_s
        if phase in _RECOVERING or handled or warming:
            out.append(k)
    return tuple(sorted(out))


def _recovered(r: ReplicaState) -> bool:
    """Whether the replica came back from a failure (relaunched, requeued, a new incarnation)."""
    return bool(r.failures or r.relaunches or r.requeues or len(r.incarnations) > 1)


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
        self._noted: RunState | None = None
        self._dirty: set[int] = set()
        self._dirty_all = True
        self._last_at = float("-inf")

    def note_changed(self, old: RunState, new: RunState, replicas: Iterable[int] | None) -> None:
        """The policy state went from `old` to `new`; only `replicas` (None: any) changed. Lets
        `on_report` look at the replicas that may be recovering instead of at every replica
        (a state it was not told about is looked at in full)."""
        if replicas is None or old is not self._noted:
            self._dirty_all = True
        else:
            self._dirty.update(replicas)
        self._noted = new

    def _refresh(self, state: RunState, at: float) -> None:
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
            if r is None or r.phase in FINISHED_PHASES:
                continue
            if r.phase in _RECOVERING or r.handled is not None:
                self._unsettled.add(k)
            elif r.phase == "training" and _recovered(r):
                # The hold is for training *again*: a replica on its first start (healed at
                # step 0 from the primary at most) has no recovery to wait out, so a node slow
                # from the run's first step is judged from then on.
                self._warming[k] = r.phase_since
        self._dirty = set()
        self._dirty_all = False
        self._noted = state
        self._last_at = at

    def _no_evidence(self, replica: int, at: float) -> bool:
        """Whether `replica`'s sample is no evidence (after `_refresh`): another replica is
        recovering, or some replica, `replica` included, trains again after a recovery for less
        than `recovery_hold_s` (a replacement's own first steps on a busy machine are slow)."""
        if len(self._unsettled) > 1 or (self._unsettled and replica not in self._unsettled):
            return True
        hold = self.monitor.detect.recovery_hold_s
        expired = []
        found = False
        for k, since in self._warming.items():
            if at - since >= hold:
                expired.append(k)  # settled for good: time only runs forward here
            elif at - since >= 0:
                found = True
                break
        for k in expired:
            del self._warming[k]
        return found

    def _recovering(self, state: RunState, at: float) -> tuple[int, ...]:
        """`recovering_replicas` of every replica (after `_refresh`): only the candidates."""
        rows = []
        for k in self._unsettled | set(self._warming):
            r = state.replicas[k]
            rows.append((k, r.phase, r.phase_since, r.handled is not None))
        return recovering_replicas(rows, -1, at, self.monitor.detect.recovery_hold_s)

    def on_report(
        self, report: ReplicaReport, state: RunState, now: float, at: float
    ) -> list[StragglerEviction]:
        """Observe one accepted report (monotonic `now`); the policy events to submit."""
        sample = TimingSample.from_report(report, now)
        known = state.replicas.get(report.replica)
        if not sample.nodes and known is not None and known.nodes:
            # A leader that does not know its nodes (ranks given RANK/MASTER_ADDR instead of
            # Slurm's step variables) still runs where squeue says the replica's job runs.
            sample = replace(sample, nodes=tuple(known.nodes))
        self._refresh(state, at)
        evidence = not self._no_evidence(report.replica, at)
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

    def on_actions(self, actions: Iterable[Action], now: float) -> None:
        for a in actions:
            if isinstance(a, Requeue) and not self.monitor.requeue_pending(a.replica):
                self.monitor.note_requeue(a.replica, now)

    def account(self, state: RunState, now: float, replicas: Iterable[int] | None = None) -> None:
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
