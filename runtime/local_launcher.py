"""Run an FT-HSDP job on one machine: the lighthouse plus R replicas x W ranks as local processes.

This is the local stand-in for what Slurm and the coordinator do on a cluster: it starts
torchft's lighthouse (the quorum service), starts each replica's ranks with the same environment
contract the sbatch scripts export (`runtime.env`), and restarts a replica whose processes died,
as a requeue would, up to `max_restarts_per_replica` within `restart_window_s`, after which the
replica stays out and the run continues while `min_replicas` hold. Faults can be injected: a
`kill -9` of one replica at a step, or random kills with an exponential inter-arrival time
(chaos). A kill is only injected while another replica is healthy and not healing, because the
committed state lives only in live replicas between durable checkpoints.

The launcher owns its run directory: each run starts from fresh state files (`clear_run_state`)
and the workers get the launcher's own Lighthouse address, never a `control.json`; a directory
that holds a run submitted to Slurm (`jobs.json`) is left alone and the local run goes to its
`local/` subdirectory instead (`local_run_dir`). The Lighthouse gets a start deadline with one
retry (`runtime.control.service.Lighthouse`). On SIGTERM or SIGINT the launcher stops every
process it started (each worker and the Lighthouse run in their own process group, which is
killed) and returns the summary so far, with the signal in `RunSummary.signal`.

Everything it measures comes from the workers' own files in the run directory: per-replica
progress events (`progress/r*.jsonl`), the data ledger (`ledger/r*.jsonl`) and the final local
shards (`final/r*_rank*.pt`). The summary says how many steps committed, the failures injected,
each healthy replica's stall (its longest gap between commits around a failure, minus a normal
step), each restarted replica's time to rejoin, whether the final weights agree, the ledger's
verdict, and the effective training time ratio (ETTR).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from runtime import ledger
from runtime.api_files import list_final_shards
from runtime.control.service import Lighthouse, LighthouseConfig
from runtime.env import Timeouts
from runtime.net import free_port
from runtime.verdict import check_ledger, final_weights_agree


@dataclass
class LaunchConfig:
    run_dir: Path
    command: list[str]
    replicas: int = 2
    ranks_per_replica: int = 2
    steps: int = 50
    min_replicas: int = 1
    max_restarts_per_replica: int = 5
    restart_window_s: float = 600.0
    timeouts: Timeouts = field(default_factory=Timeouts)
    checkpoint_every_steps: int = 0
    checkpoint_every_s: float = 0.0
    job_name: str = "fthsdp"
    kill_replica: int | None = None
    kill_at_step: int | None = None
    chaos_mtbf_s: float | None = None
    seed: int = 0
    extra_env: dict[str, str] = field(default_factory=dict)
    run_timeout_s: float = 600.0
    lighthouse_join_timeout_s: float | None = None
    #: Wait this long after a replica died before restarting it: the local stand-in for the
    #: time Slurm takes to requeue, allocate and run the prolog.
    restart_delay_s: float = 0.0
    #: Keep this many seconds of warm-up before the first chaos kill.
    chaos_warmup_s: float = 3.0
    #: No chaos kill once a replica passed this fraction of the steps, so that restarted
    #: replicas can rejoin before the end and the final weights of all of them can be compared.
    chaos_stop_fraction: float = 0.7
    #: Straggler chaos: this replica's first incarnation runs `slow_factor` times slower (its
    #: "node" is bad); a restart lands on a healthy "node". Detection and eviction run here as
    #: the coordinator runs them on Slurm (`runtime.control.straggler`); eviction = restart.
    slow_replica: int | None = None
    slow_factor: float = 2.0
    straggler_window_steps: int = 50
    straggler_evict: bool = True
    #: The local restart cost the eviction decision weighs until the run measured its own.
    straggler_requeue_cost_s: float = 5.0
    #: The slow replica runs at its normal pace up to this step, then its "node" degrades (a
    #: straggler is slow against its own recent pace too, so it needs a pace to be slower than).
    slow_after_step: int = 20
    #: Straggler detection and eviction hold off while another replica is recovering and for
    #: this long after it trains again.
    straggler_recovery_hold_s: float = 1.0


@dataclass
class Failure:
    replica: int
    kind: str  # "injected" | "chaos" | "crash"
    step: int
    t_kill: float
    t_restart: float | None = None
    t_joined: float | None = None
    t_rejoin: float | None = None
    exit_codes: list[int] = field(default_factory=list)
    detail: str = ""


@dataclass
class ReplicaState:
    replica: int
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    incarnation: int = 0
    restarts: list[float] = field(default_factory=list)
    state: str = "starting"
    step: int = 0
    healing: bool = False
    last_commit_t: float | None = None
    commits: list[tuple[float, int, bool, str]] = field(default_factory=list)
    joined: dict[str, float] = field(default_factory=dict)
    offset: int = 0
    exit_codes: list[int] = field(default_factory=list)
    #: When (monotonic) it last began training after starting or healing.
    training_since: float | None = None


@dataclass
class RunSummary:
    steps: int
    target_steps: int
    replicas: int
    failures: list[dict[str, Any]]
    weights_agree: bool
    ledger_ok: bool
    ledger_problems: list[str]
    max_healthy_stall_s: float
    stalls_s: list[float]
    rejoin_s: list[float]
    rejoin_after_load_s: list[float]
    ettr: float
    median_step_s: float
    wall_s: float
    restarts: dict[int, int]
    replicas_out: list[int]
    finished_replicas: list[int]
    ok: bool
    error: str | None = None
    #: Straggler decisions taken (replica, action, why, t, step), oldest first.
    straggler_decisions: list[dict[str, Any]] = field(default_factory=list)
    #: The signal (SIGTERM, SIGINT) that stopped the run early, if one did.
    signal: int | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def resolve_command(command: str | list[str]) -> list[str]:
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return argv


class StoppedBySignal(Exception):
    """SIGTERM or SIGINT arrived while the Lighthouse was starting."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class LocalLauncher:
    def __init__(
        self, cfg: LaunchConfig, on_update: Callable[[list[ReplicaState]], None] | None = None
    ) -> None:
        self.cfg = cfg
        self.on_update = on_update
        self.rng = random.Random(cfg.seed)
        self.replicas = [ReplicaState(r) for r in range(cfg.replicas)]
        self.failures: list[Failure] = []
        self.lighthouse: Lighthouse | None = None
        self.lighthouse_addr = ""
        self.stop_signal: int | None = None
        self._starting = False
        self._killed_once = False
        self._next_chaos: float | None = None
        self._any_done = False
        self._t0 = 0.0
        from runtime.control.straggler import EvictionConfig, StragglerConfig, StragglerMonitor

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
    def _start_lighthouse(self) -> None:
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
                "FTHSDP_RUN_DIR": str(cfg.run_dir),
                "FTHSDP_REPLICA_ID": str(replica),
                "FTHSDP_NUM_REPLICAS": str(cfg.replicas),
                "FTHSDP_LIGHTHOUSE": self.lighthouse_addr,
                "FTHSDP_JOB_NAME": cfg.job_name,
                "FTHSDP_MIN_REPLICAS": str(cfg.min_replicas),
                "FTHSDP_HEARTBEAT_TIMEOUT_S": str(cfg.timeouts.heartbeat_s),
                "FTHSDP_ALLREDUCE_TIMEOUT_S": str(cfg.timeouts.allreduce_s),
                "FTHSDP_QUORUM_TIMEOUT_S": str(cfg.timeouts.quorum_s),
                "FTHSDP_JOIN_TIMEOUT_S": str(cfg.timeouts.join_s),
                "FTHSDP_CHECKPOINT_EVERY_STEPS": str(cfg.checkpoint_every_steps),
                "FTHSDP_CHECKPOINT_EVERY_S": str(cfg.checkpoint_every_s),
                "FTHSDP_STEPS": str(cfg.steps),
                "RANK": str(rank),
                "WORLD_SIZE": str(cfg.ranks_per_replica),
                "LOCAL_RANK": str(rank),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
                "RUST_LOG": env.get("RUST_LOG", "warn"),
            }
        )
        # This launcher is the control plane: never a control.json (a submit's may be stale).
        env.pop("FTHSDP_CONTROL_FILE", None)
        env.update(cfg.extra_env)
        return env

    def _launch(self, rs: ReplicaState) -> None:
        port = free_port()
        rs.procs = []
        logs = self.cfg.run_dir / "logs"
        for rank in range(self.cfg.ranks_per_replica):
            out = open(logs / f"r{rs.replica}_w{rank}_i{rs.incarnation}.log", "wb")  # noqa: SIM115
            env = self._env(rs.replica, rank, port)
            if rs.replica == self.cfg.slow_replica and rs.incarnation == 0:
                env["FTHSDP_SLOW_FILE"] = str(self._slow_file(rs))
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

    def _kill(self, rs: ReplicaState) -> None:
        for p in rs.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
        for p in rs.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)

    def _slow_file(self, rs: ReplicaState) -> Path:
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
    def _read_progress(self, rs: ReplicaState) -> None:
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
                or now - r.training_since < hold
            )
        )

    def _observe_timing(self, rs: ReplicaState, ev: dict[str, Any]) -> None:
        from runtime.control.straggler import TimingSample

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
    def _healthy_others(self, victim: ReplicaState) -> bool:
        now = time.time()
        # The launcher's view of a replica lags its processes: one that just died on its own still
        # reads "training" until `_supervise` collects it, so ask the processes too.
        return any(
            o is not victim
            and o.state == "training"
            and o.last_commit_t is not None
            and now - o.last_commit_t < 2.0
            and all(p.poll() is None for p in o.procs)
            for o in self.replicas
        )

    def _inject(self, rs: ReplicaState, kind: str) -> None:
        self.failures.append(Failure(rs.replica, kind, rs.step, time.time()))
        self._kill(rs)
        rs.state = "dead"

    def _faults(self) -> None:
        cfg = self.cfg
        if cfg.kill_replica is not None and cfg.kill_at_step is not None and not self._killed_once:
            rs = self.replicas[cfg.kill_replica]
            due = rs.state == "training" and rs.step >= cfg.kill_at_step
            if due and (self._healthy_others(rs) or cfg.replicas == 1):
                self._killed_once = True
                self._inject(rs, "injected")
        if cfg.chaos_mtbf_s:
            now = time.monotonic()
            if self._next_chaos is None:
                self._next_chaos = (
                    now + cfg.chaos_warmup_s + self.rng.expovariate(1 / cfg.chaos_mtbf_s)
                )
            elif (
                now >= self._next_chaos
                and not self._any_done
                and max(r.step for r in self.replicas) < cfg.chaos_stop_fraction * cfg.steps
            ):
                candidates = [
                    r for r in self.replicas if r.state == "training" and self._healthy_others(r)
                ]
                if candidates:
                    self._inject(self.rng.choice(candidates), "chaos")
                    self._next_chaos = now + self.rng.expovariate(1 / cfg.chaos_mtbf_s)

    def _supervise(self, rs: ReplicaState) -> None:
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
        if now < mine[-1].t_kill + self.cfg.restart_delay_s:
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
                self._start_lighthouse()
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
                self._faults()
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

    # ---------------------------------------------------------------- summary
    def summarize(self, error: str | None = None) -> RunSummary:
        cfg = self.cfg
        for f in self.failures:
            rs = self.replicas[f.replica]
            if f.t_restart is None:
                continue
            incarnations = [inc for t, _, _, inc in rs.commits if t >= f.t_restart]
            if incarnations:
                inc = incarnations[0]
                f.t_joined = rs.joined.get(inc)
                first = [t for t, _, heal, i in rs.commits if i == inc and not heal]
                f.t_rejoin = first[0] if first else None
        intervals = []
        for rs in self.replicas:
            ts = [t for t, _, heal, _ in rs.commits if not heal]
            intervals += [b - a for a, b in itertools.pairwise(ts)]
        median_step = statistics.median(intervals) if intervals else 0.0
        stalls = []
        for f in self.failures:
            for rs in self.replicas:
                if rs.replica == f.replica:
                    continue
                before = [t for t, *_ in rs.commits if t <= f.t_kill]
                after = [t for t, *_ in rs.commits if t > f.t_kill]
                if not (before and after):
                    continue
                # A replica killed itself within this gap was not a healthy one waiting.
                if any(
                    g.replica == rs.replica and before[-1] < g.t_kill < after[0]
                    for g in self.failures
                ):
                    continue
                stalls.append(max(0.0, after[0] - before[-1] - median_step))
        records = ledger.read_log(sorted((cfg.run_dir / "ledger").glob("r*.jsonl")))
        checked = check_ledger(cfg.run_dir, cfg.steps)
        steps, ledger_ok, problems = checked.steps, checked.ok, checked.problems
        weights_agree = self._weights_agree()
        all_commit_t = [t for rs in self.replicas for t, *_ in rs.commits]
        joined_t = [t for rs in self.replicas for t in rs.joined.values()]
        ettr = 0.0
        if all_commit_t and joined_t and median_step > 0:
            by_step = {r.step: r.participants for r in records}
            useful = sum(by_step.values()) * median_step
            span = max(all_commit_t) - min(joined_t)
            ettr = min(1.0, useful / (cfg.replicas * span)) if span > 0 else 0.0
        rejoin = [f.t_rejoin - f.t_restart for f in self.failures if f.t_rejoin and f.t_restart]
        after_load = [f.t_rejoin - f.t_joined for f in self.failures if f.t_rejoin and f.t_joined]
        ok = error is None and weights_agree and ledger_ok
        return RunSummary(
            steps=steps,
            target_steps=cfg.steps,
            replicas=cfg.replicas,
            failures=[asdict(f) for f in self.failures],
            weights_agree=weights_agree,
            ledger_ok=ledger_ok,
            ledger_problems=problems[:20],
            max_healthy_stall_s=max(stalls, default=0.0),
            stalls_s=stalls,
            rejoin_s=rejoin,
            rejoin_after_load_s=after_load,
            ettr=ettr,
            median_step_s=median_step,
            wall_s=time.time() - self._t0,
            restarts={rs.replica: len(rs.restarts) for rs in self.replicas},
            replicas_out=[rs.replica for rs in self.replicas if rs.state == "out"],
            finished_replicas=sorted(list_final_shards(cfg.run_dir)),
            ok=ok,
            error=error,
            straggler_decisions=self.straggler_decisions,
            signal=self.stop_signal,
        )

    def _weights_agree(self) -> bool:
        """Final local shards of every finished replica are allclose, rank by rank."""
        shards = list_final_shards(self.cfg.run_dir)
        finished = [r.replica for r in self.replicas if r.state == "done" and r.replica in shards]
        return final_weights_agree(self.cfg.run_dir, finished)


