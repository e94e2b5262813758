"""Turn a validated `JobSpec` into the sbatch scripts of a run.

A run is one small control-plane job (`control.sbatch`) plus one job per replica
(`replica-NN.sbatch`). Each replica is its own requeueable job, never a component of one big
heterogeneous job: Slurm cannot requeue or lose one component of a het job on its own
(Slurm fact 1 in docs/design-facts.md; docs/job-spec.md explains), so a whole-run het job would
turn every node fault into a whole-run restart. A replica that has a `[replicas.helper]` is itself
a two-component het job (trainer GPUs + CPU helper), which is fine: the helper shares its
replica's fate.

The `#SBATCH` options of each component are chosen here, in Python, as `(option, value)` pairs;
the Jinja2 templates under `slurm/templates/` only lay them out and quote every value with
`shlex.quote` (sbatch's `#SBATCH` parser and bash both honour those quotes). Templates run with
`StrictUndefined`, so a missing variable is an error, not an empty string. `q` refuses CR and LF
(an `#SBATCH` option or argument must be one line); `q_lines` is only for a user's commands and
`[job].env` values, after the `#SBATCH` block, where a quoted multi-line word is valid shell.
The trainer's `srun` line sits in the `launch_trainer` block so a supervisor can wrap it without
touching the rest.

In `[train] mode = "torchft"` the trainer's step is a foreign torchft trainer: the script
exports its group's static identity (`foreign_env`: `REPLICA_GROUP_ID`, `NUM_REPLICA_GROUPS`,
the dump folder, torchft's timeouts, the progress source) and runs the step with `srun --label`
so the supervisor can tell group rank 0's lines; the supervisor adds the Lighthouse and the
rendezvous per launch (`runtime.control.supervisor`).

The Environment and compiled templates are built once per process: rendering 1000 replicas is a
loop over a compiled template.
"""

from __future__ import annotations

import functools
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

import jinja2

from slurm import contract
from slurm.contract import dump_dir, torchft_timeouts
from slurm.errors import InputError
from slurm.rundir import CONTROL_FILE, LOG_DIR
from slurm.spec import JobSpec

TEMPLATE_DIR = Path(__file__).with_name("templates")
CONTROL_SCRIPT = "control.sbatch"
Option = tuple[str, str | None]


@dataclass(frozen=True)
class RenderedScript:
    """One sbatch script of a run: its file name, the Slurm job name and the text."""

    filename: str
    job_name: str
    role: Literal["control", "replica"]
    replica: int | None
    text: str


@functools.cache
def template_environment() -> jinja2.Environment:
    """The one Jinja2 environment every script is rendered with: strict about undefined names,
    with the shell-quoting filters, so a spare slot's script is rendered like a replica's."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["q"] = _quote
    env.filters["q_lines"] = _quote_lines
    return env


def _quote(value: object) -> str:
    """shlex-quote a value for a shell or `#SBATCH` line; refuse what no quoting makes one line.

    A quoted newline is valid shell, but sbatch stops reading `#SBATCH` lines at it and an
    `export` or `srun` line split in two runs its tail as a command: CR, LF and NUL are refused.
    """
    text = str(value)
    for char, name in (("\0", "NUL"), ("\n", "newline"), ("\r", "carriage return")):
        if char in text:
            raise InputError("value", text, f"one line: no {name} characters")
    return shlex.quote(text)


def _quote_lines(value: object) -> str:
    """shlex-quote a shell word that may span lines: a user's command or `[job].env` value,
    placed after the `#SBATCH` block, where a quoted newline is plain shell (bash -n proves it
    in the property tests). Only NUL, which no script can hold, is refused."""
    text = str(value)
    if "\0" in text:
        raise InputError("value", text, "no NUL bytes")
    return shlex.quote(text)


def _num(value: float | int) -> str:
    """2.0 -> '2', 2.5 -> '2.5': what a shell user would write."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _opts(*pairs: tuple[str, object]) -> list[Option]:
    """Keep set options; True means a bare flag (`--exclusive`), None/False leaves it out."""
    out: list[Option] = []
    for key, value in pairs:
        if value is None or value is False:
            continue
        out.append((key, None if value is True else str(value)))
    return out


