"""The spec's sections: frozen dataclasses whose fields are the schema of the TOML file.

Each section's fields (with their type hints and defaults) are the only keys a spec accepts, and
`--set` overrides are typed by the field they target. Cross-field rules (constraint list length,
`switches_wait` needs `switches`, the timeout ordering heartbeat < allreduce < quorum < join)
live in each `__post_init__`, so a `JobSpec` that exists is a valid one. `SECTIONS` and `NESTED`
map the TOML tables to their classes for the parser, the overrides and spec.json's reader.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import re
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm import contract
from slurm.errors import InputError
from slurm.health_names import CHECK_NAMES
from slurm.privileges import check_setting
from slurm.spec.fields import (
    EMAIL,
    ENV_KEY,
    SAFE_NAME,
    SAFE_PATH,
    check_constraint,
    check_hostlist,
    check_mem,
    check_name,
    check_not_negative,
    check_port,
    check_positive,
    check_time,
)

MAIL_TYPES = frozenset(
    {
        "NONE",
        "BEGIN",
        "END",
        "FAIL",
        "REQUEUE",
        "ALL",
        "INVALID_DEPEND",
        "STAGE_OUT",
        "TIME_LIMIT",
        "TIME_LIMIT_90",
        "TIME_LIMIT_80",
        "TIME_LIMIT_50",
        "ARRAY_TASKS",
    }
)
GRES_FLAGS = frozenset({"enforce-binding", "disable-binding"})
RESERVED_ENV_PREFIXES = ("FTHSDP_", "SLURM_")
#: FTHSDP_ inputs a spec may set in `[job].env`: where a rank's watchdog and slow-fault reader
#: find their node's inputs (a site's health config, or a dev cluster's simulated hardware).
USER_FTHSDP_ENV = (
    contract.HEALTH_CONFIG,
    contract.SLOW_FILE,
    contract.GPU_SOURCE,
    contract.SYSFS_ROOT,
    contract.KERNEL_LOG,
    contract.WATCHDOG_INTERVAL_S,
)
MAX_REPLICAS = 100_000

STRAGGLER_MODES = ("drain", "exclude", "report")
TOPOLOGIES = ("tree", "block")


@dataclass(frozen=True)
class JobSection:
    """`[job]`: what the whole run shares (name, run_dir, accounting, environment, setup)."""

    name: str
    run_dir: str
    account: str | None = None
    qos: str | None = None
    time: str | None = None
    partition: str | None = None
    mail_user: str | None = None
    mail_type: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    setup: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Replica jobs are named <name>-rNN and the control job <name>-control.
        if (
            not isinstance(self.name, str)
            or not SAFE_NAME.fullmatch(self.name)
            or len(self.name) > 48
        ):
            raise InputError(
                "job.name", self.name, "allowed: 1-48 characters of A-Z a-z 0-9 _ . - (no spaces)"
            )
        if (
            not self.run_dir
            or not SAFE_PATH.fullmatch(self.run_dir)
            or ".." in self.run_dir.split("/")
        ):
            raise InputError(
                "job.run_dir",
                self.run_dir,
                "a path on a shared filesystem of A-Z a-z 0-9 _ . / + - (no spaces or '..')",
            )
        for key in ("account", "qos", "partition"):
            check_name(f"job.{key}", getattr(self, key))
        check_time("job.time", self.time)
        if self.mail_user is not None and not EMAIL.fullmatch(self.mail_user):
            raise InputError("job.mail_user", self.mail_user, "an e-mail address")
        if self.mail_type is not None:
            bad = [t for t in self.mail_type.split(",") if t not in MAIL_TYPES]
            if bad or not self.mail_type:
                raise InputError(
                    "job.mail_type",
                    self.mail_type,
                    f"comma list of {', '.join(sorted(MAIL_TYPES))}",
                )
        for key in self.env:
            if not ENV_KEY.fullmatch(key):
                raise InputError(f"job.env.{key}", key, "a variable name [A-Za-z_][A-Za-z0-9_]*")
            if key.startswith(RESERVED_ENV_PREFIXES) and key not in USER_FTHSDP_ENV:
                raise InputError(
                    f"job.env.{key}",
                    key,
                    "names starting FTHSDP_ or SLURM_ are set by fthsdp/Slurm "
                    f"(except {', '.join(USER_FTHSDP_ENV)})",
                )
            if "\0" in self.env[key]:
                raise InputError(f"job.env.{key}", self.env[key], "a string without NUL bytes")
        object.__setattr__(self, "env", types.MappingProxyType(dict(self.env)))

    @property
    def run_path(self) -> Path:
        return Path(self.run_dir)


@dataclass(frozen=True)
class HelperSection:
    """`[replicas.helper]`: a CPU component per replica (data loaders, tokenizers)."""

    command: str
    nodes: int = 1
    tasks_per_node: int = 1
    partition: str | None = None
    cpus_per_task: int | None = None
    mem: str | None = None

    def __post_init__(self) -> None:
        if not self.command.strip():
            raise InputError("replicas.helper.command", self.command, "a non-empty shell command")
        check_positive("replicas.helper.nodes", self.nodes)
        check_positive("replicas.helper.tasks_per_node", self.tasks_per_node)
        check_positive("replicas.helper.cpus_per_task", self.cpus_per_task)
        check_name("replicas.helper.partition", self.partition)
        check_mem("replicas.helper.mem", self.mem)


@dataclass(frozen=True)
class ReplicasSection:
    """`[replicas]`: how many replicas and what each one's Slurm job asks for."""

    count: int
    nodes: int = 1
    gpus_per_node: int = 0
    gpu_type: str | None = None
    tasks_per_node: int | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    partition: str | None = None
    switches: int | None = None
    switches_wait: str | None = None
    #: Placement model: "tree" (topology/tree: `switches`) or "block" (topology/block, Slurm
    #: 24.05+: a replica inside the fewest blocks, e.g. NVLink domains; with `segment`, each
    #: `segment` nodes of it inside one block).
    topology: str | None = None
    segment: int | None = None
    constraint: str | tuple[str, ...] | None = None
    exclude: str | None = None
    nodelist: str | None = None
    exclusive: bool = False
    gres_flags: str | None = None
    reservation: str | None = None
    helper: HelperSection | None = None

    def __post_init__(self) -> None:
        check_positive("replicas.count", self.count)
        if self.count > MAX_REPLICAS:
            raise InputError("replicas.count", self.count, f"at most {MAX_REPLICAS}")
        check_positive("replicas.nodes", self.nodes)
        check_positive("replicas.gpus_per_node", self.gpus_per_node, minimum=0)
        if self.gpu_type is not None:
            check_name("replicas.gpu_type", self.gpu_type)
            if self.gpus_per_node == 0:
                raise InputError("replicas.gpu_type", self.gpu_type, "needs gpus_per_node >= 1")
        if self.tasks_per_node is None:
            object.__setattr__(self, "tasks_per_node", self.gpus_per_node or 1)
        check_positive("replicas.tasks_per_node", self.tasks_per_node)
        check_positive("replicas.cpus_per_task", self.cpus_per_task)
        check_mem("replicas.mem", self.mem)
        check_name("replicas.partition", self.partition)
        check_name("replicas.reservation", self.reservation)
        check_positive("replicas.switches", self.switches)
        if self.switches_wait is not None:
            if self.switches is None:
                raise InputError(
                    "replicas.switches_wait", self.switches_wait, "needs replicas.switches set"
                )
            check_time("replicas.switches_wait", self.switches_wait)
        self._check_topology()
        if isinstance(self.constraint, tuple):
            if len(self.constraint) != self.count:
                raise InputError(
                    "replicas.constraint",
                    list(self.constraint),
                    f"one string, or a list of exactly replicas.count={self.count} strings",
                )
            for k, c in enumerate(self.constraint):
                check_constraint(f"replicas.constraint[{k}]", c)
        elif self.constraint is not None:
            check_constraint("replicas.constraint", self.constraint)
        check_hostlist("replicas.exclude", self.exclude)
        check_hostlist("replicas.nodelist", self.nodelist)
        if self.gres_flags is not None and self.gres_flags not in GRES_FLAGS:
            raise InputError("replicas.gres_flags", self.gres_flags, f"one of {sorted(GRES_FLAGS)}")

    def _check_topology(self) -> None:
        if self.topology is not None and self.topology not in TOPOLOGIES:
            raise InputError("replicas.topology", self.topology, f"one of {', '.join(TOPOLOGIES)}")
        if self.topology == "block" and self.switches is not None:
            raise InputError("replicas.switches", self.switches, "applies to topology = 'tree'")
        if self.segment is None:
            return
        if self.topology != "block":
            raise InputError("replicas.segment", self.segment, "needs replicas.topology = 'block'")
        check_positive("replicas.segment", self.segment)
        if self.nodes % self.segment:
            # sbatch(1): the node count must be a multiple of the segment size.
            raise InputError(
                "replicas.segment", self.segment, f"must divide replicas.nodes={self.nodes}"
            )

    @property
    def required_topology(self) -> str | None:
        """The topology plugin this spec needs: block, tree (asked for, or `switches`), or None."""
        if self.topology is None and self.switches is not None:
            return "tree"
        return self.topology

    @property
    def segment_option(self) -> int | None:
        """`--segment`, only when asked: topology/block already keeps a job that fits one base
        block inside one (24.11, 26.05), and a segment of the whole replica is refused by 24.11
        when the replica is larger than a block."""
        return self.segment if self.topology == "block" else None

    @property
    def tasks(self) -> int:
        """Ranks per replica (the trainer component)."""
        assert self.tasks_per_node is not None
        return self.nodes * self.tasks_per_node

    def constraint_for(self, replica: int) -> str | None:
        if isinstance(self.constraint, tuple):
            return self.constraint[replica]
        return self.constraint

    @property
    def gres(self) -> str | None:
        if not self.gpus_per_node:
            return None
        if self.gpu_type:
            return f"gpu:{self.gpu_type}:{self.gpus_per_node}"
        return f"gpu:{self.gpus_per_node}"

    @property
    def switches_option(self) -> str | None:
        if self.switches is None:
            return None
        return f"{self.switches}@{self.switches_wait}" if self.switches_wait else str(self.switches)


