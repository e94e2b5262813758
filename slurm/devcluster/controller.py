"""slurmctld going away and coming back, with its state: an upgrade, a failover, a restart.

On a site slurmctld is stopped for an upgrade or fails over to a backup: for a while no Slurm
command answers, and then the controller is back with every job as it was (`StateSaveLocation`).
`stop` sends slurmctld SIGTERM, on which it saves its state and exits, and waits for it to be
gone; `start` runs it again without `-c`, so it reads that state back, and waits until it answers.
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


def start(cfg: DevClusterConfig, timeout: float = 60) -> int:
    """Start slurmctld on its saved state (no `-c`); its pid once it answers."""
    running = live_daemons(cfg).get("slurmctld")
    if running is not None:
        return running
    log = cfg.directory / "log" / "slurmctld.log"
    start_daemon([binary("slurmctld"), "-f", str(cfg.conf_path)], cfg, "slurmctld", log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = live_daemons(cfg).get("slurmctld")
        if pid is not None and node_states(cfg):
            return pid
        time.sleep(0.25)
    raise EnvironmentProblem(f"slurmctld did not answer within {timeout:.0f} s: {log_tail(log)}")
