"""The job spec: one TOML file that describes an FT-HSDP run, read into frozen dataclasses.

A user writes the run once (`[job]`, `[replicas]`, `[replicas.helper]`, `[control]`, `[train]`,
`[health]`) and everything downstream (rendering, submission, the control plane, the replica
runtime) reads the same validated `JobSpec`. Validation happens here, once, so that nothing that
reaches a `#SBATCH` line or a shell line can be malformed or hostile: names are limited to a safe
charset, Slurm time and memory formats are checked, and every unknown key is an error with a
did-you-mean (the whitelist idea from submitit, applied to a whole spec). Every pattern is
applied with `fullmatch`: `$` alone would let a trailing newline through, and a newline in a
value ends sbatch's reading of `#SBATCH` lines.

The schema is the dataclasses themselves: each section's fields (with their type hints and
defaults) are the only keys accepted, and `--set key=value` overrides are typed by the field they
target. Cross-field rules (constraint list length, `switches_wait` needs `switches`, the timeout
ordering heartbeat < allreduce < quorum < join) live in `__post_init__`.

Bad input raises `slurm.errors.InputError(field, value, allowed)`, which the CLI prints as one line
with exit code 2.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import os
import re
import tomllib
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

from slurm import hostlist
from slurm.errors import InputError

#: Job names, partitions, accounts, QoS, reservations: what Slurm and a shell both take unquoted.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
#: Run directories: absolute or relative paths without whitespace, quotes or shell syntax.
SAFE_PATH = re.compile(r"[A-Za-z0-9_./+-][A-Za-z0-9_./+@=-]*")
ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Slurm's time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (plus UNLIMITED / INFINITE).
SLURM_TIME = re.compile(
    r"(?:\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d{1,2}|\d+-\d{1,2}:\d{1,2}"
    r"|\d+-\d{1,2}:\d{1,2}:\d{1,2}|UNLIMITED|INFINITE)"
)
SLURM_MEM = re.compile(r"\d+[KMGT]?")
#: Feature expressions: names joined by & | , with optional [] grouping and *count.
CONSTRAINT = re.compile(r"[A-Za-z0-9_.&|,\[\]*:-]+")
HOSTLIST = re.compile(r"[A-Za-z0-9_.,\[\]-]+")
EMAIL = re.compile(r"[A-Za-z0-9_.+-]+@[A-Za-z0-9.-]+")
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
#: Health check names (the prolog in prolog_epilog/ owns the list and rejects unknown ones).
RESERVED_ENV_PREFIXES = ("FTHSDP_", "SLURM_")
#: FTHSDP_ inputs a spec may set in `[job].env`: where a rank's watchdog and slow-fault reader
#: find their node's inputs (a site's health config, or a dev cluster's simulated hardware).
USER_FTHSDP_ENV = (
    "FTHSDP_HEALTH_CONFIG",
    "FTHSDP_SLOW_FILE",
    "FTHSDP_GPU_SOURCE",
    "FTHSDP_SYSFS_ROOT",
    "FTHSDP_KERNEL_LOG",
    "FTHSDP_WATCHDOG_INTERVAL_S",
)
MAX_REPLICAS = 100_000


# ---------------------------------------------------------------------------------------------
# field checks (pure; each raises InputError naming the dotted field)


def _name(where: str, value: str | None, optional: bool = True) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not SAFE_NAME.fullmatch(value):
        raise InputError(where, value, "allowed: 1-64 characters of A-Z a-z 0-9 _ . - (no spaces)")


def _time(where: str, value: str | None) -> None:
    if value is not None and not SLURM_TIME.fullmatch(value):
        raise InputError(
            where,
            value,
            "a Slurm time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED",
        )


def _mem(where: str, value: str | None) -> None:
    if value is not None and not SLURM_MEM.fullmatch(value):
        raise InputError(where, value, "a Slurm memory size: digits with optional K/M/G/T")


def _positive(where: str, value: int | None, minimum: int = 1) -> None:
    if value is not None and value < minimum:
        raise InputError(where, value, f"must be an integer >= {minimum}")


def _hostlist(where: str, value: str | None) -> None:
    if value is None:
        return
    if not HOSTLIST.fullmatch(value):
        raise InputError(where, value, "a Slurm hostlist such as node[1-4],gpu7")
    hostlist.expand(value, where)


def _constraint(where: str, value: str) -> None:
    if not CONSTRAINT.fullmatch(value):
        raise InputError(
            where, value, "a Slurm feature expression of A-Z a-z 0-9 _ . - joined by & | ,"
        )


def _not_negative(where: str, value: float) -> None:
    if value < 0:
        raise InputError(where, value, "must be >= 0")


def _port(where: str, value: int) -> None:
    if not (value == 0 or 1024 <= value <= 65535):
        raise InputError(where, value, "a port in 1024..65535, or 0 to pick a free one")


# ---------------------------------------------------------------------------------------------
# sections


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
            _name(f"job.{key}", getattr(self, key))
        _time("job.time", self.time)
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
        _positive("replicas.helper.nodes", self.nodes)
        _positive("replicas.helper.tasks_per_node", self.tasks_per_node)
        _positive("replicas.helper.cpus_per_task", self.cpus_per_task)
        _name("replicas.helper.partition", self.partition)
        _mem("replicas.helper.mem", self.mem)


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
        _positive("replicas.count", self.count)
        if self.count > MAX_REPLICAS:
            raise InputError("replicas.count", self.count, f"at most {MAX_REPLICAS}")
        _positive("replicas.nodes", self.nodes)
        _positive("replicas.gpus_per_node", self.gpus_per_node, minimum=0)
        if self.gpu_type is not None:
            _name("replicas.gpu_type", self.gpu_type)
            if self.gpus_per_node == 0:
                raise InputError("replicas.gpu_type", self.gpu_type, "needs gpus_per_node >= 1")
        if self.tasks_per_node is None:
            object.__setattr__(self, "tasks_per_node", self.gpus_per_node or 1)
        _positive("replicas.tasks_per_node", self.tasks_per_node)
        _positive("replicas.cpus_per_task", self.cpus_per_task)
        _mem("replicas.mem", self.mem)
        _name("replicas.partition", self.partition)
        _name("replicas.reservation", self.reservation)
        _positive("replicas.switches", self.switches)
        if self.switches_wait is not None:
            if self.switches is None:
                raise InputError(
                    "replicas.switches_wait", self.switches_wait, "needs replicas.switches set"
                )
            _time("replicas.switches_wait", self.switches_wait)
        self._check_topology()
        if isinstance(self.constraint, tuple):
            if len(self.constraint) != self.count:
                raise InputError(
                    "replicas.constraint",
                    list(self.constraint),
                    f"one string, or a list of exactly replicas.count={self.count} strings",
                )
            for k, c in enumerate(self.constraint):
                _constraint(f"replicas.constraint[{k}]", c)
        elif self.constraint is not None:
            _constraint("replicas.constraint", self.constraint)
        _hostlist("replicas.exclude", self.exclude)
        _hostlist("replicas.nodelist", self.nodelist)
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
        _positive("replicas.segment", self.segment)
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


@dataclass(frozen=True)
class ControlSection:
    """`[control]`: the small CPU job that runs the quorum service and the coordinator."""

    partition: str | None = None
    cpus: int = 2
    mem: str | None = "4G"
    time: str | None = None
    lighthouse_port: int = 0
    coordinator_port: int = 0
    python: str = "python"

    def __post_init__(self) -> None:
        _name("control.partition", self.partition)
        _positive("control.cpus", self.cpus)
        _mem("control.mem", self.mem)
        _time("control.time", self.time)
        _port("control.lighthouse_port", self.lighthouse_port)
        _port("control.coordinator_port", self.coordinator_port)
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
    heartbeat_timeout_s: float = 2
    allreduce_timeout_s: float = 5
    quorum_timeout_s: float = 10
    join_timeout_s: float = 60
    checkpoint_every_steps: int = 0
    checkpoint_every_s: float = 0
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
        _positive("train.steps", self.steps)
        _positive("train.min_replicas", self.min_replicas)
        _positive("train.max_restarts_per_replica", self.max_restarts_per_replica, minimum=0)
        for key in ("restart_window_s", "checkpoint_every_s", "checkpoint_every_steps"):
            _not_negative(f"train.{key}", getattr(self, key))
        if not self.straggler_factor > 1:
            raise InputError("train.straggler_factor", self.straggler_factor, "must be > 1")
        _positive("train.straggler_window_steps", self.straggler_window_steps)
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
        hung = self.progress_timeout_s
        if hung is not None and not (hung == 0 or self.join_timeout_s < hung < float("inf")):
            raise InputError(
                "train.progress_timeout_s",
                hung,
                f"0 (off) or seconds above train.join_timeout_s={self.join_timeout_s} "
                "(a step may wait that long for its first quorum)",
            )

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
        from prolog_epilog.config import CHECK_NAMES

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

    def __post_init__(self) -> None:
        _positive("spares.nodes", self.nodes, minimum=0)


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


# ---------------------------------------------------------------------------------------------
# generic, schema-driven parsing

_SECTIONS: dict[str, type] = {
    "job": JobSection,
    "replicas": ReplicasSection,
    "control": ControlSection,
    "train": TrainSection,
    "health": HealthSection,
    "spares": SparesSection,
}
_NESTED: dict[tuple[type, str], type] = {(ReplicasSection, "helper"): HelperSection}


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "none"
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp) if a is not type(None))
    if origin is tuple:
        return f"list of {_type_name(get_args(tp)[0])}"
    if origin is Mapping:
        return "table of strings"
    names = {int: "integer", float: "number", str: "string", bool: "true/false"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def _coerce(where: str, value: Any, tp: Any) -> Any:
    """Check `value` (from TOML) against the field type `tp`; return it in the field's form."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        errors = []
        for alt in get_args(tp):
            if alt is type(None):
                continue
            try:
                return _coerce(where, value, alt)
            except InputError as exc:
                errors.append(exc)
        raise InputError(where, value, f"expected {_type_name(tp)}")
    if origin is tuple:
        if isinstance(value, str) and where.endswith("setup"):
            value = [value]
        if not isinstance(value, list):
            raise InputError(where, value, f"expected {_type_name(tp)}")
        inner = get_args(tp)[0]
        return tuple(_coerce(f"{where}[{k}]", v, inner) for k, v in enumerate(value))
    if origin is Mapping:
        if not isinstance(value, dict):
            raise InputError(where, value, "expected a table of string values")
        out = {}
        for k, v in value.items():
            if isinstance(v, bool) or not isinstance(v, str | int | float):
                raise InputError(f"{where}.{k}", v, "expected a string (or number)")
            out[k] = str(v)
        return out
    if tp is bool:
        if not isinstance(value, bool):
            raise InputError(where, value, "expected true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(where, value, "expected an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InputError(where, value, "expected a number")
        return float(value)
    if tp is str:
        if (
            isinstance(value, int)
            and not isinstance(value, bool)
            and where.endswith(("time", "_wait"))
        ):
            return str(value)  # `time = 30` means 30 minutes, as in sbatch
        if not isinstance(value, str):
            raise InputError(where, value, "expected a string")
        return value
    raise TypeError(f"unsupported field type {tp!r}")  # pragma: no cover - schema bug


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    close = close or sorted(c for c in choices if c.startswith(word) or word.startswith(c))[:1]
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"allowed keys: {', '.join(sorted(choices))}{hint}"


def _build(cls: type, where: str, table: Any) -> Any:
    if not isinstance(table, dict):
        raise InputError(where, table, "expected a table")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "source"}
    for key in table:
        if key not in fields:
            raise InputError(
                f"{where}.{key}" if where else key, key, _did_you_mean(key, list(fields))
            )
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        dotted = f"{where}.{name}" if where else name
        if name not in table:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise InputError(dotted, None, "required")
            continue
        nested = _NESTED.get((cls, name)) or (_SECTIONS.get(name) if cls is JobSpec else None)
        if nested is not None:
            kwargs[name] = _build(nested, dotted, table[name])
        else:
            kwargs[name] = _coerce(dotted, table[name], hints[name])
    return cls(**kwargs)