#: `[control].python` left unset: `fthsdp submit` puts the interpreter it runs on in its place.
DEFAULT_PYTHON = "python"


@dataclass(frozen=True)
class ControlSection:
    """`[control]`: the small CPU job that runs the quorum service and the coordinator."""

    partition: str | None = None
    cpus: int = 2
    mem: str | None = "4G"
    time: str | None = None
    lighthouse_port: int = 0
    coordinator_port: int = 0
    python: str = DEFAULT_PYTHON
    #: How the coordinator drains a node (`slurm.privileges`): `auto` decides at start whether
    #: the run's user may; `direct` drains; `request` asks root's Epilog through the job comment.
    drain: str = "auto"

    def __post_init__(self) -> None:
        check_setting(self.drain, "control.drain")
        check_name("control.partition", self.partition)
        check_positive("control.cpus", self.cpus)
        check_mem("control.mem", self.mem)
        check_time("control.time", self.time)
        check_port("control.lighthouse_port", self.lighthouse_port)
        check_port("control.coordinator_port", self.coordinator_port)
        if self.lighthouse_port and self.lighthouse_port == self.coordinator_port:
            raise InputError(
                "control.coordinator_port", self.coordinator_port, "differs from lighthouse_port"
            )
        if not SAFE_PATH.fullmatch(self.python):
            raise InputError("control.python", self.python, "an interpreter name or path")


