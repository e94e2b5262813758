"""Block topology (`replicas.topology = "block"`): the spec rules, the rendered `--segment`, the
submit-time refusal on a Slurm without it, and placement on a real dev cluster of blocks.

Slurm 24.05 added topology/block with `BlockSizes` and `sbatch --segment` (its NEWS and man
pages); 22.05 has neither, so the placement test skips there, naming the release it found, and
runs in the 24.11 and 26.05 chroots (`python -m slurm.release_chroot run --version V -- ...`).
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import hostlist
import pytest
import user_harness

from slurm import devcluster
from slurm.devcluster.daemons import binary
from slurm.doctor import BLOCK_SINCE
from slurm.errors import InputError
from slurm.records import SlurmVersion
from slurm.render import render_replica
from slurm.slurm_json import parse_version
from slurm.spec import JobSpec, parse_spec

REPO = Path(__file__).resolve().parent.parent
WAIT_S = 120
NO_BLOCK_REASONS = ("Resources", "No suitable topology unit found")


def _spec(run_dir: str = "/tmp/t", **replicas: object) -> JobSpec:
    return parse_spec(
        {
            "job": {"name": "blk", "run_dir": run_dir},
            "replicas": {"count": 2, **replicas},
            "train": {"command": "true"},
        }
    )


# ---------------------------------------------------------------------------------------------
# the spec and the rendered line


@pytest.mark.parametrize(
    ("replicas", "field", "allowed"),
    [
        ({"topology": "torus"}, "replicas.topology", "one of tree, block"),
        ({"segment": 2, "nodes": 2}, "replicas.segment", "needs replicas.topology = 'block'"),
        ({"topology": "tree", "segment": 1}, "replicas.segment", "needs replicas.topology"),
        ({"topology": "block", "segment": 0}, "replicas.segment", "must be an integer >= 1"),
        ({"topology": "block", "segment": -2}, "replicas.segment", "must be an integer >= 1"),
        ({"topology": "block", "nodes": 4, "segment": 3}, "replicas.segment", "divide"),
        ({"topology": "block", "nodes": 2, "segment": 4}, "replicas.segment", "divide"),
        ({"topology": "block", "switches": 1}, "replicas.switches", "topology = 'tree'"),
    ],
)
def test_spec_rejects(replicas: dict[str, object], field: str, allowed: str) -> None:
    with pytest.raises(InputError) as info:
        _spec(**replicas)
    assert info.value.field == field and allowed in info.value.allowed


@pytest.mark.parametrize(
    ("replicas", "required", "segment"),
    [
        ({}, None, None),
        ({"switches": 1}, "tree", None),
        ({"topology": "tree"}, "tree", None),
        ({"topology": "tree", "switches": 2}, "tree", None),
        ({"topology": "block"}, "block", None),
        ({"topology": "block", "nodes": 4}, "block", None),
        ({"topology": "block", "nodes": 4, "segment": 2}, "block", 2),
        ({"topology": "block", "nodes": 4, "segment": 4}, "block", 4),
    ],
)
def test_segment_is_rendered_only_for_block(
    replicas: dict[str, object], required: str | None, segment: int | None
) -> None:
    spec = _spec(**replicas)
    assert spec.replicas.required_topology == required
    assert spec.replicas.segment_option == segment
    lines = render_replica(spec, 1).text.splitlines()
    got = [line for line in lines if line.startswith("#SBATCH --segment")]
    assert got == ([f"#SBATCH --segment={segment}"] if segment else [])


# ---------------------------------------------------------------------------------------------
# the real cluster


def _slurm_version() -> SlurmVersion:
    out = subprocess.run(
        [binary("slurmd"), "-V"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    return parse_version(out)


def _require_block() -> None:
    from tests.conftest import _require_slurm

    _require_slurm()
    version = _slurm_version()
    if version < BLOCK_SINCE:
        slurm_lacks_block = f"topology/block or --segment (added in {BLOCK_SINCE.release})"
        pytest.skip(f"Slurm {version} has no {slurm_lacks_block}")


@pytest.fixture()
def cluster(site_dir: Path) -> Iterator[Callable[..., devcluster.DevClusterConfig]]:
    """Start 4-node dev clusters (2 nodes per block or leaf switch); all stopped at the end."""
    started: list[devcluster.DevClusterConfig] = []

    def start(topology: str, yaml: str | None = None) -> devcluster.DevClusterConfig:
        base = devcluster.free_port_block(5, start=26000 + (os.getpid() % 200) * 10)
        cfg = devcluster.DevClusterConfig(
            directory=site_dir / f"{topology}{len(started)}",
            nodes=4,
            gpus_per_node=1,
            switch_size=2,
            topology=topology,
            ctld_port=base,
            slurmd_base_port=base + 1,
        )
        started.append(cfg)
        if yaml is not None:  # slurmctld reads topology.yaml instead of topology.conf (25.05+)
            (cfg.directory / "etc").mkdir(parents=True)
            (cfg.directory / "etc" / "topology.yaml").write_text(yaml)
        return devcluster.up(cfg, timeout=120)

    try:
        yield start
    finally:
        for cfg in started:
            devcluster.down(cfg)


@dataclass(frozen=True)
class Account:
    """A job user and their own folder: the replicas are submitted as the job user, the
    fillers that keep nodes busy as another user, as on a shared site."""

    user: str
    home: Path

    def own(self, *paths: Path) -> None:
        entry = pwd.getpwnam(self.user)
        for path in paths:
            os.chown(path, entry.pw_uid, entry.pw_gid)


@pytest.fixture()
def accounts(job_users: tuple[str, str], user_base: Path) -> tuple[Account, Account]:
    """(the job user, another user), each with a folder of their own."""
    user, other = job_users
    return (
        Account(user, user_harness.user_folder(user_base, user, "home-user")),
        Account(other, user_harness.user_folder(user_base, other, "home-other")),
    )


def _sh(cfg: devcluster.DevClusterConfig, *argv: str, by: Account | None = None) -> str:
    if by is None:
        r = subprocess.run(list(argv), env=cfg.env(), capture_output=True, text=True, timeout=30)
    else:
        env = user_harness.user_env(by.user, by.home, {"SLURM_CONF": str(cfg.conf_path)})
        r = user_harness.as_user(by.user, argv, env, by.home, timeout=30)
    assert r.returncode == 0, f"{' '.join(argv)}: {r.stderr.strip()}"
    return r.stdout.strip()


def _sbatch(cfg: devcluster.DevClusterConfig, by: Account, script: Path | None, *args: str) -> str:
    argv = ["sbatch", "--parsable", *args] + ([str(script)] if script else [])
    return _sh(cfg, *argv, by=by).split(";")[0]


def _job(cfg: devcluster.DevClusterConfig, job_id: str) -> tuple[str, str, str]:
    """(state, nodes, reason) as squeue prints them."""
    out = _sh(cfg, "squeue", "-h", "-j", job_id, "-o", "%T|%N|%r")
    state, nodes, reason = out.split("|")
    return state, nodes, reason


def _wait(what: str, predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {WAIT_S}s waiting for {what}")


def _replica_jobs(spec: JobSpec, by: Account) -> list[Path]:
    """The rendered replica scripts with their `#SBATCH` header kept verbatim and the body
    replaced by a sleep (placement is decided by the header alone), in the user's run folder."""
    paths = []
    run_dir = Path(spec.job.run_dir)
    logs = run_dir / "logs"
    logs.mkdir(parents=True)
    by.own(run_dir, logs)
    for k in range(spec.replicas.count):
        lines = render_replica(spec, k).text.splitlines()
        header = [lines[0]] + [line for line in lines[1:] if line.startswith("#SBATCH ")]
        path = run_dir / f"replica-{k}.sbatch"
        path.write_text("\n".join([*header, "sleep 600", ""]))
        by.own(path)
        paths.append(path)
    return paths


