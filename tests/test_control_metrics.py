"""Metrics: a run state in, Prometheus text out, parsed back with the official text parser."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from runtime.control.metrics import CONTENT_TYPE, aiohttp_handler, ettr, render, update_metrics

STATE: dict[str, Any] = {
    "replicas": [
        {
            "replica": 0,
            "state": "training",
            "step": 120,
            "restarts": 0,
            "step_time_s": 0.45,
            "compute_s": 0.2,
            "allreduce_wait_s": 0.25,
            "healing": False,
            "straggler": "ok",
            "straggler_factor": 1.0,
        },
        {
            "replica": 1,
            "state": "training",
            "step": 120,
            "restarts": 2,
            "step_time_s": 0.45,
            "compute_s": 0.4,
            "allreduce_wait_s": 0.05,
            "healing": False,
            "straggler": "straggler",
            "straggler_factor": 2.0,
        },
        # A replica that just came back: no timing yet, so no timing series (never a fake 0).
        {"replica": 2, "state": "healing", "step": 118, "restarts": 1},
    ],
    "participants": 3,
    "quorum_id": 7,
    "cursor": 360,
    "ettr": 0.93,
    "replicas_configured": 3,
    "min_replicas": 2,
    "requeues_by_reason": {"node": 1, "straggler": 1, "process": 2},
    "evictions": 1,
    "drained": [{"node": "node4", "reason": 'fthsdp: straggler: node4 2.0x "quoted"'}],
}


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Parse exposition text into {(sample name, sorted labels): value}."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_state_round_trips_through_the_text_format() -> None:
    registry = CollectorRegistry()
    update_metrics(registry, STATE)
    m = scrape(render(registry).decode())
    assert m[("fthsdp_replica_step", (("replica", "0"),))] == 120
    assert m[("fthsdp_replica_step", (("replica", "2"),))] == 118
    assert m[("fthsdp_replica_compute_seconds", (("replica", "1"),))] == 0.4
    assert m[("fthsdp_replica_allreduce_wait_seconds", (("replica", "0"),))] == 0.25
    assert m[("fthsdp_replica_step_seconds", (("replica", "1"),))] == 0.45
    assert ("fthsdp_replica_compute_seconds", (("replica", "2"),)) not in m
    assert m[("fthsdp_replica_healing", (("replica", "2"),))] == 1
    assert m[("fthsdp_replica_healing", (("replica", "0"),))] == 0
    assert m[("fthsdp_replica_restarts_total", (("replica", "1"),))] == 2
    assert m[("fthsdp_replica_state", (("replica", "2"), ("state", "healing")))] == 1
    assert m[("fthsdp_replica_straggler", (("replica", "1"), ("verdict", "straggler")))] == 1
    assert m[("fthsdp_replica_straggler", (("replica", "1"), ("verdict", "ok")))] == 0
    assert m[("fthsdp_replica_straggler_factor", (("replica", "1"),))] == 2.0
    assert m[("fthsdp_run_participants", ())] == 3
    assert m[("fthsdp_run_quorum_id", ())] == 7
    assert m[("fthsdp_run_cursor", ())] == 360
    assert m[("fthsdp_run_ettr", ())] == pytest.approx(0.93)
    assert m[("fthsdp_run_min_replicas", ())] == 2
    assert m[("fthsdp_run_requeues_total", (("reason", "straggler"),))] == 1
    assert m[("fthsdp_run_requeues_total", (("reason", "process"),))] == 2
    assert m[("fthsdp_run_straggler_evictions_total", ())] == 1
    reason = 'fthsdp: straggler: node4 2.0x "quoted"'
    assert m[("fthsdp_run_drained_node", (("node", "node4"), ("reason", reason)))] == 1
    assert m[("fthsdp_run_drained_nodes", ())] == 1


def test_the_lighthouse_gates_counters_are_exported_when_the_control_job_runs_one() -> None:
    registry = CollectorRegistry()
    update_metrics(registry, STATE)
    assert not any(
        k[0].startswith("fthsdp_lighthouse_gate") for k in scrape(render(registry).decode())
    )
    counts = {"authenticated": 3, "refused_bad_mac": 2, "evicted": 40}
    update_metrics(
        registry, {**STATE, "lighthouse_gate": {"counts": counts, "open": 3, "restarts": 1}}
    )
    m = scrape(render(registry).decode())
    assert m[("fthsdp_lighthouse_gate_connections_total", (("outcome", "evicted"),))] == 40
    assert m[("fthsdp_lighthouse_gate_connections_total", (("outcome", "refused_bad_mac"),))] == 2
    assert m[("fthsdp_lighthouse_gate_open", ())] == 3
    assert m[("fthsdp_lighthouse_gate_restarts_total", ())] == 1


def test_update_replaces_the_snapshot_and_drops_gone_series() -> None:
    registry = CollectorRegistry()
    update_metrics(registry, STATE)
    update_metrics(registry, {"replicas": [{"replica": 0, "step": 121}], "drained": []})
    m = scrape(render(registry).decode())
    assert m[("fthsdp_replica_step", (("replica", "0"),))] == 121
    assert ("fthsdp_replica_step", (("replica", "1"),)) not in m
    assert ("fthsdp_run_quorum_id", ()) not in m
    assert m[("fthsdp_run_drained_nodes", ())] == 0


def test_empty_state_renders_and_parses() -> None:
    registry = CollectorRegistry()
    update_metrics(registry, {})
    families = {f.name for f in text_string_to_metric_families(render(registry).decode())}
    assert {"fthsdp_replica_step", "fthsdp_run_ettr", "fthsdp_run_requeues"} <= families


@pytest.mark.timeout(30)
def test_metrics_endpoint_is_scraped_over_http() -> None:
    calls = []

    def snapshot() -> dict[str, Any]:
        calls.append(1)
        return {**STATE, "quorum_id": 7 + len(calls)}

    async def main() -> tuple[str, str, str]:
        app = web.Application()
        app.router.add_get("/metrics", aiohttp_handler(CollectorRegistry(), snapshot))
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            first = await client.get("/metrics")
            second = await client.get("/metrics")
            return first.headers["Content-Type"], await first.text(), await second.text()

    ctype, first, second = asyncio.run(main())
    assert ctype == CONTENT_TYPE
    assert scrape(first)[("fthsdp_run_quorum_id", ())] == 8
    assert scrape(second)[("fthsdp_run_quorum_id", ())] == 9  # a fresh snapshot per scrape


@pytest.mark.parametrize(
    ("phases", "expected"),
    [
        ({}, None),
        ({0: {"training": 90.0, "healing": 10.0}}, 0.9),
        ({0: {"training": 100.0}, 1: {"training": 50.0, "requeued": 30.0, "healing": 20.0}}, 0.75),
        ({0: {"out": 10.0}}, 0.0),
    ],
)
def test_ettr(phases: dict[int, dict[str, float]], expected: float | None) -> None:
    assert ettr(phases) == (None if expected is None else pytest.approx(expected))
