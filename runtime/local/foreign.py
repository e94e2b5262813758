"""`fthsdp run --local` for a foreign torchft trainer (`[train] mode = "torchft"`).

The local stand-in for what the replica jobs do on Slurm: start torchft's Lighthouse, start each
replica group's tasks (`command` under `bash -c`, one process per task, `RANK`/`WORLD_SIZE` and
`SLURM_PROCID`/`SLURM_NTASKS` set as under srun) with the same environment the supervisor gives
(`REPLICA_GROUP_ID`, `NUM_REPLICA_GROUPS`, `TORCHFT_LIGHTHOUSE`, a free `MASTER_PORT` and
`FTHSDP_RDZV_ENDPOINT`, the dump folder, torchft's timeouts), read task 0's progress like the
supervisor does (`runtime.control.foreign_step`), and restart a group whose tasks died, as a
requeue would, up to `max_restarts_per_replica`. Every task of a dead group is stopped by its
launch's incarnation, ghosts included. `kill_replica`/`kill_at_step` kill one group's tasks once
(`kill -9`, no warning) when its step reaches the given one.

Its verdict is only what a foreign trainer lets fthsdp see: each group's exit code and step.
There is no data ledger and no commit vote to check (docs/runtime.md, the table of modes).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.control.foreign_step import ForeignLaunch, ForeignStep
from runtime.control.service import Lighthouse, LighthouseConfig
from runtime.foreign import (
    GroupEndpoints,
    launch_env,
    marked_processes,
    progress_path,
    stop_leftovers,
)
from runtime.net import free_port
from slurm import contract
from slurm.contract import dump_dir, torchft_timeouts


@dataclass
class ForeignConfig:
    run_dir: Path
    command: str
    groups: int
    tasks: int = 1
    min_replicas: int = 1
    max_restarts: int = 3
    heartbeat_s: float = 2.0
    allreduce_s: float = 5.0
    quorum_s: float = 10.0
    join_s: float = 60.0
    progress_regex: str | None = None
    progress_file: str | None = None
    progress_timeout_s: float = 0.0
    env: dict[str, str] = field(default_factory=dict)
    kill_replica: int | None = None
    kill_at_step: int | None = None
    restart_delay_s: float = 0.0
    run_timeout_s: float = 1800.0


@dataclass
class GroupResult:
    replica: int
    step: int | None
    restarts: int
    exit_codes: list[int]
    ok: bool


@dataclass
class ForeignSummary:
    groups: list[GroupResult]
    ok: bool
    error: str | None = None
    signal: int | None = None


@dataclass
class _Group:
    replica: int
    launch: int = 0
    restarts: int = 0
    step: ForeignStep | None = None
    others: list[subprocess.Popen[bytes]] = field(default_factory=list)
    exit_codes: list[int] = field(default_factory=list)
    last_step: int | None = None
    done: bool = False
    out: bool = False
    restart_at: float | None = None
    killed: bool = False


class ForeignLocalRun:
    def __init__(self, cfg: ForeignConfig) -> None:
        self.cfg = cfg
        self.lighthouse: Lighthouse | None = None
        self.groups = [_Group(k) for k in range(cfg.groups)]
        self.stopped_by: int | None = None
        self._tag = f"local-{os.getpid()}-{int(time.time())}"

    def _env(self, g: _Group, port: int, task: int) -> dict[str, str]:
        c = self.cfg
        assert self.lighthouse is not None
        env = dict(os.environ)
        # `python` and `torchrun` in the command are the installation fthsdp runs from, as the
        # native mode's `python` is (`resolve_command`), not whatever comes first on PATH.
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        env.update(c.env)
        env.update(
            {
                contract.TRAIN_MODE: "torchft",
                contract.RUN_DIR: str(c.run_dir),
                contract.REPLICA_ID: str(g.replica),
                contract.REPLICA: str(g.replica),
                contract.NUM_REPLICAS: str(c.groups),
                contract.NUM_REPLICA_GROUPS: str(c.groups),
                contract.DUMP_DIR: str(dump_dir(c.run_dir, g.replica)),
                contract.LAUNCH: str(g.launch),
                contract.TORCHFT_REPLICA_GROUP_ID: str(g.replica),
                contract.TORCHFT_NUM_REPLICA_GROUPS: str(c.groups),
                contract.RANK: str(task),
                contract.LOCAL_RANK: str(task),
                contract.WORLD_SIZE: str(c.tasks),
                contract.SLURM_PROCID: str(task),
                contract.SLURM_NTASKS: str(c.tasks),
                "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
                "RUST_LOG": env.get("RUST_LOG", "warn"),
                contract.INCARNATION: f"{self._tag}.r{g.replica}.{g.launch}",
            }
        )
        env.update(torchft_timeouts(c.allreduce_s, c.quorum_s, c.join_s))
        env.update(launch_env(GroupEndpoints(self.lighthouse.url, "127.0.0.1", port)))
        env.pop(contract.CONTROL_FILE, None)  # this process is the control plane
        return env

    def _launch(self, g: _Group) -> None:
        c = self.cfg
        logs = c.run_dir / "logs"
        dump_dir(c.run_dir, g.replica).mkdir(parents=True, exist_ok=True)
        port = free_port()
        stem = f"g{g.replica}_i{g.launch}"
        progress = progress_path(c.progress_file, c.run_dir, g.replica) if c.progress_file else None
        launch = ForeignLaunch(
            command=["bash", "-c", c.command],
            env=self._env(g, port, 0),
            progress_regex=c.progress_regex,
            progress_file=progress,
            progress_timeout_s=c.progress_timeout_s,
            out=open(logs / f"{stem}_t0.out", "ab"),  # noqa: SIM115
            err=open(logs / f"{stem}_t0.err", "ab"),  # noqa: SIM115
        )
        g.step = ForeignStep(launch)
        g.step.start()
        g.others = []
        for task in range(1, c.tasks):
            with open(logs / f"{stem}_t{task}.log", "ab") as log:
                g.others.append(
                    subprocess.Popen(
                        ["bash", "-c", c.command],
                        env=self._env(g, port, task),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )

    def _finish(self, g: _Group) -> int | None:
        """The group's exit code once its launch ended (any task failing ends it), else None."""
        assert g.step is not None and g.step.child is not None
        codes = [g.step.child.poll(), *(p.poll() for p in g.others)]
        if any(code is None for code in codes) and not any(code for code in codes if code):
            return None
        for p in [g.step.child, *g.others]:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        code = g.step.wait()  # also kills whatever the launch left behind
        for p in g.others:
            p.wait()
        bad = [c for c in (code, *(p.returncode for p in g.others)) if c]
        g.last_step = g.step.step if g.step.step is not None else g.last_step
        for f in (g.step.launch.out, g.step.launch.err):
            if f is not None:
                f.close()
        return bad[0] if bad else 0

    def _tick(self) -> None:
        c = self.cfg
        now = time.monotonic()
        for g in self.groups:
            if g.done or g.out:
                continue
            if g.step is None:
                if g.restart_at is not None and now >= g.restart_at:
                    g.restart_at = None
                    self._launch(g)
                continue
            step = g.step.step
            if step is not None:
                g.last_step = step
            if (
                g.replica == c.kill_replica
                and not g.killed
                and c.kill_at_step is not None
                and (step or 0) >= c.kill_at_step
            ):
                g.killed = True
                for pid in marked_processes(contract.INCARNATION, g.step.incarnation):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)  # every task, no warning
            code = self._finish(g)
            if code is None:
                continue
            g.exit_codes.append(code)
            g.step = None
            if code == 0:
                g.done = True
            elif g.restarts >= c.max_restarts:
                g.out = True
            else:
                g.restarts += 1
                g.launch += 1
                g.restart_at = now + c.restart_delay_s

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.stopped_by = signum

    def run(self) -> ForeignSummary:
        c = self.cfg
        (c.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        error = None
        try:
            self.lighthouse = Lighthouse(
                LighthouseConfig(
                    host="127.0.0.1",
                    min_replicas=min(c.min_replicas, c.groups),
                    heartbeat_timeout_ms=int(c.heartbeat_s * 1000),
                    join_timeout_ms=int(min(c.join_s, 5.0) * 1000),
                    quorum_tick_ms=50,
                ),
                c.run_dir / "logs" / "lighthouse.log",
            )
            self.lighthouse.start_and_wait()
            for g in self.groups:
                self._launch(g)
            deadline = time.monotonic() + c.run_timeout_s
            while not all(g.done or g.out for g in self.groups):
                if self.stopped_by is not None:
                    error = f"stopped by signal {self.stopped_by}"
                    break
                if time.monotonic() > deadline:
                    error = f"the run did not finish within {c.run_timeout_s:.0f}s"
                    break
                if sum(1 for g in self.groups if not g.out) < min(c.min_replicas, c.groups):
                    error = "fewer groups left than train.min_replicas"
                    break
                self._tick()
                time.sleep(0.2)
        finally:
            self.shutdown()
            for s, handler in previous.items():
                signal.signal(s, handler)
        results = [
            GroupResult(g.replica, g.last_step, g.restarts, g.exit_codes, g.done)
            for g in self.groups
        ]
        failed = [r.replica for r in results if not r.ok]
        if error is None and failed:
            error = f"group(s) {failed} failed {c.max_restarts + 1} times; see {c.run_dir}/logs"
        ok = error is None
        return ForeignSummary(results, ok, error, self.stopped_by)

    def shutdown(self) -> None:
        for g in self.groups:
            if g.step is not None:
                with contextlib.suppress(ProcessLookupError):
                    stop_leftovers(g.step.incarnation)
                self._finish(g)
                g.step = None
        if self.lighthouse is not None:
            self.lighthouse.stop()


def config_from_spec(
    spec: Any,
    *,
    replicas: int | None = None,
    run_dir: Path | None = None,
    kill_replica: int | None = None,
    kill_at_step: int | None = None,
    restart_delay_s: float = 0.0,
    run_timeout_s: float = 1800.0,
) -> ForeignConfig:
    from slurm.errors import InputError

    t, r = spec.train, spec.replicas
    groups = replicas if replicas is not None else r.count
    if kill_replica is not None and not 0 <= kill_replica < groups:
        raise InputError("--kill-replica", kill_replica, f"a replica id in 0..{groups - 1}")
    return ForeignConfig(
        run_dir=run_dir if run_dir is not None else Path(spec.job.run_dir),
        command=t.command,
        groups=groups,
        tasks=r.nodes * (r.tasks_per_node or 1),
        min_replicas=t.min_replicas,
        max_restarts=t.max_restarts_per_replica,
        heartbeat_s=float(t.heartbeat_timeout_s),
        allreduce_s=float(t.allreduce_timeout_s),
        quorum_s=float(t.quorum_timeout_s),
        join_s=float(t.join_timeout_s),
        progress_regex=t.progress_regex,
        progress_file=t.progress_file,
        progress_timeout_s=t.hung_after_s,
        env=dict(spec.job.env),
        kill_replica=kill_replica,
        kill_at_step=kill_at_step,
        restart_delay_s=restart_delay_s,
        run_timeout_s=run_timeout_s,
    )
