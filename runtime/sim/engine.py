"""Monte Carlo discrete-event model of a training job under failures: synchronous vs FT-HSDP.

Why a simulator: nobody can test a recovery design at 100K GPUs, and the answer to "how many
replicas, how often to checkpoint" depends on how recovery costs and failure rates interact
(a second failure during a recovery, a replica out while its peers train at (R-1)/R). This
module plays that out event by event, many runs at once.

The model, in one paragraph. Hardware failures arrive as a Poisson process over the job's nodes
(plus optional rack events that take out `rack_span_replicas` adjacent replicas at once). The job
is R replicas; the synchronous job is the special case R = 1 with all GPUs in it. A failure that
hits a training replica takes it out. If a healthy peer remains, the peers stall for the quorum
timeout (`quorum_stall_s`) and go on at n_up/R throughput while the failed replica is detected,
reallocated (partial allocation), initialises NCCL at replica scale and fetches the state from a
peer. If no healthy replica remains, the job's state is lost: work since the last checkpoint is
thrown away and every replica restarts from the checkpoint (detection, full allocation, NCCL
init, checkpoint load). Either way, a (re)joining replica's slow first step stalls everyone it
joins for `first_step_s - step_s` (a synchronous allreduce waits for its slowest member). A
failure that lands on a replica still being detected or allocated is absorbed by the allocation
in progress; one that lands after its new allocation started (NCCL init, load, fetch) restarts
its recovery. Checkpoints are written every `tau` seconds of training (given, or Young/Daly for
the mode's state-loss MTBF) and stop the job for `checkpoint_write_s`.

Vectorisation: the K Monte Carlo runs advance in lockstep; each loop iteration handles the next
event (a failure or a rejoin) of every run with numpy array operations, so the Python overhead is
paid once per event index, not once per event. The pure model lives here; the CLI only formats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from runtime.sim.params import SECONDS_PER_DAY, SimParams

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

_Z95 = 1.959963984540054


@dataclass(frozen=True)
class ModeRuns:
    """Per-run outcomes of one mode (sync, or FT-HSDP with `replicas` replicas)."""

    mode: str
    replicas: int
    horizon_s: float
    checkpoint_interval_s: float
    useful_s: FloatArray  # job-equivalent seconds of kept training
    write_s: FloatArray  # wall seconds spent writing checkpoints
    lost_work_s: FloatArray  # training thrown away by rollbacks to a checkpoint
    failures: IntArray  # failures that interrupted a replica (training or restarting)
    absorbed: IntArray  # failures absorbed by an allocation already in progress
    job_losses: IntArray  # failures that left no healthy replica (rollback to checkpoint)
    recoveries: IntArray  # replica (re)joins
    recovery_s: FloatArray  # summed failure-to-training-again time of those rejoins
    spare_moves: IntArray | None = None  # replacements that came from a spare slot
    spare_nodes: int = 0  # nodes held idle besides the job's own
    nodes: int = 0  # the job's own nodes

    @property
    def ettr(self) -> FloatArray:
        return self.useful_s / self.horizon_s

    @property
    def events(self) -> int:
        return int(self.failures.sum() + self.absorbed.sum() + self.recoveries.sum())

    def summary(self) -> dict[str, Any]:
        """Means over runs with 95 % confidence intervals (normal approximation)."""
        ettr = self.ettr
        runs = ettr.size
        mean = float(ettr.mean())
        half = float(_Z95 * ettr.std(ddof=1) / math.sqrt(runs)) if runs > 1 else math.nan
        failures = int(self.failures.sum())
        recoveries = int(self.recoveries.sum())
        stalled = float((self.horizon_s - self.useful_s - self.write_s).sum())
        days = self.horizon_s / SECONDS_PER_DAY
        return {
            "mode": self.mode,
            "replicas": self.replicas,
            "runs": runs,
            "ettr": mean,
            "ettr_ci95": [mean - half, mean + half] if runs > 1 else None,
            "stall_s_mean": stalled / failures if failures else None,
            "recovery_s_mean": float(self.recovery_s.sum()) / recoveries if recoveries else None,
            "lost_work_s_mean": float(self.lost_work_s.sum()) / failures if failures else None,
            "checkpoint_overhead": float(self.write_s.mean()) / self.horizon_s,
            "checkpoint_interval_s": (
                self.checkpoint_interval_s if math.isfinite(self.checkpoint_interval_s) else None
            ),
            "failures_per_day": failures / runs / days,
            "absorbed_per_day": float(self.absorbed.sum()) / runs / days,
            "job_losses_per_day": float(self.job_losses.sum()) / runs / days,
            "spare_nodes": self.spare_nodes,
            # ETTR counted over every node held, spares included: what the spares cost.
            "ettr_per_node_held": (
                mean * self.nodes / (self.nodes + self.spare_nodes) if self.nodes else mean
            ),
            "spare_moves_per_day": (
                float(self.spare_moves.sum()) / runs / days if self.spare_moves is not None else 0
            ),
        }


class _Lockstep:
    """State of K runs of one mode, advanced together one event index at a time."""

    def __init__(self, p: SimParams, replicas: int, mode: str, rng: np.random.Generator) -> None:
        k, r = p.runs, replicas
        self.mode = mode
        shaped = p.with_changes(replicas=r)
        self.p, self.r, self.k, self.rng = p, r, k, rng
        self.horizon = p.horizon_s
        self.tau = shaped.checkpoint_interval_for(r)
        self.tw = p.checkpoint_write_s
        self.node_rate = p.nodes * p.node_failure_rate_per_s
        self.rack_rate = p.rack_failures_per_day / SECONDS_PER_DAY
        self.total_rate = self.node_rate + self.rack_rate
        self.span = min(p.rack_span_replicas, r)
        self.part_alloc_end = p.detection_s + p.alloc_partial_s
        self.part_total = shaped.replica_restart_s()
        self.job_alloc_end = p.detection_s + p.alloc_full_s
        self.job_total = shaped.job_restart_s()
        self.excess = p.first_step_excess_s
        self.qstall = p.quorum_stall_s
        # Replacement capacity: per-replica reallocation = detection + alloc + rest, where alloc
        # is a move into a spare slot, or the queue (alloc_partial_s + an exponential wait).
        self.detect = p.detection_s
        self.rest = self.part_total - p.detection_s - p.alloc_partial_s
        self.alloc = p.alloc_partial_s
        self.qwait = p.queue_wait_s
        self.move = p.spare_move_s
        # A replica moved into a warm slot skips its processes' start: only the catch-up is left.
        self.rest_warm = p.catchup_s if p.spare_kind == "warm" else self.rest
        self.slot_free_at = np.zeros((k, shaped.spare_slots if r > 1 else 0))
        self.spare_moves = np.zeros(k, dtype=np.int64)

        self.t = np.zeros(k)
        self.stall_until = np.zeros(k)
        self.phase = np.zeros(k)  # position in the train(tau) + write(tw) checkpoint cycle
        self.since = np.zeros(k)  # kept-if-no-loss progress since the last checkpoint
        self.useful = np.zeros(k)
        self.written = np.zeros(k)
        self.lost = np.zeros(k)
        self.up = np.ones((k, r), dtype=bool)
        self.down_until = np.full((k, r), np.inf)
        self.vuln_from = np.full((k, r), np.inf)
        self.episode_start = np.zeros((k, r))
        self.failures = np.zeros(k, dtype=np.int64)
        self.absorbed = np.zeros(k, dtype=np.int64)
        self.job_losses = np.zeros(k, dtype=np.int64)
        self.recoveries = np.zeros(k, dtype=np.int64)
        self.recovery_s = np.zeros(k)

    # ---- training between events -----------------------------------------------------------
    def _advance(self, dt: FloatArray, rate: FloatArray) -> None:
        tau, tw = self.tau, self.tw
        if math.isinf(tau) or tau == 0.0:
            trained = dt
            # tau == 0 only when writes are free: everything is committed at once.
            self.since = self.since + rate * dt if math.isinf(tau) else np.zeros_like(dt)
        else:
            cycle = tau + tw
            x = self.phase + dt
            n = np.floor(x / cycle)
            rem = x - n * cycle
            trained = n * tau + np.minimum(rem, tau) - np.minimum(self.phase, tau)
            self.since = np.where(n >= 1, rate * np.minimum(rem, tau), self.since + rate * trained)
            self.phase = rem
        self.useful += rate * trained
        self.written += np.maximum(dt - trained, 0.0)

    # ---- events ----------------------------------------------------------------------------
    def _rejoin(self, rows: npt.NDArray[np.bool_]) -> None:
        back = rows[:, None] & (self.down_until <= self.t[:, None])
        t_col = self.t[:, None]
        self.recoveries += back.sum(axis=1)
        self.recovery_s += np.where(back, t_col + self.excess - self.episode_start, 0.0).sum(axis=1)
        self.up |= back
        self.down_until[back] = np.inf
        self.vuln_from[back] = np.inf
        self.stall_until = np.where(
            rows, np.maximum(self.stall_until, self.t + self.excess), self.stall_until
        )

    def _hit(self, rows: npt.NDArray[np.int64], replica: npt.NDArray[np.int64]) -> None:
        """One failure on `replica` of each run in `rows` (one replica per run)."""
        t = self.t[rows]
        was_up = self.up[rows, replica]
        interrupts = was_up | (t >= self.vuln_from[rows, replica])
        self.absorbed[rows[~interrupts]] += 1
        rows, replica, t, was_up = (
            rows[interrupts],
            replica[interrupts],
            t[interrupts],
            was_up[interrupts],
        )
        if rows.size == 0:
            return
        self.failures[rows] += 1
        self.episode_start[rows[was_up], replica[was_up]] = t[was_up]
        self.up[rows, replica] = False
        peers = self.up[rows].any(axis=1)

        # A healthy peer remains: only this replica restarts; the peers wait for the quorum.
        pr, prep, pt = rows[peers], replica[peers], t[peers]
        alloc, moved = self._replacement(pr, pt)
        rest = np.where(moved, self.rest_warm, self.rest)
        self.down_until[pr, prep] = pt + self.detect + alloc + rest
        self.vuln_from[pr, prep] = pt + self.detect + alloc
        stalled = was_up[peers]
        self.stall_until[pr[stalled]] = np.maximum(
            self.stall_until[pr[stalled]], pt[stalled] + self.qstall
        )

        # No healthy replica left: the state is lost; the whole job restarts from its checkpoint.
        lr, lt = rows[~peers], t[~peers]
        self.job_losses[lr[was_up[~peers]]] += 1
        self.useful[lr] -= self.since[lr]
        self.lost[lr] += self.since[lr]
        self.since[lr] = 0.0
        self.phase[lr] = 0.0
        self.up[lr] = False
        self.down_until[lr] = (lt + self.job_total)[:, None]
        self.vuln_from[lr] = (lt + self.job_alloc_end)[:, None]

    def _wait(self, n: int) -> FloatArray:
        return self.rng.exponential(self.qwait, n) if self.qwait > 0 else np.zeros(n)

    def _replacement(
        self, rows: npt.NDArray[np.int64], t: FloatArray
    ) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
        """Seconds from detection to nodes for a failed replica of each run in `rows` (at `t`),
        and whether it moved into a slot: a free spare slot (`spare_move_s`), else the queue
        (`alloc_partial_s` + a wait), or a slot that comes back before the queue answers. A used
        slot is refilled via the queue."""
        queued = self.alloc + self._wait(rows.size)
        if self.slot_free_at.shape[1] == 0 or rows.size == 0:
            return queued, np.zeros(rows.size, dtype=bool)
        free_at = self.slot_free_at[rows]
        j = free_at.argmin(axis=1)
        ready = np.maximum(free_at[np.arange(rows.size), j] - t, 0.0)
        use = ready + self.move < queued
        alloc = np.where(use, ready + self.move, queued)
        self.slot_free_at[rows[use], j[use]] = (
            t[use] + ready[use] + self.alloc + self._wait(int(use.sum()))
        )
        self.spare_moves[rows[use]] += 1
        return alloc, use

    def _fail(self, rows: npt.NDArray[np.bool_]) -> None:
        idx = np.flatnonzero(rows)
        first = self.rng.integers(0, self.r, size=idx.size)
        is_rack = self.rng.random(idx.size) < (self.rack_rate / self.total_rate)
        self._hit(idx, first)
        for j in range(1, self.span):
            sel = is_rack
            self._hit(idx[sel], (first[sel] + j) % self.r)

    def run(self) -> ModeRuns:
        k, horizon = self.k, self.horizon
        scale = 1.0 / self.total_rate if self.total_rate > 0 else math.inf
        while True:
            active = self.t < horizon
            if not active.any():
                break
            tf = self.t + (self.rng.exponential(scale, k) if math.isfinite(scale) else np.inf)
            tr = self.down_until.min(axis=1)
            te = np.where(active, np.minimum(np.minimum(tf, tr), horizon), self.t)
            n_up = self.up.sum(axis=1)
            # The job trains (and checkpoints) only while some replica is up and none stalls it.
            dt = np.where(
                n_up > 0, np.clip(te - np.maximum(self.t, self.stall_until), 0.0, None), 0.0
            )
            self._advance(dt, n_up / self.r)
            self.t = te
            live = active & (te < horizon)
            rejoin = live & (tr <= tf)
            if rejoin.any():
                self._rejoin(rejoin)
            fail = live & ~rejoin
            if fail.any():
                self._fail(fail)
        return ModeRuns(
            mode=self.mode,
            replicas=self.r,
            horizon_s=horizon,
            checkpoint_interval_s=self.tau,
            useful_s=self.useful,
            write_s=self.written,
            lost_work_s=self.lost,
            failures=self.failures,
            absorbed=self.absorbed,
            job_losses=self.job_losses,
            recoveries=self.recoveries,
            recovery_s=self.recovery_s,
            spare_moves=self.spare_moves,
            spare_nodes=self.p.spare_nodes if self.r > 1 else 0,
            nodes=self.p.nodes,
        )


def simulate_mode(p: SimParams, replicas: int, *, stream: int, mode: str = "fthsdp") -> ModeRuns:
    """Run `p.runs` Monte Carlo runs with `replicas` replicas (1 = synchronous training).

    Synchronous training is FT-HSDP's degenerate case: one replica holding every GPU, so each
    failure loses the job's state, reallocates everything and initialises NCCL at full scale.
    `stream` picks an independent random stream of `p.seed`.
    """
    p.with_changes(replicas=replicas).validated()
    rng = np.random.default_rng([p.seed, stream])
    return _Lockstep(p, replicas, mode, rng).run()


@dataclass(frozen=True)
class Comparison:
    """Synchronous vs FT-HSDP for one replica count."""

    sync: ModeRuns
    fthsdp: ModeRuns

    def record(self, params: SimParams) -> dict[str, Any]:
        return {
            "replicas": self.fthsdp.replicas,
            "sync": self.sync.summary(),
            "fthsdp": self.fthsdp.summary(),
            "params": params.with_changes(replicas=self.fthsdp.replicas).as_dict(),
            "control_plane": params.control_load(self.fthsdp.replicas).as_dict(),
        }


def compare(p: SimParams, replica_counts: list[int] | None = None) -> list[Comparison]:
    """Synchronous training once, FT-HSDP for each replica count (default: `p.replicas`).

    Sync and each FT-HSDP replica count draw from their own random streams of `p.seed`, so
    adding a count to a sweep does not change the others' results.
    """
    p.validated()
    counts = replica_counts or [p.replicas]
    for r in counts:
        p.with_changes(replicas=r).validated()
    sync = simulate_mode(p, 1, stream=0, mode="sync")
    return [Comparison(sync=sync, fthsdp=simulate_mode(p, r, stream=r)) for r in counts]


def spares_sweep(
    p: SimParams, spare_nodes: list[int], kinds: tuple[str, ...] = ("cold", "warm")
) -> list[dict[str, Any]]:
    """FT-HSDP with `p.replicas` replicas for each spare node count and slot kind: ETTR vs K,
    cold against warm slots (no spares is one row, whatever the kind).

    Every row replays the same random stream (common random numbers), so the differences
    between rows are the spares' doing, not the draw's."""
    p.validated()
    out = []
    for k in spare_nodes:
        for kind in kinds if k else kinds[:1]:
            q = p.with_changes(spare_nodes=k, spare_kind=kind).validated()
            runs = simulate_mode(q, q.replicas, stream=q.replicas)
            row = {"spare_nodes": k, "spare_kind": kind if k else "-"}
            out.append({**row, "spare_slots": q.spare_slots, **runs.summary()})
    return out