def parse_spec(data: Mapping[str, Any], source: str = "") -> JobSpec:
    """Validate a spec given as plain data (what tomllib returns)."""
    spec: JobSpec = _build(JobSpec, "", dict(data))
    return dataclasses.replace(spec, source=source) if source else spec


# ---------------------------------------------------------------------------------------------
# overrides


def _field_type(path: list[str]) -> Any:
    """The type hint of the field a dotted override path targets (None = a free-form table)."""
    cls: type = JobSpec
    for k, key in enumerate(path):
        if cls is JobSpec:
            if key not in _SECTIONS:
                raise InputError("--set", ".".join(path), _did_you_mean(key, list(_SECTIONS)))
            cls = _SECTIONS[key]
            continue
        hints = get_type_hints(cls)
        if key not in hints:
            raise InputError("--set", ".".join(path), _did_you_mean(key, list(hints)))
        nested = _NESTED.get((cls, key))
        if nested is not None:
            cls = nested
            continue
        if get_origin(hints[key]) is Mapping:
            if k + 2 != len(path):
                raise InputError("--set", ".".join(path), f"{'.'.join(path[: k + 1])}.NAME=VALUE")
            return str
        if k + 1 != len(path):
            raise InputError("--set", ".".join(path), f"{'.'.join(path[: k + 1])} is not a table")
        return hints[key]
    raise InputError("--set", ".".join(path), "a field, not a section")