def _blocks(cfg: devcluster.DevClusterConfig) -> list[set[str]]:
    """Node sets of the base blocks, as slurmctld reports them (`scontrol show topology`)."""
    out = []
    for line in _sh(cfg, "scontrol", "show", "topology").splitlines():
        fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
        if "BlockName" in fields:
            out.append(set(hostlist.expand_hostlist(fields["Nodes"])))
    return out


def _fill(cfg: devcluster.DevClusterConfig, by: Account, node: str) -> str:
    job = _sbatch(
        cfg, by, None, "-w", node, "-N1", "--exclusive", "--output=/dev/null", "--wrap", "sleep 600"
    )
    _wait(f"filler on {node}", lambda: _job(cfg, job)[0] == "RUNNING")
    return job


def _fthsdp(cfg: devcluster.DevClusterConfig, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fthsdp_cli", *args],
        env={**os.environ, "SLURM_CONF": str(cfg.conf_path)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
    )


@pytest.mark.slurm
@pytest.mark.parametrize("segment", [None, 2])
def test_each_replica_lands_inside_one_block(
    cluster: Callable[..., devcluster.DevClusterConfig],
    accounts: tuple[Account, Account],
    segment: int | None,
) -> None:
    """node1 and node4 busy leaves node2 + node3 idle, one in each block: a 2-node replica
    must wait rather than span blocks, then take a whole block each; with `segment = 2` and
    without (topology/block alone keeps a job that fits one block inside one)."""
    _require_block()
    cfg = cluster("block")
    blocks = _blocks(cfg)
    assert blocks == [{"node1", "node2"}, {"node3", "node4"}]
    user, other = accounts
    asked = {} if segment is None else {"segment": segment}
    spec = _spec(
        str(user.home / "run"), nodes=2, gpus_per_node=1, topology="block", exclusive=True, **asked
    )
    scripts = _replica_jobs(spec, user)
    lines = [x for x in scripts[0].read_text().splitlines() if x.startswith("#SBATCH --segment")]
    assert lines == ([] if segment is None else [f"#SBATCH --segment={segment}"])
    fill1, fill4 = _fill(cfg, other, "node1"), _fill(cfg, other, "node4")
    replicas = [_sbatch(cfg, user, s) for s in scripts]
    # The reason slurmctld gives once it has tried and found no block: 24.11 says Resources,
    # 26.05 "No suitable topology unit found"; the replica queued behind it waits on Priority.
    _wait(
        "replica 0 pending for want of a block",
        lambda: _job(cfg, replicas[0])[::2] in {("PENDING", r) for r in NO_BLOCK_REASONS},
    )
    assert _job(cfg, replicas[1])[0] == "PENDING"
    idle = _sh(cfg, "sinfo", "-h", "-N", "-t", "idle", "-o", "%N").split()
    assert sorted(idle) == ["node2", "node3"]
    _sh(cfg, "scancel", fill4, by=other)
    _wait("replica 0 running", lambda: _job(cfg, replicas[0])[0] == "RUNNING")
    _sh(cfg, "scancel", fill1, by=other)
    _wait("replica 1 running", lambda: _job(cfg, replicas[1])[0] == "RUNNING")
    placed = [set(hostlist.expand_hostlist(_job(cfg, j)[1])) for j in replicas]
    assert placed == [{"node3", "node4"}, {"node1", "node2"}]
    assert all(p in blocks for p in placed)


@pytest.mark.slurm
def test_without_block_topology_the_same_replica_spans_switches(
    cluster: Callable[..., devcluster.DevClusterConfig], accounts: tuple[Account, Account]
) -> None:
    """The control for the test above: under topology/tree, with no `switches`, the same 2-node
    replica starts at once on node2 + node3, across two leaf switches."""
    from tests.conftest import _require_slurm

    _require_slurm()
    cfg = cluster("tree")
    user, other = accounts
    spec = _spec(str(user.home / "run"), nodes=2, gpus_per_node=1, exclusive=True)
    _fill(cfg, other, "node1")
    _fill(cfg, other, "node4")
    job = _sbatch(cfg, user, _replica_jobs(spec, user)[0])
    _wait("the replica running", lambda: _job(cfg, job)[0] == "RUNNING")
    assert set(hostlist.expand_hostlist(_job(cfg, job)[1])) == {"node2", "node3"}


@pytest.mark.slurm
def test_doctor_checks_the_segment_against_the_blocks(
    cluster: Callable[..., devcluster.DevClusterConfig], tmp_path: Path
) -> None:
    _require_block()
    cfg = cluster("block")
    spec = tmp_path / "block.toml"
    # The plain dev cluster has no fthsdp hooks: Prolog and PrologFlags fail on both runs.
    hooks = {"Prolog", "PrologFlags"}
    for nodes, fails in ((2, hooks), (4, {*hooks, "segment"})):
        spec.write_text(
            '[job]\nname = "blk"\nrun_dir = "/tmp/blk"\npartition = "gpu"\n'
            f'[replicas]\ncount = 2\nnodes = {nodes}\ntopology = "block"\nsegment = {nodes}\n'
            '[train]\ncommand = "true"\n'
        )
        r = _fthsdp(cfg, "doctor", "--json", "--spec", str(spec))
        assert r.returncode == 1, r.stdout + r.stderr
        found = {f["check"]: f["status"] for f in json.loads(r.stdout)["findings"]}
        assert {k for k, v in found.items() if v == "fail"} == fails, found
        assert found["TopologyPlugin"] == "pass" and "segment" in found


TOPOLOGY_YAML = """---
- topology: racks
  cluster_default: true
  block:
    block_sizes: [2, 4]
    blocks:
      - block: b1
        nodes: node[1-2]
      - block: b2
        nodes: node[3-4]
"""


@pytest.mark.slurm
def test_blocks_from_topology_yaml_are_seen_though_topology_plugin_says_tree(
    cluster: Callable[..., devcluster.DevClusterConfig], tmp_path: Path
) -> None:
    """With a topology.yaml (Slurm 25.05+), slurm.conf's TopologyPlugin=topology/tree still
    prints in `scontrol show config`; doctor and submit judge by `scontrol show topology`."""
    from tests.conftest import _require_slurm

    _require_slurm()
    version = _slurm_version()
    if version < SlurmVersion(25, 5, 0):
        pytest.skip(f"Slurm {version} has no topology.yaml (added in 25.05)")
    cfg = cluster("tree", yaml=TOPOLOGY_YAML)
    assert "TopologyPlugin          = topology/tree" in _sh(cfg, "scontrol", "show", "config")
    spec = tmp_path / "block.toml"
    spec.write_text(
        '[job]\nname = "blk"\nrun_dir = "/tmp/blk"\npartition = "gpu"\n'
        '[replicas]\ncount = 2\nnodes = 2\ntopology = "block"\nsegment = 2\n'
        '[train]\ncommand = "true"\n'
    )
    r = _fthsdp(cfg, "doctor", "--json", "--spec", str(spec))
    found = {f["check"]: f for f in json.loads(r.stdout)["findings"]}
    assert found["TopologyPlugin"]["status"] == "pass", found["TopologyPlugin"]
    assert "scontrol show topology shows topology/block" in found["TopologyPlugin"]["detail"]
    assert found["segment"]["status"] == "pass"


@pytest.mark.slurm
def test_submit_refuses_block_where_the_cluster_lacks_it(
    slurm_cluster: devcluster.DevClusterConfig, site_user: user_harness.SiteUser
) -> None:
    """On the session's tree cluster: 22.05 lacks the plugin, 24.11+ is not configured for it.
    Either way one line, exit 2, and nothing queued or written (the job user's submit)."""
    spec = site_user.home / "block.toml"
    run_dir = site_user.home / "run"
    site_user.write(
        spec,
        f'[job]\nname = "blk"\nrun_dir = "{run_dir}"\n'
        '[replicas]\ncount = 2\nnodes = 2\ntopology = "block"\n[train]\ncommand = "true"\n',
    )
    before = _sh(slurm_cluster, "squeue", "-h", "-o", "%i")
    r = site_user.fthsdp("submit", str(spec))
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "replicas.topology: got 'block'; " in lines[0], lines
    version = _slurm_version()
    if version < BLOCK_SINCE:
        assert "lacks" in lines[0] and "24.05 or later" in lines[0]
    else:
        assert "topology/tree: the spec asks for topology/block" in lines[0]
    assert _sh(slurm_cluster, "squeue", "-h", "-o", "%i") == before
    assert not run_dir.exists()
