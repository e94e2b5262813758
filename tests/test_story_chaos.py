"""A seeded chaos campaign on the dev cluster: faults of several kinds on one run, then the
invariants a run must keep through all of them.

The run of `test_story_control_e2e.py` (3 one-node replicas of `examples/train_tiny.py` + the
control job, health gated, submitted by the job user through the site install). Before the first
fault an administrator drains the node of one replica (`admin: chaos maintenance`; the job on it
keeps running, and the schedule never moves that replica): the first replica whose node the
control job does not share, so that a power loss of the control job's node never takes it. The
schedule (`tests/chaos_harness.py`) is drawn from `FTHSDP_CHAOS_SEED` (default 1), with replica
0 as the protected one, and then renumbered onto the run (`with_protected`):
`FTHSDP_CHAOS_FAULTS` faults (default 3) of the kinds in `FTHSDP_CHAOS_KINDS` (comma separated;
default the short set `xid79,kill,control`; `benchmarks/chaos.py` runs every kind over 5 seeds),
striking no replica more often than the run's `max_restarts_per_replica` (5 here; a replica that
fails more is left out by design). With a `slow` fault in the schedule the run evicts stragglers
(`straggler_mode = "drain"`, factor 3 over 20 steps). Each fault strikes a few
steps after the run was last whole and is then waited out; a node it broke is healed
afterwards, as an operator would, so the next fault has a node to go to.

After the run finished, whatever the schedule was:

- every unit was trained exactly once and every step reached (the ledger), no committed step
  was lost to a rollback (the run never went back to an older state), and the final weights of
  all replicas agree;
- every requeue in the journal is of a replica a requeueing fault struck, one per fault;
- the administrator's drain is exactly as they left it;
- no job of the run is left running or queued.

Figures per fault (time until the run is whole again, the healthy replicas' longest stall, the
steps lost) are printed, and written as JSON to `FTHSDP_CHAOS_OUT` when it is set. A failing
seed is rerun alone with `FTHSDP_CHAOS_SEED=N pytest tests/test_story_chaos.py`;
`FTHSDP_CHAOS_KEEP=DIR` keeps its run folder and Slurm's view of the jobs and nodes in DIR.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from chaos_harness import (
    ANY_REPLICA,
    CONTROL_DOWN,
    REQUEUES,
    SHORT_KINDS,
    Fault,
    Outcome,
    committed,
    figures,
    lowest_after,
    plan,
    stall_s,
    unattributed_requeues,
    with_protected,
)
from control_harness import (
    ROOT,
    clean_up,
    control_info,
    control_node,
    fthsdp,
    health_gated,
    requeues_in_journal,
    submit_until_training,
    wait_until,
    write_spec,
)
from user_harness import SiteUser

from runtime.verdict import check_ledger, final_weights_agree
from slurm.backend import CommandBackend, SlurmCommandError
from slurm.devcluster import DevClusterConfig
from slurm.devcluster import controller as ctld
from slurm.spec import load_spec

SEED = int(os.environ.get("FTHSDP_CHAOS_SEED", "1"))
FAULTS = int(os.environ.get("FTHSDP_CHAOS_FAULTS", "3"))
CHOSEN = tuple(k for k in os.environ.get("FTHSDP_CHAOS_KINDS", ",".join(SHORT_KINDS)).split(","))
#: Enough steps that the run outlasts every fault and its recovery on a loaded machine.
STEPS = 200 + 220 * FAULTS
#: Failures a replica of the run may have (`train.max_restarts_per_replica`, set in the run's
#: spec above the default so that every kind fits in one run); one more and the policy leaves it
#: out, which the policy's own tests check, so the schedule stays within it.
STRIKES = 5
#: The straggler settings of a run with `slow` faults (a factor above the shared cores' noise, on
#: this campaign's 0.1 s steps; `test_story_straggler_devcluster.py` runs longer steps and a
#: shorter window, which keeps that noise a smaller ratio), and the steady training a replica's
#: own pace needs before a slowdown is measured against it.
STRAGGLER = ("train.straggler_factor=3", "train.straggler_window_steps=20",
             "train.straggler_requeue_cost_s=30")  # fmt: skip
SLOW = 5
SETTLE_S = 25.0
#: How long slurmctld stays away: past the coordinator's report timeout.
OUTAGE_S = 45.0
ADMIN_REASON = "admin: chaos maintenance"
TERMINAL = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "GONE"}

Trace = list[tuple[float, dict[int, dict[str, Any]]]]
Reps = dict[int, dict[str, Any]]


@pytest.mark.slurm
@pytest.mark.one_release
@pytest.mark.slow
@pytest.mark.timeout(600 + 240 * FAULTS)
def test_a_seeded_chaos_campaign_keeps_every_invariant(
    slurm_cluster: DevClusterConfig, site_user: SiteUser
) -> None:
    schedule = plan(SEED, FAULTS, CHOSEN, 3, protected=0, strikes=STRIKES)
    print(f"chaos seed {SEED}: " + "; ".join(f"{f.kind}@{f.replica}" for f in schedule))
    print("(replica 0 there is the protected one: the first not beside the control job)")
    with health_gated(slurm_cluster) as gated:
        Campaign(gated, site_user, schedule).run()


def _rode_on(before: Reps, after: Reps, healthy: list[int], what: object) -> None:
    """The healthy replicas rode the fault out: the same job, never restarted by Slurm."""
    for k in healthy:
        assert after[k]["job_id"] == before[k]["job_id"], (what, after[k])
        assert after[k]["restarts"] == before[k]["restarts"], (what, after[k])


def _scontrol(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["scontrol", *args], capture_output=True, text=True, timeout=30, check=False
    )


class Campaign:
    """One run under one schedule: the faults, their outcomes, and the checks at the end."""

    def __init__(self, gated: DevClusterConfig, user: SiteUser, schedule: list[Fault]) -> None:
        self.cfg = gated
        self.env = user.with_env(TINY_STEP_SLEEP_S="0.1")
        self.schedule = schedule
        self.slow = any(f.kind == "slow" for f in schedule)
        self.spec, self.run_dir = write_spec(
            self.env, STEPS, name="chaos", straggler_mode="drain" if self.slow else "report"
        )
        self.root_env = dict(os.environ)  # the operator's side: faults, heals, the admin drain
        self.backend = CommandBackend()
        self.trace: Trace = []
        self.outcomes: list[Outcome] = []
        self.broken: set[str] = set()
        self.admin_node: str | None = None
        self.jobs: dict[int, str] = {}

    # -- the run --------------------------------------------------------------------------

    def run(self) -> None:
        try:
            sets = [f"train.max_restarts_per_replica={STRIKES}", *(STRAGGLER if self.slow else ())]
            before = submit_until_training(self.env, self.spec, self.run_dir, self.trace, sets=sets)
            self.jobs = {k: r["job_id"] for k, r in before.items()}
            # The administrator's drain goes on a replica's node that the control job does not
            # share: a drained node takes no new job, so the control job is never there, and
            # a power loss of its node never takes the protected replica.
            beside = control_node(self.run_dir)
            protected = min(k for k, r in before.items() if beside not in r["nodes"])
            self.schedule = with_protected(self.schedule, protected, len(before))
            print(
                f"protected replica {protected} (control job on {beside}): "
                + "; ".join(f"{f.kind}@{f.replica}" for f in self.schedule)
            )
            self.admin_node = before[protected]["nodes"][0]
            r = _scontrol(
                "update", f"NodeName={self.admin_node}", "State=DRAIN", f"Reason={ADMIN_REASON}"
            )
            assert r.returncode == 0, r.stderr
            for fault in self.schedule:
                self._strike(fault)
            final = self._until(
                lambda r: all(x["slurm_state"] == "COMPLETED" for x in r.values()),
                900,
                "the run to finish",
            )
            self._check(final)
        finally:
            self._report()
            ctld.start(self.cfg)
            self._keep()
            if self.admin_node is not None:
                _scontrol("update", f"NodeName={self.admin_node}", "State=RESUME")
            for node in sorted(self.broken):
                self._heal(node, wait=False)
            clean_up(self.env, self.run_dir, self.cfg, None)

    def _keep(self) -> None:
        """With `FTHSDP_CHAOS_KEEP=DIR`: the run folder and Slurm's view of its jobs and nodes,
        copied there before the clean-up removes them, to find out why a seed failed."""
        keep = os.environ.get("FTHSDP_CHAOS_KEEP")
        if not keep:
            return
        dest = Path(keep) / f"seed-{SEED}"
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(self.run_dir, dest / "run", symlinks=True)
        for name, argv in (("jobs", ["show", "job", "--details"]), ("nodes", ["show", "node"])):
            (dest / f"scontrol-{name}.txt").write_text(_scontrol(*argv).stdout)
        (dest / "trace.json").write_text(json.dumps(self.trace, default=str) + "\n")

    def _until(self, pred: Callable[[Reps], bool], timeout: float, what: str) -> Reps:
        return wait_until(self.env, self.run_dir, pred, timeout, what, self.trace)

    def _whole(self, at_least: int) -> Reps:
        return self._until(
            lambda r: all(
                x["state"] == "training" and (x["step"] or 0) >= at_least for x in r.values()
            ),
            300,
            f"every replica training at step {at_least}",
        )

    def _strike(self, fault: Fault) -> None:
        base = committed(self.trace[-1][1]) if self.trace else 0
        reps = self._whole(base + fault.after_steps)
        if fault.kind == "slow":
            reps = self._steady(SETTLE_S)
        assert committed(reps) < STEPS - 60, f"the run is too near its end for {fault}"
        outcome = Outcome(fault, time.time(), step_before=committed(reps))
        inject = ["cluster", "inject", "--dir", str(self.cfg.directory)]
        if fault.kind in REQUEUES:
            node = reps[fault.replica]["nodes"][0]
            self._where(outcome, node)
            healthy = [k for k in reps if k != fault.replica]
            kind = {"second": "xid79", "slow": f"slow={SLOW}"}.get(fault.kind, fault.kind)
            fthsdp(self.root_env, *inject, node, "--fault", kind)
            self.broken.add(node)
            if fault.kind == "second":
                assert fault.other is not None
                self._until(
                    lambda r: r[fault.replica]["state"] != "training",
                    120,
                    f"replica {fault.replica} recovering",
                )
                other = reps[fault.other]["nodes"][0]
                fthsdp(self.root_env, *inject, other, "--fault", "kill")
                healthy = [k for k in healthy if k != fault.other]
            self._recovered(reps, outcome, healthy)
            self._heal(node, wait=True)
        elif fault.kind == "kill":
            node = reps[fault.replica]["nodes"][0]
            self._where(outcome, node)
            fthsdp(self.root_env, *inject, node, "--fault", "kill")
            self._recovered(reps, outcome, [k for k in reps if k != fault.replica])
        elif fault.kind == CONTROL_DOWN:
            self._control_node_down(reps, outcome, inject)
        elif fault.kind == "control":
            self._control_requeue(reps, outcome)
        elif fault.kind == "coordinator":
            self._control_killed(reps, outcome)
        elif fault.kind == "slurmctld":
            self._slurmctld_away(reps, outcome)
        else:
            raise AssertionError(f"no driver for chaos kind {fault.kind}")
        self.outcomes.append(outcome)
        print(f"chaos {fault.kind}@{outcome.fault.replica}: {json.dumps(outcome.to_dict())}")

    def _where(self, outcome: Outcome, node: str) -> None:
        """Record the struck node and the control job's, for the campaign's figures."""
        outcome.node = node
        try:
            outcome.control_node = control_node(self.run_dir)
        except (SlurmCommandError, ValueError):
            outcome.control_node = None  # Slurm could not say: the figure says unknown

    def _recovered(self, before: Reps, outcome: Outcome, healthy: list[int]) -> None:
        """Wait until every struck replica restarted (a requeue or a relaunch) and caught up."""
        fault = outcome.fault
        struck = [fault.replica] + ([fault.other] if fault.other is not None else [])

        def starts(x: dict[str, Any]) -> int:
            # Unknown while Slurm cannot say (a node down): no restart seen yet.
            return (x["restarts"] or 0) + (x["relaunches"] or 0)

        def back(r: Reps) -> bool:
            top = max((r[k]["step"] or 0) for k in healthy) if healthy else 0
            return all(
                starts(r[k]) > starts(before[k])
                and r[k]["state"] == "training"
                and (r[k]["step"] or 0) >= top - 3
                for k in struck
            )

        after = self._until(back, 300, f"replica(s) {struck} back after {fault.kind}")
        self._close(outcome, healthy)
        _rode_on(before, after, healthy, fault)
        if fault.kind in REQUEUES:
            assert after[fault.replica]["restarts"] == before[fault.replica]["restarts"] + 1
            assert after[fault.replica]["nodes"][0] != before[fault.replica]["nodes"][0]

    def _close(self, outcome: Outcome, healthy: list[int]) -> None:
        now = time.time()
        outcome.recovered_s = round(now - outcome.injected_at, 2)
        outcome.stall_s = round(stall_s(self.trace, outcome.injected_at, now, healthy), 2)
        outcome.step_low_after = lowest_after(self.trace, outcome.injected_at, outcome.step_before)

    def _steady(self, seconds: float) -> Reps:
        """Every replica training for `seconds` more: a replica's own pace is learned from its
        last reports, and a slowdown is measured against it."""
        until = time.monotonic() + seconds
        return self._until(
            lambda r: (
                time.monotonic() >= until and all(x["state"] == "training" for x in r.values())
            ),
            seconds + 120,
            f"{seconds:g} s of steady training",
        )

    def _control_node_down(self, before: Reps, outcome: Outcome, inject: list[str]) -> None:
        """Power off the control job's node: the control plane comes back elsewhere (the
        survivors' supervisors release its requeue), a replica beside it is requeued by Slurm
        and catches up, and the others ride on in their jobs."""
        pid = control_info(self.run_dir).get("pid")
        node = control_node(self.run_dir)
        assert node != self.admin_node, (node, self.admin_node)
        struck = [k for k, r in before.items() if node in r["nodes"]]
        healthy = [k for k in before if k not in struck]
        outcome.fault = replace(outcome.fault, replica=struck[0] if struck else ANY_REPLICA)
        fthsdp(self.root_env, *inject, node, "--fault", "down")
        self.broken.add(node)
        deadline = time.monotonic() + 300
        while control_info(self.run_dir).get("pid") in (None, pid):
            assert time.monotonic() < deadline, "the control plane did not come back"
            self._until(lambda r: True, 60, "status while the control plane is away")
            time.sleep(1)

        def back(r: Reps) -> bool:
            top = max((r[k]["step"] or 0) for k in healthy)
            return all(
                r[k]["state"] == "training" and (r[k]["step"] or 0) >= (before[k]["step"] or 0) + 20
                for k in healthy
            ) and all(
                (r[k]["restarts"] or 0) > (before[k]["restarts"] or 0)
                and r[k]["state"] == "training"
                and (r[k]["step"] or 0) >= top - 3
                for k in struck
            )

        after = self._until(back, 300, f"the run whole again after {node} lost power")
        self._close(outcome, healthy)
        _rode_on(before, after, healthy, CONTROL_DOWN)
        for k in struck:
            assert after[k]["nodes"][0] != node, (CONTROL_DOWN, after[k])
        self._heal(node, wait=True)

    def _control_job(self) -> str:
        status = json.loads(fthsdp(self.env, "status", str(self.run_dir), "--json"))
        (control,) = [str(j["job_id"]) for j in status["jobs"] if j["role"] == "control"]
        return control

    def _control_requeue(self, before: Reps, outcome: Outcome) -> None:
        control = self._control_job()
        pid = control_info(self.run_dir).get("pid")
        self.backend.requeue(control)
        self.backend.release(control)
        deadline = time.monotonic() + 180
        while control_info(self.run_dir).get("pid") in (None, pid):
            assert time.monotonic() < deadline, "the requeued control job never came back"
            time.sleep(1)
        self._rising(before, outcome, "the control plane's requeue")

    def _control_killed(self, before: Reps, outcome: Outcome) -> None:
        first = control_info(self.run_dir)
        os.kill(int(first["pid"]), signal.SIGKILL)
        deadline = time.monotonic() + 90
        while control_info(self.run_dir).get("pid") in (None, first["pid"]):
            assert time.monotonic() < deadline, "the killed control plane was not restarted"
            time.sleep(0.5)
        self._rising(before, outcome, "the control plane's restart in place")

    def _slurmctld_away(self, before: Reps, outcome: Outcome) -> None:
        assert ctld.stop(self.cfg) is not None
        try:
            # The outage's length is the fault itself; status keeps answering meanwhile.
            while time.time() - outcome.injected_at < OUTAGE_S:
                self._until(lambda r: True, 30, "status during the outage")
                time.sleep(2)
        finally:
            ctld.start(self.cfg)
        self._rising(before, outcome, "slurmctld's restart")

    def _rising(self, before: Reps, outcome: Outcome, what: str) -> None:
        """Every replica trains 20 steps past where it was, in the same job, never restarted."""
        after = self._until(
            lambda r: all(
                x["state"] == "training" and (x["step"] or 0) >= (before[k]["step"] or 0) + 20
                for k, x in r.items()
            ),
            300,
            f"every replica training after {what}",
        )
        self._close(outcome, list(before))
        _rode_on(before, after, list(after), what)

    def _heal(self, node: str, wait: bool) -> None:
        """Heal `node` (boot it after a power loss) and give it back to Slurm, as an operator."""
        subprocess.run(
            [sys.executable, "-m", "fthsdp_cli", "cluster", "heal", node,
             "--dir", str(self.cfg.directory)],
            env=self.root_env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        deadline = time.monotonic() + (120 if wait else 20)
        while time.monotonic() < deadline:
            try:
                (info,) = self.backend.nodes([node])
            except (SlurmCommandError, ValueError):
                time.sleep(1)
                continue
            if info.drained_by_us:
                self.backend.resume(node)
            elif info.state.lower() in ("idle", "mixed", "allocated") and not info.drained:
                self.broken.discard(node)
                return
            time.sleep(1)
        assert not wait, f"{node} did not come back after the heal"

    # -- the end ------------------------------------------------------------------------

    def _check(self, final: Reps) -> None:
        assert final_weights_agree(self.run_dir, [0, 1, 2]), "the final weights differ"
        ledger = check_ledger(self.run_dir, STEPS)
        assert ledger.ok, ledger.problems
        # No fault loses every replica's state at once. A control-plane outage is waited out
        # in memory for `train.control_wait_s`; past it every worker gives up on the quorum
        # service and the run goes back to its newest durable checkpoint. (With the join
        # timeout as that limit, a 136 s outage in a loaded `make test` on 26.05 rolled back
        # 249 steps.)
        control_wait = load_spec(self.spec).train.control_wait_in_effect_s
        long_outage = [
            o.stall_s
            for o in self.outcomes
            if o.fault.kind == "control" and (o.stall_s or 0) > control_wait
        ]
        print(
            f"chaos rolled back {ledger.rolled_back} steps; control outages past the "
            f"control-plane wait: {long_outage}"
        )
        assert ledger.rolled_back == 0 or long_outage, (
            f"{ledger.rolled_back} committed steps were rolled back"
        )
        requeued = [job for job, _ in requeues_in_journal(self.run_dir, self.env)]
        struck = [o.fault for o in self.outcomes]
        problems = unattributed_requeues(requeued, struck, self.jobs)
        assert not problems, problems
        assert self.admin_node is not None
        (info,) = self.backend.nodes([self.admin_node])
        assert info.drained and info.reason == ADMIN_REASON, info
        # The control job ends by itself once every replica completed (30 s grace).
        ids = [*self.jobs.values(), self._control_job()]
        deadline = time.monotonic() + 180
        left: list[str] = []
        while time.monotonic() < deadline:
            left = [
                f"{j.job_id} {j.state}" for j in self.backend.jobs(ids) if j.state not in TERMINAL
            ]
            if not left:
                break
            time.sleep(3)
        assert not left, f"jobs of the run left after it: {left}"

    def _report(self) -> None:
        data = {
            "seed": SEED,
            "kinds": list(CHOSEN),
            "steps": STEPS,
            "schedule": [f.__dict__ for f in self.schedule],
            "outcomes": [o.to_dict() for o in self.outcomes],
            "figures": figures(self.outcomes),
            "complete": len(self.outcomes) == len(self.schedule),
        }
        print(f"chaos figures: {json.dumps(data['figures'])}")
        out = os.environ.get("FTHSDP_CHAOS_OUT")
        if out:
            Path(out).write_text(json.dumps(data, indent=2) + "\n")
