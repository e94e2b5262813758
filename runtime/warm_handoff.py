"""How a warm spare slot's processes learn which replica they become.

A warm slot (`[spares] warm = true`) starts the training command before any fault: every rank
starts, imports, meets its peers in the slot, builds the model and checks its node, then waits in
`FTHSDP.data()` for an identity. When the coordinator moves a failed replica into the slot, the
slot's supervisor writes `warm/<slot job>.json` (0600, atomically) naming the replica, the launch
and its incarnation and the forwarder to the gated Lighthouse; the ranks poll for it, take those
values into their environment and join the quorum as that replica. The leader writes
`warm/<slot job>.ready` once the slot is warm, so `fthsdp status` and the benchmarks can tell a
warm slot from one still starting.

Only the run's owner writes here (the run directory is 0700); a file that is not private to this
user, or whose fields are not what the supervisor writes, is an error the worker stops on, never
an identity it guesses.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from slurm import contract
from slurm.rundir import WARM_DIR, write_private

#: How often a waiting rank looks for its handoff: a stat of one small file.
POLL_S = 0.02


class HandoffError(RuntimeError):
    """The handoff file exists but is not one this run's supervisor wrote."""


@dataclass(frozen=True)
class Handoff:
    replica: int
    launch: int
    incarnation: str
    #: The supervisor's forwarder to the gated Lighthouse (None: the run has no secret).
    forwarder: str | None = None

    def environ(self) -> dict[str, str]:
        """What the replica's own step would have found in its environment."""
        env = {
            contract.REPLICA_ID: str(self.replica),
            contract.REPLICA: str(self.replica),
            contract.LAUNCH: str(self.launch),
            contract.INCARNATION: self.incarnation,
        }
        if self.forwarder:
            env[contract.LIGHTHOUSE_FORWARDER] = self.forwarder
        return env


def handoff_path(run_dir: Path, slot_job: str) -> Path:
    return Path(run_dir) / WARM_DIR / f"{slot_job}.json"


def ready_path(handoff: Path) -> Path:
    return handoff.with_suffix(".ready")


def write_handoff(path: Path, handoff: Handoff) -> None:
    path.parent.mkdir(mode=0o700, exist_ok=True)
    write_private(path, json.dumps(asdict(handoff)))


def _private_text(path: Path) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise HandoffError(f"{path}: {exc.strerror}") from None
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise HandoffError(f"{path} is not private to this user (mode {st.st_mode & 0o777:o})")
        return f.read()


def read_handoff(path: Path, num_replicas: int) -> Handoff | None:
    """The handoff, None while there is none; `HandoffError` for anything else."""
    text = _private_text(path)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        raise HandoffError(f"{path} is not JSON") from None
    if not isinstance(data, dict) or set(data) != {"replica", "launch", "incarnation", "forwarder"}:
        raise HandoffError(f"{path} does not hold replica, launch, incarnation and forwarder")
    replica, launch, inc, fwd = (data[k] for k in ("replica", "launch", "incarnation", "forwarder"))
    if type(replica) is not int or not 0 <= replica < num_replicas:
        raise HandoffError(f"{path}: replica {replica!r} is not in 0..{num_replicas - 1}")
    if type(launch) is not int or launch < 0:
        raise HandoffError(f"{path}: launch {launch!r} is not a count")
    if not isinstance(inc, str) or not 0 < len(inc) <= 64 or not inc.isprintable():
        raise HandoffError(f"{path}: incarnation {inc!r} is not a launch's name")
    if fwd is not None and (not isinstance(fwd, str) or not fwd.startswith("http://127.0.0.1:")):
        raise HandoffError(f"{path}: forwarder {fwd!r} is not a local address")
    return Handoff(replica, launch, inc, fwd)


def wait_for_handoff(
    path: Path,
    num_replicas: int,
    poll_s: float = POLL_S,
    sleep: Callable[[float], None] = time.sleep,
) -> Handoff:
    """Block until the supervisor names this slot's replica (the slot may wait for hours)."""
    while True:
        found = read_handoff(path, num_replicas)
        if found is not None:
            return found
        sleep(poll_s)


def mark_ready(handoff: Path, **fields: Any) -> None:
    """Say that this slot's processes are warm (the leader, once)."""
    handoff.parent.mkdir(mode=0o700, exist_ok=True)
    write_private(ready_path(handoff), json.dumps({"t": time.time(), **fields}))


def read_ready(handoff: Path) -> dict[str, Any] | None:
    """When and how the slot became warm, or None (not yet, or not a warm slot)."""
    try:
        text = _private_text(ready_path(handoff))
        data = json.loads(text) if text is not None else None
    except (HandoffError, ValueError):
        return None
    return data if isinstance(data, dict) else None
