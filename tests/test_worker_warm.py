"""A warm spare's worker: it starts, builds its model and waits without a replica; handed one, it
joins the quorum as that replica and heals from its peer (real torch processes on gloo, a real
torchft Lighthouse; no Slurm). The handoff file's rules are tested by table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime.env import EnvError, parse_env
from runtime.local.config import LaunchConfig
from runtime.local.launcher import LocalLauncher
from runtime.net import free_port
from runtime.warm_handoff import (
    Handoff,
    HandoffError,
    handoff_path,
    read_handoff,
    read_ready,
    ready_path,
    write_handoff,
)
from slurm import contract

ROOT = Path(__file__).resolve().parents[1]


def _write(path: Path, data: object, mode: int = 0o600) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    os.chmod(path, mode)


GOOD = {"replica": 1, "launch": 0, "incarnation": "77.0.0", "forwarder": None}


@pytest.mark.parametrize(
    ("data", "why"),
    [
        ({**GOOD, "replica": 2}, "not in 0..1"),
        ({**GOOD, "replica": -1}, "not in 0..1"),
        ({**GOOD, "replica": True}, "not in 0..1"),
        ({**GOOD, "launch": -1}, "not a count"),
        ({**GOOD, "incarnation": ""}, "not a launch's name"),
        ({**GOOD, "incarnation": "a\nb"}, "not a launch's name"),
        ({**GOOD, "forwarder": "http://10.0.0.1:80"}, "not a local address"),
        ({k: v for k, v in GOOD.items() if k != "launch"}, "does not hold"),
        ([1], "does not hold"),
    ],
)
def test_a_handoff_the_supervisor_did_not_write_is_refused(
    tmp_path: Path, data: object, why: str
) -> None:
    path = handoff_path(tmp_path, "77")
    _write(path, data)
    with pytest.raises(HandoffError, match=why):
        read_handoff(path, num_replicas=2)


def test_a_handoff_readable_by_others_is_refused(tmp_path: Path) -> None:
    path = handoff_path(tmp_path, "77")
    _write(path, GOOD, mode=0o644)
    with pytest.raises(HandoffError, match="not private"):
        read_handoff(path, num_replicas=2)


def test_the_handoff_round_trips_and_names_the_replicas_environment(tmp_path: Path) -> None:
    path = handoff_path(tmp_path, "77")
    assert read_handoff(path, 2) is None
    h = Handoff(1, 3, "77.0.3", "http://127.0.0.1:4242")
    write_handoff(path, h)
    assert read_handoff(path, 2) == h
    assert path.stat().st_mode & 0o777 == 0o600
    assert h.environ()[contract.REPLICA_ID] == "1"
    assert h.environ()[contract.LIGHTHOUSE_FORWARDER] == "http://127.0.0.1:4242"


def _worker_env(run_dir: Path) -> dict[str, str]:
    return {
        contract.RUN_DIR: str(run_dir),
        contract.NUM_REPLICAS: "2",
        contract.LIGHTHOUSE: "http://127.0.0.1:1",
        contract.RANK: "0",
        contract.WORLD_SIZE: "1",
        contract.MASTER_ADDR: "127.0.0.1",
        contract.MASTER_PORT: "29500",
    }


def test_only_a_warm_step_may_start_without_a_replica(tmp_path: Path) -> None:
    env = _worker_env(tmp_path)
    with pytest.raises(EnvError, match=contract.REPLICA_ID):
        parse_env(env)
    warm = parse_env({**env, contract.WARM_HANDOFF: str(handoff_path(tmp_path, "77"))})
    assert warm.waiting_warm and warm.rendezvous_name == "w77"
    named = parse_env({**env, contract.WARM_HANDOFF: "x", contract.REPLICA_ID: "1"})
    assert not named.waiting_warm and named.rendezvous_name == "r1"


def _events(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _wait(what: str, cond: object, procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"a worker exited {p.returncode} while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} in {timeout:.0f} s")
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_warm_worker_waits_with_its_model_built_then_joins_as_the_replica_it_is_handed(
    tmp_path: Path,
) -> None:
    """Replica 1's two ranks start warm: imports, their process group, the model sharded with
    fully_shard, a checked node, then nothing until the handoff. Replica 0 trains alone first;
    handed replica 1, the warm ranks join its quorum and heal from it, and both finish with the
    same parameters."""
    steps = 40
    cfg = LaunchConfig(
        run_dir=tmp_path,
        command=[sys.executable, str(ROOT / "examples" / "train_tiny.py")],
        replicas=2,
        ranks_per_replica=2,
        steps=steps,
        extra_env={"TINY_STEP_SLEEP_S": "0.05", "PYTHONPATH": str(ROOT)},
    )
    launcher = LocalLauncher(cfg)
    launcher.start_lighthouse()
    handoff = handoff_path(tmp_path, "77")
    procs: list[subprocess.Popen[bytes]] = []
    logs = tmp_path / "logs"
    try:
        ports = (free_port(), free_port())
        for rank in range(2):
            env = launcher._env(1, rank, ports[1])
            del env[contract.REPLICA_ID]
            env[contract.WARM_HANDOFF] = str(handoff)
            with open(logs / f"warm-{rank}.log", "wb") as out:
                procs.append(
                    subprocess.Popen(cfg.command, env=env, stdout=out, stderr=subprocess.STDOUT)
                )
        _wait("warm mark", lambda: ready_path(handoff).exists(), procs, 180)
        ready = read_ready(handoff)
        assert ready is not None and ready["pid"] == procs[0].pid
        progress = tmp_path / "progress"
        assert not (progress / "r1.jsonl").exists()  # no replica yet: nothing written as one

        for rank in range(2):
            with open(logs / f"r0-{rank}.log", "wb") as out:
                env = launcher._env(0, rank, ports[0])
                procs.append(
                    subprocess.Popen(cfg.command, env=env, stdout=out, stderr=subprocess.STDOUT)
                )

        def committed(n: int) -> bool:
            path = progress / "r0.jsonl"
            return path.exists() and any(
                e.get("event") == "metrics" and int(e.get("step", 0)) >= n  # type: ignore[call-overload]
                for e in _events(path)
            )

        _wait("commits of replica 0", lambda: committed(5), procs, 180)
        assert all(p.poll() is None for p in procs[:2])  # still waiting, never joined
        write_handoff(handoff, Handoff(1, 0, "warm-test.0.0", None))
        for p in procs:
            assert p.wait(timeout=180) == 0, (logs / "warm-0.log").read_text()[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        launcher.lighthouse.stop()

    start = next(e for e in _events(progress / "r1.jsonl") if e["event"] == "start")
    assert start["warm"] is True and float(start["warm_for_s"]) > 0  # type: ignore[arg-type]
    heals = [e for e in _events(progress / "r1.jsonl") if e["event"] == "healed"]
    assert heals, "the warm replica joined behind its peer and must have healed from it"
    import torch

    for rank in range(2):
        a = torch.load(tmp_path / "final" / f"r0_rank{rank}.pt")
        b = torch.load(tmp_path / "final" / f"r1_rank{rank}.pt")
        assert a["step"] == b["step"] == steps
        for name, value in a["params"].items():
            assert torch.equal(value, b["params"][name]), name
