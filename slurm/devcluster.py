"""A real Slurm cluster on one host, for tests and the demo.

fthsdp is tested against Slurm itself, not a mock: one `munged`, one `slurmctld` and one `slurmd`
per simulated node, all on loopback ports, all as root (docs/design-facts.md, Slurm fact 8). Each
node gets placeholder GPU device files so GRES scheduling is real, and nodes are grouped under leaf
switches in `topology.conf` so `--switches` placement is real too.

The cluster is self-contained in one directory: its own munge key and socket, its own config,
state, logs and pid files. `up` refuses to start over live daemons, and stops everything it
started if any step fails; `down` cancels the cluster's jobs (so no training processes outlive
it), stops this cluster's daemons and deletes nothing.

Daemons are found by their pid files *and* by their command line (`-f <this slurm.conf>`,
`--socket=<this munge socket>`): from Slurm 23.11 on, `scontrol reconfigure` restarts slurmctld
and every slurmd under new pids, so a pid read before a reconfigure may name a process that is
gone (or, later, someone else's). `reconfigure` waits until the restarted daemons are back.

Slurmd runs the cluster's Prolog and HealthCheckProgram as root, so the directory must be root's
alone: the default is under /var/lib (not a world-writable temp folder a local user could create
first), and a directory not owned by root, or writable by group or others, is refused.

The configuration is written by pure functions (`slurm_conf`, `gres_conf`, `topology_conf`) so it
can be read and tested without starting anything.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from slurm import hostlist
from slurm.errors import EnvironmentProblem, InputError

REQUIRED_BINARIES = ("munged", "slurmctld", "slurmd", "sinfo", "scontrol", "sbatch", "squeue")
CONFIG_FILE = "cluster.json"
DEFAULT_DIR = Path(os.environ.get("FTHSDP_CLUSTER_DIR", "/var/lib/fthsdp/devcluster"))
#: Slurm releases from this one on restart their daemons on `scontrol reconfigure`.
RESTARTS_ON_RECONFIGURE = (23, 11)
#: How long a reconfigure may take to bring the restarted daemons back (a loaded test machine).
RECONFIGURE_TIMEOUT_S = 90


@dataclass(frozen=True)
class DevClusterConfig:
    """Everything that decides what the dev cluster looks like; saved as `cluster.json`."""

    directory: Path = DEFAULT_DIR
    nodes: int = 4
    gpus_per_node: int = 8
    switch_size: int = 2
    #: "tree": leaf switches of `switch_size` nodes; "block" (Slurm 24.05+): blocks of that size.
    topology: str = "tree"
    gpu_type: str = "h100"
    cpus_per_node: int = 16
    memory_mb: int = 64000
    ctld_port: int = 16817
    slurmd_base_port: int = 17001
    partition: str = "gpu"
    prolog: str | None = None
    epilog: str | None = None
    prolog_flags: str = "Alloc"
    nohold_on_prolog_fail: bool = True
    health_check_program: str | None = None
    health_check_interval: int = 0
    prolog_epilog_timeout: int = 60
    task_prolog: str | None = None
    #: Simulated hardware + health gating (`with_health`): node inputs under `hardware/`.
    health: bool = False
    extra_env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("nodes", "gpus_per_node", "switch_size", "cpus_per_node", "memory_mb"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InputError(name, value, "must be a positive integer")
        if self.topology not in ("tree", "block"):
            raise InputError("topology", self.topology, "one of tree, block")
        if self.nodes > 64:
            raise InputError("nodes", self.nodes, "the dev cluster allows 1..64 nodes")
        for name in ("ctld_port", "slurmd_base_port"):
            port = getattr(self, name)
            if not 1024 <= port <= 65000:
                raise InputError(name, port, "must be a port in 1024..65000")

    @property
    def node_names(self) -> list[str]:
        return [f"node{i}" for i in range(1, self.nodes + 1)]

    @property
    def switches(self) -> dict[str, list[str]]:
        """Leaf switch name -> nodes under it, `switch_size` consecutive nodes per switch."""
        names = self.node_names
        return {
            f"s{k // self.switch_size + 1}": names[k : k + self.switch_size]
            for k in range(0, len(names), self.switch_size)
        }

    @property
    def ports(self) -> list[int]:
        return [self.ctld_port, *range(self.slurmd_base_port, self.slurmd_base_port + self.nodes)]

    @property
    def conf_path(self) -> Path:
        return self.directory / "etc" / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.directory / "munge" / "munge.socket"

    def env(self) -> dict[str, str]:
        """Environment that points Slurm's commands at this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf_path)}

    def to_json(self) -> str:
        data = asdict(self)
        data["directory"] = str(self.directory)
        data["extra_env"] = dict(self.extra_env)
        return json.dumps(data, indent=2, sort_keys=True)

    @classmethod
    def load(cls, directory: Path) -> DevClusterConfig:
        # Its pid files decide what root kills: read them only from a folder root alone controls.
        check_directory(directory)
        path = directory / CONFIG_FILE
        if not path.exists():
            raise InputError(
                "--dir", str(directory), f"holds no dev cluster ({CONFIG_FILE} missing)"
            )
        data = json.loads(path.read_text())
        data["directory"] = Path(data["directory"])
        return cls(**data)


