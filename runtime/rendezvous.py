"""Where the ranks of one replica meet under `srun`: the first node's address and a free port.

torch's process group needs `MASTER_ADDR:MASTER_PORT`, a TCP store that group rank 0 serves.
Under `srun` there is no launcher to hand those out, so the worker works them out itself:

* **Address.** The first node of the step, by name. Where that name does not resolve (the dev
  cluster's node1..nodeN all live on one host; sites whose node names are not DNS names), the
  node's `NodeAddr` comes from Slurm through `slurm.backend` (the node record's `address`); when
  Slurm cannot say, the worker stops with the reason rather than guess. The runtime never runs a
  Slurm command itself.
* **Port.** A port derived from the job id alone collides: two replicas of two runs (or two dev
  clusters) on one host with equal job ids, or a daemon already on that port. So rank 0 tries a
  sequence of candidate ports derived from the *incarnation* (job id, Slurm restart count,
  supervisor launch: `FTHSDP_INCARNATION`, else job and step id) over a wide range, takes the
  first one it can bind, and publishes it in `run_dir/rendezvous/rK.json` together with the
  incarnation. The other ranks wait for a file naming their own incarnation, so a file left by an
  earlier launch is never used. A replica of one rank publishes nothing.

The bind check and the store's own bind are two steps; another process could take the port in
between. That is a process fault like any other (the step is relaunched with a new
incarnation, hence new candidates), not a silent hang.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from runtime.env import WorkerEnv
from slurm import contract

PORT_LOW = 20000
PORT_SPAN = 40000
CANDIDATES = 64
RENDEZVOUS_DIR = "rendezvous"


class RendezvousError(RuntimeError):
    """The replica's ranks could not agree on where to meet (no free port, no published port)."""


def incarnation_key(env: dict[str, str] | os._Environ[str], job_id: str | None) -> str:
    """What makes this launch of the replica's step unique (the supervisor sets it)."""
    if env.get(contract.INCARNATION):
        return str(env[contract.INCARNATION])
    return f"{job_id or '0'}.{env.get(contract.SLURM_STEP_ID, '0')}"


def candidate_ports(key: str, count: int = CANDIDATES) -> Iterator[int]:
    """Ports to try for one incarnation: pseudo-random over [PORT_LOW, PORT_LOW + PORT_SPAN)."""
    for i in range(count):
        digest = hashlib.sha256(f"{key}/{i}".encode()).digest()
        yield PORT_LOW + int.from_bytes(digest[:4], "big") % PORT_SPAN


def port_free(port: int, host: str = "") -> bool:
    """True if a TCP listener could bind `port` here now (all interfaces, like torch's store)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_port(key: str, free: Callable[[int], bool] = port_free) -> int:
    """The first candidate of `key` that is free here."""
    for port in candidate_ports(key):
        if free(port):
            return port
    raise RendezvousError(f"no free port among {CANDIDATES} candidates for {key}")


def resolves(name: str) -> bool:
    try:
        socket.getaddrinfo(name, None)
    except (OSError, UnicodeError):
        return False
    return True


def node_address(name: str, lookup: Callable[[str], str] | None = None) -> str:
    """`name` if it resolves, else its Slurm NodeAddr (via `slurm.backend`).

    Never guesses: when Slurm cannot be read, or shows the node without an address, this raises
    `RendezvousError` saying why. The bare name comes back only when Slurm itself says the
    node's NodeAddr is its name.
    """
    if resolves(name):
        return name
    if lookup is None:
        lookup = _slurm_node_address
    found = lookup(name)
    if not found:
        raise RendezvousError(f"node {name} does not resolve and Slurm shows no address for it")
    return found


def _slurm_node_address(name: str) -> str:
    from slurm.backend import SlurmCommandError, make_backend

    try:
        return make_backend(timeout=20, retries=2).node(name).address
    except (SlurmCommandError, OSError) as exc:
        raise RendezvousError(
            f"node {name} does not resolve and its address cannot be read from Slurm: {exc}"
        ) from None


def _publish(path: Path, record: dict[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


def _read(path: Path) -> dict[str, object] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def resolve(
    env: WorkerEnv,
    environ: dict[str, str] | os._Environ[str] = os.environ,
    lookup: Callable[[str], str] | None = None,
    free: Callable[[int], bool] = port_free,
) -> tuple[str, int]:
    """(MASTER_ADDR, MASTER_PORT) for this rank under srun; `env` as parsed, for RANK launches
    (the local launcher, torchrun) the given address and port are kept."""
    if not env.nodes:
        return env.master_addr, env.master_port
    addr = node_address(env.nodes[0], lookup)
    key = incarnation_key(environ, env.slurm_job_id)
    # The run and replica go into the candidates too: equal job ids of two runs (or two dev
    # clusters) on one host then try different ports.
    seed = f"{env.run_dir}/{env.rendezvous_name}/{key}"
    path = env.run_dir / RENDEZVOUS_DIR / f"{env.rendezvous_name}.json"
    if env.world_size == 1:
        return addr, pick_port(seed, free)
    if env.rank == 0:
        port = pick_port(seed, free)
        _publish(path, {"incarnation": key, "addr": addr, "port": port, "at": time.time()})
        return addr, port
    deadline = time.monotonic() + env.timeouts.join_s
    while time.monotonic() < deadline:
        data = _read(path)
        if data is not None and data.get("incarnation") == key:
            return str(data["addr"]), int(str(data["port"]))
        time.sleep(0.1)
    raise RendezvousError(f"rank 0 published no rendezvous for {key} in {path}")
