"""The launch contract: the variables a run's scripts export and the runtime reads.

`slurm.render` writes these names into every sbatch script (`export NAME=value`), and the
runtime reads them back in the worker (`runtime.env.parse_env`), the replica supervisor, the
foreign-trainer step, the node watchdog and the baselines; `fthsdp run --local` sets the same
names for its workers. Spelling each name once, here, on the Slurm side (which imports nothing of
the runtime), keeps the two sides from drifting apart. The values that both sides derive from
the spec live here for the same reason: a foreign trainer's dump folder (`dump_dir`) and
torchft's timeout variables (`torchft_timeouts`). Pure, no torch.
"""

from __future__ import annotations

import math
from pathlib import Path

# -- what every job of a run exports (`slurm.render.runtime_env`) ------------------------------
RUN_DIR = "FTHSDP_RUN_DIR"
REPLICA_ID = "FTHSDP_REPLICA_ID"
NUM_REPLICAS = "FTHSDP_NUM_REPLICAS"
CONTROL_FILE = "FTHSDP_CONTROL_FILE"
JOB_NAME = "FTHSDP_JOB_NAME"
MIN_REPLICAS = "FTHSDP_MIN_REPLICAS"
MAX_RESTARTS_PER_REPLICA = "FTHSDP_MAX_RESTARTS_PER_REPLICA"
RESTART_WINDOW_S = "FTHSDP_RESTART_WINDOW_S"
HEARTBEAT_TIMEOUT_S = "FTHSDP_HEARTBEAT_TIMEOUT_S"
ALLREDUCE_TIMEOUT_S = "FTHSDP_ALLREDUCE_TIMEOUT_S"
QUORUM_TIMEOUT_S = "FTHSDP_QUORUM_TIMEOUT_S"
JOIN_TIMEOUT_S = "FTHSDP_JOIN_TIMEOUT_S"
#: How long a replica waits for its run's control plane to come back (the supervisor before a
#: launch, a worker after a failed quorum), keeping its state in memory.
CONTROL_WAIT_S = "FTHSDP_CONTROL_WAIT_S"
#: Its default (seconds): a requeue of the control job on a busy cluster.
DEFAULT_CONTROL_WAIT_S = 300.0
#: The `[train]` timeouts' defaults (seconds), for the spec, the workers and the Lighthouse alike.
#: The heartbeat timeout is how long the Lighthouse keeps a silent replica in the quorum: it
#: bounds the healthy replicas' stall after a peer's process dies, and a replacement's join. Five
#: of the workers' 0.1 s heartbeats; none was missed at a load average of 16 on two cores
#: (docs/benchmarks.md, `heartbeat_drops_loaded`).
DEFAULT_HEARTBEAT_TIMEOUT_S = 0.5
DEFAULT_ALLREDUCE_TIMEOUT_S = 5.0
DEFAULT_QUORUM_TIMEOUT_S = 10.0
DEFAULT_JOIN_TIMEOUT_S = 60.0
CHECKPOINT_EVERY_STEPS = "FTHSDP_CHECKPOINT_EVERY_STEPS"
CHECKPOINT_EVERY_S = "FTHSDP_CHECKPOINT_EVERY_S"
#: `FTHSDP_CHECKPOINT_EVERY_S` for the Young/Daly cadence.
CHECKPOINT_AUTO = "auto"


def checkpoint_every_s_value(every_s: float | None) -> str:
    """`FTHSDP_CHECKPOINT_EVERY_S` for a cadence in seconds (None: Young/Daly's, `auto`)."""
    if every_s is None:
        return CHECKPOINT_AUTO
    return str(int(every_s)) if float(every_s).is_integer() else repr(float(every_s))


#: The failure model the Young/Daly cadence is computed against (`train.*` of the same names).
RUN_NODES = "FTHSDP_RUN_NODES"
NODE_FAILURES_PER_1000_DAY = "FTHSDP_NODE_FAILURES_PER_1000_DAY"
RUN_LOSSES_PER_DAY = "FTHSDP_RUN_LOSSES_PER_DAY"
REQUEUE_COST_S = "FTHSDP_REQUEUE_COST_S"
#: Their defaults: assumptions a site should replace with its own history (Llama 3's ~2.3 node
#: failures per 1000 nodes a day, one whole-run loss in ten days, a 120 s requeue).
DEFAULT_NODE_FAILURES_PER_1000_DAY = 2.3
DEFAULT_RUN_LOSSES_PER_DAY = 0.1
DEFAULT_REQUEUE_COST_S = 120.0
STEPS = "FTHSDP_STEPS"
HEALTH_CHECKS = "FTHSDP_HEALTH_CHECKS"
#: A fixed Lighthouse instead of the control file (a worker started by hand); torchft's own
#: name is read as the fallback.
LIGHTHOUSE = "FTHSDP_LIGHTHOUSE"
TORCHFT_LIGHTHOUSE = "TORCHFT_LIGHTHOUSE"
#: The replica supervisor's local forwarder to the gated Lighthouse (`http://127.0.0.1:PORT`):
#: the leader's Manager talks to the Lighthouse through it.
LIGHTHOUSE_FORWARDER = "FTHSDP_LIGHTHOUSE_FORWARDER"