def directory_problem(uid: int, mode: int, holds_cluster: bool) -> str | None:
    """Why a folder with this owner and mode cannot hold (or sit above) a root-run cluster.

    None means it can. A folder above the cluster's may be writable by others only with the
    sticky bit (like /tmp): then nobody but root can rename or replace what root made in it.
    """
    if uid != 0:
        return f"is owned by uid {uid}, not root"
    if mode & 0o022 and (holds_cluster or not mode & stat.S_ISVTX):
        return f"is writable by group or others (mode {stat.S_IMODE(mode):04o})"
    return None


def check_directory(directory: Path) -> None:
    """Refuse a cluster folder that someone other than root controls, or could swap."""
    directory = directory.absolute()
    for path in [directory, *directory.parents]:
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        problem = directory_problem(st.st_uid, st.st_mode, holds_cluster=path == directory)
        if problem:
            raise InputError(
                "--dir",
                str(directory),
                f"{path} {problem}; the dev cluster runs its files as root, so use a folder "
                "owned by root with mode 0700",
            )


def make_directory(directory: Path) -> None:
    """Create the cluster folder root-only (0700) if missing, then check it and its parents."""
    if not directory.exists():
        directory.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=0o700)
    check_directory(directory)


def _hl(names: list[str]) -> str:
    return hostlist.compress(names)


