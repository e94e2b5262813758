"""The model-quality benchmark's short version (`benchmarks/quality.py`): one seed of FT-HSDP on
the digits with 3 replica kills, judged on the held-out loss against the no-fault run.

The no-fault reference is computed in this process: static HSDP, FT-HSDP without faults and one
process trained on the same data order reach the same final held-out loss (the benchmark
measured all three equal to 1e-6 for every seed; `test_story_ft_protocol` checks FT-HSDP's
weights against static HSDP's), so the test pays for one multi-process run only.

The run is the local launcher's: it starts the lighthouse and the 3 replicas' processes, each
in its own process group, and kills all of them when it returns or fails; the `finally` here
covers a test interrupted mid-run, and the test checks that no worker outlived the run.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchft")
pytest.importorskip("sklearn")

from benchmarks import quality
from runtime.env import Timeouts
from runtime.local.launcher import LocalLauncher

STEPS = 200
#: Kills of replicas 1, 2, then 1 again once it is back. A restart costs 5-15 s of process
#: start and imports on this 2-core machine, so the third kill waits for replica 1 to return
#: (about 100 steps at 0.1 s a step), and at least two replicas finish to compare weights.
SCHEDULE = ((1, 20), (2, 40), (1, 140))
#: How far the 3-kill run's final held-out loss may lie above the no-fault one. At 200 steps
#: static HSDP's final loss has a seed-to-seed std of 0.004 (range 0.011, 5 seeds) with the
#: data order fixed, and a std of 0.0105 (range -0.025 to +0.015) when only the data order
#: moves (the stream started 280-1,120 samples on): the kills re-issue units later, so they move
#: the order. 0.03 is about three order stds, just above that range.
TOLERANCE = 0.03


def short_args() -> argparse.Namespace:
    return argparse.Namespace(ranks=1, eval_every=10, sleep=0.1, window=20, steps=STEPS)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_three_kills_reach_the_no_fault_loss(tmp_path: Path) -> None:
    cfg = quality.launch_config("kills3", 0, short_args(), tmp_path)
    cfg.kill_schedule = SCHEDULE
    # Unlike the benchmark, two replicas must hold for a step: on a loaded machine a restart took
    # 30 s, and replica 0 alone trained the last 160 steps and finished before either killed
    # replica was back, so the third kill never came. With two required, replica 0 waits for a
    # peer, within quorum and join timeouts that outlast such a restart.
    cfg.min_replicas = 2
    cfg.timeouts = Timeouts(heartbeat_s=2.0, allreduce_s=10.0, quorum_s=90.0, join_s=120.0)
    launcher = LocalLauncher(cfg)
    try:
        summary = launcher.run()
    finally:
        launcher.shutdown()
        procs = [p for rs in launcher.replicas for p in rs.procs]
        assert procs and all(p.poll() is not None for p in procs), "a worker outlived the run"
    assert summary.ok and summary.weights_agree and summary.ledger_ok, summary
    assert [(f["kind"], f["replica"]) for f in summary.failures] == [
        ("injected", r) for r, _ in SCHEDULE
    ], summary.failures
    assert len(summary.finished_replicas) >= 2, summary  # the weights' agreement means something
    # What the kills cost in participation: on a quiet machine a killed replica can be back
    # before its peers commit another step (they wait out the step it left), so this may be 1.
    share = quality.participation(tmp_path, STEPS)
    assert 0.5 < share <= 1.0, share

    got = quality.at_step(quality.heldout_curve(tmp_path, "r*.jsonl"), STEPS, 2)
    base = quality.replay(0, quality.static_units(STEPS))
    assert math.isfinite(got) and base < 0.5  # it learned: the initial loss is ln(10) = 2.3
    assert got - base <= TOLERANCE, (got, base, share)
    # the run's updates are exactly those of the samples its ledger says it trained
    replayed = quality.replay(0, quality.trained_units(quality.contributors(tmp_path)))
    assert replayed == pytest.approx(got, abs=1e-4)
