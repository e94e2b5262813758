"""Prometheus metrics for a run, built from the coordinator's state on every scrape.

Operators watch a long FT-HSDP run through dashboards and alerts, not through `fthsdp status`:
a straggler, a replica that keeps restarting, or an ETTR that sags should page someone. The
coordinator already holds the run's whole state (the policy's view plus the latest timing of each
replica), so the metrics are a pure projection of that state: `update_metrics(registry, state)`
stores a snapshot in a collector registered on the registry, and each scrape renders the
snapshot. Nothing is counted twice or kept out of sync, and a coordinator restarted from its
journal serves the same numbers.

Counters (`requeues`, `evictions`) are totals from the journal-backed state, so they stay monotonic
across coordinator restarts. The snapshot is a plain mapping (the `/v1/state` JSON shape), so
this module imports neither the policy nor the coordinator:

    {"replicas": [{"replica": 0, "state": "training", "step": 120, "restarts": 0,
                   "step_time_s": 0.31, "compute_s": 0.2, "allreduce_wait_s": 0.1,
                   "healing": false, "straggler": "ok"}, ...],
     "participants": 3, "quorum_id": 7, "cursor": 360, "ettr": 0.97,
     "requeues_by_reason": {"node": 1, "straggler": 1}, "evictions": 1,
     "drained": [{"node": "node4", "reason": "fthsdp: straggler: node4 2.0x"}],
     "outage": None, "refusals": {"401 /v1/reports": 3, "header timeout": 1}}

Every key is optional: what the state does not have is not exported (never a made-up zero).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from aiohttp import web

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Per-replica gauges: (metric name, state key, help).
_REPLICA_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("fthsdp_replica_step", "step", "Latest committed step the replica's leader reported."),
    ("fthsdp_replica_step_seconds", "step_time_s", "Wall time of the replica's latest step."),
    (
        "fthsdp_replica_compute_seconds",
        "compute_s",
        "Replica's own compute time per step (forward, backward, local reduce-scatter).",
    ),
    (
        "fthsdp_replica_allreduce_wait_seconds",
        "allreduce_wait_s",
        "Time the replica waited in the cross-replica allreduce in its latest step.",
    ),
    (
        "fthsdp_replica_straggler_factor",
        "straggler_factor",
        "Replica's compute time over the median of the others (episode median when slow).",
    ),
)
_STRAGGLER_STATES = ("ok", "suspect", "straggler")

#: Run gauges: (metric name, state key, help).
_RUN_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("fthsdp_run_participants", "participants", "Replicas in the latest quorum."),
    ("fthsdp_run_quorum_id", "quorum_id", "Latest quorum id (rises at every reconfiguration)."),
    ("fthsdp_run_cursor", "cursor", "Global sample cursor of the committed state."),
    (
        "fthsdp_run_ettr",
        "ettr",
        "Effective training time ratio so far: replica-seconds training / replica-seconds owned.",
    ),
    ("fthsdp_run_replicas", "replicas_configured", "Replicas the run is configured with."),
    ("fthsdp_run_min_replicas", "min_replicas", "Fewest replicas the run may continue with."),
)


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    return None


class RunStateCollector(Collector):
    """Renders the latest snapshot of a run's state as metric families."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: Mapping[str, Any] = {}

    def set_state(self, state: Mapping[str, Any]) -> None:
        with self._lock:
            self._state = state

    def describe(self) -> list[Metric]:
        # Returning no descriptions keeps registration from calling collect() on empty state.
        return []

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            state = self._state
        yield from _families(state)


