"""Submission against a real slurmctld (the dev cluster): what the design rests on.

- Slurm itself (`sbatch --test-only`) accepts every rendered script.
- A 2-replica run whose replicas each have a CPU helper component: each replica is one het job
  (SLURM_HET_SIZE=2 inside), its GPU component lands under one leaf switch.
- Requeueing one replica restarts only that job (restart count 1), the other keeps running
  untouched, and `release` makes the requeued job start at once rather than ~120 s later
  (docs/design-facts.md, Slurm facts 1, 2, 4).

The control job runs `python -m fthsdp_cli control`, which this branch does not provide; it exits
at once, which is harmless here: replicas depend on it with `after:` (it has started), and the
tests check only the replica jobs.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import hostlist
import pytest

from slurm.backend import CommandBackend, JobInfo, SlurmCommandError
from slurm.cancel import cancel_run
from slurm.devcluster import DevClusterConfig
from slurm.errors import InputError
from slurm.render import render_run, write_scripts
from slurm.rundir import RunRecord, is_live, live_jobs, read_run
from slurm.spec import JobSpec, parse_spec
from slurm.submit import submit_run

pytestmark = pytest.mark.slurm
ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")

# Rank 0 of the trainer component appends "<het size> <nodes comp 0> <nodes comp 1> <restart>"
# to run_dir/replica-<id>.het, then every rank sleeps: a stand-in for a long training run.
RECORDER = (
    'if [ "$SLURM_PROCID" = 0 ]; then echo "$SLURM_HET_SIZE $SLURM_JOB_NODELIST_HET_GROUP_0 '
    '$SLURM_JOB_NODELIST_HET_GROUP_1 ${SLURM_RESTART_COUNT:-0}" '
    '>> "$FTHSDP_RUN_DIR/replica-$FTHSDP_REPLICA_ID.het"; fi; exec sleep 600'
)


def dev_spec(run_dir: Path, **train: Any) -> JobSpec:
    return parse_spec(
        {
            "job": {
                "name": "ftdev",
                "run_dir": str(run_dir),
                "partition": "gpu",
                "time": "00:15:00",
                "env": {"PYTHONPATH": str(ROOT)},
            },
            "replicas": {
                "count": 2,
                "nodes": 2,
                "gpus_per_node": 8,
                "gpu_type": "h100",
                "tasks_per_node": 1,
                "cpus_per_task": 1,
                "switches": 1,
                "switches_wait": "00:01:00",
                "helper": {"nodes": 1, "cpus_per_task": 1, "command": "exec sleep 600"},
            },
            "control": {"cpus": 1, "mem": "100M", "python": sys.executable},
            "train": {"command": RECORDER, **train},
        }
    )


def _shown(*argv: str) -> str:
    try:
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except subprocess.TimeoutExpired:
        return f"({argv[0]} gave no answer in 30 s)\n"


def wait_for(
    predicate: Callable[[], T | None],
    timeout: float,
    what: str,
    cluster: DevClusterConfig | None = None,
) -> T:
    """`predicate`'s first true value; on timeout an AssertionError with the queue, the nodes
    and, given the cluster, slurmctld's last lines."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    queue = _shown("squeue", "-o", "%i %j %T %r %S %N")
    # A job pending on Resources is explained by the nodes' states, reasons and what each has
    # allocated (GRES included), and by the scheduler's own log.
    nodes = _shown("sinfo", "-N", "-o", "%N %T %E")
    alloc = "".join(
        line.strip() + "\n"
        for line in _shown("scontrol", "show", "node").splitlines()
        if line.strip().startswith(("NodeName=", "Gres=", "CfgTRES=", "AllocTRES=", "State="))
    )
    jobs = _shown("scontrol", "show", "job", "-d")
    log = ""
    if cluster is not None:
        path = cluster.directory / "log" / "slurmctld.log"
        with contextlib.suppress(OSError):
            log = "\n".join(path.read_text(errors="replace").splitlines()[-80:])
    raise AssertionError(
        f"timed out after {timeout:.0f}s waiting for {what}; squeue:\n{queue}sinfo:\n{nodes}"
        f"nodes:\n{alloc}jobs:\n{jobs}slurmctld.log:\n{log}"
    )


