"""Submission logic without Slurm: a recording backend stands in for `CommandBackend`
(the dev-cluster tests in test_slurm_submit_devcluster.py drive the real one)."""

from __future__ import annotations

import json
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from submit_harness import RecordingBackend

from fthsdp_cli.commands.status import run_status
from fthsdp_cli.main import cli
from slurm.backend import (
    JobInfo,
    NodeInfo,
    SlurmCommandError,
    SlurmOutputError,
    SlurmVersion,
)
from slurm.backend.pyslurm import versions_match
from slurm.cancel import cancel_run
from slurm.errors import InputError
from slurm.rundir import Pool, Slot, read_pool, read_run, write_pool
from slurm.spec import parse_spec
from slurm.submit import check_against_cluster, gpus_on_node, submit_run

SPECS = Path(__file__).with_name("specs")


def spec_in(tmp_path: Path, **replicas: Any) -> Any:
    return parse_spec(
        {
            "job": {"name": "u", "run_dir": str(tmp_path / "run")},
            "replicas": {"count": 3, **replicas},
            "train": {"command": "python t.py"},
        }
    )


def test_submit_orders_jobs_and_records_them(tmp_path: Path) -> None:
    backend = RecordingBackend()
    record = submit_run(spec_in(tmp_path), backend)
    run = tmp_path / "run"
    assert [p.name for p, _ in backend.submitted] == [
        "control.sbatch",
        "replica-00.sbatch",
        "replica-01.sbatch",
        "replica-02.sbatch",
    ]
    assert backend.submitted[0][1] == []
    for _, args in backend.submitted[1:]:
        assert args == ["--dependency=after:101,singleton"]
    assert record.control is not None and record.control.job_id == "101"
    assert [(r.replica, r.job_id, r.job_name) for r in record.replicas] == [
        (0, "102", "u-r00"),
        (1, "103", "u-r01"),
        (2, "104", "u-r02"),
    ]
    assert read_run(run) == record
    spec_json = json.loads((run / "spec.json").read_text())
    assert spec_json["replicas"]["count"] == 3
    assert spec_json["train"]["heartbeat_timeout_s"] == 0.5
    secret = run / "secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert len(secret.read_text().strip()) == 64
    assert (run / "logs").is_dir()


def test_failed_submit_cancels_what_was_submitted(tmp_path: Path) -> None:
    backend = RecordingBackend(fail_at=2)
    with pytest.raises(SlurmCommandError):
        submit_run(spec_in(tmp_path), backend)
    assert backend.cancelled == ["101", "102"]
    assert not (tmp_path / "run" / "jobs.json").exists()


def test_live_run_is_refused_even_forced_and_a_finished_one_unless_forced(tmp_path: Path) -> None:
    backend = RecordingBackend()
    run = tmp_path / "run"
    first = submit_run(spec_in(tmp_path), backend)
    old_secret = (run / "secret").read_text()
    for force in (False, True):
        with pytest.raises(InputError) as info:
            submit_run(spec_in(tmp_path), backend, force=force)
        assert info.value.field == "job.run_dir"
        assert "live run (jobs 101,102,103,104)" in str(info.value)
        assert f"fthsdp cancel {run}" in str(info.value)
    assert len(backend.submitted) == 4
    # The run finished (its control job too): the same directory is refused without --force ...
    backend.queue = [JobInfo(j.job_id, j.job_name, "COMPLETED", "", 0, "None") for j in first.jobs]
    for name in ("progress", "ledger"):
        (run / name).mkdir()
        (run / name / "r0.jsonl").write_text("{}\n")
    (run / "finished").write_text("300")
    (run / "control.json").write_text("{}")
    (run / "control.sqlite").write_text("journal")
    (run / "logs" / "control-101.err").write_text("old log")
    with pytest.raises(InputError, match=r"holds a finished run .* pass --force"):
        submit_run(spec_in(tmp_path), backend)
    assert (run / "finished").exists() and read_run(run) == first
    # ... and with --force, the earlier run's state moves to archive/<time>/ first.
    second = submit_run(spec_in(tmp_path), backend, force=True)
    assert second.control is not None and second.control.job_id == "105"
    assert read_run(run) == second
    assert (run / "secret").read_text() != old_secret
    (archived,) = (run / "archive").iterdir()
    assert sorted(p.name for p in archived.iterdir()) == [
        "control.json",
        "control.sqlite",
        "finished",
        "jobs.json",
        "ledger",
        "logs",
        "progress",
    ]
    assert (archived / "logs" / "control-101.err").read_text() == "old log"
    assert json.loads((archived / "jobs.json").read_text())["control"]["job_id"] == "101"
    for name in ("finished", "progress", "ledger", "control.json", "control.sqlite"):
        assert not (run / name).exists(), name
    assert stat.S_IMODE(archived.stat().st_mode) == 0o700