def _families(state: Mapping[str, Any]) -> Iterator[Metric]:
    replicas: Sequence[Mapping[str, Any]] = state.get("replicas") or []
    for name, key, doc in _REPLICA_GAUGES:
        g = GaugeMetricFamily(name, doc, labels=["replica"])
        for r in replicas:
            value = _number(r.get(key))
            if value is not None:
                g.add_metric([str(r["replica"])], value)
        yield g
    healing = GaugeMetricFamily(
        "fthsdp_replica_healing",
        "1 while the replica is catching up from a peer.",
        labels=["replica"],
    )
    phase = GaugeMetricFamily(
        "fthsdp_replica_state", "1 for the replica's current state.", labels=["replica", "state"]
    )
    straggler = GaugeMetricFamily(
        "fthsdp_replica_straggler",
        "1 for the replica's straggler verdict (ok, suspect, straggler).",
        labels=["replica", "verdict"],
    )
    restarts = CounterMetricFamily(
        "fthsdp_replica_restarts",
        "Times the replica was restarted (relaunched in place or requeued).",
        labels=["replica"],
    )
    for r in replicas:
        label = str(r["replica"])
        is_healing = r.get("healing")
        if is_healing is None and r.get("state") is not None:
            is_healing = r.get("state") == "healing"
        if is_healing is not None:
            healing.add_metric([label], float(bool(is_healing)))
        if r.get("state") is not None:
            phase.add_metric([label, str(r["state"])], 1.0)
        verdict = r.get("straggler")
        if verdict is not None:
            for v in _STRAGGLER_STATES:
                straggler.add_metric([label, v], float(v == verdict))
        n = _number(r.get("restarts"))
        if n is not None:
            restarts.add_metric([label], n)
    yield from (healing, phase, straggler, restarts)

    for name, key, doc in _RUN_GAUGES:
        value = _number(state.get(key))
        g = GaugeMetricFamily(name, doc)
        if value is not None:
            g.add_metric([], value)
        yield g
    requeues = CounterMetricFamily(
        "fthsdp_run_requeues", "Replica requeues and relaunches, by reason.", labels=["reason"]
    )
    for reason, total in sorted((state.get("requeues_by_reason") or {}).items()):
        value = _number(total)
        if value is not None:
            requeues.add_metric([str(reason)], value)
    yield requeues
    evictions = CounterMetricFamily(
        "fthsdp_run_straggler_evictions", "Stragglers evicted (requeued) in this run."
    )
    if _number(state.get("evictions")) is not None:
        evictions.add_metric([], float(state["evictions"]))
    yield evictions
    drained = GaugeMetricFamily(
        "fthsdp_run_drained_node",
        "1 for each node this run drained, with the drain reason.",
        labels=["node", "reason"],
    )
    drained_list: Sequence[Mapping[str, Any]] = state.get("drained") or []
    for d in drained_list:
        drained.add_metric([str(d.get("node")), str(d.get("reason", ""))], 1.0)
    yield drained
    n_drained = GaugeMetricFamily("fthsdp_run_drained_nodes", "Nodes this run has drained.")
    n_drained.add_metric([], float(len(drained_list)))
    yield n_drained
    outage = state.get("outage", ...)
    if outage is not ...:
        mass = GaugeMetricFamily(
            "fthsdp_control_mass_silence",
            "1 while most replicas are silent at once: the coordinator is not hearing them (its "
            "network, its node, a flood), so nothing is drained or requeued for silence.",
        )
        mass.add_metric([], float(outage is not None))
        yield mass
        silent = GaugeMetricFamily(
            "fthsdp_control_mass_silence_replicas",
            "Replicas silent when the current mass silence began (0 when there is none).",
        )
        silent.add_metric([], float(len(outage["silent"])) if outage else 0.0)
        yield silent
    refused = CounterMetricFamily(
        "fthsdp_control_refused",
        "Requests and connections the coordinator refused since it started, by status and route "
        "template ('unmatched' for no route) or by reason (header timeout, eviction at a cap): "
        "unauthenticated traffic shows here.",
        labels=["reason"],
    )
    for reason, total in sorted((state.get("refusals") or {}).items()):
        value = _number(total)
        if value is not None:
            refused.add_metric([str(reason)], value)
    yield refused
    gate = state.get("lighthouse_gate")
    if isinstance(gate, Mapping):
        connections = CounterMetricFamily(
            "fthsdp_lighthouse_gate_connections",
            "Connections to the Lighthouse gate since the control job started, by outcome "
            "(authenticated, refused_bad_mac, refused_malformed, timed_out, evicted, ...): "
            "unauthenticated traffic to the quorum port shows here.",
            labels=["outcome"],
        )
        for outcome, total in sorted((gate.get("counts") or {}).items()):
            if (value := _number(total)) is not None:
                connections.add_metric([str(outcome)], value)
        yield connections
        opened = GaugeMetricFamily(
            "fthsdp_lighthouse_gate_open", "Authenticated connections through the gate now."
        )
        opened.add_metric([], _number(gate.get("open")) or 0.0)
        yield opened
        restarts = CounterMetricFamily(
            "fthsdp_lighthouse_gate_restarts", "Times the gate's process was started again."
        )
        restarts.add_metric([], _number(gate.get("restarts")) or 0.0)
        yield restarts


_COLLECTORS: weakref.WeakKeyDictionary[CollectorRegistry, RunStateCollector] = (
    weakref.WeakKeyDictionary()
)
_COLLECTORS_LOCK = threading.Lock()


def update_metrics(registry: CollectorRegistry, state: Mapping[str, Any]) -> None:
    """Make `registry` export `state` (registers the run collector on first use)."""
    with _COLLECTORS_LOCK:
        collector = _COLLECTORS.get(registry)
        if collector is None:
            collector = RunStateCollector()
            registry.register(collector)
            _COLLECTORS[registry] = collector
    collector.set_state(state)


def render(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus' text exposition format (what `/metrics` serves)."""
    return generate_latest(registry)


def aiohttp_handler(
    registry: CollectorRegistry, snapshot: Callable[[], Mapping[str, Any]]
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """A `GET /metrics` handler: take the coordinator's snapshot, update the registry, render."""
    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        update_metrics(registry, snapshot())
        return web.Response(body=render(registry), headers={"Content-Type": CONTENT_TYPE})

    return handle


def ettr(
    phase_seconds: Mapping[int, Mapping[str, float]], productive: Sequence[str] = ("training",)
) -> float | None:
    """Effective training time ratio: replica-seconds in a productive phase / all replica-seconds.

    `phase_seconds` maps replica -> {phase: seconds spent in it so far}. Healing, restarting,
    requeued and pending time are the losses a fault costs; time a replica is left `out` counts
    as lost too, since the run paid for the capacity it planned on.
    """
    total = sum(sum(p.values()) for p in phase_seconds.values())
    if total <= 0:
        return None
    good = sum(p.get(name, 0.0) for p in phase_seconds.values() for name in productive)
    return good / total