# -- what a foreign torchft trainer's group exports (`slurm.render.foreign_env`) ---------------
TRAIN_MODE = "FTHSDP_TRAIN_MODE"
NUM_REPLICA_GROUPS = "FTHSDP_NUM_REPLICA_GROUPS"
DUMP_DIR = "FTHSDP_DUMP_DIR"
PROGRESS_REGEX = "FTHSDP_PROGRESS_REGEX"
PROGRESS_FILE = "FTHSDP_PROGRESS_FILE"
PROGRESS_TIMEOUT_S = "FTHSDP_PROGRESS_TIMEOUT_S"
#: torchft's own names for the group's identity.
TORCHFT_REPLICA_GROUP_ID = "REPLICA_GROUP_ID"
TORCHFT_NUM_REPLICA_GROUPS = "NUM_REPLICA_GROUPS"
TORCHFT_TIMEOUT_SEC = "TORCHFT_TIMEOUT_SEC"
TORCHFT_QUORUM_TIMEOUT_SEC = "TORCHFT_QUORUM_TIMEOUT_SEC"
TORCHFT_CONNECT_TIMEOUT_SEC = "TORCHFT_CONNECT_TIMEOUT_SEC"

# -- what the replica supervisor (or `fthsdp run --local`) adds per launch of a step ------------
REPLICA = "FTHSDP_REPLICA"
LAUNCH = "FTHSDP_LAUNCH"
#: The launch's incarnation (`job.restarts.launch`); it also marks the step's processes.
INCARNATION = "FTHSDP_INCARNATION"
#: A warm spare slot's step (no FTHSDP_REPLICA_ID yet): the handoff file that will name its
#: replica (`runtime.warm_handoff`).
WARM_HANDOFF = "FTHSDP_WARM_HANDOFF"
#: Of a foreign trainer (`runtime.foreign`); also TORCHFT_LIGHTHOUSE, MASTER_ADDR and MASTER_PORT.
RDZV_ENDPOINT = "FTHSDP_RDZV_ENDPOINT"

# -- where a task finds its node's inputs: the watchdog's and the slow fault's (a spec's ---------
# -- `[job].env`, a dev cluster's TaskProlog, or the local launcher set them) -------------------
HEALTH_CONFIG = "FTHSDP_HEALTH_CONFIG"
GPU_SOURCE = "FTHSDP_GPU_SOURCE"
SYSFS_ROOT = "FTHSDP_SYSFS_ROOT"
KERNEL_LOG = "FTHSDP_KERNEL_LOG"
WATCHDOG_INTERVAL_S = "FTHSDP_WATCHDOG_INTERVAL_S"
SLOW_FILE = "FTHSDP_SLOW_FILE"

# -- what Slurm (sbatch, srun) or torchrun sets, and the runtime reads ----------------------------
SLURM_JOB_ID = "SLURM_JOB_ID"
SLURM_PROCID = "SLURM_PROCID"
SLURM_NTASKS = "SLURM_NTASKS"
SLURM_LOCALID = "SLURM_LOCALID"
SLURM_STEP_NODELIST = "SLURM_STEP_NODELIST"
SLURM_JOB_NODELIST = "SLURM_JOB_NODELIST"
#: A heterogeneous job's first component's nodes (the replica's own, before any spare's).
SLURM_JOB_NODELIST_HET_GROUP_0 = "SLURM_JOB_NODELIST_HET_GROUP_0"
SLURM_RESTART_COUNT = "SLURM_RESTART_COUNT"
SLURM_STEP_ID = "SLURM_STEP_ID"
SLURMD_NODENAME = "SLURMD_NODENAME"
RANK = "RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_RANK = "LOCAL_RANK"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"


def dump_dir(run_dir: Path, replica: int) -> Path:
    """The per-group folder a trainer may write its dumps, logs and progress to."""
    return run_dir / "dump" / f"replica-{replica:02d}"


def torchft_timeouts(op_s: float, quorum_s: float, connect_s: float) -> list[tuple[str, str]]:
    """torchft's timeout variables; it reads whole seconds (`int()`), so fractions round up."""
    return [
        (TORCHFT_TIMEOUT_SEC, str(math.ceil(op_s))),
        (TORCHFT_QUORUM_TIMEOUT_SEC, str(math.ceil(quorum_s))),
        (TORCHFT_CONNECT_TIMEOUT_SEC, str(math.ceil(connect_s))),
    ]