def launch(
    cfg: LaunchConfig, on_update: Callable[[list[ReplicaState]], None] | None = None
) -> RunSummary:
    return LocalLauncher(cfg, on_update).run()


def config_from_spec(
    spec: Any,
    *,
    replicas: int | None = None,
    ranks_per_replica: int | None = None,
    steps: int | None = None,
    run_dir: Path | None = None,
    **faults: Any,
) -> LaunchConfig:
    """A `LaunchConfig` from a `slurm.spec.JobSpec` (CLI options override the spec)."""
    from slurm.errors import InputError

    train = spec.train
    timeouts = Timeouts(
        heartbeat_s=float(train.heartbeat_timeout_s),
        allreduce_s=float(train.allreduce_timeout_s),
        quorum_s=float(train.quorum_timeout_s),
        join_s=float(train.join_timeout_s),
    )
    if (why := timeouts.problem()) is not None:
        raise InputError("train.allreduce_timeout_s", train.allreduce_timeout_s, why)
    per_node = spec.replicas.tasks_per_node or max(spec.replicas.gpus_per_node, 1)
    count = replicas if replicas is not None else spec.replicas.count
    if count < 1:
        raise InputError("--replicas", count, "at least 1")
    ranks = ranks_per_replica if ranks_per_replica is not None else spec.replicas.nodes * per_node
    if ranks < 1:
        raise InputError("--ranks-per-replica", ranks, "at least 1")
    kill = faults.get("kill_replica")
    if kill is not None and not 0 <= kill < count:
        raise InputError("--kill-replica", kill, f"a replica id in 0..{count - 1}")
    slow = faults.get("slow_replica")
    if slow is not None and not 0 <= slow < count:
        raise InputError("--slow-replica", slow, f"a replica id in 0..{count - 1}")
    factor = faults.get("slow_factor", 2.0)
    if not 1.0 <= factor <= 100.0:
        raise InputError("--slow-factor", factor, "a factor in [1, 100]")
    return LaunchConfig(
        run_dir=run_dir if run_dir is not None else Path(spec.job.run_dir),
        command=resolve_command(train.command),
        replicas=count,
        ranks_per_replica=ranks,
        steps=steps if steps is not None else (train.steps or 100),
        min_replicas=min(train.min_replicas, count),
        max_restarts_per_replica=train.max_restarts_per_replica,
        restart_window_s=float(train.restart_window_s),
        timeouts=timeouts,
        checkpoint_every_steps=train.checkpoint_every_steps,
        checkpoint_every_s=float(train.checkpoint_every_s),
        job_name=spec.job.name,
        **faults,
    )


#: Run-directory entries a fresh local run clears (durable checkpoints are kept with --resume).
RUN_STATE = (
    "progress",
    "ledger",
    "final",
    "logs",
    "finished",
    "slow",
    "rendezvous",
    "control.json",
    "control.sqlite",
    "control.sqlite-wal",
    "control.sqlite-shm",
)
#: Where a local run goes inside a directory that holds a run submitted to Slurm.
LOCAL_SUBDIR = "local"


def local_run_dir(run_dir: Path) -> tuple[Path, str | None]:
    """The directory a local run owns for `run_dir`, and a note when it is not `run_dir`
    itself: a directory with a submitted run (`jobs.json`) is that run's, so the local run
    goes to its `local/` subdirectory and leaves the submitted run's files alone."""
    if (run_dir / "jobs.json").exists():
        own = run_dir / LOCAL_SUBDIR
        return own, f"{run_dir} holds a run submitted to Slurm; this local run uses {own}"
    return run_dir, None


def clear_run_state(run_dir: Path, keep_checkpoints: bool) -> None:
    import shutil

    names = RUN_STATE if keep_checkpoints else (*RUN_STATE, "checkpoints")
    for name in names:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