#: `[train].mode`: the native API (`runtime.api.FTHSDP`) or a foreign torchft trainer whose
#: progress the replica supervisor reads (docs/runtime.md, "Bring your own trainer").
TRAIN_MODES = ("fthsdp", "torchft")
#: Seconds without progress after which a foreign trainer's step is taken as hung (torchft mode).
DEFAULT_PROGRESS_TIMEOUT_S = 600.0

#: Placeholders `[train].progress_file` may use; filled per replica group by the supervisor.
PROGRESS_FILE_FIELDS = ("dump_dir", "replica")


def _progress_regex(value: str) -> None:
    if any(c in value for c in "\0\r\n"):
        raise InputError("train.progress_regex", value, "one line (no CR, LF or NUL)")
    try:
        compiled = re.compile(value)
    except re.error as exc:
        raise InputError("train.progress_regex", value, f"a Python regex ({exc})") from None
    if "step" not in compiled.groupindex:
        raise InputError(
            "train.progress_regex", value, "a regex with a named group (?P<step>[0-9]+)"
        )


def _progress_file(value: str) -> None:
    import string

    try:
        names = [f for _, f, _, _ in string.Formatter().parse(value) if f is not None]
    except ValueError as exc:
        raise InputError("train.progress_file", value, f"a path ({exc})") from None
    allowed = ", ".join("{" + n + "}" for n in PROGRESS_FILE_FIELDS)
    for name in names:
        if name not in PROGRESS_FILE_FIELDS:
            raise InputError("train.progress_file", value, f"a path using only {allowed}")
    if not value.strip() or any(c in value for c in "\0\r\n"):
        raise InputError("train.progress_file", value, "a one-line path (no CR, LF or NUL)")


