"""Submit a run: render into `run_dir`, sbatch the control job, then one job per replica.

Order matters. The control job (quorum service + coordinator) goes first; each replica job then
depends on it with `after:<control>` (start once the control job has started) plus `singleton`
(never two incarnations of one replica at once). Job ids land in `run_dir/jobs.json`, which is
how every later command finds the run. If any sbatch fails part-way, the jobs already submitted
are cancelled again, so a failed submit never leaves half a run in the queue.

Before anything is written, `SLURM_CONF` (when set) must name a readable, non-empty file (Slurm's
commands retry a missing one for a minute and then print several lines), the spec is checked
against what the cluster offers (GPUs per node in the partition) when Slurm answers, and the
run_dir is refused if it holds a live run (even with `force`) or an earlier run's state (unless
`force`, which moves that state to `run_dir/archive/<time>/` first; see `slurm.rundir`).

A submit is all or nothing for the run directory too: if any step fails, the files it wrote are
removed and the ones it replaced are put back (a new run_dir is removed entirely), so a failed
submit never leaves a secret, scripts and spec.json without the jobs.json that goes with them.
The run directory is made 0700 and what it holds for the run (secret, spec.json, jobs.json)
0600: it holds the run's HMAC key and the state later commands act on.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from slurm.backend import NodeInfo, SlurmBackend, SlurmCommandError, SlurmOutputError
from slurm.doctor import require_topology_support
from slurm.errors import EnvironmentProblem, InputError
from slurm.render import RenderedScript, python_bin, render_run, write_scripts
from slurm.rundir import (
    JOBS_FILE,
    LOG_DIR,
    RUN_DIR_MODE,
    SECRET_FILE,
    SPARE_SCRIPT,
    SPARES_FILE,
    SPEC_FILE,
    JobRecord,
    Pool,
    RunRecord,
    Slot,
    archive_state,
    check_resubmit,
    check_run_dir,
    create_secret,
    new_record,
    restore_archive,
    write_pool,
    write_private,
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


def check_slurm_conf(env: Mapping[str, str] | None = None) -> None:
    """Refuse a `SLURM_CONF` that names no readable, non-empty file, before any Slurm command.

    Slurm's commands retry a missing config for 60 s and then print several lines; an empty one
    fails with `ClusterName needs to be specified`. Unset is left to Slurm (its default path, or
    a configless setup).
    """
    path = (os.environ if env is None else env).get("SLURM_CONF")
    if not path:
        return
    hint = "start the dev cluster (fthsdp cluster up) or point SLURM_CONF at a slurm.conf"
    try:
        size = os.stat(path).st_size
    except OSError as exc:
        raise EnvironmentProblem(f"SLURM_CONF={path}: {exc.strerror}; {hint}") from None
    if not Path(path).is_file():
        raise EnvironmentProblem(f"SLURM_CONF={path}: not a file; {hint}")
    if size == 0:
        raise EnvironmentProblem(f"SLURM_CONF={path}: the file is empty; {hint}")
    if not os.access(path, os.R_OK):
        raise EnvironmentProblem(f"SLURM_CONF={path}: not readable by this user; {hint}")


def prepare_run_dir(spec: JobSpec, scripts: list[RenderedScript]) -> None:
    """Write scripts, spec.json, logs/ and a fresh secret into run_dir (0700, files 0600)."""
    run = spec.run_dir
    run.mkdir(mode=RUN_DIR_MODE, parents=True, exist_ok=True)
    if run.stat().st_uid == os.geteuid():
        run.chmod(RUN_DIR_MODE)
    (run / LOG_DIR).mkdir(mode=RUN_DIR_MODE, exist_ok=True)
    write_scripts(scripts, run)
    spec_text = json.dumps(spec.to_dict(), indent=2, sort_keys=True) + "\n"
    write_private(run / SPEC_FILE, spec_text)
    secret = run / SECRET_FILE
    secret.unlink(missing_ok=True)  # a new run gets a new key
    create_secret(secret)


@contextlib.contextmanager
def run_dir_transaction(run: Path, names: Iterable[str]) -> Iterator[None]:
    """All or nothing for the files `names` (and logs/) of `run`: on an exception inside, what
    was written is removed and what it replaced is put back; a run dir this made is removed."""
    existed = run.exists()
    if not existed:
        run.mkdir(mode=RUN_DIR_MODE, parents=True)
    backup = Path(tempfile.mkdtemp(prefix=".submit-", dir=run))
    had_logs = (run / LOG_DIR).exists()
    moved = []
    try:
        for name in names:
            if (run / name).exists() or (run / name).is_symlink():
                os.replace(run / name, backup / name)
                moved.append(name)
        yield
    except BaseException:
        if not existed:
            shutil.rmtree(run, ignore_errors=True)
        else:
            for name in names:
                with contextlib.suppress(FileNotFoundError):
                    (run / name).unlink()
            for name in moved:
                os.replace(backup / name, run / name)
            if not had_logs:
                shutil.rmtree(run / LOG_DIR, ignore_errors=True)
            shutil.rmtree(backup, ignore_errors=True)
        raise
    shutil.rmtree(backup, ignore_errors=True)


def submit_run(
    spec: JobSpec,
    backend: SlurmBackend,
    force: bool = False,
    check_cluster: bool = True,
    replica_args: Sequence[str] = (),
) -> RunRecord:
    """Render, write and submit every job of `spec`; return what was recorded in jobs.json.

    `replica_args` go to every replica's sbatch (`slurm.expedite.SBATCH_OPTION` where the
    cluster grants an expedited requeue)."""
    run = spec.run_dir
    check_run_dir(run, "job.run_dir")  # nobody else may be able to replace what we submit
    require_topology_support(spec)  # before anything is queued: sbatch < 24.05 lacks --segment
    earlier = check_resubmit(run, backend, force=force)
    if check_cluster:
        # Advisory: sbatch refuses what cannot run anyway. An answer of a shape we do not know
        # is not advisory: drain and resume would misread it too, so it stops the submit here.
        try:
            nodes = backend.nodes()
        except SlurmOutputError:
            raise
        except SlurmCommandError:
            nodes = []
        check_against_cluster(spec, nodes)
    scripts = render_run(spec)
    # The pool's files always: an earlier run's spares.json must not outlive it into this run.
    names = [s.filename for s in scripts] + [SPEC_FILE, SECRET_FILE, JOBS_FILE]
    names += [SPARE_SCRIPT, SPARES_FILE]
    archived = archive_state(run, earlier) if earlier else None
    try:
        with run_dir_transaction(run, names):
            record = _submit_scripts(spec, scripts, backend, replica_args)
            write_run(record)
    except BaseException:
        if archived is not None:
            restore_archive(run, archived)
        raise
    return record


def _submit_scripts(
    spec: JobSpec,
    scripts: list[RenderedScript],
    backend: SlurmBackend,
    replica_args: Sequence[str] = (),
) -> RunRecord:
    """prepare_run_dir, then sbatch control and replicas; cancels what it submitted on failure."""
    run = spec.run_dir
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
                run / s.filename, [f"--dependency=after:{control_id},singleton", *replica_args]
            )
            submitted.append(job_id)
            replicas.append(JobRecord("replica", job_id, s.job_name, s.filename, s.replica))
        record = replace(record, replicas=tuple(replicas))
        if spec.spares.nodes:
            submitted += submit_spares(spec, backend, control_id)
    except BaseException:
        with contextlib.suppress(SlurmCommandError):
            backend.cancel(submitted)
        raise
    return record


def submit_spares(spec: JobSpec, backend: SlurmBackend, control_id: str) -> list[str]:
    """Write the slot script, queue `spares.nodes / replicas.nodes` slots after the replicas (on
    a busy cluster the replicas' own nodes come first) and record them in the pool file."""
    run = spec.run_dir
    path = run / SPARE_SCRIPT
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o700)
    with os.fdopen(fd, "w") as f:
        f.write(render_spare(spec))
    ids: list[str] = []
    try:
        for _ in range(spec.spares.nodes // spec.replicas.nodes):
            ids.append(backend.submit(path, [f"--dependency=after:{control_id}"]))
        write_pool(run, Pool(target=len(ids), slots=tuple(Slot(j) for j in ids)))
    except BaseException:
        with contextlib.suppress(SlurmCommandError):
            backend.cancel(ids)
        raise
    return ids


def render_spare(spec: JobSpec) -> str:
    """The spare slot script: one replica's shape (partition, GRES, constraint, switches, helper
    component), its own job name and no `singleton`; it waits for the coordinator to assign a
    replica, then runs that replica's script (`runtime.control.spares`). A warm slot starts the
    replicas' step at once and hands it the replica instead."""
    from slurm.render import replica_options, runtime_env, template_environment, trainer_srun

    comp0, comp1 = replica_options(spec, 0)
    name = f"{spec.job.name}-spare"
    logs = spec.run_dir / LOG_DIR
    renamed = {
        "job-name": name,
        "output": str(logs / "spare-%j.out"),
        "error": str(logs / "spare-%j.err"),
    }
    comp0 = [(k, renamed.get(k, v)) for k, v in comp0 if k != "dependency"]
    comp1 = [(k, f"{name}-helper" if k == "job-name" else v) for k, v in comp1]
    text = (
        template_environment()
        .get_template("spares.sbatch.j2")
        .render(
            run_name=spec.job.name,
            component0=comp0,
            component1=comp1,
            env=runtime_env(spec),
            user_env=sorted(spec.job.env.items()),
            setup=spec.job.setup,
            python=spec.control.python,
            python_bin=python_bin(spec.control.python),
            run_dir=str(spec.run_dir),
            warm=spec.spares.warm,
            trainer_srun=trainer_srun(spec) if spec.spares.warm else [],
            train_command=spec.train.command,
        )
    )
    return text