def runtime_env(spec: JobSpec) -> list[tuple[str, str]]:
    """The FTHSDP_* variables every job of the run exports (`slurm.contract`)."""
    t = spec.train
    run = spec.run_dir
    env = [
        (contract.RUN_DIR, str(run)),
        (contract.NUM_REPLICAS, str(spec.replicas.count)),
        (contract.CONTROL_FILE, str(run / CONTROL_FILE)),
        (contract.JOB_NAME, spec.job.name),
        (contract.MIN_REPLICAS, str(t.min_replicas)),
        (contract.MAX_RESTARTS_PER_REPLICA, str(t.max_restarts_per_replica)),
        (contract.RESTART_WINDOW_S, _num(t.restart_window_s)),
        (contract.HEARTBEAT_TIMEOUT_S, _num(t.heartbeat_timeout_s)),
        (contract.ALLREDUCE_TIMEOUT_S, _num(t.allreduce_timeout_s)),
        (contract.QUORUM_TIMEOUT_S, _num(t.quorum_timeout_s)),
        (contract.JOIN_TIMEOUT_S, _num(t.join_timeout_s)),
        (contract.CONTROL_WAIT_S, _num(t.control_wait_in_effect_s)),
        (contract.CHECKPOINT_EVERY_STEPS, str(t.checkpoint_every_steps)),
        (
            contract.CHECKPOINT_EVERY_S,
            contract.checkpoint_every_s_value(t.checkpoint_every_s_in_effect),
        ),
        (contract.RUN_NODES, str(spec.replicas.count * spec.replicas.nodes)),
        (contract.NODE_FAILURES_PER_1000_DAY, _num(t.failures_per_1000_nodes_day)),
        (contract.RUN_LOSSES_PER_DAY, _num(t.run_losses_per_day)),
        (contract.REQUEUE_COST_S, _num(t.straggler_requeue_cost_s)),
    ]
    if t.steps is not None:
        env.append((contract.STEPS, str(t.steps)))
    env.append((contract.HEALTH_CHECKS, ",".join(spec.health.checks)))
    return env


def foreign_env(spec: JobSpec, replica: int) -> list[tuple[str, str]]:
    """What a foreign torchft trainer's group gets at render time (docs/runtime.md): torchft's
    own variables (a `[job].env` entry, exported after these, overrides them) and where the
    supervisor reads its progress."""
    t = spec.train
    groups = str(spec.replicas.count)
    env = [
        (contract.TRAIN_MODE, t.mode),
        (contract.NUM_REPLICA_GROUPS, groups),
        (contract.DUMP_DIR, str(dump_dir(spec.run_dir, replica))),
        (contract.TORCHFT_REPLICA_GROUP_ID, str(replica)),
        (contract.TORCHFT_NUM_REPLICA_GROUPS, groups),
        *torchft_timeouts(t.allreduce_timeout_s, t.quorum_timeout_s, t.join_timeout_s),
    ]
    if t.progress_regex is not None:
        env.append((contract.PROGRESS_REGEX, t.progress_regex))
    if t.progress_file is not None:
        env.append((contract.PROGRESS_FILE, t.progress_file))
    env.append((contract.PROGRESS_TIMEOUT_S, f"{t.hung_after_s:g}"))
    return env


def _shared_options(spec: JobSpec, log_stem: str, gated: bool = True) -> list[Option]:
    logs = spec.run_dir / LOG_DIR
    j = spec.job
    return _opts(
        ("output", logs / f"{log_stem}-%j.out"),
        ("error", logs / f"{log_stem}-%j.err"),
        ("open-mode", "append"),
        ("account", j.account),
        ("qos", j.qos),
        ("mail-user", j.mail_user),
        ("mail-type", j.mail_type),
        # The prolog reads the checks this job requires from its comment (docs/job-spec.md).
        ("comment", spec.health.comment if gated else None),
    )


def replica_options(spec: JobSpec, replica: int) -> tuple[list[Option], list[Option]]:
    """`#SBATCH` options of a replica job: (trainer component, helper component or [])."""
    r = spec.replicas
    stem = spec.replica_script(replica).removesuffix(".sbatch")
    comp0 = [
        *_opts(
            ("job-name", spec.replica_name(replica)),
            ("requeue", True),
            ("dependency", "singleton"),
        ),
        *_shared_options(spec, stem),
        *_opts(
            ("time", spec.job.time),
            ("partition", r.partition or spec.job.partition),
            ("nodes", r.nodes),
            ("ntasks-per-node", r.tasks_per_node),
            ("cpus-per-task", r.cpus_per_task),
            ("mem", r.mem),
            ("gres", r.gres),
            ("gres-flags", r.gres_flags),
            ("switches", r.switches_option),
            # Only for topology = "block": sbatch before 24.05 does not know --segment.
            ("segment", r.segment_option),
            ("constraint", r.constraint_for(replica)),
            ("exclude", r.exclude),
            ("nodelist", r.nodelist),
            ("exclusive", r.exclusive),
            ("reservation", r.reservation),
        ),
    ]
    h = r.helper
    comp1: list[Option] = []
    if h is not None:
        comp1 = _opts(
            # Slurm 22.05 checks `singleton` per component: a helper component sharing the
            # trainer's name waits on it forever (the het job never starts). Its own name
            # keeps singleton meaningful for both components.
            ("job-name", f"{spec.replica_name(replica)}-helper"),
            ("account", spec.job.account),
            ("qos", spec.job.qos),
            ("time", spec.job.time),
            ("partition", h.partition or spec.job.partition),
            ("nodes", h.nodes),
            ("ntasks-per-node", h.tasks_per_node),
            ("cpus-per-task", h.cpus_per_task),
            ("mem", h.mem),
        )
    return comp0, comp1


