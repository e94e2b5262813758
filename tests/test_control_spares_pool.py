"""The spare pool's pure decisions and its file, by tables (no Slurm)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.control.spare_slots import SlotView, assign, choose_slot, plan_upkeep, pool_summary
from slurm.backend import SlurmCommandError
from slurm.errors import InputError
from slurm.rundir import Pool, PoolFileError, Slot, read_pool, write_pool
from slurm.spec import parse_spec

IDLE = Slot("11")
IDLE2 = Slot("12")
BUSY = Slot("13", replica=1, script="replica-01.sbatch", since=5.0)


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


@pytest.mark.parametrize(
    "data",
    [
        [],
        {"slots": []},  # no target
        {"target": -1},
        {"target": 1, "slots": [{"job_id": "1; rm -rf /"}]},
        {"target": 1, "slots": [{"job_id": "1", "replica": 0, "script": "../../bin/sh"}]},
        {"target": 1, "slots": [{"job_id": "1", "replica": 0}]},  # a replica without its script
        {"target": 1, "slots": [{"job_id": "1", "replica": -2, "script": "replica-00.sbatch"}]},
    ],
)
def test_a_bad_pool_file_is_refused(tmp_path: Path, data: object) -> None:
    (tmp_path / "spares.json").write_text(json.dumps(data))
    with pytest.raises(PoolFileError, match=r"spares\.json"):
        read_pool(tmp_path)


def test_no_pool_file_means_no_spares(tmp_path: Path) -> None:
    assert read_pool(tmp_path) is None


BASE = {"job": {"name": "a", "run_dir": "/tmp/a"}, "train": {"command": "x"}}


@pytest.mark.parametrize(
    ("replicas", "spares", "error"),
    [
        ({"count": 2}, {}, None),
        ({"count": 2}, {"nodes": 1}, None),
        ({"count": 2, "nodes": 2}, {"nodes": 4}, None),
        ({"count": 2, "nodes": 2}, {"nodes": 3}, "a multiple of replicas.nodes=2"),
        ({"count": 2}, {"nodes": -1}, "must be an integer >= 0"),
        ({"count": 2, "constraint": ["a", "b"]}, {"nodes": 1}, "per-replica constraint"),
        ({"count": 2}, {"node": 1}, "did you mean 'nodes'"),
    ],
)
def test_spares_section(
    replicas: dict[str, object], spares: dict[str, object], error: str | None
) -> None:
    data = dict(BASE, replicas=replicas, spares=spares)
    if error is None:
        assert parse_spec(data).spares.nodes == spares.get("nodes", 0)
    else:
        with pytest.raises(InputError, match=error):
            parse_spec(data)


# -- submit: the slot jobs and the pool file --------------------------------------------------


def _spares_spec(tmp_path: Path, nodes: int, **replicas: object) -> object:
    return parse_spec(
        {
            "job": {"name": "u", "run_dir": str(tmp_path / "run"), "partition": "gpu"},
            "replicas": {"count": 2, "nodes": 2, "gpus_per_node": 8, "switches": 1, **replicas},
            "train": {"command": "python t.py"},
            "spares": {"nodes": nodes},
        }
    )


def test_submit_queues_replica_shaped_slots_after_the_replicas(tmp_path: Path) -> None:
    from submit_harness import RecordingBackend

    from slurm.cancel import cancel_run
    from slurm.submit import submit_run

    backend = RecordingBackend()
    record = submit_run(_spares_spec(tmp_path, 4), backend)  # type: ignore[arg-type]
    run = tmp_path / "run"
    names = [p.name for p, _ in backend.submitted]
    assert (
        names == ["control.sbatch", "replica-00.sbatch", "replica-01.sbatch"] + ["spare.sbatch"] * 2
    )
    assert backend.submitted[-1][1] == ["--dependency=after:101"]  # no singleton
    pool = read_pool(run)
    assert pool == Pool(2, (Slot("104"), Slot("105")))
    assert (run / "spares.json").stat().st_mode & 0o777 == 0o600
    script = (run / "spare.sbatch").read_text()
    replica = (run / "replica-00.sbatch").read_text()
    # The replica's shape, its own name, no singleton, and the agent instead of the trainer.
    for line in ("--nodes=2", "--gres=gpu:8", "--switches=1", "--partition=gpu", "--requeue"):
        assert f"#SBATCH {line}" in script and f"#SBATCH {line}" in replica
    assert "#SBATCH --job-name=u-spare" in script and "singleton" not in script
    assert "-m runtime.control.spares agent --run-dir" in script
    assert cancel_run(record, backend) == ["102", "103", "104", "105", "101"]


def test_a_run_without_spares_leaves_no_pool_file(tmp_path: Path) -> None:
    from submit_harness import RecordingBackend

    from slurm.submit import submit_run

    run = tmp_path / "run"
    run.mkdir()
    write_pool(run, Pool(1, (Slot("7"),)))  # an earlier run's
    submit_run(_spares_spec(tmp_path, 0), RecordingBackend(), force=True)  # type: ignore[arg-type]
    assert read_pool(run) is None and not (run / "spare.sbatch").exists()


def test_a_resubmit_is_refused_while_a_slot_job_lives_on(tmp_path: Path) -> None:
    """Replicas and control job gone, a slot job still queued (its control plane died before
    it cancelled the pool): the run is live, even with --force."""
    from submit_harness import RecordingBackend

    from slurm.records import JobInfo
    from slurm.submit import submit_run

    backend = RecordingBackend()
    submit_run(_spares_spec(tmp_path, 4), backend)  # type: ignore[arg-type]
    backend.queue = [JobInfo("105", "u-spare", "PENDING", "", 0, "None")]
    with pytest.raises(InputError, match=r"holds a live run \(jobs 105\)"):
        submit_run(_spares_spec(tmp_path, 4), backend, force=True)  # type: ignore[arg-type]
    backend.queue = []
    (tmp_path / "run" / "spares.json").write_text("{")
    with pytest.raises(InputError, match="a readable spare pool") as err:
        submit_run(_spares_spec(tmp_path, 4), backend, force=True)  # type: ignore[arg-type]
    assert err.value.field == "job.run_dir"


def test_a_failed_slot_submit_cancels_the_whole_run(tmp_path: Path) -> None:
    from submit_harness import RecordingBackend

    from slurm.submit import submit_run

    backend = RecordingBackend(fail_at=4)  # control, 2 replicas, slot 1, then slot 2 fails
    with pytest.raises(SlurmCommandError):
        submit_run(_spares_spec(tmp_path, 4), backend)  # type: ignore[arg-type]
    assert sorted(backend.cancelled) == ["101", "102", "103", "104"]
    assert not (tmp_path / "run" / "jobs.json").exists()
    assert read_pool(tmp_path / "run") is None


# -- the coordinator's I/O adapter against a recording backend --------------------------------


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
