"""The verdict of a local run, judged from the workers' own files in the run directory.

Per-replica progress events (`progress/r*.jsonl`), the data ledger (`ledger/r*.jsonl`) and the
final local shards (`final/r*_rank*.pt`), together with the failures the launcher saw, give how
many steps committed, each healthy replica's stall (its longest gap between commits over a
failure's outage, minus a normal step), each restarted replica's time to rejoin, whether the final
weights agree, the ledger's verdict, and the effective training time ratio (ETTR).
"""

from __future__ import annotations

import itertools
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from runtime import ledger
from runtime.local.config import LaunchConfig
from runtime.local.faults import Failure
from runtime.local.replicas import LocalReplica
from runtime.verdict import check_ledger, final_weights_agree
from runtime.worker.outputs import list_final_shards


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


def outage_stall(commits: list[float], t0: float, t1: float, median_step: float) -> float | None:
    """A healthy replica's stall over an outage [t0, t1]: its longest gap between commits that
    overlaps it, minus a normal step. The gap that holds the fault is often a normal one (the
    survivors commit the step the dead replica had contributed to); the wait comes at the next
    quorum. None when the replica committed nothing before t0 or after t1."""
    before = [t for t in commits if t <= t0]
    after = [t for t in commits if t > t1]
    if not (before and after):
        return None
    marks = [before[-1], *(t for t in commits if t0 < t <= t1), after[0]]
    return max(0.0, max(b - a for a, b in itertools.pairwise(marks)) - median_step)


def down_during(failures: list[dict[str, Any]], replica: int, t0: float, t1: float) -> bool:
    """Whether one of the replica's own outages (kill to first full step back) overlaps [t0, t1]:
    then it was not a healthy replica waiting."""
    return any(
        g["replica"] == replica and g["t_kill"] <= t1 and (g.get("t_rejoin") or g["t_kill"]) >= t0
        for g in failures
    )


def healthy_stalls(
    failures: list[dict[str, Any]], commits: dict[int, list[float]], median_step: float
) -> list[float]:
    """Each failure's stall of each replica that stayed up through its outage (from the kill to
    the restarted replica's first full step; only the gap that holds the kill if it never came
    back)."""
    stalls = []
    for f in failures:
        t1 = f.get("t_rejoin") or f["t_kill"]
        for replica, ts in commits.items():
            if replica == f["replica"] or down_during(failures, replica, f["t_kill"], t1):
                continue
            stall = outage_stall(ts, f["t_kill"], t1, median_step)
            if stall is not None:
                stalls.append(stall)
    return stalls


def summarize(
    cfg: LaunchConfig,
    replicas: list[LocalReplica],
    failures: list[Failure],
    *,
    started: float,
    error: str | None = None,
    straggler_decisions: list[dict[str, Any]] | None = None,
    stop_signal: int | None = None,
) -> RunSummary:
    """The run's summary; fills in each restarted replica's join and rejoin times on
    `failures`. `started` is the run's wall-clock start."""
    for f in failures:
        rs = replicas[f.replica]
        if f.t_restart is None:
            continue
        incarnations = [inc for t, _, _, inc in rs.commits if t >= f.t_restart]
        if incarnations:
            inc = incarnations[0]
            f.t_joined = rs.joined.get(inc)
            first = [t for t, _, heal, i in rs.commits if i == inc and not heal]
            f.t_rejoin = first[0] if first else None
    intervals = []
    for rs in replicas:
        ts = [t for t, _, heal, _ in rs.commits if not heal]
        intervals += [b - a for a, b in itertools.pairwise(ts)]
    median_step = statistics.median(intervals) if intervals else 0.0
    commits = {rs.replica: [t for t, *_ in rs.commits] for rs in replicas}
    stalls = healthy_stalls([asdict(f) for f in failures], commits, median_step)
    records = ledger.read_log(sorted((cfg.run_dir / "ledger").glob("r*.jsonl")))
    checked = check_ledger(cfg.run_dir, cfg.steps)
    steps, ledger_ok, problems = checked.steps, checked.ok, checked.problems
    weights_agree = finished_weights_agree(cfg.run_dir, replicas)
    all_commit_t = [t for rs in replicas for t, *_ in rs.commits]
    joined_t = [t for rs in replicas for t in rs.joined.values()]
    ettr = 0.0
    if all_commit_t and joined_t and median_step > 0:
        by_step = {r.step: r.participants for r in records}
        useful = sum(by_step.values()) * median_step
        span = max(all_commit_t) - min(joined_t)
        ettr = min(1.0, useful / (cfg.replicas * span)) if span > 0 else 0.0
    rejoin = [f.t_rejoin - f.t_restart for f in failures if f.t_rejoin and f.t_restart]
    after_load = [f.t_rejoin - f.t_joined for f in failures if f.t_rejoin and f.t_joined]
    ok = error is None and weights_agree and ledger_ok
    return RunSummary(
        steps=steps,
        target_steps=cfg.steps,
        replicas=cfg.replicas,
        failures=[asdict(f) for f in failures],
        weights_agree=weights_agree,
        ledger_ok=ledger_ok,
        ledger_problems=problems[:20],
        max_healthy_stall_s=max(stalls, default=0.0),
        stalls_s=stalls,
        rejoin_s=rejoin,
        rejoin_after_load_s=after_load,
        ettr=ettr,
        median_step_s=median_step,
        wall_s=time.time() - started,
        restarts={rs.replica: len(rs.restarts) for rs in replicas},
        replicas_out=[rs.replica for rs in replicas if rs.state == "out"],
        finished_replicas=sorted(list_final_shards(cfg.run_dir)),
        ok=ok,
        error=error,
        straggler_decisions=straggler_decisions if straggler_decisions is not None else [],
        signal=stop_signal,
    )


def finished_weights_agree(run_dir: Path, replicas: list[LocalReplica]) -> bool:
    """Final local shards of every finished replica are allclose, rank by rank."""
    shards = list_final_shards(run_dir)
    finished = [r.replica for r in replicas if r.state == "done" and r.replica in shards]
    return final_weights_agree(run_dir, finished)
