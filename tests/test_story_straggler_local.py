"""Local launcher: a replica slowed 2x from its first step (its node degraded from allocation,
so it never ran at a pace of its own) is detected within the window of its first steps, evicted
and restarted once; afterwards the run steps at its normal pace, and it still ends with agreeing
weights and a clean ledger."""

from __future__ import annotations

import json
import statistics
import sys
from itertools import pairwise
from pathlib import Path

import pytest

from runtime.env import Timeouts
from runtime.local.config import LaunchConfig
from runtime.local.launcher import LocalLauncher

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_slow_replica_is_evicted_once_and_the_pace_recovers(tmp_path: Path) -> None:
    cfg = LaunchConfig(
        run_dir=tmp_path / "run",
        command=[sys.executable, str(ROOT / "examples" / "train_tiny.py")],
        replicas=3,
        ranks_per_replica=1,
        steps=150,
        min_replicas=2,
        timeouts=Timeouts(heartbeat_s=2.0, allreduce_s=10.0, quorum_s=20.0, join_s=30.0),
        extra_env={"TINY_STEP_SLEEP_S": "0.1", "PYTHONPATH": str(ROOT)},
        slow_replica=1,
        slow_factor=2.0,
        slow_after_step=0,
        straggler_window_steps=10,
        straggler_requeue_cost_s=2.0,
        run_timeout_s=200.0,
    )
    summary = LocalLauncher(cfg).run()
    assert summary.ok, summary.error or summary.ledger_problems
    evictions = [d for d in summary.straggler_decisions if d["action"] == "evict"]
    assert [d["replica"] for d in evictions] == [1]
    # Flagged (the first decision) within the window plus the warm-up samples of its first steps.
    assert summary.straggler_decisions[0]["step"] <= 10 + 5, summary.straggler_decisions[0]
    assert 1.6 < evictions[0]["factor"] < 2.4
    assert summary.restarts == {0: 0, 1: 1, 2: 0}
    assert [f["kind"] for f in summary.failures] == ["straggler"]

    events = [
        json.loads(x) for x in (cfg.run_dir / "progress" / "r0.jsonl").read_text().splitlines()
    ]
    commits = [e["t"] for e in events if e["event"] == "commit"]
    t_evict = evictions[0]["t"]
    # The steps just before the eviction: all in the slow window (10 steps).
    before = [b - a for a, b in pairwise(t for t in commits if t < t_evict)][-8:]
    after = [b - a for a, b in pairwise(t for t in commits if t > t_evict + 8.0)]
    assert len(before) >= 5 and len(after) >= 5
    # Slow phase ~2x; once the replacement participates the healthy replica steps fast again.
    assert statistics.median(after) < 0.75 * statistics.median(before)
