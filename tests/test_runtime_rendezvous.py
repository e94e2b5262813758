"""`runtime.rendezvous`: ports and addresses for a replica's ranks under srun."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from launch_env import BASE

from runtime.env import parse_env


def _srun_env(tmp_path: Path, rank: int, world: int, nodes: str = "node[3-4]") -> dict[str, str]:
    raw = {
        k: v
        for k, v in BASE.items()
        if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    raw.update(
        FTHSDP_RUN_DIR=str(tmp_path),
        SLURM_PROCID=str(rank),
        SLURM_NTASKS=str(world),
        SLURM_STEP_NODELIST=nodes,
        SLURM_JOB_ID="19",
        FTHSDP_INCARNATION="19.0.1",
    )
    return raw


def test_rendezvous_ports_depend_on_incarnation_and_skip_busy_ones() -> None:
    from runtime import rendezvous

    first = list(rendezvous.candidate_ports("run/r1/19.0.1"))
    assert first == list(rendezvous.candidate_ports("run/r1/19.0.1"))  # deterministic
    assert first[:4] != list(rendezvous.candidate_ports("run/r1/19.0.2"))[:4]
    assert first[:4] != list(rendezvous.candidate_ports("other/r1/19.0.1"))[:4]
    assert all(20000 <= p < 60000 for p in first)
    busy = set(first[:3])
    assert rendezvous.pick_port("run/r1/19.0.1", free=lambda p: p not in busy) == first[3]
    with pytest.raises(rendezvous.RendezvousError):
        rendezvous.pick_port("k", free=lambda p: False)


def test_rendezvous_unresolvable_node_asks_slurm(tmp_path: Path) -> None:
    from runtime import rendezvous

    asked: list[str] = []

    def lookup(name: str) -> str:
        asked.append(name)
        return "127.0.0.1"

    env = parse_env(_srun_env(tmp_path, 0, 1, "nosuchnode-fthsdp[1-2]"))
    addr, port = rendezvous.resolve(env, _srun_env(tmp_path, 0, 1), lookup=lookup)
    assert (addr, asked) == ("127.0.0.1", ["nosuchnode-fthsdp1"])
    assert 20000 <= port < 60000
    assert not (tmp_path / "rendezvous").exists()  # one rank: nothing to publish
    # A name that resolves is used as is; RANK-style launches keep what they were given.
    assert rendezvous.node_address("localhost", lookup=lambda n: "x") == "localhost"
    local = parse_env(BASE)
    assert rendezvous.resolve(local) == ("127.0.0.1", 29600)


def test_rendezvous_rank0_publishes_others_wait_for_their_incarnation(tmp_path: Path) -> None:
    from runtime import rendezvous

    lookup = lambda name: "10.0.0.3"  # noqa: E731
    raw1 = _srun_env(tmp_path, 1, 2, "nosuchnode-fthsdp[3-4]")
    env1 = parse_env(raw1)
    # A file left by an earlier launch is never used.
    (tmp_path / "rendezvous").mkdir()
    (tmp_path / "rendezvous" / "r1.json").write_text(
        json.dumps({"incarnation": "19.0.0", "addr": "old", "port": 1})
    )
    got: list[tuple[str, int]] = []
    waiter = threading.Thread(target=lambda: got.append(rendezvous.resolve(env1, raw1, lookup)))
    waiter.start()
    time.sleep(0.3)
    assert not got
    raw0 = _srun_env(tmp_path, 0, 2, "nosuchnode-fthsdp[3-4]")
    published = rendezvous.resolve(parse_env(raw0), raw0, lookup, free=lambda p: True)
    waiter.join(10)
    assert got == [published] and published[0] == "10.0.0.3"
