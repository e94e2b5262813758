"""What a dev cluster looks like: `DevClusterConfig`, saved in its folder as `cluster.json`.

The config decides every port, path and node of the cluster, so `down`, `status` and `inject`
find a running cluster from its folder alone. The folder is root's: its pid files decide what
root kills, so it is read only from a folder `check_directory` accepts.
"""

from __future__ import annotations

import json
import os
import pwd
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from slurm.devcluster.directory import check_directory
from slurm.errors import InputError

CONFIG_FILE = "cluster.json"
DEFAULT_DIR = Path(os.environ.get("FTHSDP_CLUSTER_DIR", "/var/lib/fthsdp/devcluster"))
#: Writes what the nodes need besides Slurm's files (see `DevClusterConfig.node_setup`).
NodeSetup = Callable[["DevClusterConfig", bool], None]


def default_slurm_user() -> str:
    """The account slurmctld runs as: Debian's `slurm` (made by its slurm-wlm packages) where it
    exists, as on a site; root otherwise, the only account sure to exist."""
    try:
        pwd.getpwnam("slurm")
    except KeyError:
        return "root"
    return "slurm"


@dataclass(frozen=True)
class DevClusterConfig:
    """Everything that decides what the dev cluster looks like; saved as `cluster.json`."""

    directory: Path = DEFAULT_DIR
    nodes: int = 4
    gpus_per_node: int = 8
    switch_size: int = 2
    #: "tree": leaf switches of `switch_size` nodes; "block" (Slurm 24.05+): blocks of that size.
    topology: str = "tree"
    gpu_type: str = "h100"
    cpus_per_node: int = 16
    memory_mb: int = 64000
    ctld_port: int = 16817
    slurmd_base_port: int = 17001
    partition: str = "gpu"
    #: slurmctld's account (`SlurmUser`): unprivileged like a site's, so the cluster has no
    #: rights a site's controller lacks. slurmd stays root. Looked up when the files are written.
    slurm_user: str = field(default_factory=default_slurm_user)
    prolog: str | None = None
    epilog: str | None = None
    prolog_flags: str = "Alloc"
    nohold_on_prolog_fail: bool = True
    health_check_program: str | None = None
    health_check_interval: int = 0
    prolog_epilog_timeout: int = 60
    task_prolog: str | None = None
    #: Simulated hardware + health gating (`prolog_epilog.dev_health.with_health`): node inputs
    #: under `hardware/`, written by `node_setup`.
    health: bool = False
    extra_env: Mapping[str, str] = field(default_factory=dict)
    #: Writes the nodes' inputs beside the config files (`write_files`): each node's simulated
    #: hardware and the health hooks' scripts, supplied with `health` by the layer that owns
    #: them. Called with this config and `fresh` (True on `up`). Not saved in cluster.json.
    node_setup: NodeSetup | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("nodes", "gpus_per_node", "switch_size", "cpus_per_node", "memory_mb"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InputError(name, value, "must be a positive integer")
        if self.topology not in ("tree", "block"):
            raise InputError("topology", self.topology, "one of tree, block")
        if self.nodes > 64:
            raise InputError("nodes", self.nodes, "the dev cluster allows 1..64 nodes")
        for name in ("ctld_port", "slurmd_base_port"):
            port = getattr(self, name)
            if not 1024 <= port <= 65000:
                raise InputError(name, port, "must be a port in 1024..65000")
        try:
            pwd.getpwnam(self.slurm_user)
        except KeyError:
            raise InputError(
                "slurm_user", self.slurm_user, "must be an account of this machine"
            ) from None

    @property
    def node_names(self) -> list[str]:
        return [f"node{i}" for i in range(1, self.nodes + 1)]

    @property
    def switches(self) -> dict[str, list[str]]:
        """Leaf switch name -> nodes under it, `switch_size` consecutive nodes per switch."""
        names = self.node_names
        return {
            f"s{k // self.switch_size + 1}": names[k : k + self.switch_size]
            for k in range(0, len(names), self.switch_size)
        }

    @property
    def ports(self) -> list[int]:
        return [self.ctld_port, *range(self.slurmd_base_port, self.slurmd_base_port + self.nodes)]

    @property
    def conf_path(self) -> Path:
        return self.directory / "etc" / "slurm.conf"

    @property
    def slurm_ids(self) -> tuple[int, int]:
        """(uid, gid) of `slurm_user`, for the files slurmctld writes."""
        entry = pwd.getpwnam(self.slurm_user)
        return entry.pw_uid, entry.pw_gid

    @property
    def munge_socket(self) -> Path:
        return self.directory / "munge" / "munge.socket"

    def env(self) -> dict[str, str]:
        """Environment that points Slurm's commands at this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf_path)}

    def to_json(self) -> str:
        data = asdict(self)
        data["directory"] = str(self.directory)
        data["extra_env"] = dict(self.extra_env)
        del data["node_setup"]
        return json.dumps(data, indent=2, sort_keys=True)

    @classmethod
    def load(cls, directory: Path) -> DevClusterConfig:
        # Its pid files decide what root kills: read them only from a folder root alone controls.
        check_directory(directory)
        path = directory / CONFIG_FILE
        if not path.exists():
            raise InputError(
                "--dir", str(directory), f"holds no dev cluster ({CONFIG_FILE} missing)"
            )
        data = json.loads(path.read_text())
        data["directory"] = Path(data["directory"])
        return cls(**data)
