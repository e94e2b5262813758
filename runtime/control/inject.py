"""Fault injection on the dev cluster: make one node fail the way real hardware does.

Hardware faults (`xid79`, `ecc`, `nvlink`, `ib`) rewrite that node's simulated inputs
(`prolog_epilog.simulated_hardware`): the prolog, the HealthCheckProgram and the in-job watchdog
read them exactly as they read a real node, so the whole path (watchdog -> leader's fatal report
-> coordinator -> drain + requeue -> prolog gates the new nodes) runs for real. Faults accumulate
per node in `faults.json` until `heal` writes the node healthy again.

`slow[=FACTOR]` is a gray failure (a throttled GPU): it writes `root/node/slow` with the factor,
which the replica ranks on that node read through `FTHSDP_SLOW_FILE=<root>/{node}/slow`
(`runtime.control.straggler.steptiming`) and run that much slower; nothing fails, only the
straggler detector sees it. `heal` removes it.

`kill` has no hardware sign: it SIGKILLs the replica's training processes on that node (the tasks
of the supervisor's srun step), which is a process fault: tier 1, relaunch in place. Several dev
clusters can share a host, and every one has a `node1`: a process is this cluster's only when its
environment names this cluster's `SLURM_CONF` (Slurm sets it in every task), besides
`SLURMD_NODENAME` and `FTHSDP_LAUNCH`.

`check_target` is what the CLI asks first: the node must be one of the cluster's, and a hardware
or slow fault needs a cluster started with `--health`, the only one whose hooks and jobs read the
simulated hardware.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from prolog_epilog.simulated_hardware import FAULTS as HARDWARE_FAULTS
from prolog_epilog.simulated_hardware import write_node_inputs
from slurm import contract
from slurm.devcluster.power import sigkill
from slurm.errors import InputError

FAULTS = ("xid79", "ecc", "nvlink", "ib", "kill", "slow", "down")
SLOW_FILE = "slow"
DEFAULT_SLOW_FACTOR = 2.0
FAULTS_FILE = "faults.json"


def hardware_root(cluster_dir: Path) -> Path:
    """Where the dev cluster keeps each node's simulated hardware."""
    return Path(os.environ.get("FTHSDP_HARDWARE_ROOT") or Path(cluster_dir) / "hardware")


def node_faults(root: Path, node: str) -> list[str]:
    try:
        return list(json.loads((root / node / FAULTS_FILE).read_text()))
    except (OSError, ValueError):
        return []


def _save_faults(root: Path, node: str, faults: list[str]) -> None:
    path = root / node / FAULTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(faults))


def fault_name(fault: str) -> str:
    """The fault's name (`slow=3` -> `slow`); an unknown fault is an InputError."""
    name, _, arg = fault.partition("=")
    if name not in FAULTS or (arg and name != "slow"):
        raise InputError("--fault", fault, f"one of {', '.join(FAULTS)} (slow=FACTOR)")
    return name


def check_target(
    node: str, fault: str | None, nodes: list[str], health: bool, cluster_dir: Path
) -> None:
    """Refuse a node the cluster does not have, and a fault nothing on this cluster would read."""
    if node not in nodes:
        raise InputError(
            "NODE", node, f"a node of the dev cluster in {cluster_dir}: {', '.join(nodes)}"
        )
    if fault is None or fault_name(fault) in ("kill", "down"):
        return  # processes, not simulated hardware; `heal` heals hardware only where it exists
    if not health:
        raise InputError(
            "--dir",
            str(cluster_dir),
            "a cluster started with simulated hardware; nothing on this one reads it: start it "
            "with 'fthsdp cluster up --health'",
        )


def inject(
    root: Path, node: str, fault: str, gpus: int = 8, slurm_conf: Path | None = None
) -> list[str]:
    """Inject `fault` into `node`; returns the node's hardware faults now, or the killed pids.

    `kill` needs `slurm_conf`, the cluster's config: it is how its processes are told apart."""
    name, _, arg = fault.partition("=")
    fault_name(fault)
    if name == "slow":
        return _inject_slow(root, node, arg, fault)
    if fault == "kill":
        if slurm_conf is None:
            raise InputError("--fault", fault, "kill needs the cluster's SLURM_CONF")
        return [str(pid) for pid in kill_replica_processes(node, slurm_conf)]
    assert fault in HARDWARE_FAULTS
    faults = [*node_faults(root, node), fault]
    faults = list(dict.fromkeys(faults))
    write_node_inputs(root, node, gpus, [f for f in faults if f in HARDWARE_FAULTS])
    _save_faults(root, node, faults)
    return faults


def _inject_slow(root: Path, node: str, arg: str, fault: str) -> list[str]:
    from runtime.control.straggler.steptiming import parse_factor

    try:
        factor = parse_factor(arg) if arg else DEFAULT_SLOW_FACTOR
    except ValueError:
        raise InputError("--fault", fault, "slow=FACTOR with FACTOR in [1, 100]") from None
    path = root / node / SLOW_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(".slow.tmp")
    tmp.write_text(f"{factor:g}\n")
    os.replace(tmp, path)  # ranks re-read it every second: never let them see half a file
    faults = [f for f in node_faults(root, node) if not f.startswith("slow")]
    faults = [*faults, f"slow={factor:g}"]
    _save_faults(root, node, faults)
    return faults


def heal(root: Path, node: str, gpus: int = 8) -> None:
    """Write the node's inputs healthy again and forget its faults."""
    (root / node / SLOW_FILE).unlink(missing_ok=True)
    write_node_inputs(root, node, gpus, ())
    _save_faults(root, node, [])


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        key, eq, value = item.partition(b"=")
        if eq:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def is_replica_task(env: dict[str, str], comm: str, node: str, slurm_conf: Path) -> bool:
    """Whether a process with this environment is a replica's task on `node` of the cluster whose
    config is `slurm_conf` (pure: tested by a table)."""
    conf = env.get("SLURM_CONF")
    if not conf or os.path.realpath(conf) != os.path.realpath(slurm_conf):
        return False
    if env.get(contract.SLURMD_NODENAME) != node or contract.LAUNCH not in env:
        return False
    return contract.SLURM_PROCID in env and comm not in ("srun", "slurmstepd")


def replica_processes(node: str, slurm_conf: Path) -> Iterator[int]:
    """Training task processes of any replica step on dev node `node` of this cluster only."""
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        if is_replica_task(_environ(pid), _comm(pid), node, slurm_conf):
            yield pid


def kill_replica_processes(node: str, slurm_conf: Path) -> list[int]:
    return sigkill(replica_processes(node, slurm_conf))
