"""Fault -> replacement participating on an idle dev cluster: a warm spare, a cold spare, none.

One health-gated dev cluster (4 nodes; root, slurm-wlm, munge) for the whole benchmark; each run
is the scenario of `tests/test_story_spares_warm.py`, run by the job user through the site
install: 2 one-node replicas of `examples/train_tiny.py` + the control job, an Xid 79 into
replica 1's node.

- warm (`[spares] nodes = 1`, `warm = true`): the slot's processes wait with the model built;
  replica 1's identity is handed to them;
- cold (`[spares] nodes = 1`): the slot's agent starts replica 1's script in the slot;
- none: replica 1's job is requeued and Slurm starts it on an idle node (Prolog included);
- warm, heartbeat 2 s: warm, with `train.heartbeat_timeout_s = 2` (the Lighthouse forgets the
  dead replica later; the default is 0.5 s, 2 s until 2026-12).

Stages, seconds from the injection: detect (the fatal report, journal), requeued (the Requeue
journaled done: the move into the slot, or `scontrol requeue`; the report and the action are
journaled within a few ms of each other); then from that: start (-> the `start` record in
replica 1's progress log: its Manager built, warm or not), join + catch-up (-> its first
committed step there: it participates); and fault -> participating as `fthsdp status` saw it
(the leaders' status reports, sent at most once a second while nothing changes). The three run
interleaved, `--repeat` times (default 5); medians and ranges go to
benchmarks/figures/warm_spares.json.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import user_harness  # noqa: E402
from control_harness import clean_up, fthsdp  # noqa: E402
from test_story_spares_full_cluster import (  # noqa: E402
    advancing_in,
    reps,
    spec_text,
    steady,
    wait_status,
)

from benchmarks.harness import Run, interleave, ratios, repeats_arg  # noqa: E402
from benchmarks.site_cluster import site_cluster  # noqa: E402
from prolog_epilog import dev_health  # noqa: E402
from runtime.control.journal.store import Journal  # noqa: E402
from slurm import devcluster  # noqa: E402

KINDS = ("warm", "cold", "none", "warm, heartbeat 2 s")
STAGES = ("detect_s", "requeued_s", "start_s", "catchup_s", "participating_s")
TARGETS = {"warm": "≤ 3 s", "cold": "≤ 8 s", "none": "≤ 10 s", "warm, heartbeat 2 s": "≤ 3 s"}
#: Fault -> participating of one kind over another's, repeat by repeat.
RATIOS = (
    ("warm", "cold"),
    ("warm", "none"),
    ("cold", "none"),
    ("warm", "warm, heartbeat 2 s"),
)
RATIO_LABEL = "fault → participating, {num} / {den} (same repeat)"


def stages(run_dir: Path, fault_at: float) -> dict[str, Any]:
    """The stages of replica 1's way back: the journal for the coordinator's side, replica 1's
    progress log for its start and its first committed step (read once the run has ended)."""
    journal = Journal.in_run_dir(run_dir)
    try:
        events: list[Any] = [ev for _, ev in journal.events()]
    finally:
        journal.close()
    fatal = next(
        e.at
        for e in events
        if type(e).__name__ == "ReportReceived"
        and e.report.replica == 1
        and e.report.kind == "fatal"
        and e.at >= fault_at
    )
    db = sqlite3.connect(run_dir / "control.sqlite")
    try:
        (requeued,) = db.execute(
            "SELECT MIN(a.at) FROM attempts a JOIN actions b ON a.action_id = b.id "
            "WHERE b.type = 'Requeue' AND a.outcome = 'done' AND a.at >= ?",
            (fault_at,),
        ).fetchone()
    finally:
        db.close()
    progress = [
        json.loads(line)
        for line in (run_dir / "progress" / "r1.jsonl").read_text().splitlines()
        if line.strip()
    ]
    start = next(e for e in progress if e["event"] == "start" and e["t"] > requeued)
    commit = next(
        e for e in progress if e["event"] == "commit" and e["incarnation"] == start["incarnation"]
    )
    mine = [e for e in progress if e.get("incarnation") == start["incarnation"]]
    first = {k: next((e["t"] for e in mine if e["event"] == k), None) for k in ("joined", "healed")}
    return {
        "named_after_requeue_s": start["named_at"] - requeued if start.get("named_at") else None,
        "joined_after_start_s": first["joined"] - start["t"] if first["joined"] else None,
        "healed_after_start_s": first["healed"] - start["t"] if first["healed"] else None,
        "detect_s": fatal - fault_at,
        "requeued_s": requeued - fault_at,
        "start_s": start["t"] - requeued,
        "catchup_s": commit["t"] - start["t"],
        "participating_s": commit["t"] - fault_at,
        "warm": bool(start.get("warm")),
    }


def one(cfg: devcluster.DevClusterConfig, user: user_harness.SiteUser, kind: str,
        n: list[int]) -> dict[str, Any]:  # fmt: skip
    n[0] += 1
    env, spec, run_dir = spec_text(user, f"ws{n[0]}", 0 if kind == "none" else 1)
    if kind.startswith("warm"):
        text = spec.read_text() + "warm = true\n"
        if kind != "warm":
            line = "heartbeat_timeout_s = 2"
            text, found = re.subn(r"(?m)^heartbeat_timeout_s = .*$", line, text)
            assert found == 1, "the spec names no heartbeat timeout to change"
        env.write(spec, text)
    victim: str | None = None
    out: dict[str, Any] = {"kind": kind}
    try:
        fthsdp(env, "submit", str(spec))

        def ready(d: dict[str, Any]) -> bool:
            ok = all(x["state"] == "training" and (x["step"] or 0) >= 10 for x in reps(d).values())
            if kind == "none":
                return ok
            slots = (d.get("spares") or {}).get("slots") or []
            return ok and len(slots) == 1 and slots[0]["state"] == "RUNNING" and (
                kind == "cold" or bool(slots[0].get("warm"))
            )  # fmt: skip

        before = steady(env, run_dir, ready)
        victim = reps(before)[1]["nodes"][0]
        old = reps(before)[1]["job_id"]
        new_job = old if kind == "none" else before["spares"]["slots"][0]["job_id"]
        fthsdp(dict(os.environ), "cluster", "inject", victim, "--fault", "xid79",
               "--dir", str(cfg.directory))  # fmt: skip
        # The injection's instant: when the node's simulated kernel log was rewritten (the
        # command's own start and exit are not part of the fault).
        out["fault_at"] = (dev_health.hardware_dir(cfg) / victim / "kern.log").stat().st_mtime
        moved = advancing_in(new_job)

        def back(d: dict[str, Any]) -> bool:
            return victim not in reps(d)[1]["nodes"] and moved(d)

        wait_status(env, run_dir, back, 180, f"replica 1 back ({kind})", 0.3)
        out["status_s"] = time.time() - out["fault_at"]
    finally:
        clean_up(env, run_dir, cfg, victim)
    out.update(stages(run_dir, out["fault_at"]))
    assert out["warm"] == kind.startswith("warm"), out
    print(kind, json.dumps(out), flush=True)
    return out


def main() -> None:
    repeats = repeats_arg()
    run = Run(
        "warm_spares",
        "Fault → participating: warm spare, cold spare, no spare (idle cluster)",
        "The dev cluster (4 nodes, health-gated), 2 replicas × 1 rank of `examples/train_tiny.py` "
        "(0.1 s of sleep per step) + the control job, submitted by an unprivileged user through "
        "the site install; an Xid 79 into replica 1's node. warm: `[spares] nodes = 1, warm = "
        "true` (the slot's processes wait with the model built); cold: `[spares] nodes = 1`; "
        "none: the requeued job starts on an idle node; warm, heartbeat 2 s: warm with "
        "`train.heartbeat_timeout_s = 2` (default 0.5). Interleaved, one cluster for all runs; "
        "stages from the coordinator's journal and replica 1's progress log.",
        repeats,
    )
    with site_cluster("fthsdp-bench-warm-") as (cluster, user):
        n = [0]
        got = interleave({k: functools.partial(one, cluster, user, k, n) for k in KINDS}, repeats)
    labels = {
        "detect_s": "detect (injection → fatal report)",
        "requeued_s": "drain + requeue or move journaled (from the fault)",
        "start_s": "start (→ Manager built, progress log)",
        "catchup_s": "join + catch-up (→ first committed step)",
        "participating_s": "**fault → participating** (first commit)",
    }
    for kind in KINDS:
        for stage in STAGES:
            target = TARGETS[kind] if stage == "participating_s" else None
            run.row(f"{kind}: {labels[stage]}", [r[stage] for r in got[kind]], "s", target, 2)
        run.row(
            f"{kind}: fault → participating as `fthsdp status` saw it",
            [r["status_s"] for r in got[kind]],
            "s",
            digits=2,
        )
    part = {k: [r["participating_s"] for r in got[k]] for k in KINDS}
    for num, den in RATIOS:
        run.row(RATIO_LABEL.format(num=num, den=den), ratios(part, num, den), "x", digits=2)
    run.extra["runs"] = got
    run.write()


if __name__ == "__main__":
    main()