def slurm_conf(cfg: DevClusterConfig) -> str:
    """slurm.conf for the dev cluster; settings chosen so failures and requeues are fast."""
    d = cfg.directory
    host = socket.gethostname().split(".")[0]
    sched = ["bf_interval=1", "bf_continue"]
    if cfg.nohold_on_prolog_fail:
        sched.append("nohold_on_prolog_fail")
    lines = [
        "# Written by fthsdp cluster up; regenerated on every start.",
        "ClusterName=fthsdp-dev",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={cfg.ctld_port}",
        f"SlurmdPort={cfg.slurmd_base_port}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={cfg.munge_socket}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={d / 'state'}",
        f"SlurmdSpoolDir={d / 'spool' / '%n'}",
        f"SlurmctldPidFile={d / 'run' / 'slurmctld.pid'}",
        f"SlurmdPidFile={d / 'run' / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={d / 'log' / 'slurmd-%n.log'}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        # TaskPlugin, MpiDefault, SwitchType, AccountingStorageType, JobAcctGatherType and
        # JobCompType stay unset: their 22.05 defaults are the "none" plugins, which 23.x dropped
        # (24.11 and 26.05 document them as "unset by default" and ship no */none plugins).
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "ProctrackType=proctrack/linuxproc",
        f"TopologyPlugin=topology/{cfg.topology}",
        "GresTypes=gpu",
        "SlurmdParameters=config_overrides",
        "JobRequeue=1",
        "ReturnToService=2",
        "SlurmdTimeout=10",
        "SlurmctldTimeout=10",
        "MessageTimeout=10",
        "InactiveLimit=0",
        "KillWait=2",
        "MinJobAge=600",
        "SchedulerType=sched/backfill",
        f"SchedulerParameters={','.join(sched)}",
        f"PrologEpilogTimeout={cfg.prolog_epilog_timeout}",
    ]
    if cfg.prolog:
        lines += [f"Prolog={cfg.prolog}", f"PrologFlags={cfg.prolog_flags}"]
    if cfg.epilog:
        lines.append(f"Epilog={cfg.epilog}")
    if cfg.task_prolog:
        lines.append(f"TaskProlog={cfg.task_prolog}")
    if cfg.health_check_program:
        lines += [
            f"HealthCheckProgram={cfg.health_check_program}",
            f"HealthCheckInterval={cfg.health_check_interval or 30}",
            "HealthCheckNodeState=ANY",
        ]
    for k, name in enumerate(cfg.node_names):
        lines.append(
            f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 "
            f"Port={cfg.slurmd_base_port + k} CPUs={cfg.cpus_per_node} "
            f"RealMemory={cfg.memory_mb} Gres=gpu:{cfg.gpu_type}:{cfg.gpus_per_node} State=UNKNOWN"
        )
    lines.append(
        f"PartitionName={cfg.partition} Nodes={_hl(cfg.node_names)} Default=YES "
        "MaxTime=INFINITE State=UP OverSubscribe=NO"
    )
    return "\n".join(lines) + "\n"


def gres_conf(cfg: DevClusterConfig) -> str:
    """gres.conf pointing each node's GPUs at placeholder files (no GPU hardware here)."""
    last = cfg.gpus_per_node - 1
    dev = cfg.directory / "dev"
    return (
        f"NodeName={_hl(cfg.node_names)} Name=gpu Type={cfg.gpu_type} File={dev}/nvidia[0-{last}]\n"
        if last > 0
        else f"NodeName={_hl(cfg.node_names)} Name=gpu Type={cfg.gpu_type} File={dev}/nvidia0\n"
    )