def _srun_args(het_group: int | None, nodes: int, tasks: int, cpus: int | None) -> list[str]:
    # srun in 22.05+ does not inherit --cpus-per-task from sbatch, so it is repeated here.
    args = [] if het_group is None else [f"--het-group={het_group}"]
    args += [f"--nodes={nodes}", f"--ntasks-per-node={tasks}"]
    if cpus is not None:
        args.append(f"--cpus-per-task={cpus}")
    return [shlex.quote(a) for a in args]


def trainer_srun(spec: JobSpec) -> list[str]:
    """The srun options of a replica's trainer step (a warm spare slot starts the same step)."""
    r = spec.replicas
    assert r.tasks_per_node is not None
    het = r.helper is not None
    trainer = _srun_args(0 if het else None, r.nodes, r.tasks_per_node, r.cpus_per_task)
    trainer.append("--kill-on-bad-exit=1")
    if spec.train.mode == "torchft":
        trainer.append("--label")  # task ids on each line: the supervisor reads task 0's
    return trainer


def render_replica(spec: JobSpec, replica: int) -> RenderedScript:
    if not 0 <= replica < spec.replicas.count:
        raise InputError("--replica", replica, f"a replica id in 0..{spec.replicas.count - 1}")
    r = spec.replicas
    comp0, comp1 = replica_options(spec, replica)
    trainer = trainer_srun(spec)
    foreign = spec.train.mode == "torchft"
    helper = (
        _srun_args(1, r.helper.nodes, r.helper.tasks_per_node, r.helper.cpus_per_task)
        if r.helper
        else []
    )
    env = runtime_env(spec)
    env.insert(1, (contract.REPLICA_ID, str(replica)))
    if foreign:
        env += foreign_env(spec, replica)
    text = (
        template_environment()
        .get_template("replica.sbatch.j2")
        .render(
            replica=replica,
            num_replicas=r.count,
            run_name=spec.job.name,
            component0=comp0,
            component1=comp1,
            env=env,
            user_env=sorted(spec.job.env.items()),
            setup=spec.job.setup,
            helper=r.helper,
            helper_srun=helper,
            trainer_srun=trainer,
            train_command=spec.train.command,
            foreign=foreign,
            python=spec.control.python,
            python_bin=python_bin(spec.control.python),
            run_dir=str(spec.run_dir),
        )
    )
    return RenderedScript(
        spec.replica_script(replica), spec.replica_name(replica), "replica", replica, text
    )


def python_bin(python: str) -> str | None:
    """The folder of `[control].python` when it is a path: the scripts put it first on PATH so
    the training command's `python` and `torchrun` are that installation's too."""
    return str(PurePosixPath(python).parent) if "/" in python else None


def control_options(spec: JobSpec) -> list[Option]:
    c = spec.control
    return [
        *_opts(("job-name", spec.control_name), ("requeue", True)),
        *_shared_options(spec, "control", gated=False),
        *_opts(
            ("time", c.time or spec.job.time),
            ("partition", c.partition or spec.job.partition),
            ("nodes", 1),
            ("ntasks", 1),
            ("cpus-per-task", c.cpus),
            ("mem", c.mem),
        ),
    ]


def render_control(spec: JobSpec) -> RenderedScript:
    c = spec.control
    text = (
        template_environment()
        .get_template("control.sbatch.j2")
        .render(
            run_name=spec.job.name,
            options=control_options(spec),
            env=runtime_env(spec),
            user_env=sorted(spec.job.env.items()),
            setup=spec.job.setup,
            python=c.python,
            python_bin=python_bin(c.python),
            run_dir=str(spec.run_dir),
            lighthouse_port=c.lighthouse_port,
            coordinator_port=c.coordinator_port,
        )
    )
    return RenderedScript(CONTROL_SCRIPT, spec.control_name, "control", None, text)


def render_run(
    spec: JobSpec, replicas: Iterable[int] | None = None, control: bool = True
) -> list[RenderedScript]:
    """The control script (unless `control=False`) and the chosen (default: all) replicas."""
    ids: Sequence[int] = range(spec.replicas.count) if replicas is None else list(replicas)
    out = [render_control(spec)] if control else []
    out += [render_replica(spec, k) for k in ids]
    return out


def write_scripts(scripts: Iterable[RenderedScript], out_dir: Path) -> list[Path]:
    """Write scripts into `out_dir` (created 0700), each readable and executable by its owner
    only (a run directory holds the run's key); returns their paths."""
    out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    paths = []
    for s in scripts:
        p = out_dir / s.filename
        p.write_text(s.text)
        p.chmod(0o700)
        paths.append(p)
    return paths


def concatenated(scripts: Iterable[RenderedScript]) -> str:
    """All scripts as one text, each after a `# ==> NAME <==` line (render without --out)."""
    return "".join(f"# ==> {s.filename} <==\n{s.text}" for s in scripts)