@dataclass(frozen=True)
class TrainSection:
    """`[train]`: the user's entry point and the fault-tolerance knobs the runtime reads."""

    command: str
    steps: int | None = None
    min_replicas: int = 1
    max_restarts_per_replica: int = 3
    restart_window_s: float = 3600
    heartbeat_timeout_s: float = contract.DEFAULT_HEARTBEAT_TIMEOUT_S
    allreduce_timeout_s: float = contract.DEFAULT_ALLREDUCE_TIMEOUT_S
    quorum_timeout_s: float = contract.DEFAULT_QUORUM_TIMEOUT_S
    join_timeout_s: float = contract.DEFAULT_JOIN_TIMEOUT_S
    #: How long a replica waits out an outage of the run's control plane (its node lost, the
    #: control job requeued and pending) with its model in memory; unset means
    #: `contract.DEFAULT_CONTROL_WAIT_S`, or the join timeout if longer.
    control_wait_s: float | None = None
    #: Durable checkpoints: every N steps, or every S seconds; with neither set the cadence is
    #: Young/Daly's for the measured write time against the run's expected whole-run loss rate
    #: (`checkpoint_every_s = 0` and no steps: off).
    checkpoint_every_steps: int = 0
    checkpoint_every_s: float | None = None
    #: The failure model behind that cadence: independent node failures (Llama 3 saw ~2.3 per
    #: 1000 nodes a day) and events that take out every replica at once (power, cooling).
    failures_per_1000_nodes_day: float = contract.DEFAULT_NODE_FAILURES_PER_1000_DAY
    run_losses_per_day: float = contract.DEFAULT_RUN_LOSSES_PER_DAY
    #: Straggler policy of the control job (`runtime.control.straggler`): a replica this many
    #: times slower than its peers' median compute, for `straggler_window_steps` steps or
    #: `straggler_window_s` seconds, is a straggler; it is evicted when the time it costs the run
    #: exceeds a requeue's cost (this run's measured one, else `straggler_requeue_cost_s`).
    straggler_factor: float = 1.5
    straggler_window_steps: int = 50
    straggler_window_s: float = 300
    straggler_requeue_cost_s: float = 120
    #: What an eviction does with the slow node: drain it (`fthsdp: straggler: ...`), only keep
    #: this replica's job off it (exclude), or nothing but a report (report).
    straggler_mode: str = "drain"
    #: "fthsdp" (the native API) or "torchft": `command` is a torchft trainer that knows nothing
    #: of fthsdp; the supervisor reads its step from `progress_regex` (over group rank 0's
    #: output, named group `step`) or `progress_file` (JSONL with a `step` field).
    mode: str = "fthsdp"
    progress_regex: str | None = None
    progress_file: str | None = None
    #: torchft mode: a step whose progress has not advanced for this long (from its launch or
    #: its last step) is hung; the supervisor stops it and relaunches it as a process fault.
    #: 0 turns the check off; unset means `DEFAULT_PROGRESS_TIMEOUT_S`.
    progress_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if not self.command.strip():
            raise InputError("train.command", self.command, "a non-empty shell command")
        if self.mode not in TRAIN_MODES:
            raise InputError("train.mode", self.mode, f"one of {', '.join(TRAIN_MODES)}")
        given = [k for k in ("progress_regex", "progress_file") if getattr(self, k) is not None]
        if self.mode == "torchft" and len(given) != 1:
            raise InputError(
                "train.progress_regex",
                self.progress_regex,
                "exactly one of train.progress_regex or train.progress_file in torchft mode",
            )
        if self.progress_timeout_s is not None:
            given.append("progress_timeout_s")
        if self.mode != "torchft" and given:
            raise InputError(
                f"train.{given[0]}", getattr(self, given[0]), 'only with mode = "torchft"'
            )
        if self.progress_regex is not None:
            _progress_regex(self.progress_regex)
        if self.progress_file is not None:
            _progress_file(self.progress_file)
        check_positive("train.steps", self.steps)
        check_positive("train.min_replicas", self.min_replicas)
        check_positive("train.max_restarts_per_replica", self.max_restarts_per_replica, minimum=0)
        for key in ("restart_window_s", "checkpoint_every_steps"):
            check_not_negative(f"train.{key}", getattr(self, key))
        if self.checkpoint_every_s is not None:
            check_not_negative("train.checkpoint_every_s", self.checkpoint_every_s)
        for key in ("failures_per_1000_nodes_day", "run_losses_per_day"):
            if not 0 <= getattr(self, key) < float("inf"):
                raise InputError(f"train.{key}", getattr(self, key), "a finite number >= 0")
        if not self.straggler_factor > 1:
            raise InputError("train.straggler_factor", self.straggler_factor, "must be > 1")
        check_positive("train.straggler_window_steps", self.straggler_window_steps)
        if not self.straggler_window_s > 0:
            raise InputError("train.straggler_window_s", self.straggler_window_s, "must be > 0")
        if self.straggler_mode not in STRAGGLER_MODES:
            raise InputError(
                "train.straggler_mode", self.straggler_mode, f"one of {', '.join(STRAGGLER_MODES)}"
            )
        cost = self.straggler_requeue_cost_s
        if not 0 <= cost < float("inf"):
            raise InputError("train.straggler_requeue_cost_s", cost, "must be >= 0 seconds")
        order = ("heartbeat_timeout_s", "allreduce_timeout_s", "quorum_timeout_s", "join_timeout_s")
        for key in order:
            if getattr(self, key) <= 0:
                raise InputError(f"train.{key}", getattr(self, key), "must be > 0 seconds")
        for lo, hi in itertools.pairwise(order):
            if not getattr(self, lo) < getattr(self, hi):
                raise InputError(
                    f"train.{hi}",
                    getattr(self, hi),
                    f"must exceed train.{lo}={getattr(self, lo)} "
                    "(required: heartbeat < allreduce < quorum < join)",
                )
        wait = self.control_wait_s
        if wait is not None and not self.join_timeout_s <= wait < float("inf"):
            raise InputError(
                "train.control_wait_s",
                wait,
                f"seconds >= train.join_timeout_s={self.join_timeout_s} "
                "(a restarted control plane takes that long to settle)",
            )
        hung = self.progress_timeout_s
        if hung is not None and not (hung == 0 or self.join_timeout_s < hung < float("inf")):
            raise InputError(
                "train.progress_timeout_s",
                hung,
                f"0 (off) or seconds above train.join_timeout_s={self.join_timeout_s} "
                "(a step may wait that long for its first quorum)",
            )

    @property
    def control_wait_in_effect_s(self) -> float:
        """The control-plane wait in effect (`control_wait_s`)."""
        if self.control_wait_s is None:
            return max(contract.DEFAULT_CONTROL_WAIT_S, self.join_timeout_s)
        return self.control_wait_s

    @property
    def checkpoint_every_s_in_effect(self) -> float | None:
        """The time cadence of durable checkpoints: None for Young/Daly's (`checkpoint_every_s`
        unset and no step cadence), 0 for none beyond the step cadence."""
        if self.checkpoint_every_s is None:
            return 0.0 if self.checkpoint_every_steps > 0 else None
        return float(self.checkpoint_every_s)

    @property
    def hung_after_s(self) -> float:
        """The progress timeout in effect: 0 when off (always off in native mode)."""
        if self.mode != "torchft":
            return 0.0
        if self.progress_timeout_s is None:
            return max(DEFAULT_PROGRESS_TIMEOUT_S, 2 * self.join_timeout_s)
        return self.progress_timeout_s


