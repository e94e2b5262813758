"""Spec loading: defaults, overrides, and one-line errors for every kind of bad input."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from slurm.errors import InputError
from slurm.spec import JobSpec, apply_overrides, load_spec, parse_spec

ROOT = Path(__file__).resolve().parent.parent
SPECS = Path(__file__).with_name("specs")


def minimal(**sections: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = {
        "job": {"name": "t", "run_dir": "/r"},
        "replicas": {"count": 2},
        "train": {"command": "python t.py"},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return data


def test_defaults_of_minimal_spec() -> None:
    spec = parse_spec(minimal())
    assert spec.replicas.nodes == 1
    assert spec.replicas.tasks_per_node == 1  # no GPUs: one task per node
    assert spec.replicas.helper is None
    assert spec.train.min_replicas == 1
    assert spec.train.max_restarts_per_replica == 3
    assert spec.train.restart_window_s == 3600
    assert (spec.train.heartbeat_timeout_s, spec.train.allreduce_timeout_s) == (0.5, 5)
    assert (spec.train.quorum_timeout_s, spec.train.join_timeout_s) == (10, 60)
    assert (spec.train.control_wait_s, spec.train.control_wait_in_effect_s) == (None, 300)
    assert (spec.train.checkpoint_every_steps, spec.train.checkpoint_every_s) == (0, None)
    assert spec.train.checkpoint_every_s_in_effect is None  # Young/Daly's cadence
    assert spec.train.steps is None
    assert spec.control.lighthouse_port == 0 and spec.control.coordinator_port == 0
    assert spec.health.checks == ()


def test_tasks_per_node_defaults_to_gpus() -> None:
    spec = parse_spec(minimal(replicas={"gpus_per_node": 8}))
    assert spec.replicas.tasks_per_node == 8
    assert spec.replicas.gres == "gpu:8"
    spec = parse_spec(minimal(replicas={"gpus_per_node": 8, "gpu_type": "h100"}))
    assert spec.replicas.gres == "gpu:h100:8"


def test_spec_is_frozen() -> None:
    spec = parse_spec(minimal(job={"env": {"A": "1"}}))
    with pytest.raises(AttributeError):
        spec.replicas.count = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.job.env["B"] = "2"  # type: ignore[index]


def test_example_and_test_specs_load() -> None:
    tiny = load_spec(ROOT / "examples" / "tiny.toml")
    assert tiny.replicas.count == 2 and tiny.replicas.nodes == 1
    assert tiny.replicas.tasks_per_node == 2 and tiny.replicas.gpus_per_node == 0
    assert tiny.train.command == "python examples/train_tiny.py"
    assert os.path.isabs(tiny.job.run_dir)
    for path in SPECS.glob("*.toml"):
        assert isinstance(load_spec(path), JobSpec)
    helper = load_spec(SPECS / "helper.toml")
    assert helper.replicas.helper is not None
    assert helper.replicas.constraint_for(2) == "bldg_a|bldg_c"


def test_relative_run_dir_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec_file = tmp_path / "s.toml"
    spec_file.write_text(
        '[job]\nname="a"\nrun_dir="runs/a"\n[replicas]\ncount=1\n[train]\ncommand="x"\n'
    )
    monkeypatch.chdir(tmp_path)
    assert load_spec(spec_file).job.run_dir == str(tmp_path / "runs" / "a")


@pytest.mark.parametrize(
    ("override", "field", "expected"),
    [
        ("replicas.count=4", ("replicas", "count"), 4),
        ("train.heartbeat_timeout_s=1.5", ("train", "heartbeat_timeout_s"), 1.5),
        ("replicas.exclusive=true", ("replicas", "exclusive"), True),
        ("job.name=other", ("job", "name"), "other"),
        ("job.time=30", ("job", "time"), "30"),  # a str field keeps the text
        ("replicas.constraint=a&b", ("replicas", "constraint"), "a&b"),
        ('replicas.constraint=["x","y"]', ("replicas", "constraint"), ("x", "y")),
        ("replicas.helper.command=sleep 1", ("replicas", "helper"), None),
    ],
)
def test_overrides_are_typed_by_field(
    override: str, field: tuple[str, str], expected: object
) -> None:
    spec = load_spec(SPECS / "cpu.toml", [override])
    value = getattr(getattr(spec, field[0]), field[1])
    if field[1] == "helper":
        assert value is not None and value.command == "sleep 1"
    else:
        assert value == expected


def test_override_env_entry() -> None:
    spec = load_spec(SPECS / "basic.toml", ["job.env.EXTRA=1=2"])
    assert spec.job.env["EXTRA"] == "1=2"
    assert spec.job.env["NCCL_DEBUG"] == "WARN"


def test_env_may_point_the_watchdog_at_its_inputs() -> None:
    """The watchdog's and slow fault's input paths are the user's to set; the rest of FTHSDP_
    stays fthsdp's (see the BAD table)."""
    spec = load_spec(
        SPECS / "basic.toml",
        ["job.env.FTHSDP_HEALTH_CONFIG=/etc/fthsdp/health.toml", "job.env.FTHSDP_SLOW_FILE=/x"],
    )
    assert spec.job.env["FTHSDP_HEALTH_CONFIG"] == "/etc/fthsdp/health.toml"
    assert spec.job.env["FTHSDP_SLOW_FILE"] == "/x"


