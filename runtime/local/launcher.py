"""Run an FT-HSDP job on one machine: the lighthouse plus R replicas x W ranks as local processes.

This is the local stand-in for what Slurm and the coordinator do on a cluster: it starts
torchft's lighthouse (the quorum service), starts each replica's ranks with the same environment
contract the sbatch scripts export (`runtime.env`), and restarts a replica whose processes died,
as a requeue would, up to `max_restarts_per_replica` within `restart_window_s`, after which the
replica stays out and the run continues while `min_replicas` hold. The faults to inject
(`runtime.local.faults`) and the straggler eviction (`runtime.control.straggler`) end in the
same kill and restart.

The launcher owns its run directory (`runtime.local.run_state`): the workers get the launcher's
own Lighthouse address, never a `control.json`. The Lighthouse gets a start deadline with one
retry (`runtime.control.service.Lighthouse`). On SIGTERM or SIGINT the launcher stops every
process it started (each worker and the Lighthouse run in their own process group, which is
killed) and returns the summary so far (`runtime.local.summary`), with the signal in
`RunSummary.signal`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from runtime.control.service import Lighthouse, LighthouseConfig
from runtime.local.config import LaunchConfig, resolve_command
from runtime.local.faults import Failure, FaultInjector
from runtime.local.replicas import LocalReplica
from runtime.local.summary import RunSummary, summarize
from runtime.net import free_port
from slurm import contract


class StoppedBySignal(Exception):
    """SIGTERM or SIGINT arrived while the Lighthouse was starting."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class LocalLauncher:
    def __init__(
        self, cfg: LaunchConfig, on_update: Callable[[list[LocalReplica]], None] | None = None
    ) -> None:
        self.cfg = cfg
        self.on_update = on_update
        self.replicas = [LocalReplica(r) for r in range(cfg.replicas)]
        self.failures: list[Failure] = []
        self.lighthouse: Lighthouse | None = None
        self.lighthouse_addr = ""
        self.stop_signal: int | None = None
        self._starting = False
        self.faults = FaultInjector(cfg, self._inject)
        self._any_done = False
        self._t0 = 0.0
        from runtime.control.straggler.detect import StragglerConfig
        from runtime.control.straggler.evict import EvictionConfig
        from runtime.control.straggler.monitor import StragglerMonitor

        self.stragglers = StragglerMonitor(
            StragglerConfig(
                window_steps=cfg.straggler_window_steps,
                recovery_hold_s=cfg.straggler_recovery_hold_s,
            ),
            EvictionConfig(
                mode="exclude" if cfg.straggler_evict else "report",
                min_replicas=cfg.min_replicas,
                requeue_cost_estimate_s=cfg.straggler_requeue_cost_s,
            ),
            total_steps=cfg.steps,
        )
        self.straggler_decisions: list[dict[str, Any]] = []

    # ---------------------------------------------------------------- processes
    def start_lighthouse(self) -> None:
        """Start the Lighthouse and wait until it listens (a deadline, one retry)."""
        cfg = self.cfg
        join_s = cfg.lighthouse_join_timeout_s or min(cfg.timeouts.join_s, 5.0)
        (cfg.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        config = LighthouseConfig(
            host="127.0.0.1",
            min_replicas=cfg.min_replicas,
            heartbeat_timeout_ms=int(cfg.timeouts.heartbeat_s * 1000),
            join_timeout_ms=int(join_s * 1000),
            quorum_tick_ms=50,
        )
        self.lighthouse = Lighthouse(config, cfg.run_dir / "logs" / "lighthouse.log")
        self.lighthouse.start_and_wait()
        self.lighthouse_addr = self.lighthouse.url

    def _env(self, replica: int, rank: int, port: int) -> dict[str, str]:
        cfg = self.cfg
        env = dict(os.environ)
        env.update(
            {
                contract.RUN_DIR: str(cfg.run_dir),
                contract.REPLICA_ID: str(replica),
                contract.NUM_REPLICAS: str(cfg.replicas),
                contract.LIGHTHOUSE: self.lighthouse_addr,
                contract.JOB_NAME: cfg.job_name,
                contract.MIN_REPLICAS: str(cfg.min_replicas),
                contract.HEARTBEAT_TIMEOUT_S: str(cfg.timeouts.heartbeat_s),
                contract.ALLREDUCE_TIMEOUT_S: str(cfg.timeouts.allreduce_s),
                contract.QUORUM_TIMEOUT_S: str(cfg.timeouts.quorum_s),
                contract.JOIN_TIMEOUT_S: str(cfg.timeouts.join_s),
                contract.CONTROL_WAIT_S: str(cfg.timeouts.control_s),
                contract.CHECKPOINT_EVERY_STEPS: str(cfg.checkpoint_every_steps),
                contract.CHECKPOINT_EVERY_S: contract.checkpoint_every_s_value(
                    cfg.checkpoint_every_s
                ),
                contract.RUN_NODES: str(cfg.failure_model.nodes),
                contract.NODE_FAILURES_PER_1000_DAY: str(
                    cfg.failure_model.failures_per_1000_nodes_day
                ),
                contract.RUN_LOSSES_PER_DAY: str(cfg.failure_model.run_losses_per_day),
                contract.REQUEUE_COST_S: str(cfg.failure_model.requeue_cost_s),
                contract.STEPS: str(cfg.steps),
                contract.RANK: str(rank),
                contract.WORLD_SIZE: str(cfg.ranks_per_replica),
                contract.LOCAL_RANK: str(rank),
                contract.MASTER_ADDR: "127.0.0.1",
                contract.MASTER_PORT: str(port),
                "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
                "RUST_LOG": env.get("RUST_LOG", "warn"),
            }
        )
        # This launcher is the control plane: never a control.json (a submit's may be stale).
        env.pop(contract.CONTROL_FILE, None)
        env.update(cfg.extra_env)
        return env

    def _launch(self, rs: LocalReplica) -> None:
        port = free_port()
        rs.procs = []
        logs = self.cfg.run_dir / "logs"
        for rank in range(self.cfg.ranks_per_replica):
            out = open(logs / f"r{rs.replica}_w{rank}_i{rs.incarnation}.log", "wb")  # noqa: SIM115
            env = self._env(rs.replica, rank, port)
            if rs.replica == self.cfg.slow_replica and rs.incarnation == 0:
                env[contract.SLOW_FILE] = str(self._slow_file(rs))
            rs.procs.append(
                subprocess.Popen(
                    resolve_command(self.cfg.command),
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            out.close()
        rs.state = "starting"
        rs.healing = False

    def _kill(self, rs: LocalReplica) -> None:
        for p in rs.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
        for p in rs.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)

    def _slow_file(self, rs: LocalReplica) -> Path:
        return self.cfg.run_dir / "slow" / f"r{rs.replica}"

    def _degrade(self) -> None:
        """Slow the slow replica's first incarnation down once it passed `slow_after_step`."""
        cfg = self.cfg
        if cfg.slow_replica is None:
            return
        rs = self.replicas[cfg.slow_replica]
        path = self._slow_file(rs)
        if rs.incarnation == 0 and rs.step >= cfg.slow_after_step and not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(str(cfg.slow_factor))

    def shutdown(self) -> None:
        """Stop every process this launcher started: each replica's process groups, then the
        Lighthouse's."""
        for rs in self.replicas:
            self._kill(rs)
        if self.lighthouse is not None:
            self.lighthouse.stop()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.stop_signal is None:
            self.stop_signal = signum
        if self._starting:
            raise StoppedBySignal(signum)  # out of the Lighthouse's start wait

    # ---------------------------------------------------------------- progress
    def _read_progress(self, rs: LocalReplica) -> None:
        path = self.cfg.run_dir / "progress" / f"r{rs.replica}.jsonl"
        if not path.exists():
            return
        with open(path) as f:
            f.seek(rs.offset)
            data = f.read()
        complete = data.rsplit("\n", 1)[0] if "\n" in data else ""
        if not complete:
            return
        rs.offset += len(complete) + 1
        for line in complete.splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            kind = ev.get("event")
            if kind == "joined":
                rs.joined[ev["incarnation"]] = ev["t"]
            elif kind == "commit":
                rs.step = ev["step"] + 1
                rs.healing = bool(ev.get("healing"))
                if not rs.healing and rs.state != "training":
                    rs.training_since = time.monotonic()
                rs.state = "healing" if rs.healing else "training"
                rs.last_commit_t = ev["t"]
                rs.commits.append((ev["t"], ev["step"], rs.healing, ev["incarnation"]))
                self._observe_timing(rs, ev)
            elif kind == "done":
                rs.state = "finishing"

    # ---------------------------------------------------------------- stragglers
    def _recovering(self, replica: int) -> tuple[int, ...]:
        """The other replicas starting, dead, healing, or training again for less than the
        hold (`runtime.control.straggler.recovering_replicas`' local counterpart)."""
        hold = self.cfg.straggler_recovery_hold_s
        now = time.monotonic()
        return tuple(
            r.replica
            for r in self.replicas
            if r.replica != replica
            and r.state not in ("done", "out", "finishing")
            and (
                r.state in ("starting", "dead", "healing")
                or r.training_since is None
                # Training again after a restart; a first start is no recovery to wait out.
                or (r.incarnation > 0 and now - r.training_since < hold)
            )
        )

    def _observe_timing(self, rs: LocalReplica, ev: dict[str, Any]) -> None:
        from runtime.control.straggler.detect import TimingSample

        compute = ev.get("compute_s")
        self.stragglers.observe_sample(
            TimingSample(
                replica=rs.replica,
                step=int(ev["step"]),
                received_at=time.monotonic(),
                compute_s=float(compute) if compute is not None else None,
                incarnation=str(ev["incarnation"]),
                healing=bool(ev.get("healing")),
                step_time_s=ev.get("step_s"),
                allreduce_wait_s=ev.get("wait_s"),
                nodes=(f"local-r{rs.replica}-i{rs.incarnation}",),
            ),
            evidence=not self._recovering(rs.replica),
        )

    def _evict_stragglers(self) -> None:
        if self._any_done:
            return  # the run is ending: nothing left to gain
        participants = sum(1 for r in self.replicas if r.state in ("training", "healing"))
        in_flight = any(r.state in ("dead", "starting") for r in self.replicas)
        recovering = self._recovering(-1)
        for d in self.stragglers.decisions(participants, time.monotonic(), in_flight, recovering):
            rs = self.replicas[d.replica]
            self.straggler_decisions.append(
                {**d.to_dict(), "t": time.time(), "step": rs.step, "incarnation": rs.incarnation}
            )
            if d.action == "evict" and rs.state in ("training", "healing") and not self._any_done:
                self._inject(rs, "straggler")
                self.failures[-1].detail = d.reason or d.why

    # ---------------------------------------------------------------- faults
    def _inject(self, rs: LocalReplica, kind: str) -> None:
        self.failures.append(Failure(rs.replica, kind, rs.step, time.time()))
        self._kill(rs)
        rs.state = "dead"

    def _supervise(self, rs: LocalReplica) -> None:
        if rs.state in ("done", "out"):
            return
        codes = [p.poll() for p in rs.procs]
        if rs.state != "dead" and all(c == 0 for c in codes):
            rs.state = "done"
            self._any_done = True
            return
        failed = [c for c in codes if c is not None and c != 0]
        if rs.state != "dead" and not failed:
            return
        self._kill(rs)
        codes = [p.poll() for p in rs.procs]
        rs.exit_codes = [c if c is not None else -9 for c in codes]
        if rs.state != "dead":  # died on its own
            self.failures.append(Failure(rs.replica, "crash", rs.step, time.time()))
        mine = [f for f in self.failures if f.replica == rs.replica]
        mine[-1].exit_codes = rs.exit_codes
        if self._any_done:
            rs.state = "out"
            return
        now = time.time()
        if now < mine[-1].t_kill + self.cfg.restart_delay_s or self._outage_left(mine[-1]):
            rs.state = "dead"  # collected; restarted on a later pass
            return
        rs.restarts = [t for t in rs.restarts if now - t < self.cfg.restart_window_s]
        if len(rs.restarts) >= self.cfg.max_restarts_per_replica:
            rs.state = "out"
            return
        rs.restarts.append(now)
        rs.incarnation += 1
        for f in reversed(self.failures):
            if f.replica == rs.replica and f.t_restart is None:
                f.t_restart = now
                break
        self._launch(rs)

    def _outage_left(self, failure: Failure) -> bool:
        """The outage of a replica killed by the configured kills (`restart_after_steps`) is not
        over yet. A crash, a chaos kill or an eviction restarts as usual: the outage is a planned
        fault, not a policy for every death."""
        after = self.cfg.restart_after_steps
        if not after or failure.kind != "injected":
            return False
        return max(r.step for r in self.replicas) < failure.step + after

    # ---------------------------------------------------------------- main loop
    def run(self) -> RunSummary:
        """Run to the end, a failure, the timeout, or SIGTERM/SIGINT; every process it started
        is stopped before it returns the summary."""
        previous: dict[int, Any] = {}
        with contextlib.suppress(ValueError):  # not the main thread: no signal handling
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, self._on_signal)
        try:
            return self._run()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _run(self) -> RunSummary:
        cfg = self.cfg
        cfg.run_dir.mkdir(parents=True, exist_ok=True)
        self._t0 = time.time()
        error = None
        try:
            self._starting = True
            try:
                self.start_lighthouse()
            except StoppedBySignal:
                pass  # stop_signal is set: nothing is launched, the loop ends at once
            finally:
                self._starting = False
            for rs in self.replicas:
                if self.stop_signal is None:
                    self._launch(rs)
            deadline = time.monotonic() + cfg.run_timeout_s
            while True:
                if self.stop_signal is not None:
                    name = signal.Signals(self.stop_signal).name
                    error = f"stopped by {name} after {time.time() - self._t0:.0f}s"
                    break
                for rs in self.replicas:
                    self._read_progress(rs)
                self._degrade()
                self.faults.tick(self.replicas, self._any_done)
                self._evict_stragglers()
                for rs in self.replicas:
                    self._supervise(rs)
                if self.on_update is not None:
                    self.on_update(self.replicas)
                active = [r for r in self.replicas if r.state not in ("done", "out")]
                if not active:
                    break
                alive = [r for r in self.replicas if r.state != "out"]
                if len(alive) < cfg.min_replicas:
                    error = (
                        f"only {len(alive)} replicas left, below min_replicas={cfg.min_replicas}"
                    )
                    break
                if time.monotonic() > deadline:
                    error = f"run did not finish within {cfg.run_timeout_s:.0f}s"
                    break
                time.sleep(0.05)
        finally:
            self.shutdown()
        for rs in self.replicas:
            self._read_progress(rs)
        return self.summarize(error)

    def summarize(self, error: str | None = None) -> RunSummary:
        return summarize(
            self.cfg,
            self.replicas,
            self.failures,
            started=self._t0,
            error=error,
            straggler_decisions=self.straggler_decisions,
            stop_signal=self.stop_signal,
        )


def launch(
    cfg: LaunchConfig, on_update: Callable[[list[LocalReplica]], None] | None = None
) -> RunSummary:
    return LocalLauncher(cfg, on_update).run()