def test_forced_submit_that_fails_puts_the_earlier_run_back(tmp_path: Path) -> None:
    backend = RecordingBackend()
    run = tmp_path / "run"
    first = submit_run(spec_in(tmp_path), backend)
    backend.queue = [JobInfo(j.job_id, j.job_name, "COMPLETED", "", 0, "None") for j in first.jobs]
    (run / "finished").write_text("300")
    backend.fail_at = 5  # the new run: its control job is queued, its first replica fails
    with pytest.raises(SlurmCommandError):
        submit_run(spec_in(tmp_path), backend, force=True)
    assert backend.cancelled == ["105"]
    assert read_run(run) == first
    assert (run / "finished").read_text() == "300"
    assert list((run / "archive").iterdir()) == []


def test_cancel_and_status_use_jobs_json(tmp_path: Path) -> None:
    backend = RecordingBackend()
    record = submit_run(spec_in(tmp_path), backend)
    backend.queue = [
        JobInfo("101", "u-control", "RUNNING", "node1", 0, "None"),
        JobInfo("102", "u-r00", "RUNNING", "node1", 1, "None", het_job_id="102"),
        JobInfo("200", "u-r00", "RUNNING", "node2", 1, "None", het_job_id="102", het_offset=1),
        JobInfo("103", "u-r01", "PENDING", "", 0, "Dependency"),
    ]
    status = run_status(tmp_path / "run", backend)
    rows = {(r["role"], r["replica"]): r for r in status["jobs"]}
    assert rows[("replica", 0)]["nodes"] == ["node1", "node2"]
    assert rows[("replica", 0)]["restarts"] == 1
    assert rows[("replica", 1)]["state"] == "PENDING"
    assert rows[("replica", 2)]["state"] == "GONE"
    assert rows[("control", None)]["state"] == "RUNNING"
    json.dumps(status)  # plain data
    assert cancel_run(record, backend) == ["102", "103", "104", "101"]


def node(name: str, gres: str, partitions: tuple[str, ...] = ("gpu",)) -> NodeInfo:
    return NodeInfo(name=name, state="idle", gres=gres, partitions=partitions)


@pytest.mark.parametrize(
    ("gres", "gpu_type", "expected"),
    [
        ("gpu:h100:8", None, 8),
        ("gpu:h100:8(S:0-1)", None, 8),
        ("gpu:8", None, 8),
        ("gpu:a100:4,gpu:h100:4", "h100", 4),
        ("gpu:a100:4,gpu:h100:4", None, 8),
        ("gpu:h100:8", "a100", 0),
        ("(null)", None, 0),
        ("", None, 0),
    ],
)
def test_gpus_on_node(gres: str, gpu_type: str | None, expected: int) -> None:
    assert gpus_on_node(gres, gpu_type) == expected


def test_node_answer_of_unknown_shape_stops_submit_before_anything_is_queued(
    tmp_path: Path,
) -> None:
    class UnknownShape(RecordingBackend):
        def nodes(self, names: Iterable[str] = ()) -> list[NodeInfo]:
            raise SlurmOutputError(
                ["sinfo", "--json"], SlurmVersion(99, 1, 0), "no top-level nodes"
            )

    backend = UnknownShape()
    with pytest.raises(SlurmOutputError, match=r"sinfo --json on Slurm 99\.01\.0"):
        submit_run(spec_in(tmp_path, gpus_per_node=8), backend)
    assert backend.submitted == []
    assert not (tmp_path / "run" / "jobs.json").exists()


def test_gpu_request_checked_against_partition(tmp_path: Path) -> None:
    nodes = [node("n1", "gpu:h100:8"), node("c1", "gpu:h100:16", ("cpu",))]
    check_against_cluster(spec_in(tmp_path, gpus_per_node=8, partition="gpu"), nodes)
    with pytest.raises(InputError) as info:
        check_against_cluster(spec_in(tmp_path, gpus_per_node=9, partition="gpu"), nodes)
    assert info.value.field == "replicas.gpus_per_node"
    assert "at most 8 GPUs per node in partition gpu" in str(info.value)
    with pytest.raises(InputError, match="of type a100"):
        check_against_cluster(
            spec_in(tmp_path, gpus_per_node=1, gpu_type="a100", partition="gpu"), nodes
        )
    # submit runs the check when Slurm answers, and skips it when it does not.
    with pytest.raises(InputError):
        submit_run(
            spec_in(tmp_path, gpus_per_node=9, partition="gpu"), RecordingBackend(nodes=nodes)
        )
    submit_run(spec_in(tmp_path, gpus_per_node=9, partition="gpu"), RecordingBackend())


