"""End to end on the dev cluster: every replica's node loses power at once, and the run comes
back from its newest durable checkpoint.

3 replicas (one node each, `examples/train_tiny.py`) + the control job on the health-gated session
cluster, submitted by the job user with a checkpoint every `EVERY` steps. Once a checkpoint is
complete and training has gone `PAST` steps beyond it, root powers off every replica node at once
(`fthsdp cluster inject NODE --fault down`: slurmd and every process of its jobs die), waits for
slurmctld to find them down, and boots them again (`heal`), as after a power event.

What is asserted:

- Slurm requeues every replica job (restart count >= 1), and the run finishes every step;
- the workers restore the newest complete checkpoint that existed when the power went
  (a `restored` event at that step), not step 0;
- the ledger replays cleanly against the restored history: every unit trained exactly once,
  and exactly the steps trained after the checkpoint were redone (`rolled_back`);
- the final weights of the replicas agree;
- `fthsdp status` shows the restored replicas' own steps, below the step lost with the power,
  never the stale one.

The control job shares node1 with replica 0 here, so it is lost too: nothing of the run is left
to move the requeued jobs' begin time, and they wait out Slurm's requeue delay (about 100-120 s,
docs/design-facts.md) before they start again.

`make test` runs it on the host's release (`one_release`, for the time budget); `make test-slurm`
runs it on any release.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from control_harness import (
    ROOT,
    SPEC,
    clean_up,
    fthsdp,
    heal_node,
    health_gated,
    node_state,
    submit_until_training,
    wait_until,
)
from user_harness import SiteUser

from runtime import ledger
from runtime.checkpoint import latest_complete
from runtime.verdict import check_ledger, final_weights_agree
from slurm.devcluster import DevClusterConfig

STEPS = 400
EVERY = 100
#: Steps trained past the first checkpoint (and short of the second) before the power goes:
#: what the loss costs, and long enough to replay that `status` is seen below it.
PAST = 70


def _steps(reps: dict[int, dict[str, Any]]) -> list[int]:
    return [r["step"] or 0 for r in reps.values()]


def _ledger_max_step(run_dir: Path) -> int:
    return max(r.step for r in ledger.read_log(sorted((run_dir / "ledger").glob("r*.jsonl"))))


def _back(row: dict[str, Any]) -> bool:
    """Training in its requeued job, as the coordinator sees it: its count of Slurm's requeues
    (squeue's restart count can show the requeue before the coordinator has polled it, while
    its row still holds the lost incarnation's phase and step)."""
    return row["state"] == "training" and (row["requeues"] or 0) >= 1 and row["restarts"] >= 1


def _restored(run_dir: Path) -> list[int]:
    steps = []
    for path in sorted((run_dir / "progress").glob("r*.jsonl")):
        for line in path.read_text().splitlines():
            with_event = json.loads(line)
            if with_event.get("event") == "restored":
                steps.append(int(with_event["step"]))
    return steps


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.one_release
@pytest.mark.timeout(600)
def test_the_run_comes_back_from_its_checkpoint_after_every_replica_node_loses_power(
    slurm_cluster: DevClusterConfig, site_user: SiteUser
) -> None:
    with health_gated(slurm_cluster) as gated:
        _run_loss(gated, site_user)


def _run_loss(gated: DevClusterConfig, user: SiteUser) -> None:
    env = user.with_env(TINY_STEP_SLEEP_S="0.2")
    run_dir = user.home / "run"
    spec = user.home / "spec.toml"
    text = SPEC.format(
        name="runloss",
        run_dir=run_dir,
        python=user.python,
        root=ROOT,
        steps=STEPS,
        straggler_mode="report",
    )
    user.write(spec, text.replace("[health]", f"checkpoint_every_steps = {EVERY}\n\n[health]"))
    root_env = dict(os.environ)
    trace: list[tuple[float, dict[int, dict[str, Any]]]] = []
    nodes: list[str] = []
    try:
        before = submit_until_training(env, spec, run_dir, trace)
        jobs = {k: r["job_id"] for k, r in before.items()}
        nodes = sorted({r["nodes"][0] for r in before.values()})
        # Root reads the run's files (the job user's), as an operator would.
        deadline = time.monotonic() + 180
        while (done := latest_complete(run_dir / "checkpoints")) is None:
            assert time.monotonic() < deadline, "no checkpoint completed"
            time.sleep(1)
        first = int(done.name.split("_")[1])
        wait_until(
            env,
            run_dir,
            lambda r: min(_steps(r)) >= first + PAST,
            180,
            f"training {PAST} steps past checkpoint {first}",
            trace,
        )
        for node in nodes:
            fthsdp(root_env, "cluster", "inject", "--dir", str(gated.directory), node,
                   "--fault", "down")  # fmt: skip
        t_loss = time.time()
        # What the power took: the newest complete checkpoint, and the last step committed.
        newest = latest_complete(run_dir / "checkpoints")
        assert newest is not None
        kept = int(newest.name.split("_")[1])
        lost_at = _ledger_max_step(run_dir)
        assert lost_at > kept, (lost_at, kept)
        print(f"power lost on {nodes} at step {lost_at}; newest checkpoint step {kept}")

        deadline = time.monotonic() + 120
        while any(not node_state(n).startswith("down") for n in nodes):
            assert time.monotonic() < deadline, {n: node_state(n) for n in nodes}
            time.sleep(1)
        for node in nodes:
            heal_node(gated, node)

        back = wait_until(
            env,
            run_dir,
            lambda r: all(_back(x) for x in r.values()),
            300,
            "every replica requeued and training again",
            trace,
        )
        t_back = time.time()
        print(f"training again {t_back - t_loss:.1f}s after the power loss: {_steps(back)}")
        # status shows what the restored replicas report, not the step lost with the power
        after_loss = [reps for t, reps in trace if t > t_loss]
        for k in jobs:
            seen = [reps[k]["step"] for reps in after_loss if k in reps and _back(reps[k])]
            assert seen and seen[0] is not None and seen[0] < lost_at, (k, seen, lost_at)
        final = wait_until(
            env,
            run_dir,
            lambda r: all(x["slurm_state"] == "COMPLETED" for x in r.values()),
            300,
            "the run finished",
            trace,
        )
        for k, job in jobs.items():
            assert final[k]["job_id"] == job

        restored = _restored(run_dir)
        assert restored and set(restored) == {kept}, (restored, kept)
        verdict = check_ledger(run_dir, STEPS)
        assert verdict.ok, verdict.problems[:5]
        # checkpoint `kept` holds steps 0..kept-1: steps kept..lost_at were trained twice
        assert verdict.rolled_back == lost_at - kept + 1, (verdict.rolled_back, lost_at, kept)
        assert final_weights_agree(run_dir, [0, 1, 2]), "the final weights differ"
        print(
            f"run loss: checkpoint {kept}, lost at {lost_at}, {verdict.rolled_back} steps redone, "
            f"back in {t_back - t_loss:.1f}s"
        )
    finally:
        for node in nodes:
            if node_state(node).startswith("down"):
                heal_node(gated, node)
        clean_up(env, run_dir, gated, None)
