"""A restarted Lighthouse counts quorum ids from 1 again; the store keys of its quorums must not
meet those of the old incarnation's quorums of the same id (`runtime.worker.manager`).

Seen on the dev cluster after a control-job requeue: every replica's process-group rendezvous
for the new quorum read the peers' addresses of the old quorum with that id and gloo failed with
"Connection refused", quorum after quorum, until workers exited and were relaunched.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from torch.distributed import TCPStore
from torchft._torchft import QuorumResult
from torchft.process_group import create_store_client

from runtime.worker.manager import EpochStoreClient, epoch_store_address


class FakeClient:
    """torchft's ManagerClient as far as the Manager's quorum uses it."""

    def __init__(self, store_address: str) -> None:
        self.store_address = store_address
        self.calls: list[dict[str, Any]] = []

    def _quorum(self, **kwargs: Any) -> QuorumResult:
        self.calls.append(kwargs)
        result = QuorumResult()
        result.store_address = self.store_address
        result.quorum_id = 1
        return result

    def should_commit(self, *args: Any) -> bool:
        return True


def test_each_quorum_names_the_incarnation_that_made_it() -> None:
    epoch = [1796306458]
    client = EpochStoreClient(FakeClient("vm:29500"), lambda: epoch[0])
    assert client._quorum(step=3).store_address == "vm:29500/fthsdp-epoch-1796306458"
    epoch[0] = 1796306551  # the control plane restarted
    result = client._quorum(step=4)
    assert result.store_address == "vm:29500/fthsdp-epoch-1796306551"
    assert result.quorum_id == 1  # what torchft reports is left as the Lighthouse gave it
    assert client.should_commit(0, 4, True) is True  # everything else is torchft's own


@pytest.mark.timeout(60)
def test_the_same_quorum_id_of_two_incarnations_meets_no_old_key() -> None:
    """torchft's own store client on a real TCPStore, the way `_async_quorum` builds it."""
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    base = f"127.0.0.1:{server.port}"
    timeout = timedelta(seconds=5)
    old = create_store_client(f"{epoch_store_address(base, 100)}/torchft/1/0", timeout)
    old.set("rank_1", "127.0.0.1:28035")  # a peer's address in the old quorum 1
    new = create_store_client(f"{epoch_store_address(base, 200)}/torchft/1/0", timeout)
    assert not new.check(["rank_1"])
    again = create_store_client(f"{epoch_store_address(base, 100)}/torchft/1/0", timeout)
    assert again.get("rank_1") == b"127.0.0.1:28035"