def _parse_literal(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply `section.key=value` overrides to raw spec data, typed by the target field.

    A string field takes the text as is; any other field parses it as a TOML value
    (`4`, `2.5`, `true`, `["a", "b"]`), so validation reports a wrong type against the field.
    """
    out: dict[str, Any] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    for item in overrides:
        key, sep, text = item.partition("=")
        path = key.strip().split(".")
        if not sep or not all(path):
            raise InputError("--set", item, "KEY=VALUE, e.g. replicas.count=4")
        tp = _field_type(path)
        accepts_str = tp is str or (
            get_origin(tp) in (Union, types.UnionType) and str in get_args(tp)
        )
        value: Any = _parse_literal(text)
        if accepts_str and not isinstance(value, list):
            value = text
        node = out
        for part in path[:-1]:
            child = node.get(part)
            child = dict(child) if isinstance(child, dict) else {}
            node[part] = child
            node = child
        node[path[-1]] = value
    return out


def load_spec(path: str | Path, overrides: Sequence[str] = ()) -> JobSpec:
    """Read, override and validate a spec file. Raises InputError on any bad input."""
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise InputError("SPEC", str(p), "an existing TOML file") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError("SPEC", str(p), f"valid TOML ({exc})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError("SPEC", str(p), f"a readable UTF-8 file ({exc})") from None
    data = apply_overrides(raw, overrides)
    job = data.get("job")
    if isinstance(job, dict) and isinstance(job.get("run_dir"), str) and job["run_dir"]:
        # Slurm jobs and later commands run from other directories: pin the path now.
        job["run_dir"] = os.path.abspath(job["run_dir"])
    return parse_spec(data, source=str(p))
