"""Slurm's expedited requeue: a requeued job immediately eligible and first in the queue.

From 25.11 a batch job may ask for it (`sbatch --requeue=expedite`; the 26.05 man page spells it
so, where 25.11.0's said `expedited`), and slurmctld grants it only when the site allows it
(`SlurmctldParameters=enable_expedited_requeue`). For fthsdp it is the cure of the per-replica
path's long pole on a full cluster: a requeued replica otherwise waits behind every job queued
meanwhile. `fthsdp submit --expedite` asks for it on every replica job where the running
slurmctld has it (read from `scontrol show config`, never guessed), and `fthsdp doctor` says
whether it does. It is not the default: an expedited job is eligible, and may be started, before
the coordinator can add the suspect node to its `ExcNodeList` (which Slurm accepts only while the
job is pending), so a run without drain rights can come back on the very node that failed (seen
on 26.05 with the straggler story as a job user).
Elsewhere a requeued replica is released at once (`StartTime`) and waits its turn by priority;
`[spares]` keeps a node for it instead.
"""

from __future__ import annotations

from slurm.records import SlurmVersion
from slurm.slurm_config import SlurmConfig

#: The release that added it (SchedMD's 25.11 release notes).
EXPEDITE_SINCE = SlurmVersion(25, 11, 0)
#: The SlurmctldParameters item that allows it.
ENABLE = "enable_expedited_requeue"
#: What a replica job passes to sbatch to ask for it.
SBATCH_OPTION = "--requeue=expedite"


def expedited_requeue(cfg: SlurmConfig) -> tuple[bool, str]:
    """(whether replica jobs can ask for an expedited requeue on this cluster, why)."""
    version = cfg.version
    if (version.major, version.minor) < (EXPEDITE_SINCE.major, EXPEDITE_SINCE.minor):
        return False, f"Slurm {version} has none (added in {EXPEDITE_SINCE.release})"
    if ENABLE not in cfg.items("SlurmctldParameters"):
        return False, f"Slurm {version} has it, but SlurmctldParameters lacks {ENABLE}"
    return True, f"Slurm {version} with SlurmctldParameters={ENABLE}"