def test_overrides_do_not_mutate_input() -> None:
    data = minimal()
    apply_overrides(data, ["replicas.count=9"])
    assert data["replicas"]["count"] == 2


# (spec change or override, field named in the message, a phrase of what is allowed)
BAD: list[tuple[dict[str, Any], str, str]] = [
    ({"job": {"nmae": "x"}}, "job.nmae", "did you mean 'name'"),
    ({"replicas": {"gpus_per_nod": 8}}, "replicas.gpus_per_nod", "did you mean 'gpus_per_node'"),
    ({"trian": {}}, "trian", "did you mean 'train'"),
    ({"replicas": {"count": 0}}, "replicas.count", ">= 1"),
    ({"replicas": {"count": -3}}, "replicas.count", ">= 1"),
    ({"replicas": {"count": "4"}}, "replicas.count", "integer"),
    ({"replicas": {"count": True}}, "replicas.count", "integer"),
    ({"replicas": {"nodes": 1.5}}, "replicas.nodes", "integer"),
    ({"replicas": {"exclusive": "yes"}}, "replicas.exclusive", "true or false"),
    ({"replicas": {"constraint": ["a"]}}, "replicas.constraint", "exactly replicas.count=2"),
    ({"replicas": {"constraint": "a b"}}, "replicas.constraint", "feature expression"),
    ({"replicas": {"constraint": ["a", "b;rm"]}}, "replicas.constraint[1]", "feature"),
    ({"replicas": {"switches_wait": "00:10:00"}}, "replicas.switches_wait", "needs"),
    ({"replicas": {"switches": 1, "switches_wait": "10m"}}, "replicas.switches_wait", "time"),
    ({"replicas": {"gpu_type": "h100"}}, "replicas.gpu_type", "gpus_per_node"),
    ({"replicas": {"mem": "lots"}}, "replicas.mem", "memory size"),
    ({"replicas": {"nodelist": "node[1-"}}, "replicas.nodelist", "hostlist"),
    ({"replicas": {"gres_flags": "bind"}}, "replicas.gres_flags", "enforce-binding"),
    ({"job": {"time": "1 day"}}, "job.time", "Slurm time"),
    ({"job": {"time": "25:61:00:00"}}, "job.time", "Slurm time"),
    ({"job": {"name": "a b"}}, "job.name", "no spaces"),
    ({"job": {"name": "x;rm -rf /"}}, "job.name", "allowed"),
    ({"job": {"name": "$(id)"}}, "job.name", "allowed"),
    ({"job": {"name": "a" * 49}}, "job.name", "1-48"),
    ({"job": {"partition": "gpu'"}}, "job.partition", "allowed"),
    ({"job": {"run_dir": ""}}, "job.run_dir", "shared filesystem"),
    ({"job": {"run_dir": "/a b"}}, "job.run_dir", "no spaces"),
    ({"job": {"run_dir": "/a/../b"}}, "job.run_dir", "'..'"),
    ({"job": {"mail_type": "SOMETIMES"}}, "job.mail_type", "comma list"),
    ({"job": {"mail_user": "not an address"}}, "job.mail_user", "e-mail"),
    ({"job": {"env": {"bad-key": "1"}}}, "job.env.bad-key", "variable name"),
    ({"job": {"env": {"FTHSDP_REPLICA_ID": "1"}}}, "job.env.FTHSDP_REPLICA_ID", "set by"),
    ({"job": {"env": {"A": ["x"]}}}, "job.env.A", "string"),
    ({"train": {"command": "  "}}, "train.command", "non-empty"),
    ({"train": {"min_replicas": 3}}, "train.min_replicas", "replicas.count=2"),
    ({"train": {"quorum_timeout_s": 4}}, "train.quorum_timeout_s", "heartbeat < allreduce"),
    ({"train": {"heartbeat_timeout_s": 5}}, "train.allreduce_timeout_s", "must exceed"),
    ({"train": {"join_timeout_s": 10}}, "train.join_timeout_s", "must exceed"),
    ({"train": {"control_wait_s": 59}}, "train.control_wait_s", ">= train.join_timeout_s=60"),
    ({"train": {"control_wait_s": "5m"}}, "train.control_wait_s", "number"),
    ({"train": {"heartbeat_timeout_s": 0}}, "train.heartbeat_timeout_s", "> 0"),
    ({"train": {"checkpoint_every_s": -1}}, "train.checkpoint_every_s", ">= 0"),
    ({"train": {"checkpoint_every_s": "auto"}}, "train.checkpoint_every_s", "number"),
    ({"train": {"run_losses_per_day": -1}}, "train.run_losses_per_day", "finite number >= 0"),
    (
        {"train": {"failures_per_1000_nodes_day": float("inf")}},
        "train.failures_per_1000_nodes_day",
        "finite number >= 0",
    ),
    ({"control": {"lighthouse_port": 80}}, "control.lighthouse_port", "1024..65535"),
    (
        {"control": {"lighthouse_port": 2000, "coordinator_port": 2000}},
        "control.coordinator_port",
        "differs",
    ),
    ({"health": {"checks": ["ECC!"]}}, "health.checks", "allowed: gpu-count"),
    ({"health": {"checks": ["gpu_count"]}}, "health.checks", "did you mean 'gpu-count'"),
    ({"health": {"checks": ["ecc", "ecc"]}}, "health.checks", "at most once"),
    ({"replicas": {"helper": {"nodes": 1}}}, "replicas.helper.command", "required"),
    ({"replicas": {"helper": {"command": "x", "cpus": 2}}}, "replicas.helper.cpus", "did you"),
]


