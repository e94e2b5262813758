"""`runtime.control.spare_manager`: the coordinator's pool I/O adapter against a recording
backend."""

from __future__ import annotations

from pathlib import Path

import pytest
from spares_harness import BUSY, IDLE

from slurm.rundir import Pool, Slot, read_pool, write_pool


class PoolBackend:
    """squeue/sinfo answers from tables; records cancels and sbatches."""

    def __init__(self, jobs: dict[str, tuple[str, str]], drained: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.table = jobs
        self.drained = set(drained)
        self.cancelled: list[str] = []
        self.submitted: list[str] = []

    def jobs(self, job_ids: object = (), name: object = None) -> list[object]:
        from slurm.records import JobInfo

        wanted = set(job_ids)  # type: ignore[call-overload]
        return [
            JobInfo(j, "s", state, nodes, 0, "None")
            for j, (state, nodes) in self.table.items()
            if j in wanted
        ]

    def nodes(self, names: object = ()) -> list[object]:
        from slurm.records import NodeInfo

        return [
            NodeInfo(n, "mixed", ("DRAIN",) if n in self.drained else (), "fthsdp: xid")
            for n in names  # type: ignore[attr-defined]
        ]

    def cancel(self, job_ids: object) -> None:
        self.cancelled += list(job_ids)  # type: ignore[call-overload]

    def submit(self, script: Path, args: object = ()) -> str:
        self.submitted.append(script.name)
        return str(900 + len(self.submitted))


def test_move_into_a_free_slot_cancels_the_old_job_and_queues_a_refill(tmp_path: Path) -> None:
    from runtime.control.spare_manager import SpareManager

    write_pool(tmp_path, Pool(1, (Slot("11"),)))
    backend = PoolBackend({"11": ("RUNNING", "n3")})
    manager = SpareManager(tmp_path, backend, clock=lambda: 5.0)  # type: ignore[arg-type]
    move, why = manager.move(1, "7", "replica-01.sbatch")
    assert move is not None and (move.to_job, move.nodes) == ("11", ("n3",)) and why
    assert backend.cancelled == ["7"] and backend.submitted == ["spare.sbatch"]
    pool = read_pool(tmp_path)
    assert pool is not None
    assert pool.slot("11") == Slot("11", 1, "replica-01.sbatch", 5.0)
    assert pool.slot("901") == Slot("901")  # the refill
    # A resumed action (coordinator restart) finds the move done: nothing twice.
    again, why = manager.move(1, "7", "replica-01.sbatch")
    assert again == move and why == "moved already"
    assert backend.cancelled == ["7"] and backend.submitted == ["spare.sbatch"]


@pytest.mark.parametrize(
    ("slots", "jobs", "drained"),
    [
        ((BUSY,), {"13": ("RUNNING", "n3")}, set()),  # the only slot is in use
        ((IDLE,), {"11": ("PENDING", "")}, set()),  # still waiting for nodes
        ((IDLE,), {"11": ("RUNNING", "n3")}, {"n3"}),  # its node failed a check
    ],
)
def test_no_free_slot_falls_back_and_says_so(
    tmp_path: Path, slots: tuple[Slot, ...], jobs: dict[str, tuple[str, str]], drained: set[str]
) -> None:
    from runtime.control.spare_manager import SpareManager

    write_pool(tmp_path, Pool(1, slots))
    backend = PoolBackend(jobs, drained)
    move, why = SpareManager(tmp_path, backend).move(0, "7", "replica-00.sbatch")  # type: ignore[arg-type]
    assert move is None and "plain requeue, the replica waits for the scheduler" in why
    assert backend.cancelled == []  # the failed job is left to the plain requeue
    pool = read_pool(tmp_path)
    assert pool is not None and pool.fallbacks[-1].job_id == "7" and pool.fallbacks[-1].why == why


def test_upkeep_retires_a_slot_on_a_drained_node_and_refills(tmp_path: Path) -> None:
    from runtime.control.spare_manager import SpareManager

    write_pool(tmp_path, Pool(1, (IDLE,)))
    backend = PoolBackend({"11": ("RUNNING", "n3")}, {"n3"})
    done = SpareManager(tmp_path, backend).upkeep()  # type: ignore[arg-type]
    assert backend.cancelled == ["11"] and backend.submitted == ["spare.sbatch"]
    assert any("retired slots 11" in line for line in done)
    pool = read_pool(tmp_path)
    assert pool is not None and pool.slots == (Slot("901"),) and pool.retired == ("11",)


def test_a_node_the_run_asked_to_drain_is_no_slot_for_a_replica(tmp_path: Path) -> None:
    """Without drain rights the suspect node stays up until root's Epilog acts: a slot on it is
    treated as on a drained node (never moved into, retired when idle)."""
    from runtime.control.spare_manager import SpareManager

    write_pool(tmp_path, Pool(1, (IDLE,)))
    backend = PoolBackend({"11": ("RUNNING", "n3")})
    manager = SpareManager(tmp_path, backend)  # type: ignore[arg-type]
    manager.suspects = frozenset({"n3"})
    move, why = manager.move(0, "7", "replica-00.sbatch")
    assert move is None and "plain requeue" in why
    manager.upkeep()
    assert backend.cancelled == ["11"] and backend.submitted == ["spare.sbatch"]
