"""A dev node's power loss and its return: the fault a site sees when a node simply dies.

On a real cluster a node that loses power takes its slurmd and every process of its jobs with
it, at once, and tells nobody: slurmctld notices only when the node stops answering
(`SlurmdTimeout`), marks it DOWN and requeues or ends its jobs. The dev cluster's nodes are
processes on one host, so `power_off` SIGKILLs what belongs to one node, in the order that keeps
anything from reporting the death: its slurmd, its slurmstepds (found by their sockets in the
node's spool folder), and every process of its jobs (found by the cluster's `SLURM_CONF` and
the node's `SLURMD_NODENAME` in their environment). `power_on` starts the node's slurmd again;
with `ReturnToService=2` slurmctld takes the node back once it registers, as after a reboot.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from slurm.devcluster.config import DevClusterConfig
from slurm.devcluster.daemons import binary, live_daemons, log_tail, start_daemon
from slurm.errors import EnvironmentProblem, InputError


def _proc_ids() -> Iterator[int]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            yield int(entry.name)


def _environ(pid: int) -> dict[bytes, bytes]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.partition(b"=")[::2] for item in raw.split(b"\0") if b"=" in item)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def socket_inodes(unix_table: str, folder: Path) -> set[int]:
    """Inodes of the unix sockets bound under `folder`, from the text of /proc/net/unix."""
    prefix = str(folder).rstrip("/") + "/"
    out = set()
    for line in unix_table.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[7].startswith(prefix) and fields[6].isdigit():
            out.add(int(fields[6]))
    return out


def _socket_inodes_of(pid: int) -> set[int]:
    out: set[int] = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:[") and target.endswith("]"):
            out.add(int(target[8:-1]))
    return out


def node_processes(cfg: DevClusterConfig, node: str) -> list[int]:
    """The pids that live on dev node `node`: its slurmd first, then its slurmstepds, then its
    jobs' processes."""
    if node not in cfg.node_names:
        raise InputError("NODE", node, f"a node of this cluster: {', '.join(cfg.node_names)}")
    me = os.getpid()
    daemon = live_daemons(cfg).get(f"slurmd {node}")
    try:
        table = Path("/proc/net/unix").read_text()
    except OSError:
        table = ""
    spool_sockets = socket_inodes(table, cfg.directory / "spool" / node)
    conf = str(cfg.conf_path).encode()
    steps: list[int] = []
    jobs: list[int] = []
    for pid in _proc_ids():
        if pid in (me, daemon):
            continue
        if _cmdline(pid).startswith(b"slurmstepd"):
            # Its socket in the node's spool folder names it; 24.11+ start it with an
            # environment of its own, without SLURM_CONF.
            if spool_sockets & _socket_inodes_of(pid):
                steps.append(pid)
            continue
        env = _environ(pid)
        if env.get(b"SLURM_CONF") == conf and env.get(b"SLURMD_NODENAME") == node.encode():
            jobs.append(pid)
    return ([daemon] if daemon else []) + steps + jobs


def sigkill(pids: Iterable[int]) -> list[int]:
    """SIGKILL each pid in turn; the ones that were still there to kill."""
    killed = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        killed.append(pid)
    return killed


def power_off(cfg: DevClusterConfig, node: str) -> list[int]:
    """SIGKILL everything on `node` at once, as a power loss would; the pids killed."""
    return sigkill(node_processes(cfg, node))


def power_on(cfg: DevClusterConfig, node: str, timeout: float = 60) -> int:
    """Start `node`'s slurmd again (a node that booted); its pid once it runs. Slurm itself takes
    the node back into service when it registers (`ReturnToService=2`)."""
    if node not in cfg.node_names:
        raise InputError("NODE", node, f"a node of this cluster: {', '.join(cfg.node_names)}")
    name = f"slurmd {node}"
    running = live_daemons(cfg).get(name)
    if running:
        return running
    log = cfg.directory / "log" / f"slurmd-{node}.log"
    start_daemon([binary("slurmd"), "-N", node, "-f", str(cfg.conf_path)], cfg, name, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = live_daemons(cfg).get(name)
        if pid:
            return pid
        time.sleep(0.2)
    raise EnvironmentProblem(f"{name} did not start within {timeout:.0f} s: {log_tail(log)}")