@pytest.fixture
def backend(slurm_cluster: DevClusterConfig) -> Iterator[CommandBackend]:
    """The real backend; every run recorded under the test's tmp dirs is cancelled afterwards."""
    b = CommandBackend(timeout=20)
    runs: list[Path] = []
    b.runs = runs  # type: ignore[attr-defined]
    try:
        yield b
    finally:
        for run in runs:
            try:
                record = read_run(run)
            except InputError:
                continue
            # A test that broke the run's spares.json on purpose gets the rest cancelled and
            # then the InputError naming the file; the wait below still proves nothing is left.
            with contextlib.suppress(InputError):
                cancel_run(record, b)
            ids = record.job_ids
            wait_for(
                lambda ids=ids: not [j for j in b.jobs(ids) if is_live(j)] or None,
                60,
                "the run's jobs to end",
            )


def components(backend: CommandBackend, job_id: str) -> list[JobInfo]:
    return sorted(
        (j for j in backend.jobs([job_id]) if j.base_id == job_id), key=lambda j: j.het_offset
    )


def het_lines(run: Path, replica: int) -> list[list[str]]:
    path = run / f"replica-{replica}.het"
    if not path.exists():
        return []
    return [line.split() for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.timeout(120)
def test_sbatch_test_only_accepts_rendered_scripts(backend: CommandBackend, tmp_path: Path) -> None:
    spec = dev_spec(tmp_path / "run")
    cpu = parse_spec(
        {
            "job": {"name": "cpu", "run_dir": str(tmp_path / "cpu"), "time": "5"},
            "replicas": {"count": 2, "tasks_per_node": 2},
            "train": {"command": "true"},
        }
    )
    for s in [*spec_scripts(spec, tmp_path / "a"), *spec_scripts(cpu, tmp_path / "b")]:
        answer = sbatch_test_only(backend, s)
        assert "to start at" in answer, f"{s.name}: {answer}"


def sbatch_test_only(backend: CommandBackend, script: Path) -> str:
    """`sbatch --test-only`: Slurm validates the script and says where it would run."""
    r = subprocess.run(
        ["sbatch", "--test-only", str(script)],
        capture_output=True,
        text=True,
        timeout=backend.timeout,
        env=backend.env,
        check=False,
    )
    if r.returncode != 0:
        raise SlurmCommandError(["sbatch", "--test-only", str(script)], r.returncode, r.stderr)
    return r.stderr.strip() or r.stdout.strip()


def spec_scripts(spec: JobSpec, out: Path) -> list[Path]:
    return write_scripts(render_run(spec), out)


@pytest.mark.timeout(300)
def test_two_het_replicas_one_switch_each_and_single_replica_requeue(
    backend: CommandBackend, tmp_path: Path, slurm_cluster: DevClusterConfig
) -> None:
    run = tmp_path / "run"
    spec = dev_spec(run)
    backend.runs.append(run)  # type: ignore[attr-defined]
    record: RunRecord = submit_run(spec, backend)
    assert len(record.replicas) == 2

    # A second submit into the same run_dir is refused while the run is live.
    with pytest.raises(InputError, match="holds a live run"):
        submit_run(spec, backend)

    # Both replicas start; each is a 2-component het job.
    lines = wait_for(
        lambda: (
            [het_lines(run, k) for k in (0, 1)] if all(het_lines(run, k) for k in (0, 1)) else None
        ),
        120,
        "both replicas to start and record their het allocation",
    )
    switch_of = {n: s for s, ns in slurm_cluster.switches.items() for n in ns}
    gpu_nodes = []
    for k, rec in enumerate(record.replicas):
        (size, comp0, comp1, restart) = lines[k][0]
        assert size == "2", f"replica {k} is not a 2-component het job"
        assert restart == "0"
        nodes0 = hostlist.expand_hostlist(comp0)
        assert len(nodes0) == 2
        assert len({switch_of[n] for n in nodes0}) == 1, f"replica {k} spans switches: {comp0}"
        assert len(hostlist.expand_hostlist(comp1)) == 1
        gpu_nodes.append(set(nodes0))
        comps = components(backend, rec.job_id)
        assert [c.het_offset for c in comps] == [0, 1]
        assert all(c.state == "RUNNING" for c in comps)
    assert not gpu_nodes[0] & gpu_nodes[1]

    # Requeue replica 0 only, and make it eligible at once.
    r0, r1 = record.replicas
    before_r1 = components(backend, r1.job_id)
    t0 = time.monotonic()
    backend.requeue(r0.job_id)
    backend.release(r0.job_id)
    restarted = wait_for(
        lambda: [ln for ln in het_lines(run, 0) if ln[3] == "1"],
        100,
        "replica 0 to run again after requeue",
        slurm_cluster,
    )
    elapsed = time.monotonic() - t0
    assert restarted[0][0] == "2"
    # Held back ~120 s without release (docs/design-facts.md, Slurm fact 2); with it, it starts
    # promptly.
    assert elapsed < 60, f"requeued replica took {elapsed:.0f}s to restart"
    comps0 = components(backend, r0.job_id)
    assert comps0[0].restarts == 1 and comps0[0].state == "RUNNING"
    after_r1 = components(backend, r1.job_id)
    assert [c.restarts for c in after_r1] == [0, 0]
    assert [c.state for c in after_r1] == ["RUNNING", "RUNNING"]
    assert [c.nodes for c in after_r1] == [c.nodes for c in before_r1]
    assert len(het_lines(run, 1)) == 1, "replica 1 was restarted too"
    # The requeued replica's GPU component again sits under one switch.
    nodes = hostlist.expand_hostlist(restarted[0][1])
    assert len({switch_of[n] for n in nodes}) == 1

    # status shows the same through jobs.json + squeue.
    from fthsdp_cli.commands.status import run_status

    rows = {r["replica"]: r for r in run_status(run, backend)["jobs"] if r["role"] == "replica"}
    assert rows[0]["restarts"] == 1 and rows[1]["restarts"] == 0
    assert len(rows[0]["nodes"]) == 2


@pytest.mark.timeout(120)
def test_cli_submit_status_cancel(backend: CommandBackend, tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from fthsdp_cli.main import cli

    run = tmp_path / "clirun"
    backend.runs.append(run)  # type: ignore[attr-defined]
    spec = ROOT / "examples" / "tiny.toml"
    overrides = [
        f"job.run_dir={run}",
        "train.command=exec sleep 300",
        f"control.python={sys.executable}",
        "replicas.mem=100M",
        "control.mem=100M",
    ]
    sets = [arg for o in overrides for arg in ("--set", o)]
    runner = CliRunner()
    r = runner.invoke(cli, ["submit", str(spec), "--json", *sets])
    assert r.exit_code == 0, r.output
    record = json.loads(r.output)
    assert [j["replica"] for j in record["replicas"]] == [0, 1]
    r = runner.invoke(cli, ["submit", str(spec), *sets])
    assert r.exit_code == 2 and "holds a live run" in r.output

    def replicas_running() -> list[dict[str, Any]] | None:
        res = runner.invoke(cli, ["status", str(run), "--json"])
        assert res.exit_code == 0, res.output
        rows = [row for row in json.loads(res.output)["jobs"] if row["role"] == "replica"]
        return rows if all(row["state"] == "RUNNING" for row in rows) else None

    rows = wait_for(replicas_running, 60, "both tiny replicas to run")
    assert [len(row["nodes"]) for row in rows] == [1, 1]
    r = runner.invoke(cli, ["status", str(run)])
    assert r.exit_code == 0 and "tiny" in r.output
    r = runner.invoke(cli, ["cancel", str(run)])
    assert r.exit_code == 0 and "cancelled 3 job(s)" in r.output
    wait_for(lambda: not live_jobs(read_run(run), backend) or None, 60, "cancelled jobs to leave")
    # A spare pool file that cannot be read: the rest is still cancelled, then exit 2 naming it.
    (run / "spares.json").write_text("{")
    r = runner.invoke(cli, ["cancel", str(run)])
    assert r.exit_code == 2 and "nothing left to cancel" in r.output, r.output
    assert "spares.json" in r.output and "scancel them by hand" in r.output, r.output
