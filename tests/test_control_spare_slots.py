"""`runtime.control.spare_slots`: the spare pool's pure decisions, by tables (no Slurm)."""

from __future__ import annotations

from pathlib import Path

import pytest
from spares_harness import BUSY, IDLE, IDLE2

from runtime.control.spare_slots import SlotView, assign, choose_slot, plan_upkeep, pool_summary
from slurm.rundir import Pool, Slot, read_pool, write_pool


def view(job: str, state: str | None = "RUNNING", nodes: str = "n1", bad: str = "") -> SlotView:
    return SlotView(
        job, state, tuple(nodes.split(",")) if nodes else (), tuple(bad.split(",")) if bad else ()
    )


@pytest.mark.parametrize(
    ("slots", "views", "exclude", "chosen"),
    [
        # the oldest idle, running, healthy slot
        ((IDLE, IDLE2), {"11": view("11"), "12": view("12", nodes="n2")}, "", "11"),
        # a slot still waiting for nodes cannot take a replica
        ((IDLE, IDLE2), {"11": view("11", "PENDING", ""), "12": view("12")}, "", "12"),
        # a slot on a node that failed a check is skipped
        ((IDLE, IDLE2), {"11": view("11", bad="n1"), "12": view("12")}, "", "12"),
        # a slot that hosts a replica already is not free
        ((BUSY,), {"13": view("13")}, "", None),
        # the failed job itself (a replica on a slot failing again) is never its own target
        ((IDLE,), {"11": view("11")}, "11", None),
        # a slot Slurm was not asked about (no view) is not chosen on faith
        ((IDLE,), {}, "", None),
        # an empty pool
        ((), {}, "", None),
    ],
)
def test_choose_slot(
    slots: tuple[Slot, ...], views: dict[str, SlotView], exclude: str, chosen: str | None
) -> None:
    got = choose_slot(Pool(1, slots), views, exclude)
    assert (got.job_id if got else None) == chosen


@pytest.mark.parametrize(
    ("target", "slots", "views", "cancel", "drop", "submit"),
    [
        # full pool: nothing to do
        (1, (IDLE,), {"11": view("11")}, (), (), 0),
        # a queued slot counts as available: no second refill
        (1, (IDLE,), {"11": view("11", "PENDING", "")}, (), (), 0),
        # the slot now hosts a replica: one refill
        (1, (BUSY,), {"13": view("13")}, (), (), 1),
        # a hosting slot that ended is forgotten; still one refill
        (1, (BUSY,), {"13": view("13", "COMPLETED")}, (), ("13",), 1),
        # an idle slot on a drained node is retired and replaced
        (1, (IDLE,), {"11": view("11", bad="n1")}, ("11",), ("11",), 1),
        # a slot Slurm no longer lists is forgotten and replaced
        (2, (IDLE, IDLE2), {"11": view("11", None, ""), "12": view("12")}, (), ("11",), 1),
        # no answer from Slurm for a slot: it is assumed alive (never over-submit)
        (1, (IDLE,), {}, (), (), 0),
        # target 0 (spares = 0 after an edit): nothing queued
        (0, (), {}, (), (), 0),
    ],
)
def test_plan_upkeep(
    target: int,
    slots: tuple[Slot, ...],
    views: dict[str, SlotView],
    cancel: tuple[str, ...],
    drop: tuple[str, ...],
    submit: int,
) -> None:
    plan = plan_upkeep(Pool(target, slots), views)
    assert (plan.cancel, plan.drop, plan.submit) == (cancel, drop, submit)


def test_assign_records_the_move_and_the_file_round_trips(tmp_path: Path) -> None:
    pool = assign(Pool(1, (IDLE,)), IDLE, 1, "replica-01.sbatch", "7", ("n1",), 9.0)
    assert pool.slot("11") == Slot("11", 1, "replica-01.sbatch", 9.0)
    assert pool.moved_from("7") is not None and pool.moved_from("7").to_job == "11"  # type: ignore[union-attr]
    write_pool(tmp_path, pool)
    assert (tmp_path / "spares.json").stat().st_mode & 0o777 == 0o600
    assert read_pool(tmp_path) == pool
    summary = pool_summary(pool, {"11": view("11")})
    assert (summary["idle"], summary["in_use"], summary["slots"][0]["replica"]) == (0, 1, 1)


def test_the_summary_says_which_slots_are_warm() -> None:
    pool = Pool(2, (IDLE, IDLE2))
    views = {"11": view("11"), "12": view("12")}
    rows = pool_summary(pool, views, {"11": True})["slots"]
    assert [r["warm"] for r in rows] == [True, False]
    assert [r["warm"] for r in pool_summary(pool, views)["slots"]] == [False, False]
