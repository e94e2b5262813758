"""This cluster's processes: starting its daemons, finding them, signalling them.

Daemons are found by their pid files *and* by their command line (`-f <this slurm.conf>`,
`--socket=<this munge socket>`): from Slurm 23.11 on, `scontrol reconfigure` restarts slurmctld
and every slurmd under new pids, so a pid read before a reconfigure may name a process that is
gone (or, later, someone else's).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import signal
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path

from slurm.devcluster.config import DevClusterConfig
from slurm.errors import EnvironmentProblem

REQUIRED_BINARIES = ("munged", "slurmctld", "slurmd", "sinfo", "scontrol", "sbatch", "squeue")


def pid_files(cfg: DevClusterConfig) -> dict[str, Path]:
    run = cfg.directory / "run"
    files = {
        "munged": cfg.directory / "munge" / "munged.pid",
        "slurmctld": cfg.directory / "ctld" / "slurmctld.pid",
    }
    files.update({f"slurmd {n}": run / f"slurmd-{n}.pid" for n in cfg.node_names})
    return files


def read_pid(path: Path) -> int | None:
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
    recorded = {name: read_pid(path) for name, path in pid_files(cfg).items()}
    for pid, name in sorted(cluster_processes(cfg).items()):
        if name not in out or recorded.get(name) == pid:
            out[name] = pid
    ordered = {n: out[n] for n in recorded if n in out}
    return {**ordered, **out}


def port_in_use(port: int) -> bool:
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
        if not any(port_in_use(q) for q in range(p, p + count)):
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


def binary(name: str) -> str:
    found = shutil.which(name) or _sbin(name)
    if not found:
        raise EnvironmentProblem(
            f"{name} not found (install with: apt-get install -y slurm-wlm munge)"
        )
    return found


def log_tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def start_daemon(argv: list[str], cfg: DevClusterConfig, what: str, log: Path) -> None:
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
        detail = (r.stderr or r.stdout).strip().splitlines()[-1:] or [log_tail(log)]
        raise EnvironmentProblem(f"{what} failed to start: {detail[0]}")


def signal_pid(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def kill_orphan_steps(cfg: DevClusterConfig) -> None:
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


@functools.cache
def slurm_release() -> tuple[int, int]:
    """The installed Slurm's (major, minor), from `slurmd -V` (read once per process)."""
    r = subprocess.run(
        [binary("slurmd"), "-V"], capture_output=True, text=True, timeout=30, check=False
    )
    m = re.search(r"\b(\d{2})\.(\d{2})\.\d+", r.stdout + r.stderr)
    if not m:
        raise EnvironmentProblem(f"slurmd -V printed no version: {(r.stdout + r.stderr).strip()!r}")
    return int(m.group(1)), int(m.group(2))
