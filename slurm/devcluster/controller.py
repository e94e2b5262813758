"""slurmctld going away and coming back, with its state: an upgrade, a failover, a restart.

On a site slurmctld is stopped for an upgrade or fails over to a backup: for a while no Slurm
command answers, and then the controller is back with every job as it was (`StateSaveLocation`).
`stop` sends slurmctld SIGTERM, on which it saves its state and exits, and waits for it to be
gone; `start` runs it again without `-c`, so it reads that state back, and waits until it answers
and every node whose slurmd runs has registered again. Until a node registers, a restarted
slurmctld (24.11 and later) shows it UNKNOWN and refuses work that needs it ("Requested node
configuration is not available"), so a caller that submits at once would be refused.
The slurmds and every job step keep running meanwhile, as they do on a site.
"""

from __future__ import annotations

import signal
import time

from slurm.devcluster.config import DevClusterConfig
from slurm.devcluster.daemons import binary, live_daemons, log_tail, signal_pid, start_daemon
from slurm.devcluster.lifecycle import node_states
from slurm.errors import EnvironmentProblem


def stop(cfg: DevClusterConfig, timeout: float = 30) -> int | None:
    """Stop slurmctld with its state saved; its pid, or None if it was not running."""
    pid = live_daemons(cfg).get("slurmctld")
    if pid is None:
        return None
    signal_pid(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while "slurmctld" in live_daemons(cfg):
        if time.monotonic() > deadline:
            raise EnvironmentProblem(f"slurmctld (pid {pid}) did not stop within {timeout:.0f} s")
        time.sleep(0.1)
    return pid


def start(cfg: DevClusterConfig, timeout: float = 90) -> int:
    """Start slurmctld on its saved state (no `-c`); its pid once it answers and every node with
    a running slurmd has registered with it (a powered-off node stays as Slurm sees it)."""
    running = live_daemons(cfg).get("slurmctld")
    log = cfg.directory / "log" / "slurmctld.log"
    if running is None:
        start_daemon([binary("slurmctld"), "-f", str(cfg.conf_path)], cfg, "slurmctld", log)
    deadline = time.monotonic() + timeout
    waiting: list[str] = []
    while time.monotonic() < deadline:
        daemons = live_daemons(cfg)
        pid = daemons.get("slurmctld")
        states = node_states(cfg)
        if pid is not None and states:
            waiting = unregistered(states, daemons)
            if not waiting:
                return pid
        time.sleep(0.25)
    if waiting:
        raise EnvironmentProblem(
            f"slurmctld answers, but {', '.join(waiting)} did not register within "
            f"{timeout:.0f} s: {log_tail(log)}"
        )
    raise EnvironmentProblem(f"slurmctld did not answer within {timeout:.0f} s: {log_tail(log)}")


def unregistered(states: dict[str, str], daemons: dict[str, int]) -> list[str]:
    """The nodes whose slurmd runs but which slurmctld still shows as UNKNOWN (or not at all)."""
    live = sorted(name.split(" ", 1)[1] for name in daemons if name.startswith("slurmd "))
    return [node for node in live if states.get(node, "unk").startswith("unk")]
