"""`runtime.env`: the launch contract as the worker reads it, and control.json re-read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launch_env import BASE

from runtime.env import EnvError, Timeouts, parse_env, read_control, slurm_port


def test_env_local_launcher_contract() -> None:
    env = parse_env(BASE)
    assert (env.replica_id, env.num_replicas, env.rank, env.world_size) == (1, 2, 1, 2)
    assert env.master_port == 29600 and not env.is_leader
    assert env.timeouts == Timeouts(0.5, 5.0, 10.0, 60.0, 300.0)
    assert parse_env({**BASE, "FTHSDP_CONTROL_WAIT_S": "900"}).timeouts.control_s == 900.0


@pytest.mark.parametrize(
    ("change", "every_s"),
    [
        ({}, None),  # unset: Young/Daly's cadence
        ({"FTHSDP_CHECKPOINT_EVERY_S": "auto"}, None),
        ({"FTHSDP_CHECKPOINT_EVERY_S": "auto", "FTHSDP_CHECKPOINT_EVERY_STEPS": "5"}, 0.0),
        ({"FTHSDP_CHECKPOINT_EVERY_S": "0"}, 0.0),
        ({"FTHSDP_CHECKPOINT_EVERY_S": "90"}, 90.0),
    ],
)
def test_env_checkpoint_cadence(change: dict[str, str], every_s: float | None) -> None:
    raw = {k: v for k, v in BASE.items() if not k.startswith("FTHSDP_CHECKPOINT")}
    env = parse_env({**raw, **change, "FTHSDP_RUN_NODES": "6", "FTHSDP_RUN_LOSSES_PER_DAY": "1"})
    assert env.checkpoint_every_s == every_s
    assert (env.failure_model.nodes, env.failure_model.run_losses_per_day) == (6, 1.0)


def test_env_slurm_ranks_and_rendezvous() -> None:
    raw = {
        k: v
        for k, v in BASE.items()
        if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    raw.update(
        SLURM_PROCID="3",
        SLURM_NTASKS="4",
        SLURM_LOCALID="1",
        SLURM_STEP_NODELIST="node[3-4]",
        SLURM_JOB_ID="1234",
    )
    env = parse_env(raw)
    assert (env.rank, env.world_size, env.local_rank) == (3, 4, 1)
    assert env.master_addr == "node3" and env.nodes == ("node3", "node4")
    assert env.master_port == slurm_port("1234") == 21234


@pytest.mark.parametrize(
    ("change", "variable"),
    [
        ({"FTHSDP_REPLICA_ID": "2"}, "FTHSDP_REPLICA_ID"),
        ({"FTHSDP_REPLICA_ID": "x"}, "FTHSDP_REPLICA_ID"),
        ({"FTHSDP_RUN_DIR": ""}, "FTHSDP_RUN_DIR"),
        ({"FTHSDP_NUM_REPLICAS": "0"}, "FTHSDP_NUM_REPLICAS"),
        ({"RANK": "2"}, "RANK"),
        ({"MASTER_PORT": None}, "MASTER_PORT"),
        ({"FTHSDP_MIN_REPLICAS": "3"}, "FTHSDP_MIN_REPLICAS"),
        ({"FTHSDP_ALLREDUCE_TIMEOUT_S": "0.4"}, "FTHSDP_ALLREDUCE_TIMEOUT_S"),
        ({"FTHSDP_QUORUM_TIMEOUT_S": "4"}, "FTHSDP_ALLREDUCE_TIMEOUT_S"),
        ({"FTHSDP_HEALTH_CHECKS": "xid,nvlink"}, "FTHSDP_HEALTH_CHECKS"),
        ({"FTHSDP_CONTROL_WAIT_S": "30"}, "FTHSDP_CONTROL_WAIT_S"),
        ({"FTHSDP_CONTROL_WAIT_S": "soon"}, "FTHSDP_CONTROL_WAIT_S"),
        ({"FTHSDP_LIGHTHOUSE": None}, "FTHSDP_CONTROL_FILE"),
        ({"RANK": None, "WORLD_SIZE": None}, "RANK"),
        ({"FTHSDP_CHECKPOINT_EVERY_S": "nan"}, "FTHSDP_CHECKPOINT_EVERY_S"),
        ({"FTHSDP_CHECKPOINT_EVERY_S": "hourly"}, "FTHSDP_CHECKPOINT_EVERY_S"),
        ({"FTHSDP_RUN_LOSSES_PER_DAY": "inf"}, "FTHSDP_RUN_LOSSES_PER_DAY"),
        ({"FTHSDP_RUN_NODES": "0"}, "FTHSDP_RUN_NODES"),
    ],
)
def test_env_errors_name_the_variable(change: dict[str, str | None], variable: str) -> None:
    raw = {**BASE, **change}
    with pytest.raises(EnvError) as info:
        parse_env({k: v for k, v in raw.items() if v is not None})
    assert info.value.variable == variable


def test_control_file_reread(tmp_path: Path) -> None:
    control = tmp_path / "control.json"
    env = parse_env({**BASE, "FTHSDP_CONTROL_FILE": str(control), "FTHSDP_LIGHTHOUSE": ""})
    assert env.endpoints() is None
    control.write_text(json.dumps({"lighthouse": "http://a:1", "coordinator": "http://a:2"}))
    found = env.endpoints()
    assert found is not None and found.lighthouse == "http://a:1"
    control.write_text(json.dumps({"lighthouse": "http://b:1"}))  # control job requeued
    found = read_control(control)
    assert found is not None and found.lighthouse == "http://b:1" and found.coordinator is None
    control.write_text("{half")
    assert read_control(control) is None
