"""Which `SlurmBackend` fthsdp uses: one factory, `make_backend()`, that every caller goes through.

The rule is Slurm's own commands (`CommandBackend`), always, unless the environment asks for
pyslurm with `FTHSDP_BACKEND=pyslurm`; then `PyslurmBackend` is used if `pyslurm_usable()` finds
that pyslurm imports and was built for the running Slurm, and the commands otherwise. Nothing
picks pyslurm on its own: the commands work on every Slurm release, pyslurm is built for one
release at a time, and no pyslurm release on the package index matches a Slurm installable here
(see `slurm.backend.pyslurm`), so it cannot be tested here. The CLI, the coordinator, the replica
supervisor, the spare slots and the prolog/epilog hooks all call this one factory, so the choice
is made in one place.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from slurm.backend.commands import CommandBackend

#: The environment variable that asks for a backend other than Slurm's commands.
BACKEND_ENV = "FTHSDP_BACKEND"


def make_backend(
    *,
    timeout: float = 30.0,
    retries: int = 3,
    backoff: float = 0.5,
    env: dict[str, str] | None = None,
    notice: Callable[[str], None] | None = None,
) -> CommandBackend:
    """The backend to act on Slurm with: Slurm's commands, or pyslurm when asked for and usable.

    The options are `CommandBackend`'s (the pyslurm backend takes the same, for the commands it
    still runs).
    """
    kind: type[CommandBackend] = CommandBackend
    if os.environ.get(BACKEND_ENV) == "pyslurm":
        from slurm.backend.pyslurm import PyslurmBackend, pyslurm_usable

        if pyslurm_usable():
            kind = PyslurmBackend
    return kind(timeout=timeout, retries=retries, backoff=backoff, env=env, notice=notice)
