"""End to end on the dev cluster: a replica on a slow node is evicted alone, kept off that node.

The run of `test_story_control_e2e.py` (3 one-node replicas of `examples/train_tiny.py` + the
control job + one spare node) on the health-gated cluster, whose TaskProlog has every rank read
its node's simulated slow file (`FTHSDP_SLOW_FILE=<hardware root>/{node}/slow`,
`runtime.control.straggler.steptiming`), with a short straggler window
(`train.straggler_window_steps`) and `straggler_mode = "drain"`.
`fthsdp cluster inject <replica 1's node> --fault slow=5` makes replica 1 compute at a fifth of
its speed: nothing fails, the others wait for it in every allreduce. The coordinator's straggler
monitor must see it, and since the slowdown over the remaining steps costs more than a requeue,
evict it: requeue replica 1's job exactly once, off the node. The job restarts on the spare node
and rejoins; replicas 0 and 2 keep their job ids, never restart, and their step rises throughout.

The run is the job user's (`fthsdp-user`, through the site install), who may not drain: the
drain is asked of root's Epilog in the job's comment (`fthsdp: straggler: <node> <factor>x` as
its detail), the requeued job excludes the node, and the dev cluster's Epilog, under the default
`recheck` policy, runs the node's checks, which find nothing wrong with a slow node: it stays in
service (docs/operators.md, "Drain requests").

Timing is taken from the run itself (the machine is small and shared): the deadlines scale with
the step time measured before the fault.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import pytest
from control_harness import (
    clean_up,
    fthsdp,
    health_gated,
    journal_summary,
    requeued_and_caught_up,
    wait_until,
    write_spec,
)
from user_harness import SiteUser

from slurm import hostlist
from slurm.backend import CommandBackend
from slurm.devcluster import DevClusterConfig

#: Each step sleeps this long beside its few milliseconds of compute. A replica starved of CPU on
#: 2 cores shared with other tests' dev clusters loses time per step whatever the step's length
#: (about 0.3 s at worst seen), so a longer step makes that noise a smaller ratio: at 0.1 s a
#: healthy replica was once seen 4.1x slower than its peers for over 20 steps, and evicted.
STEP_SLEEP_S = 0.25
#: 10 steps at the slowed pace take 12.5 s: to look as slow, a healthy replica would have to lose
#: 0.5 s in every step for 7.5 s.
WINDOW_STEPS = 10
FACTOR = 3.0
SLOW = 5.0
#: Seconds of steady training before the fault: the detector's own-pace window and then some.
SETTLE_S = 25.0

Trace = list[tuple[float, dict[int, dict[str, Any]]]]


def coordinator_timings(run_dir: Path, user: SiteUser) -> str:
    """What the straggler monitor says now, for a failure message: its suspects and stragglers
    with the decision taken for each (`fthsdp status --json`, as the user), and the control job's
    log lines about stragglers."""
    r = user.fthsdp("status", str(run_dir), "--json")
    try:
        listed = json.dumps(json.loads(r.stdout).get("stragglers"))
    except ValueError:
        listed = r.stderr.strip()
    return f"{listed}\n{control_log(run_dir)}"


def control_log(run_dir: Path, pattern: str = "straggler") -> str:
    """The control job's log lines that mention `pattern`: the monitor's verdicts and decisions
    with what each rests on, for a failure message (the run folder is removed afterwards)."""
    lines = []
    for path in sorted((run_dir / "logs").glob("control*.err")):
        try:
            text = path.read_text(errors="replace")
        except OSError as exc:
            lines.append(f"{path.name}: unreadable: {exc}")
            continue
        lines += [f"{path.name}: {line[:400]}" for line in text.splitlines() if pattern in line]
    return "\n".join(lines[-20:]) or f"(no {pattern!r} line in the control job's log)"


def first_restart(trace: Trace) -> str:
    """When the status first showed a replica restarted, and each replica's step just before."""
    for i, (t, reps) in enumerate(trace):
        moved = [k for k, r in reps.items() if r["restarts"]]
        if moved:
            before = {k: r["step"] for k, r in trace[i - 1][1].items()} if i else {}
            at = time.strftime("%H:%M:%S", time.localtime(t))
            return f"replica {moved} restarted by {at}; the steps before: {before}"
    return "no restart in the trace"


def seconds_per_step(trace: Trace) -> float:
    """Seconds per committed step over the trace, the median over the replicas."""
    (t0, first), (t1, last) = trace[0], trace[-1]
    rates = []
    for k in first:
        done = (last[k]["step"] or 0) - (first[k]["step"] or 0)
        rates.append((t1 - t0) / done if done > 0 else float("inf"))
    return float(statistics.median(rates))


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_slow_node_replica_alone_is_evicted(
    slurm_cluster: DevClusterConfig, site_user: SiteUser
) -> None:
    with health_gated(slurm_cluster) as gated:
        _slow_node_replica_alone_is_evicted(gated, site_user)