@dataclass(frozen=True)
class HealthSection:
    """`[health]`: which prolog checks this job requires (passed via --comment and env)."""

    checks: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for c in self.checks:
            if c not in CHECK_NAMES:
                close = difflib.get_close_matches(c, CHECK_NAMES, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise InputError("health.checks", c, f"allowed: {', '.join(CHECK_NAMES)}{hint}")
        if len(set(self.checks)) != len(self.checks):
            raise InputError("health.checks", list(self.checks), "each check at most once")

    @property
    def comment(self) -> str | None:
        """The job comment the prolog reads (`fthsdp-health:ecc,xid`); None when none asked."""
        return "fthsdp-health:" + ",".join(self.checks) if self.checks else None


@dataclass(frozen=True)
class SparesSection:
    """`[spares]`: nodes the run keeps allocated and idle, so a replica whose node fails moves
    onto them at once instead of waiting in the queue (docs/control-plane.md, "Hot spares")."""

    #: Spare nodes held; 0 = none (a node fault requeues the replica's job). A multiple of
    #: `replicas.nodes`: a replacement takes a whole replica's worth of nodes.
    nodes: int = 0
    #: Each slot runs the training command ahead of a fault: started, imported, its model built
    #: and its node checked, waiting for a replica's identity (docs/control-plane.md, "Warm
    #: spares").
    warm: bool = False

    def __post_init__(self) -> None:
        check_positive("spares.nodes", self.nodes, minimum=0)
        if self.warm and not self.nodes:
            raise InputError("spares.warm", True, "false when spares.nodes = 0 (no slot to warm)")


@dataclass(frozen=True)
class JobSpec:
    """A validated run: the six sections, plus where the spec came from."""

    job: JobSection
    replicas: ReplicasSection
    train: TrainSection
    control: ControlSection = field(default_factory=ControlSection)
    health: HealthSection = field(default_factory=HealthSection)
    spares: SparesSection = field(default_factory=SparesSection)
    source: str = ""

    def __post_init__(self) -> None:
        if self.train.min_replicas > self.replicas.count:
            raise InputError(
                "train.min_replicas",
                self.train.min_replicas,
                f"at most replicas.count={self.replicas.count}",
            )
        if self.spares.nodes % self.replicas.nodes:
            raise InputError(
                "spares.nodes",
                self.spares.nodes,
                f"a multiple of replicas.nodes={self.replicas.nodes} (a spare replaces a replica)",
            )
        if self.spares.nodes and isinstance(self.replicas.constraint, tuple):
            raise InputError(
                "spares.nodes",
                self.spares.nodes,
                "0 with a per-replica constraint list (a spare must fit every replica)",
            )
        if self.spares.warm and self.train.mode != "fthsdp":
            raise InputError(
                "spares.warm",
                True,
                f'false with train.mode = "{self.train.mode}" (only the fthsdp API can wait for a '
                "replica's identity)",
            )
        if self.spares.warm and self.replicas.helper is not None:
            raise InputError(
                "spares.warm", True, "false with a [replicas.helper] component (not kept warm)"
            )

    @property
    def run_dir(self) -> Path:
        return self.job.run_path

    def replica_name(self, replica: int) -> str:
        return f"{self.job.name}-r{replica:0{self.replica_digits}d}"

    @property
    def control_name(self) -> str:
        return f"{self.job.name}-control"

    @property
    def replica_digits(self) -> int:
        return max(2, len(str(self.replicas.count - 1)))

    def replica_script(self, replica: int) -> str:
        return f"replica-{replica:0{self.replica_digits}d}.sbatch"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (written to run_dir/spec.json at submit)."""
        data: dict[str, Any] = _plain(self)
        return data


def _plain(value: Any) -> Any:
    """Dataclasses, mappings and tuples as JSON-able dicts and lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


#: The TOML tables of a spec and the section each one is read into.
SECTIONS: dict[str, type] = {
    "job": JobSection,
    "replicas": ReplicasSection,
    "control": ControlSection,
    "train": TrainSection,
    "health": HealthSection,
    "spares": SparesSection,
}
#: Tables inside a section: (section class, field) -> the class that table is read into.
NESTED: dict[tuple[type, str], type] = {(ReplicasSection, "helper"): HelperSection}
