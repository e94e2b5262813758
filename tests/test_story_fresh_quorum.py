"""A quorum of fresh replicas waits for the live replica it missed, and never restores from disk.

Real processes (the local launcher, torchft's Lighthouse, `examples/train_tiny.py` on gloo), 3
replicas of one rank, a durable checkpoint every 10 steps. Replicas 1 and 2 are killed together
(`kill -9`) while replica 0 trains on; they restart fresh. Once both have started and replica 0
has committed again (so it holds the run's state and is alive), replica 0 is stopped (SIGSTOP)
before the fresh pair's first quorum: the Lighthouse drops it when its heartbeat lapses and forms
a quorum of the two fresh replicas. A checkpoint is on disk, so restoring it looks possible; but
it is older than the live replica's state, and training from it beside that replica would be a
second history. The fresh pair must wait instead (`wait`: "fresh quorum behind the run",
`runtime.worker.step`); once replica 0 is continued (SIGCONT) all three form a quorum, the pair
heals from it, and the run ends with one history: no `restored` event, no rolled-back step,
exactly-once ledger, equal weights.

Each trainer waits 5 s between its start and its first step (`TINY_START_SLEEP_S`, a stand-in
for a model's build), so replica 0 commits and is stopped before the pair asks for a quorum. Should
the pair still win the race (its first quorum before replica 0's next commit: it heals at once,
the ordinary path), the test kills the pair again, up to `ATTEMPTS` times, so that it judges the
fresh-quorum path and not the race.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchft")

from runtime import ledger
from runtime.env import Timeouts
from runtime.local.config import LaunchConfig
from runtime.local.launcher import LocalLauncher
from runtime.local.replicas import LocalReplica

ROOT = Path(__file__).resolve().parent.parent
ATTEMPTS = 3
#: How long the stopped replica may wait for the pair's `wait` before the attempt counts as lost.
WAIT_FOR_PAIR_S = 25.0
WAIT_REASON = "fresh quorum behind the run"


def _events(run_dir: Path, replica: int) -> list[dict[str, Any]]:
    path = run_dir / "progress" / f"r{replica}.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line still being written
    return out


def _signal(rs: LocalReplica, sig: int) -> None:
    for p in rs.procs:
        if p.poll() is None:
            os.killpg(p.pid, sig)


@dataclass
class Choreography:
    """Called on every pass of the launcher's loop (`on_update`); never blocks it."""

    run_dir: Path
    kill_at_step: int = 40
    stage: str = "train"
    attempts: int = 0
    since: float = 0.0
    pair: dict[int, str] = field(default_factory=dict)
    step_at_start: int = 0
    won: bool = False
    log: list[str] = field(default_factory=list)

    def _note(self, what: str) -> None:
        self.log.append(f"{time.monotonic():.2f} {what}")

    def _new_start(self, replica: int, old: str | None) -> str | None:
        starts = [e for e in _events(self.run_dir, replica) if e["event"] == "start"]
        if starts and starts[-1]["incarnation"] != old:
            return str(starts[-1]["incarnation"])
        return None

    def _pair_did(self, kinds: set[str]) -> list[dict[str, Any]]:
        return [
            e
            for k, inc in self.pair.items()
            for e in _events(self.run_dir, k)
            if e.get("incarnation") == inc and e["event"] in kinds
        ]

    def __call__(self, replicas: list[LocalReplica]) -> None:
        a, b, c = replicas
        now = time.monotonic()
        if self.stage == "train" and min(r.step for r in replicas) >= self.kill_at_step:
            self.attempts += 1
            self.pair = {
                k: str(s[-1]["incarnation"])
                for k in (1, 2)
                if (s := [e for e in _events(self.run_dir, k) if e["event"] == "start"])
            }
            for rs in (b, c):
                _signal(rs, signal.SIGKILL)
            self._note(f"attempt {self.attempts}: killed 1 and 2 at step {a.step}")
            self.stage = "restarting"
        elif self.stage == "restarting":
            fresh = {k: self._new_start(k, self.pair.get(k)) for k in (1, 2)}
            if all(fresh.values()):
                self.pair = {k: str(v) for k, v in fresh.items()}
                self.step_at_start = a.step
                self._note(f"both started fresh; replica 0 at step {a.step}")
                self.stage = "await-commit"
        elif self.stage == "await-commit" and a.step > self.step_at_start:
            _signal(a, signal.SIGSTOP)
            self.since = now
            self._note(f"replica 0 committed step {a.step} after their start: stopped")
            self.stage = "stopped"
        elif self.stage == "stopped":
            if self._pair_did({"restored"}):
                _signal(a, signal.SIGCONT)
                self._note("the fresh pair restored the checkpoint beside the live replica 0")
                self.stage = "done"
            elif self._pair_did({"wait"}):
                self.won = True
                self._note("the fresh pair waits: replica 0 continued")
                _signal(a, signal.SIGCONT)
                self.stage = "done"
            elif self._pair_did({"healed", "commit"}) or now - self.since > WAIT_FOR_PAIR_S:
                _signal(a, signal.SIGCONT)
                self._note("the pair reached replica 0 first (the race): again")
                self.stage = "train" if self.attempts < ATTEMPTS else "done"
                self.kill_at_step = a.step + 20


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_fresh_quorum_waits_for_the_live_replica_instead_of_restoring(tmp_path: Path) -> None:
    show = Choreography(tmp_path)
    cfg = LaunchConfig(
        run_dir=tmp_path,
        command=[sys.executable, str(ROOT / "examples" / "train_tiny.py")],
        replicas=3,
        ranks_per_replica=1,
        steps=400,
        checkpoint_every_steps=10,
        max_restarts_per_replica=10,
        straggler_evict=False,  # the stopped replica is not a straggler to evict
        # Replica 0's quorum, sent just before the stop, must outlast the stop and the pair's
        # slow start on a loaded machine: past it replica 0 exits (a process fault), its state is
        # lost for real, and restoring the checkpoint is then right.
        timeouts=Timeouts(heartbeat_s=2.0, allreduce_s=5.0, quorum_s=40.0, join_s=60.0),
        # The pair restarts only once the Lighthouse has forgotten its killed incarnations
        # (heartbeat 2 s): a fresh pair heartbeating before that keeps replica 0's quorum
        # waiting for it, so replica 0 cannot commit before the pair's first quorum (the race
        # this test must not depend on).
        restart_delay_s=2.5,
        run_timeout_s=360,
        extra_env={
            "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "TINY_STEP_SLEEP_S": "0.1",
            # between a restarted replica's start and its first quorum: time for replica 0 to
            # commit once more and be stopped before the fresh pair asks for a quorum
            "TINY_START_SLEEP_S": "5",
        },
    )
    launcher = LocalLauncher(cfg, on_update=show)
    try:
        summary = launcher.run()
    finally:
        for rs in launcher.replicas:  # never leave a stopped process behind
            for p in rs.procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGCONT)
        launcher.shutdown()

    print("\n".join(show.log))  # the choreography, shown with -s or on a failure
    assert show.won, show.log
    waits = [e for k in (1, 2) for e in _events(tmp_path, k) if e["event"] == "wait"]
    assert waits and all(e["reason"] == WAIT_REASON for e in waits), (waits, show.log)
    assert list((tmp_path / "checkpoints").iterdir()), "no durable checkpoint was written"
    restored = [e for k in range(3) for e in _events(tmp_path, k) if e["event"] == "restored"]
    assert restored == [], (restored, show.log)
    healed = [e for k in (1, 2) for e in _events(tmp_path, k) if e["event"] == "healed"]
    assert healed, show.log
    assert summary.ok, (summary, show.log)
    assert summary.steps == 400 and summary.weights_agree and summary.ledger_ok
    checked = ledger.verify(ledger.read_log(sorted((tmp_path / "ledger").glob("r*.jsonl"))))
    assert checked.ok and checked.rolled_back == 0, (checked, show.log)
