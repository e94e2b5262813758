"""A real Slurm cluster on one host, for tests and the demo.

fthsdp is tested against Slurm itself, not a mock: one `munged`, one `slurmctld` and one `slurmd`
per simulated node, all on loopback ports (docs/design-facts.md, Slurm fact 8). As on a site,
slurmctld runs as the unprivileged `SlurmUser` (Debian's `slurm`) and slurmd as root, and the
config is world-readable, so jobs of ordinary users run with ordinary users' rights. Each
node gets placeholder GPU device files so GRES scheduling is real, and nodes are grouped under leaf
switches in `topology.conf` so `--switches` placement is real too.

The cluster is self-contained in one directory: its own munge key and socket, its own config,
state, logs and pid files. Only root may write the directory (0755): the default is under
/var/lib (not a world-writable temp folder a local user could create first).

- `config`: `DevClusterConfig`, what the cluster looks like, saved as `cluster.json`;
- `directory`: the checks that keep the cluster's folder root's alone;
- `conf`: slurm.conf, gres.conf and topology.conf, as pure functions of the config;
- `daemons`: starting, finding (by pid file and command line) and signalling its processes;
- `lifecycle`: `up`, `reconfigure`, `down`, `status`, `running_cluster`;
- `power`: a node's power loss and its boot; `controller`: slurmctld stopped and started again
  on its saved state.

Slurm's hooks (Prolog, Epilog, HealthCheckProgram, TaskProlog) come in as paths, and anything
else the nodes need (simulated hardware) from the config's `node_setup`: this package knows
nothing of the health checks (`prolog_epilog.dev_health` supplies them).
"""

from __future__ import annotations

from slurm.devcluster.conf import gres_conf, slurm_conf, topology_conf
from slurm.devcluster.config import CONFIG_FILE, DEFAULT_DIR, DevClusterConfig, NodeSetup
from slurm.devcluster.daemons import (
    cluster_processes,
    daemon_name,
    free_port_block,
    live_daemons,
    missing_prerequisites,
    slurm_release,
)
from slurm.devcluster.directory import check_directory, directory_problem, make_directory
from slurm.devcluster.lifecycle import (
    RESTARTS_ON_RECONFIGURE,
    ClusterStatus,
    down,
    node_states,
    preflight,
    reconfigure,
    restart_pending,
    running_cluster,
    status,
    up,
    write_files,
)

__all__ = [
    "CONFIG_FILE",
    "DEFAULT_DIR",
    "RESTARTS_ON_RECONFIGURE",
    "ClusterStatus",
    "DevClusterConfig",
    "NodeSetup",
    "check_directory",
    "cluster_processes",
    "daemon_name",
    "directory_problem",
    "down",
    "free_port_block",
    "gres_conf",
    "live_daemons",
    "make_directory",
    "missing_prerequisites",
    "node_states",
    "preflight",
    "reconfigure",
    "restart_pending",
    "running_cluster",
    "slurm_conf",
    "slurm_release",
    "status",
    "topology_conf",
    "up",
    "write_files",
]
