"""Submit a run: render into `run_dir`, sbatch the control job, then one job per replica.

Order matters. The control job (quorum service + coordinator) goes first; each replica job then
depends on it with `after:<control>` (start once the control job has started) plus `singleton`
(never two incarnations of one replica at once). Job ids land in `run_dir/jobs.json`, which is
how every later command finds the run. If any sbatch fails part-way, the jobs already submitted
are cancelled again, so a failed submit never leaves half a run in the queue.

Before anything is written, the spec is checked against what the cluster offers (GPUs per node in
the partition) when Slurm answers, and the run_dir is refused if it holds a live run.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable
from dataclasses import replace

from slurm.backend import NodeInfo, SlurmBackend, SlurmCommandError
from slurm.doctor import require_topology_support
from slurm.errors import InputError
from slurm.render import RenderedScript, render_run, write_scripts
from slurm.run_dir import (
    LOG_DIR,
    SECRET_FILE,
    SPEC_FILE,
    JobRecord,
    RunRecord,
    check_not_live,
    new_record,
    write_run,
)
from slurm.spec import JobSpec

_GRES_GPU = re.compile(r"^gpu(?::(?P<type>[^:(]+))?:(?P<count>\d+)")


def gpus_on_node(gres: str, gpu_type: str | None = None) -> int:
    """GPUs a node offers according to its sinfo gres string (e.g. `gpu:h100:8(S:0-1)`)."""
    total = 0
    for item in gres.split(","):
        m = _GRES_GPU.match(item.strip())
        if m and (gpu_type is None or m.group("type") == gpu_type):
            total += int(m.group("count"))
    return total


def check_against_cluster(spec: JobSpec, nodes: Iterable[NodeInfo]) -> None:
    """Refuse GPU requests that no node of the replicas' partition can satisfy."""
    r = spec.replicas
    if not r.gpus_per_node:
        return
    partition = r.partition or spec.job.partition
    pool = [n for n in nodes if partition is None or partition in n.partitions]
    if not pool:
        return  # unknown partition: sbatch itself names it in its error
    best = max(gpus_on_node(n.gres, r.gpu_type) for n in pool)
    if r.gpus_per_node > best:
        where = f"partition {partition}" if partition else "this cluster"
        kind = f" of type {r.gpu_type}" if r.gpu_type else ""
        raise InputError(
            "replicas.gpus_per_node",
            r.gpus_per_node,
            f"at most {best} GPUs{kind} per node in {where}",
        )


def prepare_run_dir(spec: JobSpec, scripts: list[RenderedScript]) -> None:
    """Write scripts, spec.json, logs/ and a fresh secret into run_dir."""
    # Imported here: runtime.control.report is torch-free, but the CLI's import path stays short.
    from runtime.control.report import create_secret

    run = spec.run_dir
    (run / LOG_DIR).mkdir(parents=True, exist_ok=True)
    write_scripts(scripts, run)
    (run / SPEC_FILE).write_text(json.dumps(spec.to_dict(), indent=2, sort_keys=True) + "\n")
    secret = run / SECRET_FILE
    secret.unlink(missing_ok=True)  # a new run gets a new key
    create_secret(secret)


def submit_run(
    spec: JobSpec, backend: SlurmBackend, force: bool = False, check_cluster: bool = True
) -> RunRecord:
    """Render, write and submit every job of `spec`; return what was recorded in jobs.json."""
    run = spec.run_dir
    require_topology_support(spec)  # before anything is queued: sbatch < 24.05 lacks --segment
    check_not_live(run, backend, force=force)
    if check_cluster:
        with contextlib.suppress(SlurmCommandError):
            check_against_cluster(spec, backend.nodes())
    scripts = render_run(spec)
    prepare_run_dir(spec, scripts)
    record = new_record(run, spec.job.name)
    submitted: list[str] = []
    try:
        control = scripts[0]
        control_id = backend.submit(run / control.filename)
        submitted.append(control_id)
        record = replace(
            record, control=JobRecord("control", control_id, control.job_name, control.filename)
        )
        replicas = []
        for s in scripts[1:]:
            job_id = backend.submit(
                run / s.filename, [f"--dependency=after:{control_id},singleton"]
            )
            submitted.append(job_id)
            replicas.append(JobRecord("replica", job_id, s.job_name, s.filename, s.replica))
        record = replace(record, replicas=tuple(replicas))
    except BaseException:
        with contextlib.suppress(SlurmCommandError):
            backend.cancel(submitted)
        raise
    write_run(record)
    return record


def cancel_run(record: RunRecord, backend: SlurmBackend) -> list[str]:
    """Cancel every job of a run (replicas first, so none outlives its control plane)."""
    ids = [r.job_id for r in record.replicas] + ([record.control.job_id] if record.control else [])
    backend.cancel(ids)
    return ids