def topology_conf(cfg: DevClusterConfig) -> str:
    """topology.conf: nodes under leaf switches of `switch_size`, leaves under one spine."""
    leaves = cfg.switches
    if cfg.topology == "block":
        blocks = [f"BlockName=b{name[1:]} Nodes={_hl(nodes)}" for name, nodes in leaves.items()]
        # Base blocks of switch_size, paired into higher levels (2x, 4x, ...) as Slurm does.
        sizes = [cfg.switch_size * 2**k for k in range(len(blocks).bit_length())]
        return "\n".join([*blocks, f"BlockSizes={','.join(map(str, sizes))}"]) + "\n"
    lines = [f"SwitchName={name} Nodes={_hl(nodes)}" for name, nodes in leaves.items()]
    lines.append(f"SwitchName=spine Switches={_hl(list(leaves))}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Process management


def _pid_files(cfg: DevClusterConfig) -> dict[str, Path]:
    run = cfg.directory / "run"
    files = {"munged": cfg.directory / "munge" / "munged.pid", "slurmctld": run / "slurmctld.pid"}
    files.update({f"slurmd {n}": run / f"slurmd-{n}.pid" for n in cfg.node_names})
    return files


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not a running daemon.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def _option(argv: Sequence[str], flag: str) -> str | None:
    """The value after `flag` in argv (`-f X`), or None."""
    for k, arg in enumerate(argv[:-1]):
        if arg == flag:
            return argv[k + 1]
    return None


def daemon_name(argv: Sequence[str], cfg: DevClusterConfig) -> str | None:
    """Which of this cluster's daemons a process with this command line is (None = not one).

    `up` starts every daemon with this cluster's own config (`-f`) or munge socket, and a
    restart by `scontrol reconfigure` keeps the command line.
    """
    if not argv:
        return None
    program = os.path.basename(argv[0])
    if program == "munged":
        return "munged" if f"--socket={cfg.munge_socket}" in argv else None
    if program not in ("slurmctld", "slurmd") or _option(argv, "-f") != str(cfg.conf_path):
        return None
    if program == "slurmctld":
        return "slurmctld"
    node = _option(argv, "-N")
    return f"slurmd {node}" if node else None


def cluster_processes(cfg: DevClusterConfig) -> dict[int, str]:
    """Every live process that is one of this cluster's daemons: pid -> daemon name."""
    out = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = [
                a.decode(errors="replace") for a in (proc / "cmdline").read_bytes().split(b"\0")
            ]
        except OSError:
            continue
        name = daemon_name([a for a in argv if a], cfg)
        if name and _alive(int(proc.name)):
            out[int(proc.name)] = name
    return out


def live_daemons(cfg: DevClusterConfig) -> dict[str, int]:
    """This cluster's running daemons, name -> pid, found by command line (see `daemon_name`).

    A pid file only breaks a tie while a restarted daemon and its predecessor both live; a pid
    file naming a process that is not this cluster's daemon (gone, or the pid reused) is ignored.
    """
    out: dict[str, int] = {}
    recorded = {name: _read_pid(path) for name, path in _pid_files(cfg).items()}
    for pid, name in sorted(cluster_processes(cfg).items()):
        if name not in out or recorded.get(name) == pid:
            out[name] = pid
    ordered = {n: out[n] for n in recorded if n in out}
    return {**ordered, **out}


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def free_port_block(count: int, start: int = 20000, stop: int = 60000) -> int:
    """First port p >= start such that p..p+count-1 are all free on loopback (for tests)."""
    p = start
    while p + count < stop:
        if not any(_port_in_use(q) for q in range(p, p + count)):
            return p
        p += count
    raise EnvironmentProblem(f"no block of {count} free loopback ports in {start}..{stop}")


def missing_prerequisites() -> list[str]:
    """What stops the dev cluster from starting here, each as a short phrase (empty = ready)."""
    problems = []
    if os.geteuid() != 0:
        problems.append("must run as root (slurmd needs it)")
    missing = [b for b in REQUIRED_BINARIES if shutil.which(b) is None and not _sbin(b)]
    if missing:
        problems.append(
            f"missing {', '.join(missing)} (install with: apt-get install -y slurm-wlm munge)"
        )
    return problems


def _sbin(binary: str) -> str | None:
    for d in ("/usr/sbin", "/sbin", "/usr/local/sbin"):
        p = Path(d) / binary
        if p.exists():
            return str(p)
    return None


def _binary(name: str) -> str:
    found = shutil.which(name) or _sbin(name)
    if not found:
        raise EnvironmentProblem(
            f"{name} not found (install with: apt-get install -y slurm-wlm munge)"
        )
    return found


def preflight(cfg: DevClusterConfig) -> None:
    """Raise EnvironmentProblem with a one-line reason if `up` cannot start cleanly."""
    problems = missing_prerequisites()
    if problems:
        raise EnvironmentProblem("; ".join(problems))
    make_directory(cfg.directory)
    live = live_daemons(cfg)
    if live:
        names = ", ".join(f"{n} (pid {p})" for n, p in live.items())
        raise EnvironmentProblem(
            f"{cfg.directory} already runs a cluster: {names}; run 'fthsdp cluster down' first"
        )
    busy = [p for p in cfg.ports if _port_in_use(p)]
    if busy:
        raise EnvironmentProblem(
            f"port(s) {', '.join(map(str, busy))} in use; choose others with --port/--slurmd-port"
        )


def write_files(cfg: DevClusterConfig, fresh_hardware: bool = False) -> None:
    """Write configs, the munge key, placeholder GPU files and the directories daemons need
    (and, with `cfg.health`, the simulated hardware and health wrappers: `write_health_files`)."""
    d = cfg.directory
    for sub in ("etc", "state", "run", "log", "dev", "spool", "munge", "munge-key"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    for n in cfg.node_names:
        (d / "spool" / n).mkdir(exist_ok=True)
    # munged wants its socket dir world-searchable and its key private to its owner.
    os.chmod(d / "munge", 0o755)
    os.chmod(d / "munge-key", 0o700)
    key = d / "munge-key" / "munge.key"
    if not key.exists():
        key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    for i in range(cfg.gpus_per_node):
        (d / "dev" / f"nvidia{i}").touch()
    (d / "etc" / "slurm.conf").write_text(slurm_conf(cfg))
    (d / "etc" / "gres.conf").write_text(gres_conf(cfg))
    (d / "etc" / "topology.conf").write_text(topology_conf(cfg))
    if cfg.health:
        write_health_files(cfg, fresh=fresh_hardware)
    (d / CONFIG_FILE).write_text(cfg.to_json())


# ---------------------------------------------------------------------------------------------
# Simulated hardware and health gating

HARDWARE_DIR = "hardware"
HEALTH_CONFIG = "health.toml"
WRAPPER_DIR = "bin"
HEALTHCHECK_INTERVAL_S = 30
REPO = Path(__file__).resolve().parent.parent


def hardware_dir(cfg: DevClusterConfig) -> Path:
    """Where each node's simulated hardware lives: `DIR/hardware/<node>/...`."""
    return cfg.directory / HARDWARE_DIR


def health_config_path(cfg: DevClusterConfig) -> Path:
    return hardware_dir(cfg) / HEALTH_CONFIG


def job_health_env(cfg: DevClusterConfig) -> dict[str, str]:
    """What a job's ranks need to read their node's simulated hardware (watchdog, slow fault).

    The cluster's TaskProlog exports these into every task that does not set them itself, so a
    spec needs no dev-cluster paths; a spec may still set them in `[job].env`.
    """
    hw = hardware_dir(cfg)
    return {
        "FTHSDP_HEALTH_CONFIG": str(health_config_path(cfg)),
        "FTHSDP_SLOW_FILE": f"{hw}/{{node}}/slow",
    }


def entrypoint_wrapper(path: Path, mode: str, config: Path, conf: Path) -> str:
    """A shell script slurmd can run as Prolog/Epilog/HealthCheckProgram: it runs this checkout's
    `prolog_epilog.entrypoints MODE --config CONFIG` with absolute paths (slurmd runs it as root
    in its own, nearly empty environment). Returns the script's path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "#!/bin/sh\n"
        f"export SLURM_CONF={shlex.quote(str(conf))}\n"
        f"export PYTHONPATH={shlex.quote(str(REPO))}\n"
        "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
        f"exec {shlex.quote(sys.executable)} -m prolog_epilog.entrypoints {mode} "
        f"--config {shlex.quote(str(config))}\n"
    )
    path.chmod(0o755)
    return str(path)


def task_prolog_script(path: Path, env: Mapping[str, str]) -> str:
    """A TaskProlog that exports `env` into each task (slurmd reads `export K=V` lines from its
    output), leaving alone any variable the job already set."""
    lines = ["#!/bin/sh", "# Written by fthsdp cluster up --health: dev-cluster inputs for tasks."]
    for key, value in env.items():
        lines.append(f'[ -n "${{{key}:-}}" ] || echo {shlex.quote(f"export {key}={value}")}')
    path.parent.mkdir(parents=True, exist_ok=True)
    # slurmd runs the TaskProlog as the job's user, any user's: its folder must let them in
    # whatever umask created it.
    path.parent.chmod(0o755)
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o755)
    return str(path)


def health_settings(
    cfg: DevClusterConfig, interval: int = HEALTHCHECK_INTERVAL_S
) -> dict[str, object]:
    """The settings that turn on simulated hardware and the project's Prolog (PrologFlags=Alloc),
    Epilog, HealthCheckProgram and TaskProlog (files are written by `write_files`); for
    `reconfigure(cfg, **health_settings(cfg))` on a running cluster."""
    bin_dir = cfg.directory / WRAPPER_DIR
    return {
        "health": True,
        "prolog": str(bin_dir / "fthsdp-prolog"),
        "epilog": str(bin_dir / "fthsdp-epilog"),
        "health_check_program": str(bin_dir / "fthsdp-healthcheck"),
        "health_check_interval": cfg.health_check_interval or interval,
        "task_prolog": str(bin_dir / "fthsdp-task-prolog"),
    }


def with_health(cfg: DevClusterConfig, interval: int = HEALTHCHECK_INTERVAL_S) -> DevClusterConfig:
    """`cfg` with `health_settings` applied (what `fthsdp cluster up --health` starts)."""
    return replace(cfg, **health_settings(cfg, interval))  # type: ignore[arg-type]


def write_health_files(cfg: DevClusterConfig, fresh: bool = False) -> None:
    """Healthy simulated hardware for every node (only for nodes that have none unless `fresh`:
    a reconfigure must not heal injected faults), the `{node}` health config and the wrappers."""
    from prolog_epilog.simulated_hardware import dev_config_toml, write_node_inputs

    hw = hardware_dir(cfg)
    for node in cfg.node_names:
        if fresh or not (hw / node / "bin" / "nvidia-smi").exists():
            write_node_inputs(hw, node, gpus=cfg.gpus_per_node)
            if fresh:
                (hw / node / "slow").unlink(missing_ok=True)
                (hw / node / "faults.json").unlink(missing_ok=True)
    config = health_config_path(cfg)
    config.write_text(
        dev_config_toml(hw, total_budget_s=10.0)
        + f"\n[checks.gpu-count]\nexpected = {cfg.gpus_per_node}\n"
    )
    bin_dir = cfg.directory / WRAPPER_DIR
    for mode in ("prolog", "epilog", "healthcheck"):
        entrypoint_wrapper(bin_dir / f"fthsdp-{mode}", mode, config, cfg.conf_path)
    task_prolog_script(bin_dir / "fthsdp-task-prolog", job_health_env(cfg))


def _run(
    argv: list[str], cfg: DevClusterConfig, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, env=cfg.env(), capture_output=True, text=True, timeout=timeout, check=False
    )


def node_states(cfg: DevClusterConfig) -> dict[str, str]:
    """Node name -> sinfo's state (e.g. 'idle', 'drain', 'down*'); empty if slurmctld is down."""
    try:
        r = _run(["sinfo", "-h", "-N", "-o", "%N %t"], cfg, timeout=10)
    except subprocess.TimeoutExpired:
        return {}
    if r.returncode != 0:
        return {}
    out: dict[str, str] = {}
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            out[parts[0]] = parts[1]
    return out


def _wait_for(predicate: object, timeout: float, what: str, interval: float = 0.25) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(interval)
    raise EnvironmentProblem(f"timed out after {timeout:.0f}s waiting for {what}")


def _tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _start(argv: list[str], cfg: DevClusterConfig, what: str, log: Path) -> None:
    r = subprocess.run(
        argv,
        env=cfg.env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        start_new_session=True,
    )
    if r.returncode != 0:
        detail = (r.stderr or r.stdout).strip().splitlines()[-1:] or [_tail(log)]
        raise EnvironmentProblem(f"{what} failed to start: {detail[0]}")


def up(cfg: DevClusterConfig, timeout: float = 60) -> DevClusterConfig:
    """Start munged, slurmctld and one slurmd per node; return once all nodes are idle.

    On any failure everything started so far is stopped again before the error propagates.
    """
    preflight(cfg)
    write_files(cfg, fresh_hardware=True)
    d = cfg.directory
    try:
        _start(
            [
                _binary("munged"),
                "--force",
                f"--key-file={d / 'munge-key' / 'munge.key'}",
                f"--socket={cfg.munge_socket}",
                f"--pid-file={d / 'munge' / 'munged.pid'}",
                f"--log-file={d / 'log' / 'munged.log'}",
                f"--seed-file={d / 'munge' / 'munged.seed'}",
            ],
            cfg,
            "munged",
            d / "log" / "munged.log",
        )
        _start(
            [_binary("slurmctld"), "-c", "-f", str(cfg.conf_path)],
            cfg,
            "slurmctld",
            d / "log" / "slurmctld.log",
        )
        _wait_for(lambda: bool(node_states(cfg)), 30, "slurmctld to answer")
        for n in cfg.node_names:
            _start(
                [_binary("slurmd"), "-N", n, "-f", str(cfg.conf_path)],
                cfg,
                f"slurmd {n}",
                d / "log" / f"slurmd-{n}.log",
            )
        _wait_for(lambda: _all_idle(cfg), timeout, f"all {cfg.nodes} nodes idle in sinfo")
    except BaseException:
        down(cfg)
        raise
    return cfg


def _all_idle(cfg: DevClusterConfig) -> bool:
    states = node_states(cfg)
    return len(states) == cfg.nodes and all(s == "idle" for s in states.values())


@functools.cache
def slurm_release() -> tuple[int, int]:
    """The installed Slurm's (major, minor), from `slurmd -V` (read once per process)."""
    r = subprocess.run(
        [_binary("slurmd"), "-V"], capture_output=True, text=True, timeout=30, check=False
    )
    m = re.search(r"\b(\d{2})\.(\d{2})\.\d+", r.stdout + r.stderr)
    if not m:
        raise EnvironmentProblem(f"slurmd -V printed no version: {(r.stdout + r.stderr).strip()!r}")
    return int(m.group(1)), int(m.group(2))


def restart_pending(before: Mapping[str, int], processes: Mapping[int, str]) -> dict[str, str]:
    """What a 23.11+ reconfigure has not finished yet: daemon -> what is wrong (empty = done).

    `before`: daemon -> pid before the reconfigure; `processes`: this cluster's live processes
    now (pid -> daemon). Done means every Slurm daemon runs again under a new pid and its
    predecessor is gone. Pid files are no evidence: the predecessor deletes its pid file when it
    exits, which can be after its successor wrote it (seen on 24.11).
    """
    pending = {}
    for name, old in before.items():
        if name == "munged":  # Slurm does not restart munge
            continue
        pids = sorted(p for p, n in processes.items() if n == name)
        if not pids:
            pending[name] = f"not running (was pid {old})"
        elif old in pids:
            pending[name] = f"pid {old} still running"
    return pending


def _rewrite_pid_files(cfg: DevClusterConfig) -> None:
    """Point every pid file at its daemon's live process (a restart may have deleted it)."""
    live = live_daemons(cfg)
    for name, path in _pid_files(cfg).items():
        if name in live and _read_pid(path) != live[name]:
            path.write_text(f"{live[name]}\n")


def reconfigure(cfg: DevClusterConfig, **changes: object) -> DevClusterConfig:
    """Rewrite slurm.conf with `changes` (e.g. prolog=...) and tell slurmctld and slurmds.

    Returns once the daemons run the new config: on 23.11 and later they restart under new pids,
    which is waited for (every old daemon gone), and the pid files are made to name them again.
    """
    new = replace(cfg, **changes)  # type: ignore[arg-type]
    # A reconfigure kills the Prolog and Epilog scripts running then (slurmd logs "epilog killed
    # by signal 15"), and Slurm drains their nodes "Job epilog failed" / "Prolog error": wait
    # until the jobs just cancelled or started are past them.
    _wait_for_no_scripts(cfg, cfg.prolog_epilog_timeout + 30)
    write_files(new)
    before = live_daemons(new)
    r = _run(["scontrol", "reconfigure"], new)
    if r.returncode != 0:
        raise EnvironmentProblem(f"scontrol reconfigure failed: {r.stderr.strip()}")
    if slurm_release() >= RESTARTS_ON_RECONFIGURE:
        deadline = time.monotonic() + RECONFIGURE_TIMEOUT_S
        while True:
            pending = restart_pending(before, cluster_processes(new))
            if not pending:
                _rewrite_pid_files(new)
                break
            if time.monotonic() > deadline:
                first = next(iter(pending)).replace("slurmd ", "slurmd-")
                log = new.directory / "log" / f"{first}.log"
                what = "; ".join(f"{name} {problem}" for name, problem in pending.items())
                raise EnvironmentProblem(
                    f"scontrol reconfigure: not restarted after {RECONFIGURE_TIMEOUT_S}s: "
                    f"{what} ({log.name}: {_tail(log)})"
                )
            time.sleep(0.25)
    _wait_for(lambda: bool(node_states(new)), 30, "slurmctld to answer after reconfigure")
    return new


def down(cfg: DevClusterConfig, grace: float = 10) -> list[str]:
    """Cancel the cluster's jobs, then stop every daemon of this cluster (see `live_daemons`).

    Daemons are looked up again until none is left, so one restarted by a reconfigure in flight
    is stopped too; munged goes last. Returns the names of daemons that were stopped; raises
    EnvironmentProblem naming any that survived SIGKILL. Deletes no files.
    """
    if "slurmctld" in live_daemons(cfg):
        with contextlib.suppress(subprocess.TimeoutExpired):
            _run(["scancel", "--full", "--quiet", "--user=root"], cfg, timeout=10)
            _wait_for_no_jobs(cfg, 8)
    stopped: list[str] = []
    for munge in (False, True):
        signalled: dict[int, float] = {}
        deadline = time.monotonic() + grace + 20
        while True:
            procs = {p: n for p, n in cluster_processes(cfg).items() if (n == "munged") == munge}
            if not procs:
                break
            now = time.monotonic()
            if now > deadline:
                left = ", ".join(f"{n} (pid {p})" for p, n in sorted(procs.items()))
                raise EnvironmentProblem(f"{cfg.directory}: could not stop {left}")
            for pid, name in procs.items():
                if pid not in signalled:
                    _signal(pid, signal.SIGTERM)
                    signalled[pid] = now
                    if name not in stopped:
                        stopped.append(name)
                elif now - signalled[pid] > grace:
                    _signal(pid, signal.SIGKILL)
            time.sleep(0.1)
    _kill_orphan_steps(cfg)
    slurmds = [n for n in stopped if n.startswith("slurmd ")]
    return slurmds + [n for n in ("slurmctld", "munged") if n in stopped]


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _wait_for_no_scripts(cfg: DevClusterConfig, timeout: float) -> None:
    """Until no job is configuring (its Prolog runs) or completing (its Epilog runs), at most
    `timeout` seconds; returns at once when slurmctld does not answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            r = _run(["squeue", "-h", "-t", "CONFIGURING,COMPLETING", "-o", "%i"], cfg, timeout=5)
        except subprocess.TimeoutExpired:
            return
        if r.returncode != 0 or not r.stdout.strip():
            return
        time.sleep(0.25)


def _wait_for_no_jobs(cfg: DevClusterConfig, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            r = _run(["squeue", "-h", "-o", "%i"], cfg, timeout=5)
        except subprocess.TimeoutExpired:
            return
        if r.returncode != 0 or not r.stdout.strip():
            return
        time.sleep(0.25)


def _kill_orphan_steps(cfg: DevClusterConfig) -> None:
    """Kill slurmstepd processes of this cluster that outlived their slurmd (by spool path)."""
    spool = str(cfg.directory / "spool")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not cmd or not cmd[0].startswith(b"slurmstepd"):
            continue
        try:
            environ = (proc / "environ").read_bytes()
        except OSError:
            environ = b""
        if spool.encode() in environ or str(cfg.conf_path).encode() in environ:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(proc.name), signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(proc.name), signal.SIGKILL)


@dataclass(frozen=True)
class ClusterStatus:
    directory: Path
    daemons: dict[str, int]
    nodes: dict[str, str]

    @property
    def running(self) -> bool:
        return "slurmctld" in self.daemons


def status(cfg: DevClusterConfig) -> ClusterStatus:
    return ClusterStatus(cfg.directory, live_daemons(cfg), node_states(cfg))


@contextlib.contextmanager
def running_cluster(cfg: DevClusterConfig, timeout: float = 60) -> Iterator[DevClusterConfig]:
    """Context manager for tests: up on entry, down on exit (even on failure)."""
    up(cfg, timeout=timeout)
    try:
        yield cfg
    finally:
        down(cfg)