@pytest.mark.parametrize(("change", "field", "allowed"), BAD)
def test_bad_input_names_field_value_and_allowed(
    change: dict[str, Any], field: str, allowed: str
) -> None:
    data = minimal()
    for section, values in change.items():
        data.setdefault(section, {}).update(values)
    with pytest.raises(InputError) as info:
        parse_spec(data)
    assert info.value.field == field
    assert allowed in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_sections_and_fields() -> None:
    with pytest.raises(InputError, match=r"job\.run_dir: got None; required"):
        parse_spec({"job": {"name": "x"}, "replicas": {"count": 1}, "train": {"command": "x"}})
    with pytest.raises(InputError, match=r"^train: got None; required"):
        parse_spec({"job": {"name": "x", "run_dir": "/r"}, "replicas": {"count": 1}})


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("replicas.count", "KEY=VALUE"),
        ("replicas.cnt=3", "did you mean 'count'"),
        ("replicas=3", "a field, not a section"),
        ("job.env=3", "job.env.NAME=VALUE"),
        ("replicas.count.x=3", "not a table"),
        ("replicas.count=four", "expected an integer"),
    ],
)
def test_bad_overrides(override: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        load_spec(SPECS / "cpu.toml", [override])


def test_unreadable_spec_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="an existing TOML file"):
        load_spec(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[job\n")
    with pytest.raises(InputError, match="valid TOML"):
        load_spec(bad)


BASE = {"job": {"name": "a", "run_dir": "/tmp/a"}, "train": {"command": "x"}}


def test_warm_spares_need_the_fthsdp_api() -> None:
    data = dict(
        BASE,
        replicas={"count": 2},
        train={"command": "x", "mode": "torchft", "progress_file": "p.txt"},
        spares={"nodes": 1, "warm": True},
    )
    with pytest.raises(InputError, match=r'spares.warm.*train.mode = "torchft"'):
        parse_spec(data)


@pytest.mark.parametrize(
    ("replicas", "spares", "error"),
    [
        ({"count": 2}, {}, None),
        ({"count": 2}, {"nodes": 1}, None),
        ({"count": 2, "nodes": 2}, {"nodes": 4}, None),
        ({"count": 2, "nodes": 2}, {"nodes": 3}, "a multiple of replicas.nodes=2"),
        ({"count": 2}, {"nodes": -1}, "must be an integer >= 0"),
        ({"count": 2, "constraint": ["a", "b"]}, {"nodes": 1}, "per-replica constraint"),
        ({"count": 2}, {"node": 1}, "did you mean 'nodes'"),
        ({"count": 2}, {"nodes": 1, "warm": True}, None),
        ({"count": 2}, {"warm": True}, "spares.warm.*false when spares.nodes = 0"),
        ({"count": 2}, {"nodes": 1, "warm": "yes"}, "spares.warm.*true or false"),
        (
            {"count": 2, "helper": {"nodes": 1, "command": "h"}},
            {"nodes": 1, "warm": True},
            r"spares.warm.*\[replicas.helper\]",
        ),
    ],
)
def test_spares_section(
    replicas: dict[str, object], spares: dict[str, object], error: str | None
) -> None:
    data = dict(BASE, replicas=replicas, spares=spares)
    if error is None:
        spec = parse_spec(data)
        assert spec.spares.nodes == spares.get("nodes", 0)
        assert spec.spares.warm is spares.get("warm", False)
    else:
        with pytest.raises(InputError, match=error):
            parse_spec(data)
