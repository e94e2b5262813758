"""A dev cluster's lifecycle: up, reconfigure, down, status.

`up` refuses to start over live daemons, and stops everything it started if any step fails;
`down` cancels the cluster's jobs (so no training processes outlive it), stops this cluster's
daemons and deletes nothing. `reconfigure` waits until the daemons a 23.11+ reconfigure restarts
are back.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from slurm.devcluster.conf import gres_conf, slurm_conf, topology_conf
from slurm.devcluster.config import CONFIG_FILE, DevClusterConfig
from slurm.devcluster.daemons import (
    binary,
    cluster_processes,
    kill_orphan_steps,
    live_daemons,
    log_tail,
    missing_prerequisites,
    pid_files,
    port_in_use,
    read_pid,
    signal_pid,
    slurm_release,
    start_daemon,
)
from slurm.devcluster.directory import make_directory
from slurm.errors import EnvironmentProblem, InputError

#: Slurm releases from this one on restart their daemons on `scontrol reconfigure`.
RESTARTS_ON_RECONFIGURE = (23, 11)
#: How long a reconfigure may take to bring the restarted daemons back (a loaded test machine).
RECONFIGURE_TIMEOUT_S = 90


def preflight(cfg: DevClusterConfig) -> None:
    """Raise EnvironmentProblem with a one-line reason if `up` cannot start cleanly."""
    problems = missing_prerequisites()
    if problems:
        raise EnvironmentProblem("; ".join(problems))
    make_directory(cfg.directory)
    unreachable = closed_folder(cfg.directory) if cfg.slurm_user != "root" else None
    if unreachable:
        raise EnvironmentProblem(
            f"{unreachable} is not searchable by other users (mode "
            f"{stat.S_IMODE(unreachable.stat().st_mode):04o}), so slurmctld, which runs as "
            f"{cfg.slurm_user}, and the cluster's users cannot read slurm.conf; use a folder "
            "every user can traverse (0755 up to /)"
        )
    live = live_daemons(cfg)
    if live:
        names = ", ".join(f"{n} (pid {p})" for n, p in live.items())
        raise EnvironmentProblem(
            f"{cfg.directory} already runs a cluster: {names}; run 'fthsdp cluster down' first"
        )
    busy = [p for p in cfg.ports if port_in_use(p)]
    if busy:
        raise EnvironmentProblem(
            f"port(s) {', '.join(map(str, busy))} in use; choose others with --port/--slurmd-port"
        )


def closed_folder(directory: Path) -> Path | None:
    """The first of `directory` and its parents that other users cannot search (None: none)."""
    for path in [directory.absolute(), *directory.absolute().parents]:
        if not path.stat().st_mode & stat.S_IXOTH:
            return path
    return None


def write_files(cfg: DevClusterConfig, fresh_hardware: bool = False) -> None:
    """Write configs, the munge key, placeholder GPU files and the directories daemons need
    (and, with `cfg.health`, what `cfg.node_setup` writes: the simulated hardware and the
    health hooks' scripts).

    Laid out as a site lays out Slurm: the config world-readable (folders 0755, files 0644)
    so every user's commands read it; what slurmctld writes (its state, pid file and log) owned
    by `cfg.slurm_user`; the munge key private to root.
    """
    d = cfg.directory
    for sub in ("etc", "state", "ctld", "run", "log", "dev", "spool", "munge", "munge-key"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    for sub in ("etc", "ctld", "run", "log", "dev", "spool", "munge"):
        os.chmod(d / sub, 0o755)
    for n in cfg.node_names:
        (d / "spool" / n).mkdir(exist_ok=True)
    # munged wants its socket dir world-searchable and its key private to its owner.
    os.chmod(d / "munge-key", 0o700)
    key = d / "munge-key" / "munge.key"
    if not key.exists():
        key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    uid, gid = cfg.slurm_ids
    ctld_log = d / "log" / "slurmctld.log"
    ctld_log.touch()
    for path in (d / "state", d / "ctld", ctld_log):
        os.chown(path, uid, gid)
    os.chmod(d / "state", 0o700)
    os.chmod(ctld_log, 0o644)
    for i in range(cfg.gpus_per_node):
        (d / "dev" / f"nvidia{i}").touch()
    try:
        release: tuple[int, int] | None = slurm_release()
    except EnvironmentProblem:
        release = None  # no slurmd here: the files are written for reading only
    for name, text in (
        ("slurm.conf", slurm_conf(cfg, release)),
        ("gres.conf", gres_conf(cfg)),
        ("topology.conf", topology_conf(cfg)),
    ):
        (d / "etc" / name).write_text(text)
        os.chmod(d / "etc" / name, 0o644)
    if cfg.node_setup is not None:
        cfg.node_setup(cfg, fresh_hardware)
    elif cfg.health:
        raise InputError(
            "health", True, "needs the node_setup that writes the nodes' simulated hardware"
        )
    (d / CONFIG_FILE).write_text(cfg.to_json())
    os.chmod(d / CONFIG_FILE, 0o644)


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


def up(cfg: DevClusterConfig, timeout: float = 60) -> DevClusterConfig:
    """Start munged, slurmctld and one slurmd per node; return once all nodes are idle.

    On any failure everything started so far is stopped again before the error propagates.
    """
    preflight(cfg)
    write_files(cfg, fresh_hardware=True)
    d = cfg.directory
    try:
        start_daemon(
            [
                binary("munged"),
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
        start_daemon(
            [binary("slurmctld"), "-c", "-f", str(cfg.conf_path)],
            cfg,
            "slurmctld",
            d / "log" / "slurmctld.log",
        )
        _wait_for(lambda: bool(node_states(cfg)), 30, "slurmctld to answer")
        for n in cfg.node_names:
            start_daemon(
                [binary("slurmd"), "-N", n, "-f", str(cfg.conf_path)],
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
    for name, path in pid_files(cfg).items():
        if name in live and read_pid(path) != live[name]:
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
                    f"{what} ({log.name}: {log_tail(log)})"
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
            # Every user's jobs (the cluster's one partition), not root's alone.
            _run(["scancel", "--full", "--quiet", f"--partition={cfg.partition}"], cfg, timeout=10)
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
                    signal_pid(pid, signal.SIGTERM)
                    signalled[pid] = now
                    if name not in stopped:
                        stopped.append(name)
                elif now - signalled[pid] > grace:
                    signal_pid(pid, signal.SIGKILL)
            time.sleep(0.1)
    kill_orphan_steps(cfg)
    slurmds = [n for n in stopped if n.startswith("slurmd ")]
    return slurmds + [n for n in ("slurmctld", "munged") if n in stopped]


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
