"""A warm spare: the slot's processes are started, imported, their model built and their node
checked before the fault; on a node fault the failed replica's identity is handed to them, and
they join and heal with no process start in the path.

2 one-node replicas of `examples/train_tiny.py` + the control job + one warm slot on the 4-node
session cluster (health gated), run by the job user through the site install. An Xid 79 goes into
replica 1's node; root injects it, as an operator would. How soon the replica participates again
is `benchmarks/spares.py`'s figure (warm against cold, interleaved), not a wall-clock bound here.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from control_harness import clean_up, fthsdp, health_gated
from test_story_spares_full_cluster import (
    _journal_requeue,
    advancing_in,
    reps,
    spec_text,
    squeue_state,
    steady,
    wait_status,
)
from user_harness import SiteUser

from slurm.backend import CommandBackend
from slurm.devcluster import DevClusterConfig


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _print_slot_logs(run_dir: Path) -> None:
    """The slots' own logs, last lines first: what a warm step said before it left."""
    logs = sorted((run_dir / "logs").glob("spare-*"), key=lambda p: p.stat().st_mtime)
    for path in logs[-4:]:
        print(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}")


def warm_spec(user: SiteUser, name: str) -> tuple[SiteUser, Path, Path]:
    env, spec, run_dir = spec_text(user, name, 1)
    env.write(spec, spec.read_text() + "warm = true\n")
    return env, spec, run_dir


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_warm_spare_takes_the_failed_replica_without_starting_a_process(
    slurm_cluster: DevClusterConfig, site_user: SiteUser
) -> None:
    backend = CommandBackend()
    with health_gated(slurm_cluster) as cfg:
        env, spec, run_dir = warm_spec(site_user, "warm1")
        root_env = dict(os.environ)
        victim: str | None = None
        try:
            fthsdp(env, "submit", str(spec))

            def ready(d: dict[str, Any]) -> bool:
                r = reps(d)
                ok = all(x["state"] == "training" and (x["step"] or 0) >= 10 for x in r.values())
                pool = d.get("spares") or {}
                slots = pool.get("slots") or []
                return ok and pool.get("idle") == 1 and all(s.get("warm") for s in slots)

            before = steady(env, run_dir, ready)
            (slot_row,) = before["spares"]["slots"]
            slot = slot_row["job_id"]
            assert "warm: its processes wait" in fthsdp(env, "status", str(run_dir))
            # Warm, yet no replica: nothing was written as replica 1 from the slot's job.
            assert not (run_dir / "logs" / f"replica-01-{slot}.out").exists()
            victim = reps(before)[1]["nodes"][0]
            fthsdp(root_env, "cluster", "inject", victim, "--fault", "xid79",
                   "--dir", str(cfg.directory))  # fmt: skip
            t_fault = time.monotonic()
            fault_at = time.time()
            after = wait_status(
                env, run_dir, advancing_in(slot), 90, "replica 1 in the warm slot", 0.3
            )
            took = time.monotonic() - t_fault
            r1 = reps(after)[1]
            assert r1["nodes"] == slot_row["nodes"] and victim not in r1["nodes"], r1
            assert f"moved to spare slot {slot}" in _journal_requeue(run_dir, env)
            assert squeue_state(reps(before)[1]["job_id"]) in ("", "CANCELLED", "COMPLETING")
            # The replica's first start in the slot is the warm one, named after the fault: the
            # processes were there before it.
            starts = [
                e
                for e in _events(run_dir / "progress" / "r1.jsonl")
                if e["event"] == "start" and e["t"] > fault_at
            ]
            assert starts and starts[0].get("warm") is True, starts
            assert starts[0]["warm_for_s"] > 0
            slot_log = (run_dir / "logs" / f"spare-{slot}.err").read_text()
            assert "replica 1 takes the warm step" in slot_log, slot_log[-2000:]
            out = (run_dir / "logs" / f"replica-01-{slot}.err").read_text()
            assert "takes over the warm step" in out, out[-2000:]
            print(json.dumps({"fault_to_participating_s": took, "start": starts[0]}))
        except BaseException:
            _print_slot_logs(run_dir)
            raise
        finally:
            clean_up(env, run_dir, cfg, victim)
    assert not [n.name for n in backend.nodes() if n.drained_by_us]
