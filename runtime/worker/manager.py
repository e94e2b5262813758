"""torchft's Manager as the step protocol uses it, and how a worker builds one.

The subclass starts a quorum without waiting for it (so the quorum overlaps forward and
backward) while every quorum member counts as a participant, and it names the few Manager
internals the protocol needs (forgetting a handled failed quorum, applying a fetched heal at a
waited quorum, the quorum id) as methods, so that no other module touches torchft's private
fields.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from runtime.env import WorkerEnv


def manager_class() -> type:
    """torchft's Manager with synchronous-quorum participation and an asynchronous start.

    Every quorum member counts as a participant (torchft's `use_async_quorum=False`), so a replica
    that heals at a waited quorum trains in that same step, while `start_quorum` still returns at
    once and the quorum overlaps forward and backward. A replica that finds itself behind at an
    overlapped quorum has already run forward on its old state: it stays "healing", torchft zeroes
    its contribution and the slot count votes the step down for everyone; it loads the state at
    the vote and is in step at the next quorum.
    """
    from torchft.manager import Manager

    class _Manager(Manager):
        def start_quorum(
            self,
            allow_heal: bool = True,
            shrink_only: bool = False,
            timeout: timedelta | None = None,
        ) -> None:
            # torchft's start_quorum without its wait for a synchronous quorum
            previous: Any = self._quorum_future  # type: ignore[has-type]
            if previous is not None:
                previous.result()
            self._errored = None
            self._healing = False
            self._quorum_future = self._executor.submit(
                self._async_quorum,
                allow_heal=allow_heal,
                shrink_only=shrink_only,
                quorum_timeout=timeout or self._quorum_timeout,
                curr_device=(
                    torch.accelerator.current_device_index()
                    if torch.accelerator.is_available()
                    else -1
                ),
            )

        def is_participating(self) -> bool:
            # torchft asserts an asynchronous quorum when healing; here healing = not in step
            return self._participating_replica_rank is not None and not self._healing

        def forget_quorum(self) -> None:
            """Drop a failed quorum whose error was handled: torchft's start_quorum would
            re-raise it."""
            self._quorum_future = None

        def apply_pending_heal(self) -> bool:
            """After a waited quorum that made this replica heal: load the fetched state now
            (torchft's synchronous-quorum healing). False when there was nothing to load or the
            fetch failed (the replica stays healing)."""
            if self._healing and self.errored() is None:
                self._apply_pending_state_dict()
                self._healing = False
                return True
            return False

        def current_quorum_id(self) -> int:
            return int(self._quorum_id)

    return _Manager


class EpochStoreClient:
    """torchft's ManagerClient, with every quorum's store address namespaced by the control
    plane incarnation that made the quorum (`epoch()`).

    torchft keys a quorum's process-group rendezvous by `store/torchft/<quorum_id>/<rank>` in
    the store of the quorum's first member, and a restarted Lighthouse counts quorum ids from 1
    again: the new quorum 1 then read the peers' addresses of the old quorum 1, still in that
    store, and gloo connected to ports long closed ("Connection refused"), quorum after quorum.
    The incarnation (the control plane's start second, which every replica reads from
    `control.json`) keeps the new keys apart from the old ones.
    """

    def __init__(self, client: Any, epoch: Callable[[], int]) -> None:
        self._client = client
        self._epoch = epoch

    def _quorum(self, *args: Any, **kwargs: Any) -> Any:
        quorum = self._client._quorum(*args, **kwargs)
        quorum.store_address = epoch_store_address(quorum.store_address, self._epoch())
        return quorum

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def epoch_store_address(store_address: str, epoch: int) -> str:
    """`host:port[/prefix]` with the incarnation's segment added to its prefix (torchft appends
    `/torchft/<quorum_id>/<rank>` and splits the address at its first `/`)."""
    return f"{store_address}/fthsdp-epoch-{epoch}"


def build_manager(
    env: WorkerEnv,
    backend: str,
    lighthouse: str,
    *,
    init_sync: bool,
    epoch: Callable[[], int] = lambda: 0,
) -> tuple[Any, Any]:
    """(torchft process group, Manager) for this rank: the replicate dimension's reconfigurable
    process group (NCCL on CUDA, gloo otherwise) and the Manager on `lighthouse`, its quorums'
    store keys namespaced by `epoch()` (`EpochStoreClient`)."""
    from torchft.process_group import ProcessGroupGloo, ProcessGroupNCCL

    allreduce = timedelta(seconds=env.timeouts.allreduce_s)
    pg = ProcessGroupNCCL(timeout=allreduce) if backend == "nccl" else None
    ft_pg = pg if pg is not None else ProcessGroupGloo(timeout=allreduce)
    manager = manager_class()(
        pg=ft_pg,
        load_state_dict=None,
        state_dict=None,
        min_replica_size=env.min_replicas,
        use_async_quorum=False,
        timeout=allreduce,
        quorum_timeout=timedelta(seconds=env.timeouts.quorum_s),
        connect_timeout=timedelta(seconds=env.timeouts.quorum_s),
        rank=env.rank,
        world_size=env.world_size,
        store_addr=env.master_addr,
        store_port=env.master_port,
        lighthouse_addr=lighthouse,
        replica_id=f"{env.job_name}_r{env.replica_id}",
        hostname=socket.gethostname() if env.nodes else "localhost",
        heartbeat_interval=timedelta(seconds=min(0.1, env.timeouts.heartbeat_s / 4)),
        init_sync=init_sync,
    )
    manager._client = EpochStoreClient(manager._client, epoch)
    return ft_pg, manager
