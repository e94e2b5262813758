"""The run's straggler policy reaches the control job: spec `train.straggler_*` -> spec.json ->
`load_run_settings` -> the coordinator's monitor, with `fthsdp control` options on top; and a
leader report without nodes still names the slow node (the one squeue says the job runs on)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runtime.control.policy import PolicyConfig, RunState, StragglerEviction
from runtime.control.settings import load_run_settings, straggler_config
from runtime.control.straggler.detect import StragglerConfig
from runtime.control.straggler.evict import EvictionConfig
from runtime.control.straggler.service import StragglerService
from runtime.protocol import ReplicaReport
from slurm.errors import InputError
from slurm.spec import parse_spec

SPEC: dict[str, Any] = {
    "job": {"name": "s", "run_dir": "/tmp/s"},
    "replicas": {"count": 3},
    "train": {"command": "python train.py", "steps": 1000},
}


def _spec_json(tmp_path: Path, **train: Any) -> Path:
    data = json.loads(json.dumps(SPEC))
    data["train"].update(train)
    (tmp_path / "spec.json").write_text(json.dumps(parse_spec(data).to_dict()))
    return tmp_path


def test_defaults_are_the_issue_defaults(tmp_path: Path) -> None:
    settings = load_run_settings(_spec_json(tmp_path))
    assert settings.straggler == StragglerConfig()
    assert settings.eviction == EvictionConfig()


def test_spec_keys_reach_the_settings(tmp_path: Path) -> None:
    run_dir = _spec_json(
        tmp_path,
        straggler_factor=1.2,
        straggler_window_steps=20,
        straggler_window_s=30,
        straggler_requeue_cost_s=15,
        straggler_mode="exclude",
    )
    settings = load_run_settings(run_dir)
    assert settings.eviction.mode == "exclude"
    s = settings.straggler
    assert (s.factor, s.window_steps, s.window_s) == (1.2, 20, 30.0)
    assert s.clear_factor == 1.2  # the clear level never exceeds a low factor
    assert settings.eviction.requeue_cost_estimate_s == 15.0


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("straggler_factor", 1.0),
        ("straggler_factor", float("nan")),
        ("straggler_window_steps", 0),
        ("straggler_window_s", 0),
        ("straggler_requeue_cost_s", -1),
        ("straggler_requeue_cost_s", float("inf")),
        ("straggler_mode", "evict"),
    ],
)
def test_bad_straggler_keys_name_the_field(key: str, value: float | str) -> None:
    data = json.loads(json.dumps(SPEC))
    data["train"][key] = value
    with pytest.raises(InputError) as info:
        parse_spec(data)
    assert info.value.field == f"train.{key}"


def test_hand_written_spec_json_with_a_bad_factor_is_input_error() -> None:
    with pytest.raises(InputError, match="factor"):
        straggler_config(0.5)


def _report(replica: int, step: int, compute: float, nodes: list[str]) -> ReplicaReport:
    return ReplicaReport(
        replica=replica,
        incarnation=f"inc{replica}",
        seq=step,
        job_id=str(100 + replica),
        nodes=nodes,
        step=step,
        participants=3,
        quorum_id=1,
        step_time_s=0.45,
        compute_s=compute,
        allreduce_wait_s=0.45 - compute,
        rank_compute_s=[compute],
    )


@pytest.mark.parametrize(
    ("reported_nodes", "expected"),
    [([], "node2"), (["node7"], "node7")],
    ids=["squeue-nodes-fill-in", "report-nodes-win"],
)
def test_slow_node_of_a_report_without_nodes(reported_nodes: list[str], expected: str) -> None:
    state = RunState.new(PolicyConfig(replicas=3, min_replicas=2), {0: "100", 1: "101", 2: "102"})
    for k, r in state.replicas.items():
        r.phase = "training"
        r.phase_since = -3600.0  # training for an hour: no replica is warming up
        r.nodes = [f"node{k + 1}"]
    service = StragglerService(
        2,
        total_steps=100_000,
        detect=StragglerConfig(window_steps=10),
        evict=EvictionConfig(min_replicas=2, requeue_cost_estimate_s=1.0),
    )
    events: list[Any] = []
    for step in range(1, 30):
        for k in range(3):
            slow = k == 1 and step > 5  # its own pace is known from steps 1-5
            nodes = reported_nodes if k == 1 else []
            report = _report(k, step, 0.4 if slow else 0.2, nodes)
            events += service.on_report(report, state, now=step + k / 10, at=float(step))
    assert [(e.replica, e.node) for e in events] == [(1, expected)]
    assert isinstance(events[0], StragglerEviction)
    assert events[0].detail.startswith(f"{expected} 2.0x")


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--straggler-factor", "0.9", "factor"),
        ("--straggler-window-steps", "0", "window"),
        ("--straggler-requeue-cost-s", "-5", "requeue-cost"),
    ],
)
def test_control_options_are_checked_before_anything_starts(
    tmp_path: Path, option: str, value: str, message: str
) -> None:
    from click.testing import CliRunner

    from fthsdp_cli.main import cli

    run_dir = _spec_json(tmp_path)
    r = CliRunner().invoke(cli, ["control", "--run-dir", str(run_dir), option, value])
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert not (run_dir / "control.sqlite").exists()
