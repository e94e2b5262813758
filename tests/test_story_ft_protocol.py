"""FT-HSDP protocol tests with real processes (CPU, gloo, torchft's lighthouse).

Each test runs the local launcher (which starts the lighthouse and R x W worker processes of
`examples/train_tiny.py`, and kills all of them, lighthouse included, when it returns or fails)
and then judges the run from the workers' own records: progress events, the data ledger and the
final local shards. The tests compare final state, as torchft's own integration tests do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchft")

from runtime import ledger  # noqa: E402
from runtime.local.config import LaunchConfig  # noqa: E402
from runtime.local.launcher import LocalLauncher  # noqa: E402
from runtime.local.summary import RunSummary  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
COMMAND = [sys.executable, str(ROOT / "examples" / "train_tiny.py")]


def _env() -> dict[str, str]:
    return {"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def run(tmp: Path, **kwargs: Any) -> RunSummary:
    extra = {**_env(), **kwargs.pop("extra_env", {})}
    cfg = LaunchConfig(run_dir=tmp, command=COMMAND, extra_env=extra, **kwargs)
    launcher = LocalLauncher(cfg)
    try:
        return launcher.run()
    finally:
        launcher.shutdown()


def events(run_dir: Path, replica: int) -> list[dict[str, Any]]:
    path = run_dir / "progress" / f"r{replica}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def timeline(run_dir: Path, summary: RunSummary) -> list[str]:
    """Each replica's starts, heals, commits and aborts around the steps the ledger flags, with
    the kills: what a failed ledger check needs to be explained."""
    flagged = {int(p.split(":")[0].split()[1]) for p in summary.ledger_problems if p[:5] == "step "}
    rows: list[tuple[float, str]] = [
        (f["t_kill"], f"kill r{f['replica']} ({f['kind']}) at step {f['step']}")
        for f in summary.failures
    ]
    for replica in range(summary.replicas):
        for e in events(run_dir, replica):
            near = any(abs(int(e.get("step", -9)) - s) <= 2 for s in flagged)
            if e["event"] in ("start", "joined", "healed") or (
                near and e["event"] in ("commit", "abort", "sync")
            ):
                rows.append(
                    (
                        e["t"],
                        f"r{replica}/{e['incarnation'][:4]} {e['event']} step {e.get('step')} "
                        f"participants {e.get('participants')} {str(e.get('error') or '')[:80]}",
                    )
                )
    t0 = min((t for t, _ in rows), default=0.0)
    return [f"{t - t0:8.2f} {what}" for t, what in sorted(rows)]


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(("ranks", "microbatches"), [(2, 1), (1, 1), (2, 2)])
def test_equivalent_to_plain_hsdp(tmp_path: Path, ranks: int, microbatches: int) -> None:
    """2 replicas x 2 ranks (FSDP inside the replica) and 2 x 1 (a plain module), no failures:
    same weights as static HSDP on the same data order; also when each step accumulates the
    gradient of two backward passes (each one crosses replicas, the second adds its mean)."""
    from runtime.baselines import load_example, spawn

    summary = run(
        tmp_path / "ft",
        replicas=2,
        ranks_per_replica=ranks,
        steps=6,
        min_replicas=2,
        extra_env={"TINY_MICROBATCHES": str(microbatches)},
    )
    assert summary.ok, summary
    spawn("plain", tmp_path / "plain", replicas=2, ranks=ranks, steps=6)
    initial = dict(load_example()["make_model"]().named_parameters())
    for r in (0, 1):
        for w in range(ranks):
            ft = torch.load(tmp_path / "ft" / "final" / f"r{r}_rank{w}.pt")["params"]
            plain = torch.load(tmp_path / "plain" / "final" / f"r{r}_rank{w}.pt")["params"]
            assert ft.keys() == plain.keys()
            for name in ft:
                assert torch.allclose(ft[name], plain[name], rtol=1e-5, atol=1e-6), name
            # the weights moved: a run that trained nothing would also "agree"
            shard = initial["0.weight"].detach().chunk(ranks)[w]
            assert not torch.allclose(ft["0.weight"], shard)
    # every replica healed from the primary at step 0 (init_sync): the sync step committed
    for r in (0, 1):
        sync = [e for e in events(tmp_path / "ft", r) if e["event"] == "sync"]
        assert sync[0]["reason"] == "init" and sync[0]["committed"]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_kill9_one_replica_mid_run(tmp_path: Path) -> None:
    """kill -9 a replica: the healthy one keeps committing, the restarted one heals mid-run."""
    summary = run(
        tmp_path,
        replicas=2,
        ranks_per_replica=2,
        steps=150,
        kill_replica=1,
        kill_at_step=5,
        # an outage long enough to see the healthy replica commit alone, however fast the restart
        restart_delay_s=3.0,
        # slow steps: a restarted worker needs 5-15 s to import torch on a busy 2-core machine,
        # 30 s when it is loaded (`make test`'s lanes), so the healthy replica's 145 steps after the
        # kill must last longer than that, or it finishes before its peer is back
        extra_env={"TINY_STEP_SLEEP_S": "0.25"},
    )
    assert summary.ok, summary
    assert summary.weights_agree and summary.ledger_ok
    assert summary.finished_replicas == [0, 1]
    assert len(summary.failures) == 1, summary.failures
    (failure,) = summary.failures
    assert failure["kind"] == "injected" and failure["t_rejoin"] is not None
    # the healthy replica's step counter kept rising while replica 1 was down: it committed
    # steps alone (1 participant) between the kill and the restarted replica's return
    ev0 = events(tmp_path, 0)
    solo = [
        e["step"]
        for e in ev0
        if e["event"] == "commit"
        and failure["t_kill"] < e["t"] < failure["t_rejoin"]
        and e["participants"] == 1
    ]
    assert len(solo) >= 3 and solo == sorted(solo), (failure, ev0)
    assert summary.max_healthy_stall_s < 5.0
    # the restarted incarnation healed mid-run at its first quorum and trained its own slot in
    # that same step: its first commit is the healed step, with both replicas participating
    restarted = [e for e in events(tmp_path, 1) if e["t"] > failure["t_restart"]]
    healed = [e for e in restarted if e["event"] == "healed"]
    commits = [e for e in restarted if e["event"] == "commit"]
    assert healed and healed[0]["step"] > 6, restarted
    # a live peer was ahead, so it never read the durable checkpoint (written since step 1)
    assert (tmp_path / "checkpoints").is_dir()
    assert not [e for e in restarted if e["event"] == "restored"], restarted
    assert commits[0]["step"] == healed[0]["step"] - 1
    assert not commits[0]["healing"] and commits[0]["participants"] == 2
    recs = ledger.read_log([tmp_path / "ledger" / "r1.jsonl"])
    assert 1 in next(r.contributors for r in recs if r.step == commits[0]["step"])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_commit_vote_no_in_one_rank(tmp_path: Path) -> None:
    """Rank 1 of replica 1 votes "no" after backward at step 4: that replica does not step,
    redoes the step by healing from its peer, and the run ends consistent."""
    summary = run(
        tmp_path,
        replicas=2,
        ranks_per_replica=2,
        steps=10,
        extra_env={"FTHSDP_INJECT_VOTE_NO": "1:1:4"},
    )
    assert summary.ok, summary
    ev1 = [e for e in events(tmp_path, 1) if e["event"] in ("commit", "abort")]
    aborted = [e for e in ev1 if e["event"] == "abort"]
    assert [e["step"] for e in aborted] == [4]
    # the leader (rank 0) itself had no error: the "no" came from rank 1 through the vote
    assert aborted[0]["error"] is None
    # replica 0 moved on to step 5; replica 1 heals from it at the next quorum and trains its
    # slot of step 5 in that same step
    after = ev1[ev1.index(aborted[0]) + 1]
    assert after["event"] == "commit" and after["step"] == 5, ev1
    assert not after["healing"] and after["participants"] == 2
    healed = [e for e in events(tmp_path, 1) if e["event"] == "healed" and e["step"] == 6]
    assert healed and healed[0]["t"] < after["t"]
    assert not any(e["event"] == "abort" for e in events(tmp_path, 0))
    # replica 1's records skip the aborted step; replica 0's cover it (both slots committed)
    recs = ledger.read_log([tmp_path / "ledger" / "r1.jsonl"])
    assert 4 not in {r.step for r in recs if r.lo is not None}


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_chaos_random_kills_three_replicas(tmp_path: Path) -> None:
    """>= 200 steps, 3 replicas, random kill -9s: identical weights, exactly-once ledger.

    Failures here can overlap (a replica dies while another is still restarting, or between a
    quorum and its process-group rendezvous), so a healthy replica's stall is bounded by the
    allreduce timeout plus the heartbeat timeout, not by one heartbeat as for a single failure.
    """
    summary = run(
        tmp_path,
        replicas=3,
        ranks_per_replica=1,
        steps=200,
        chaos_mtbf_s=7.0,
        # kills stop at step 100: a replica killed last needs its restart (10-30 s on a loaded
        # 2-core machine) to rejoin before the others finish
        chaos_stop_fraction=0.5,
        seed=7,
        max_restarts_per_replica=20,
        run_timeout_s=360,
        extra_env={"TINY_STEP_SLEEP_S": "0.15"},
    )
    assert summary.steps == 200
    assert len(summary.failures) >= 2, summary.failures
    assert summary.ledger_ok, (summary.ledger_problems, timeline(tmp_path, summary))
    assert summary.weights_agree
    assert len(summary.finished_replicas) >= 2, summary
    # One failure costs a healthy replica at most allreduce + heartbeat timeouts (+ slack); chaos
    # kills overlap (a second one lands while the first replica heals, and a fresh quorum then
    # waits for the replica that holds the state). Two kills within a second of each other (this
    # seed draws them 0.3 s apart) chain a third wait: the retried quorum's process group dials
    # the store of a peer killed meanwhile (5 s connect timeout). A loaded `make test` measured
    # 17 s so, with every invariant above kept; so allow three back to back.
    assert summary.max_healthy_stall_s < 3 * (5.0 + 2.0) + 3.0, (summary.stalls_s, summary.failures)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_cli_durable_restart_from_checkpoint(tmp_path: Path) -> None:
    """All replicas gone: a new run with --resume restarts from the durable checkpoint, ledger
    cursor included, and continues at the step it left."""
    spec = tmp_path / "tiny.toml"
    spec.write_text(
        (ROOT / "examples" / "tiny.toml")
        .read_text()
        .replace('run_dir = "runs/tiny"', f'run_dir = "{tmp_path / "run"}"')
    )
    base = [
        sys.executable,
        "-m",
        "fthsdp_cli",
        "run",
        "--local",
        str(spec),
        "--json",
        "--set",
        "train.checkpoint_every_steps=4",
        "--replicas",
        "2",
        "--ranks-per-replica",
        "1",
    ]
    env = {**os.environ, **_env()}
    first = subprocess.run(
        [*base, "--steps", "8"], env=env, capture_output=True, text=True, timeout=200
    )
    assert first.returncode == 0, first.stderr[-2000:]
    assert json.loads(first.stdout)["steps"] == 8
    from runtime import ledger

    ledger_dir = tmp_path / "run" / "ledger"
    end_cursor = ledger.verify(ledger.read_log(sorted(ledger_dir.glob("r*.jsonl")))).samples
    second = subprocess.run(
        [*base, "--steps", "12", "--resume"], env=env, capture_output=True, text=True, timeout=200
    )
    assert second.returncode == 0, second.stderr[-2000:]
    out = json.loads(second.stdout)
    assert out["weights_agree"] and out["steps"] == 12
    recs = ledger.read_log(sorted(ledger_dir.glob("r*.jsonl")))
    assert min(r.step for r in recs) == 8
    assert min(r.cursor for r in recs) == end_cursor > 0


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_worker_exit_codes(tmp_path: Path) -> None:
    """Bad environment: exit 2 naming the variable. No quorum service: exit 3 after join."""
    env = {
        **os.environ,
        **_env(),
        "FTHSDP_RUN_DIR": str(tmp_path),
        "FTHSDP_NUM_REPLICAS": "2",
        "FTHSDP_REPLICA_ID": "2",
        "RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29999",
        "FTHSDP_LIGHTHOUSE": "http://127.0.0.1:9",
    }
    bad = subprocess.run(COMMAND, env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert "FTHSDP_REPLICA_ID" in bad.stderr
    env.update(
        FTHSDP_REPLICA_ID="0",
        FTHSDP_HEARTBEAT_TIMEOUT_S="0.2",
        FTHSDP_ALLREDUCE_TIMEOUT_S="0.5",
        FTHSDP_QUORUM_TIMEOUT_S="1",
        FTHSDP_JOIN_TIMEOUT_S="2",
    )
    gone = subprocess.run(COMMAND, env=env, capture_output=True, text=True, timeout=60)
    assert gone.returncode == 3, gone.stderr[-1000:]
    assert "quorum service unreachable" in gone.stderr
