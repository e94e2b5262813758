"""`fthsdp doctor`: the pure checks by table over real `scontrol show config` captures, and the
command against real dev clusters with a good and a deliberately broken slurm.conf.

The captures under tests/fixtures/slurm_config/ are `scontrol show config` and `scontrol show
partition --oneliner` of `fthsdp cluster up --health` (4 nodes) on each release, byte for byte.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from prolog_epilog import dev_health
from slurm import devcluster
from slurm.doctor import (
    Finding,
    check_segment,
    check_topology,
    diagnose,
    exit_code,
    require_topology_support,
    spec_partitions,
)
from slurm.errors import InputError
from slurm.records import SlurmOutputError, SlurmVersion
from slurm.slurm_config import (
    SlurmConfig,
    Topology,
    parse_partitions,
    parse_show_config,
    parse_topology,
    version_of,
)
from slurm.spec import JobSpec, parse_spec

CAPTURES = Path(__file__).with_name("fixtures") / "slurm_config"
REPO = Path(__file__).resolve().parent.parent
RELEASES = sorted(
    p.name.removeprefix("show-config-").removesuffix(".txt")
    for p in CAPTURES.glob("show-config-*.txt")
)


def _capture(release: str) -> SlurmConfig:
    return parse_show_config((CAPTURES / f"show-config-{release}.txt").read_text())


def _changed(cfg: SlurmConfig, **changes: str | None) -> SlurmConfig:
    """`cfg` with settings replaced (None removes the line, as a release that lacks it)."""
    settings = dict(cfg.settings)
    for key, value in changes.items():
        if value is None:
            settings.pop(key, None)
        else:
            settings[key] = value
    return dataclasses.replace(cfg, settings=settings)


def _spec(**replicas: object) -> JobSpec:
    return parse_spec(
        {
            "job": {"name": "t", "run_dir": "/tmp/t", "partition": "gpu"},
            "replicas": {"count": 2, **replicas},
            "train": {"command": "true"},
        }
    )


def _finding(findings: list[Finding], check: str) -> Finding:
    matches = [f for f in findings if f.check == check]
    assert len(matches) == 1, [f.check for f in findings]
    return matches[0]


GOOD = _capture("22.05.8")


# ---------------------------------------------------------------------------------------------
# parsing


def test_every_capture_parses_and_passes_as_the_dev_cluster_is_configured() -> None:
    assert RELEASES, "no captures"
    for release in RELEASES:
        cfg = _capture(release)
        assert cfg.version_text == release
        findings = diagnose(cfg)
        bad = [f for f in findings if f.status != "pass"]
        assert bad == [], release


@pytest.mark.parametrize("release", RELEASES)
def test_every_capture_without_hooks_fails_with_the_lines_to_add(release: str) -> None:
    cfg = parse_show_config((CAPTURES / "unset" / f"show-config-{release}.txt").read_text())
    findings = diagnose(cfg)
    got = {f.check: (f.status, f.fix) for f in findings if f.status != "pass"}
    assert got == {
        "Prolog": ("fail", "Prolog=/usr/local/bin/fthsdp-prolog"),
        "PrologFlags": ("fail", "PrologFlags=Alloc"),
        "Epilog": ("warn", "Epilog=/usr/local/bin/fthsdp-epilog"),
        "HealthCheckProgram": ("warn", "HealthCheckProgram=/usr/local/bin/fthsdp-healthcheck"),
        "HealthCheckInterval": ("warn", "HealthCheckInterval=300"),
    }
    assert exit_code(findings) == 1


def test_indexed_settings_are_folded() -> None:
    cfg = _capture("24.11.5")
    assert cfg.get("Prolog") == cfg.get("Prolog[0]")
    assert str(cfg.get("Prolog")).endswith("/bin/fthsdp-prolog")
    text = (CAPTURES / "show-config-24.11.5.txt").read_text()
    two = text.replace("Prolog[0]               = ", "Prolog[0] = /etc/site\nProlog[1] = ")
    assert str(parse_show_config(two).get("Prolog")).startswith("/etc/site,/tmp/")


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("22.05.8", SlurmVersion(22, 5, 8)),
        ("slurm-wlm 24.11.5", SlurmVersion(24, 11, 5)),
        ("slurm 26.05.0-0rc1", SlurmVersion(26, 5, 0)),
        ("25.11", SlurmVersion(25, 11, 0)),
        ("(null)", None),
    ],
)
def test_version_of(text: str, version: SlurmVersion | None) -> None:
    assert version_of(text) == version


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no 'Configuration data as of' line"),
        ('{"config": {}}', "no 'Configuration data as of' line"),
        ("Configuration data as of 2026-11-30T15:16:37\nJobRequeue = 1\n", "no SLURM_VERSION"),
        (
            "Configuration data as of 2026-11-30T15:16:37\nSLURM_VERSION = 30.05.1\nA = 1\n",
            "on Slurm 30.05.1: unexpected output: only 2 settings",
        ),
    ],
)
def test_unknown_shapes_are_errors_naming_command_and_version(text: str, message: str) -> None:
    with pytest.raises(SlurmOutputError, match="scontrol show config") as info:
        parse_show_config(text)
    assert message in str(info.value)


def test_only_the_first_block_is_read() -> None:
    text = (CAPTURES / "show-config-22.05.8.txt").read_text()
    later = "\n\nCgroup Support Configuration:\nPrologFlags = NoSuchFlag\nMinJobAge = 1"
    cfg = parse_show_config(
        text.replace("\n\nSlurmctld(primary)", later + "\n\nSlurmctld(primary)")
    )
    assert cfg.get("PrologFlags") == "Alloc" and cfg.seconds("MinJobAge") == 600
    assert cfg.get("SlurmctldHost[0]") is not None
    assert cfg.get("PowerPlugin") is None and cfg.get("BurstBufferType") is None


def test_partitions() -> None:
    parts = parse_partitions((CAPTURES / "show-partition-22.05.8.txt").read_text(), GOOD.version)
    assert list(parts) == ["gpu"] and parts["gpu"].default and parts["gpu"].state == "UP"
    assert parse_partitions("No partitions in the system\n", GOOD.version) == {}
    with pytest.raises(SlurmOutputError, match="partition --oneliner"):
        parse_partitions("Name=gpu Nodes=x\n", GOOD.version)


# ---------------------------------------------------------------------------------------------
# checks, one row per setting and verdict

NOHOLD = "SchedulerParameters:nohold_on_prolog_fail"
SIZE = "PriorityWeightJobSize"
HETJOB_PRIO = "SchedulerParameters:bf_hetjob_prio"

CASES: list[tuple[str, Mapping[str, str | None], str, str, str | None]] = [
    # (label, changes, check, status, fix)
    ("requeue off", {"JobRequeue": "0"}, "JobRequeue", "warn", "JobRequeue=1"),
    ("requeue unprinted", {"JobRequeue": None}, "JobRequeue", "warn", None),
    ("prolog flags unset", {"PrologFlags": "(null)"}, "PrologFlags", "fail", "PrologFlags=Alloc"),
    (
        "prolog flags kept",
        {"PrologFlags": "Contain"},
        "PrologFlags",
        "fail",
        "PrologFlags=Contain,Alloc",
    ),
    ("prolog flags lower", {"PrologFlags": "alloc,Contain"}, "PrologFlags", "pass", None),
    (
        "hold on prolog fail",
        {"SchedulerParameters": "bf_interval=1,bf_continue"},
        NOHOLD,
        "fail",
        "SchedulerParameters=bf_interval=1,bf_continue,nohold_on_prolog_fail",
    ),
    (
        "no sched params",
        {"SchedulerParameters": "(null)"},
        NOHOLD,
        "fail",
        "SchedulerParameters=nohold_on_prolog_fail",
    ),
    (
        "builtin sched",
        {"SchedulerType": "sched/builtin"},
        "SchedulerType",
        "warn",
        "SchedulerType=sched/backfill",
    ),
    ("bf default", {"SchedulerParameters": "nohold_on_prolog_fail"}, "bf_interval", "pass", None),
    (
        "bf slow",
        {"SchedulerParameters": "bf_interval=120,nohold_on_prolog_fail"},
        "bf_interval",
        "warn",
        "SchedulerParameters=nohold_on_prolog_fail,bf_interval=30",
    ),
    ("no prolog", {"Prolog": "(null)"}, "Prolog", "fail", "Prolog=/usr/local/bin/fthsdp-prolog"),
    (
        "other prolog",
        {"Prolog": "/etc/slurm/prolog.d/*"},
        "Prolog",
        "warn",
        "Prolog=/usr/local/bin/fthsdp-prolog",
    ),
    ("two prologs", {"Prolog": "/etc/slurm/site,/opt/bin/fthsdp-prolog"}, "Prolog", "pass", None),
    ("no epilog", {"Epilog": "(null)"}, "Epilog", "warn", "Epilog=/usr/local/bin/fthsdp-epilog"),
    (
        "no healthcheck",
        {"HealthCheckProgram": "(null)"},
        "HealthCheckProgram",
        "warn",
        "HealthCheckProgram=/usr/local/bin/fthsdp-healthcheck",
    ),
    (
        "interval 0",
        {"HealthCheckInterval": "0 sec"},
        "HealthCheckInterval",
        "fail",
        "HealthCheckInterval=300",
    ),
    (
        "interval 0, no program",
        {"HealthCheckInterval": "0 sec", "HealthCheckProgram": "(null)"},
        "HealthCheckInterval",
        "warn",
        "HealthCheckInterval=300",
    ),
    (
        "idle only",
        {"HealthCheckNodeState": "IDLE"},
        "HealthCheckNodeState",
        "warn",
        "HealthCheckNodeState=ANY",
    ),
    ("min job age low", {"MinJobAge": "30 sec"}, "MinJobAge", "warn", "MinJobAge=300"),
    ("min job age 0", {"MinJobAge": "0 sec"}, "MinJobAge", "pass", None),
    ("min job age unprinted", {"MinJobAge": None}, "MinJobAge", "warn", None),
    ("no gres", {"GresTypes": "(null)"}, "GresTypes", "warn", "GresTypes=gpu"),
    ("other gres", {"GresTypes": "mps"}, "GresTypes", "warn", "GresTypes=mps,gpu"),
    ("untested release", {"SLURM_VERSION": "23.11.10"}, "SLURM_VERSION", "warn", None),
    (
        "no size weight",
        {"PriorityWeightJobSize": "0"},
        SIZE,
        "warn",
        "PriorityWeightJobSize=1000",
    ),
    (
        "small jobs first",
        {"PriorityFavorSmall": "Yes"},
        SIZE,
        "warn",
        "PriorityWeightTRES=GRES/gpu=1000",
    ),
    (
        "gpu weight",
        {"PriorityWeightJobSize": "0", "PriorityWeightTRES": "CPU=10,GRES/gpu=500"},
        SIZE,
        "pass",
        None,
    ),
    (
        "gpu weight negative",
        {"PriorityWeightJobSize": "0", "PriorityWeightTRES": "GRES/gpu=-5"},
        SIZE,
        "warn",
        "PriorityWeightJobSize=1000",
    ),
    ("fifo", {"PriorityType": "priority/basic", "PriorityWeightJobSize": None}, SIZE, "pass", None),
    ("site plugin", {"PriorityType": "priority/site"}, SIZE, "warn", None),
    ("priority unprinted", {"PriorityType": None}, SIZE, "warn", None),
    (
        "components apart",
        {"SchedulerParameters": "bf_interval=1,nohold_on_prolog_fail"},
        HETJOB_PRIO,
        "warn",
        "SchedulerParameters=bf_interval=1,nohold_on_prolog_fail,bf_hetjob_prio=max",
    ),
    (
        "components apart under fifo",
        {"PriorityType": "priority/basic", "SchedulerParameters": "nohold_on_prolog_fail"},
        HETJOB_PRIO,
        "pass",
        None,
    ),
]


@pytest.mark.parametrize(
    ("label", "changes", "check", "status", "fix"), CASES, ids=[c[0] for c in CASES]
)
def test_check(
    label: str, changes: Mapping[str, str | None], check: str, status: str, fix: str | None
) -> None:
    cfg = _changed(GOOD, **changes)
    if "SLURM_VERSION" in changes:
        cfg = dataclasses.replace(cfg, version_text=str(changes["SLURM_VERSION"]))
    findings = diagnose(cfg)
    f = _finding(findings, check)
    assert (f.status, f.fix) == (status, fix), f
    # A check on one item of a list setting (`KEY:item`) moves with any change to KEY.
    others = [
        g
        for g in findings
        if g.check != check and g.check.split(":")[0] not in changes and g.status != "pass"
    ]
    assert others == [], others
    assert exit_code(findings) == (1 if status == "fail" else 0)


@pytest.mark.parametrize(
    ("spec", "changes", "check", "status"),
    [
        (_spec(gpus_per_node=8), {"GresTypes": "(null)"}, "GresTypes", "fail"),
        (
            _spec(helper={"command": "x"}),
            {"SchedulerType": "sched/builtin"},
            "SchedulerType",
            "fail",
        ),
        (_spec(switches=1), {}, "TopologyPlugin", "pass"),
        (_spec(topology="tree"), {"TopologyPlugin": "topology/default"}, "TopologyPlugin", "fail"),
        (_spec(topology="block"), {}, "TopologyPlugin", "fail"),
        (_spec(), {"TopologyPlugin": "topology/default"}, "TopologyPlugin", "pass"),
        (_spec(), {"PriorityWeightJobSize": "0"}, SIZE, "pass"),
        (_spec(helper={"command": "x"}), {"PriorityWeightJobSize": "0"}, SIZE, "warn"),
        (_spec(), {"SchedulerParameters": "nohold_on_prolog_fail"}, HETJOB_PRIO, "pass"),
        (
            _spec(helper={"command": "x"}),
            {"SchedulerParameters": "nohold_on_prolog_fail"},
            HETJOB_PRIO,
            "warn",
        ),
    ],
)
def test_checks_with_a_spec(
    spec: JobSpec, changes: Mapping[str, str | None], check: str, status: str
) -> None:
    f = _finding(diagnose(_changed(GOOD, **changes), spec), check)
    assert f.status == status, f


def _shown(release: str, kind: str) -> Topology:
    text = (CAPTURES / f"show-topology-{release}-{kind}.txt").read_text()
    return parse_topology(text, version_of(release))


ON_24 = dataclasses.replace(_changed(GOOD, TopologyPlugin="topology/tree"), version_text="24.11.5")


@pytest.mark.parametrize(
    ("cfg", "required", "shown", "status", "says"),
    [
        (GOOD, "block", None, "fail", "Slurm 22.05.8 lacks"),
        (GOOD, "block", _shown("22.05.8", "tree"), "fail", "Slurm 22.05.8 lacks"),
        (GOOD, "tree", _shown("22.05.8", "tree"), "pass", "shows topology/tree"),
        (ON_24, "block", None, "fail", "topology/tree: the spec asks for topology/block"),
        (ON_24, "block", _shown("24.11.5", "tree"), "fail", "shows topology/tree: the spec"),
        # A topology.yaml's blocks with slurm.conf's TopologyPlugin=topology/tree (26.05).
        (ON_24, "block", _shown("26.05.5", "block"), "pass", "shows topology/block"),
        (_changed(ON_24, TopologyPlugin="topology/block"), "block", None, "pass", "as the spec"),
        (ON_24, "tree", Topology(None), "fail", "no topology: the spec asks for topology/tree"),
    ],
)
def test_topology(
    cfg: SlurmConfig, required: str, shown: Topology | None, status: str, says: str
) -> None:
    f = check_topology(cfg, required, shown)
    assert f.status == status and says in f.detail, f
    if status == "fail" and "lacks" not in says:
        assert f.fix == f"TopologyPlugin=topology/{required}"


@pytest.mark.parametrize("release", ["22.05.8", "24.11.5", "26.05.5"])
def test_parse_topology(release: str) -> None:
    assert _shown(release, "tree") == Topology("tree", {})
    if release != "22.05.8":
        assert _shown(release, "block") == Topology("block", {"b1": 2, "b2": 2})
    with pytest.raises(
        SlurmOutputError, match=r"show topology on Slurm 30.05.1: unexpected output: no BlockSize"
    ):
        parse_topology("BlockName=b1 Nodes=node[1-2] Size=2\n", SlurmVersion(30, 5, 1))
    assert parse_topology("", version_of(release)) == Topology(None, {})


@pytest.mark.parametrize(
    ("replicas", "blocks", "status"),
    [
        ({"nodes": 2, "segment": 2}, {"b1": 2, "b2": 2}, "pass"),
        ({"nodes": 4, "segment": 2}, {"b1": 2, "b2": 2}, "pass"),
        ({"nodes": 4, "segment": 4}, {"b1": 2, "b2": 2}, "fail"),
        ({"nodes": 4}, {"b1": 2, "b2": 2}, "pass"),
        ({"nodes": 36, "segment": 18}, {"rack1": 18, "rack2": 18}, "pass"),
        ({"nodes": 2, "segment": 2}, {}, "fail"),
    ],
)
def test_segment_fits_a_base_block(
    replicas: dict[str, object], blocks: dict[str, int], status: str
) -> None:
    assert check_segment(_spec(topology="block", **replicas), blocks).status == status


def test_partitions_of_a_spec() -> None:
    parts = parse_partitions((CAPTURES / "show-partition-22.05.8.txt").read_text(), GOOD.version)
    spec = parse_spec(
        {
            "job": {"name": "t", "run_dir": "/tmp/t", "partition": "gpu"},
            "replicas": {"count": 1, "helper": {"command": "x", "partition": "cpu"}},
            "train": {"command": "true"},
        }
    )
    assert spec_partitions(spec) == ["cpu", "gpu"]
    findings = diagnose(GOOD, spec, parts)
    assert _finding(findings, "partition gpu").status == "pass"
    missing = _finding(findings, "partition cpu")
    assert missing.status == "fail" and "this cluster has: gpu" in missing.detail
    unnamed = parse_spec(
        {"job": {"name": "t", "run_dir": "/t"}, "replicas": {"count": 1}, "train": {"command": "x"}}
    )
    no_default = {"gpu": dataclasses.replace(parts["gpu"], default=False)}
    assert _finding(diagnose(GOOD, unnamed, no_default), "default partition").status == "fail"
    assert exit_code(diagnose(GOOD, unnamed, parts)) == 0


def test_submit_refuses_block_where_slurmctld_schedules_no_blocks() -> None:
    calls: list[str] = []

    def read(cfg: SlurmConfig) -> Callable[[], SlurmConfig]:
        def config() -> SlurmConfig:
            calls.append("config")
            return cfg

        return config

    def shown(topology: Topology) -> Callable[[str], Topology]:
        def show(version: str) -> Topology:
            calls.append("topology")
            return topology

        return show

    tree, block = _shown("24.11.5", "tree"), _shown("24.11.5", "block")
    require_topology_support(_spec(), read(GOOD), shown(tree))  # no block asked: nothing read
    assert calls == []
    with pytest.raises(InputError, match=r"replicas.topology: got 'block'; .*22.05.8 lacks"):
        require_topology_support(_spec(topology="block"), read(GOOD), shown(block))
    assert calls == ["config"]
    with pytest.raises(InputError, match="shows topology/tree"):
        require_topology_support(_spec(topology="block"), read(ON_24), shown(tree))
    require_topology_support(_spec(topology="block"), read(ON_24), shown(block))


# ---------------------------------------------------------------------------------------------
# the command


def _doctor(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fthsdp_cli", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
        env=dict(env if env is not None else os.environ),
    )


def test_no_scontrol_exits_3(tmp_path: Path) -> None:
    r = _doctor(env={**os.environ, "PATH": str(tmp_path)})
    assert r.returncode == 3, r.stderr
    assert r.stderr.strip().splitlines() == [
        "fthsdp doctor: scontrol not found: is Slurm's client installed?"
    ]


def test_slurm_conf_naming_no_file_exits_3(tmp_path: Path) -> None:
    r = _doctor(env={**os.environ, "SLURM_CONF": str(tmp_path / "missing.conf")})
    assert r.returncode == 3, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "SLURM_CONF=" in lines[0] and "No such file" in lines[0]


def test_bad_spec_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[job]\nname = "t"\nrun_dir = "/t"\n[replicas]\ncount = 1\nsegment = 2\n'
        '[train]\ncommand = "x"\n'
    )
    r = _doctor("--spec", str(bad))
    assert r.returncode == 2 and "replicas.segment" in r.stderr and "Traceback" not in r.stderr


def _cluster(directory: Path, health: bool, **fields: object) -> devcluster.DevClusterConfig:
    base = devcluster.free_port_block(3, start=24000 + (os.getpid() % 200) * 10)
    cfg = devcluster.DevClusterConfig(
        directory=directory, nodes=2, ctld_port=base, slurmd_base_port=base + 1, **fields
    )
    return dev_health.with_health(cfg) if health else cfg


def _json(r: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(r.stdout)


def _on(cfg: devcluster.DevClusterConfig) -> dict[str, str]:
    return {**os.environ, "SLURM_CONF": str(cfg.conf_path)}


@pytest.mark.slurm
def test_doctor_passes_a_cluster_set_up_as_the_docs_say(tmp_path: Path, site_dir: Path) -> None:
    from tests.conftest import _require_slurm

    _require_slurm()
    spec = tmp_path / "run.toml"
    spec.write_text(
        '[job]\nname = "t"\nrun_dir = "/tmp/t"\npartition = "gpu"\n'
        "[replicas]\ncount = 2\nnodes = 1\ngpus_per_node = 8\nswitches = 1\n"
        '[train]\ncommand = "true"\n'
    )
    with devcluster.running_cluster(_cluster(site_dir / "good", health=True), timeout=120) as cfg:
        r = _doctor("--json", env=_on(cfg))
        assert r.returncode == 0, r.stdout + r.stderr
        data = _json(r)
        findings = data["findings"]
        assert isinstance(findings, list)
        assert [f["check"] for f in findings if f["status"] != "pass"] == []
        assert (
            data["slurm_version"]
            == subprocess.run(
                ["scontrol", "--version"], env=_on(cfg), capture_output=True, text=True, check=True
            ).stdout.split()[-1]
        )
        r = _doctor("--json", "--spec", str(spec), env=_on(cfg))
        assert r.returncode == 0, r.stdout + r.stderr
        checks = {f["check"]: f["status"] for f in _json(r)["findings"]}
        assert checks["partition gpu"] == checks["TopologyPlugin"] == "pass"
        r = _doctor("--spec", str(spec), env=_on(cfg))
        assert r.returncode == 0 and "0 fail" in r.stdout, r.stdout
        spec.write_text(spec.read_text().replace('partition = "gpu"', 'partition = "h200"'))
        r = _doctor("--json", "--spec", str(spec), env=_on(cfg))
        assert r.returncode == 1
        failed = [f for f in _json(r)["findings"] if f["status"] == "fail"]
        assert [f["check"] for f in failed] == ["partition h200"]


@pytest.mark.slurm
def test_doctor_fails_a_broken_cluster_and_names_the_lines(site_dir: Path) -> None:
    from tests.conftest import _require_slurm

    _require_slurm()
    # No Prolog, PrologFlags, Epilog or HealthCheckProgram, and a held job on prolog failure.
    broken = _cluster(site_dir / "broken", health=False, nohold_on_prolog_fail=False)
    with devcluster.running_cluster(broken, timeout=120) as cfg:
        r = _doctor("--json", env=_on(cfg))
        assert r.returncode == 1, r.stdout + r.stderr
        found = {f["check"]: f for f in _json(r)["findings"]}
        status = {k: f["status"] for k, f in found.items()}
        assert status["Prolog"] == status["PrologFlags"] == "fail"
        assert status["SchedulerParameters:nohold_on_prolog_fail"] == "fail"
        assert status["Epilog"] == status["HealthCheckProgram"] == "warn"
        assert found["Prolog"]["fix"] == "Prolog=/usr/local/bin/fthsdp-prolog"
        assert found["SchedulerParameters:nohold_on_prolog_fail"]["fix"] == (
            "SchedulerParameters=bf_interval=1,bf_continue,bf_hetjob_prio=max,nohold_on_prolog_fail"
        )
        r = _doctor(env=_on(cfg))
        assert r.returncode == 1 and "PrologFlags=Alloc" in r.stdout, r.stdout
    # The same cluster stopped: Slurm unreachable is exit 3 and one line.
    r = _doctor("--timeout", "60", env=_on(cfg))
    assert r.returncode == 3, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "scontrol show config" in r.stderr


# ---------------------------------------------------------------------------------------------
# the drain mode (slurm.privileges): what a run of the calling user does about a suspect node


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize(
    ("uid", "user", "mode", "says"),
    [
        (0, "root", "direct", "drains a suspect node itself"),
        (65534, "nobody", "request", "asks root's Epilog for the drain"),
    ],
)
def test_drain_mode_row(release: str, uid: int, user: str, mode: str, says: str) -> None:
    from fthsdp_cli.commands.doctor import drain_finding
    from slurm.privileges import decide

    row = drain_finding(decide(uid, user, _capture(release)))
    assert (row.check, row.status, row.fix) == ("drain mode", "pass", None)
    assert row.detail.startswith(f"{mode} for {user}: ") and says in row.detail
    assert "ExcNodeList" in row.detail


def test_root_is_direct_without_asking_slurm() -> None:
    """Root may drain on any cluster, so the probe decides without a Slurm command (no cluster
    runs here); doctor as `nobody` on a real cluster is in tests/test_story_drain_request.py."""
    from slurm.privileges import probe

    got = probe(timeout=5)
    if os.geteuid() == 0:
        assert (got.mode, got.reason) == ("direct", "running as root")
    else:
        assert got.mode == "request"