def _slow_node_replica_alone_is_evicted(gated: DevClusterConfig, site_user: SiteUser) -> None:
    env = site_user.with_env(TINY_STEP_SLEEP_S=str(STEP_SLEEP_S))
    root_env = dict(os.environ)  # the operator's side: injecting the fault
    spec, run_dir = write_spec(env, steps=5000, name="slow", straggler_mode="drain")
    overrides = [
        f"train.straggler_factor={FACTOR}",
        f"train.straggler_window_steps={WINDOW_STEPS}",
        "train.straggler_requeue_cost_s=30",
    ]
    backend = CommandBackend()
    trace: Trace = []
    victim: str | None = None
    try:
        fthsdp(env, "submit", str(spec), *[a for o in overrides for a in ("--set", o)])
        wait_until(
            env,
            run_dir,
            lambda r: all(x["state"] == "training" and (x["step"] or 0) >= 20 for x in r.values()),
            300,
            "all replicas training",
            trace,
        )
        # A baseline of the step time, measured here (2 shared cores: never a fixed figure). It
        # is also as long as the monitor's memory of each replica's own pace (its last 20
        # reports, one a second): a slowdown injected sooner is measured against the pace of
        # the busy start, when every replica was still loading, and may not look slow enough.
        mark = len(trace) - 1
        settled = time.monotonic() + SETTLE_S
        base = wait_until(
            env,
            run_dir,
            lambda r: len(trace) > mark + 5 and time.monotonic() >= settled,
            120,
            "baseline",
            trace,
        )
        step_s = seconds_per_step(trace[mark:])
        assert step_s < float("inf"), trace[mark:]
        jobs = {k: r["job_id"] for k, r in base.items()}
        victim = base[1]["nodes"][0]
        if not all(base[k]["restarts"] == 0 for k in base):
            raise AssertionError(
                f"a replica restarted before the fault: {base}\n"
                f"{first_restart(trace)}\n"
                f"journal: {journal_summary(run_dir, env)}\n"
                f"coordinator: {coordinator_timings(run_dir, env)}"
            )
        out = fthsdp(
            root_env,
            "cluster",
            "inject",
            victim,
            "--fault",
            f"slow={SLOW:g}",
            "--dir",
            str(gated.directory),
        )
        assert f"slow={SLOW:g}" in out, out
        t_fault = time.time()
        # Detection needs the window at the slowed pace, then a requeue, the prolog, a start and
        # a heal on a loaded machine: generous, and scaled by the measured step time.
        deadline = 300 + 4 * WINDOW_STEPS * SLOW * step_s
        try:
            after = wait_until(
                env,
                run_dir,
                requeued_and_caught_up(1),
                deadline,
                "replica 1 evicted, requeued and caught up",
                trace,
            )
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}\ncoordinator: {coordinator_timings(run_dir, env)}"
            ) from None
        t_rejoined = time.time()

        # Replica 1 alone moved, off the slow node; the others kept their jobs and never stopped.
        assert after[1]["job_id"] == jobs[1]
        assert after[1]["nodes"][0] != victim
        for k in (0, 2):
            assert after[k]["job_id"] == jobs[k]
            assert after[k]["restarts"] == 0 and after[k]["relaunches"] == 0, after[k]
            steps = [reps[k]["step"] for t, reps in trace if t_fault <= t <= t_rejoined]
            assert steps == sorted(steps) and steps[-1] > steps[0], steps

        # The drain was asked of root's Epilog, with the straggler reason naming the node and the
        # measured factor; the requeued job excludes the node; the Epilog's recheck found the
        # slow node healthy, so it stays in service.
        summary = journal_summary(run_dir, env)
        ((node, status, reason),) = summary["drains"]
        assert (node, status) == (victim, "requested"), summary["drains"]
        assert reason.startswith(f"fthsdp: straggler: {victim} "), reason
        assert float(reason.rsplit(" ", 1)[-1].rstrip("x")) >= FACTOR, reason
        (job,) = [j for j in backend.jobs([jobs[1]]) if j.base_id == jobs[1] and j.het_offset == 0]
        assert victim in hostlist.expand(job.excluded), job
        (info,) = backend.nodes([victim])
        assert not info.drained, info

        # Exactly one requeue, of replica 1's job, decided by the straggler monitor.
        assert [tuple(r) for r in summary["requeues"]] == [(jobs[1], "done")]
        evictions = summary["evictions"]
        assert [(e[0], e[1]) for e in evictions] == [(1, victim)]
        print(
            f"straggler e2e: baseline {step_s:.3f} s/step, evicted {evictions[0][2] - t_fault:.1f}"
            f" s after the fault, rejoined after {t_rejoined - t_fault:.1f} s"
        )
        print(control_log(run_dir, "straggler eviction"))

        # Back at full speed on the new node: `fthsdp status` lists no straggler any more.
        deadline = time.monotonic() + 120
        while True:
            listed = json.loads(fthsdp(env, "status", str(run_dir), "--json"))["stragglers"]
            if not [v for v in listed if v["replica"] == 1] or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert not [v for v in listed if v["replica"] == 1], listed
        summary = journal_summary(run_dir, env)
        assert len(summary["requeues"]) == 1 and len(summary["evictions"]) == 1
    finally:
        clean_up(env, run_dir, gated, victim)
