"""The Slurm backend: the one way fthsdp acts on Slurm and reads it.

`base` holds the narrow `SlurmBackend` interface and the drain reasons fthsdp writes, `commands`
the backend over Slurm's commands (`CommandBackend`), `pyslurm` the optional backend over
pyslurm's RPCs, and `select` the one factory, `make_backend()`, that picks between them (Slurm's
commands unless `FTHSDP_BACKEND=pyslurm` asks otherwise). The names below are the package's
interface; the records and errors come from `slurm.records`.
"""

from slurm.backend.base import REASON_MAX, SlurmBackend, drain_reason
from slurm.backend.commands import CommandBackend
from slurm.backend.select import make_backend
from slurm.records import (
    DRAIN_PREFIX,
    JobInfo,
    NodeInfo,
    NodeNameError,
    NodeNotFound,
    SlurmCommandError,
    SlurmOutputError,
    SlurmVersion,
    check_node_name,
)

__all__ = [
    "DRAIN_PREFIX",
    "REASON_MAX",
    "CommandBackend",
    "JobInfo",
    "NodeInfo",
    "NodeNameError",
    "NodeNotFound",
    "SlurmBackend",
    "SlurmCommandError",
    "SlurmOutputError",
    "SlurmVersion",
    "check_node_name",
    "drain_reason",
    "make_backend",
]