@pytest.mark.parametrize(
    ("pyslurm", "slurm", "ok"),
    [
        ("23.2.2", "slurm 23.02.7", True),
        ("25.11.0", "slurm 25.11.1", True),
        ("25.11.0", "slurm 22.05.8", False),
        ("", "slurm 22.05.8", False),
    ],
)
def test_pyslurm_version_match(pyslurm: str, slurm: str, ok: bool) -> None:
    assert versions_match(pyslurm, slurm) is ok


def test_default_backend_without_pyslurm(monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm.backend import CommandBackend, make_backend
    from slurm.backend.pyslurm import pyslurm_usable

    monkeypatch.setenv("FTHSDP_BACKEND", "pyslurm")
    if not pyslurm_usable():
        assert isinstance(make_backend(), CommandBackend)
        assert type(make_backend()) is CommandBackend


def test_cli_render_prints_every_script(tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(cli, ["render", str(SPECS / "helper.toml")])
    assert r.exit_code == 0, r.output
    headers = [line for line in r.output.splitlines() if line.startswith("# ==> ")]
    assert headers == [
        "# ==> control.sbatch <==",
        "# ==> replica-00.sbatch <==",
        "# ==> replica-01.sbatch <==",
        "# ==> replica-02.sbatch <==",
    ]
    r = runner.invoke(
        cli, ["render", str(SPECS / "helper.toml"), "--replica", "1", "--out", str(tmp_path)]
    )
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["replica-01.sbatch"]
    r = runner.invoke(
        cli, ["submit", str(SPECS / "cpu.toml"), "--dry-run", "--set", "replicas.count=3"]
    )
    assert r.exit_code == 0 and r.output.count("# ==> replica-") == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "replicas.count=0"], "replicas.count: got 0; must be an integer >= 1"),
        (["--set", "replicas.cuont=2"], "did you mean 'count'"),
        (["--set", "job.name=a;b"], "job.name: got 'a;b'"),
        (["--replica", "7"], "--replica: got 7; a replica id in 0..1"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(args: list[str], message: str) -> None:
    r = CliRunner().invoke(cli, ["render", str(SPECS / "cpu.toml"), *args])
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_cli_status_and_cancel_on_missing_run(tmp_path: Path) -> None:
    for command in ("status", "cancel"):
        r = CliRunner().invoke(cli, [command, str(tmp_path)])
        assert r.exit_code == 2
        assert "RUN_DIR" in r.output and "jobs.json" in r.output


def test_spec_json_of_a_spec_with_a_helper_reads_back(tmp_path: Path) -> None:
    # The helper's unset fields are written as null, nested one table deeper than the others.
    from slurm.rundir import read_spec_data
    from slurm.spec import load_spec

    spec = load_spec(Path(__file__).parents[1] / "examples" / "demo.toml")
    (tmp_path / "spec.json").write_text(json.dumps(spec.to_dict()))
    data = read_spec_data(tmp_path)
    assert data is not None and data["replicas"]["helper"]["partition"] is None


def _spares_spec(tmp_path: Path, nodes: int, warm: bool = False, **replicas: object) -> object:
    return parse_spec(
        {
            "job": {"name": "u", "run_dir": str(tmp_path / "run"), "partition": "gpu"},
            "replicas": {"count": 2, "nodes": 2, "gpus_per_node": 8, "switches": 1, **replicas},
            "train": {"command": "python t.py"},
            "spares": {"nodes": nodes, "warm": warm},
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


def test_a_warm_slot_starts_the_replicas_step_without_a_replica_id(tmp_path: Path) -> None:
    from submit_harness import RecordingBackend

    from slurm.submit import submit_run

    submit_run(_spares_spec(tmp_path, 2, warm=True), RecordingBackend())  # type: ignore[arg-type]
    run = tmp_path / "run"
    script = (run / "spare.sbatch").read_text()
    replica = (run / "replica-00.sbatch").read_text()
    step = replica.split(" -- srun ", 1)[1].split(" || ", 1)[0]
    assert "--nodes=2 --ntasks-per-node=8 --kill-on-bad-exit=1 bash -c 'python t.py'" in step
    assert f"-m runtime.control.spares agent --run-dir {run} --warm -- srun {step}" in script
    assert "FTHSDP_REPLICA_ID" in replica and "FTHSDP_REPLICA_ID" not in script
    cold = tmp_path / "cold"
    cold.mkdir()
    submit_run(_spares_spec(cold, 2), RecordingBackend())  # type: ignore[arg-type]
    assert "--warm" not in (cold / "run" / "spare.sbatch").read_text()


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
