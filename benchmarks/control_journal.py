"""Benchmark: journal size and control-job restart time after a long run.

1,000 replicas send 1,000,000 status reports (each replica every 10 s of simulated time, about
2.8 h), written through the journal API the way the coordinator writes them: the policy step,
one journal record per report with its nonce, a snapshot and compaction every
`compaction_interval(1000)` (4,000) events, placed so that the last one leaves the longest tail
to replay (3,999 reports). The volume is loaded without an fsync per commit (the
figures measured here do not depend on it); everything after that runs durable.

Then, interleaved for 5 rounds: a restarted control process (`fthsdp control --no-lighthouse
--no-poll`, a real process on loopback) on that journal, and one on an empty journal of the same
1,000-replica run: seconds from the process start to its first answer to a signed
`GET /v1/state`. Also the in-process replay (`Journal.rebuild`) alone, and a real-HTTP sample:
2,000 signed status reports from all 1,000 replicas to the restarted coordinator, with the
journal size after them.

Targets: the restarted coordinator answers in under 5 s; the journal (database + WAL) is under
50 MB. Prints medians and ranges and writes benchmarks/results/control_journal.json.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from control_attack import journal_rows  # noqa: E402
from control_harness import install_fake_slurm  # noqa: E402

from runtime.control.coordinator import compaction_interval  # noqa: E402
from runtime.control.journal import JOURNAL_FILE, Journal  # noqa: E402
from runtime.control.policy import PolicyConfig, ReportReceived, RunState, step  # noqa: E402
from runtime.control.report import (  # noqa: E402
    CONTROL_KEY,
    ReplicaReport,
    read_secret,
    replica_key_id,
    sign,
)

REPLICAS = 1000
REPORTS = 1_000_000
INTERVAL_S = 10.0
ROUNDS = 5
HTTP_REPORTS = 2000
JOBS = {k: str(10_000 + k) for k in range(REPLICAS)}


def make_run(run_dir: Path) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"replicas": REPLICAS}))
    jobs = {str(k): j for k, j in JOBS.items()}
    (run_dir / "jobs.json").write_text(json.dumps({"replicas": jobs}))


def load(run_dir: Path, n: int) -> dict[str, Any]:
    """Write `n` status reports as the coordinator would; returns timing and counts."""
    journal = Journal(run_dir / JOURNAL_FILE, durable=False)
    state = RunState.new(PolicyConfig(replicas=REPLICAS), JOBS)
    every = compaction_interval(REPLICAS)
    t0 = time.perf_counter()
    start = time.time() - n * INTERVAL_S / REPLICAS
    compactions = 0
    seq = 0
    for i in range(n):
        k = i % REPLICAS
        at = start + i * INTERVAL_S / REPLICAS
        report = ReplicaReport(
            replica=k,
            incarnation=f"w{k}",
            seq=i // REPLICAS + 1,
            job_id=JOBS[k],
            nodes=[f"node{k}"],
            step=i // REPLICAS,
            quorum_id=1,
            participants=REPLICAS,
            step_time_s=1.0,
            compute_s=0.8,
            allreduce_wait_s=0.2,
            cursor=i,
            sent_at=at,
        )
        event = ReportReceived(report, at)
        state, actions = step(state, event)
        seq, _ = journal.record(event, actions, nonce=f"{i:032x}", now=at)
        if i > 0 and (i + 1) % every == 1:  # the last snapshot leaves every - 1 to replay
            journal.compact(state, seq, now=at)
            compactions += 1
        if (i + 1) % 100_000 == 0:
            print(f"  {i + 1:,} reports written ({time.perf_counter() - t0:.0f} s)", flush=True)
    journal.close()
    return {"load_s": time.perf_counter() - t0, "compactions": compactions, "last_seq": seq}


def journal_bytes(run_dir: Path) -> int:
    return sum(p.stat().st_size for p in run_dir.glob(JOURNAL_FILE + "*"))


def rows(run_dir: Path) -> dict[str, int]:
    return journal_rows(run_dir, ("events", "actions", "nonces"))


def signed_state(url: str, secret: bytes) -> int:
    req = urllib.request.Request(
        url + "/v1/state", headers=sign(secret, CONTROL_KEY, "GET", "/v1/state")
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def restart(run_dir: Path, env: dict[str, str], poll: bool = False) -> tuple[float, Any]:
    """Start a control process; seconds until it answers a signed /v1/state. Returns the
    process (the caller stops it)."""
    control = run_dir / "control.json"
    control.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "fthsdp_cli", "control", "--run-dir", str(run_dir)]
    argv += ["--bind", "127.0.0.1", "--no-lighthouse"] + ([] if poll else ["--no-poll"])
    log = open(run_dir / "control.log", "ab")  # noqa: SIM115
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log)
    log.close()
    secret = read_secret(run_dir / "secret") if (run_dir / "secret").exists() else None
    deadline = t0 + 120
    while time.perf_counter() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"control process exited {proc.returncode}; see {log.name}")
        if control.exists():
            try:
                url = json.loads(control.read_text())["coordinator"]
            except (ValueError, KeyError):
                url = None
            if url:
                secret = secret or read_secret(run_dir / "secret")
                if signed_state(url, secret) == 200:
                    return time.perf_counter() - t0, (proc, url)
        time.sleep(0.02)
    proc.kill()
    raise RuntimeError("control process did not answer within 120 s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def http_sample(url: str, secret: bytes) -> dict[str, Any]:
    """`HTTP_REPORTS` signed status reports over real HTTP, 8 senders at a time."""

    def one(i: int) -> float:
        k = i % REPLICAS
        body = ReplicaReport(
            replica=k, incarnation=f"http{k}", seq=i // REPLICAS + 1, job_id=JOBS[k], step=10**6
        ).to_json()
        headers = sign(secret, replica_key_id(k), "POST", "/v1/reports", body)
        req = urllib.request.Request(url + "/v1/reports", data=body, headers=headers)
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200
        return time.perf_counter() - t0

    t0 = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        latencies = sorted(pool.map(one, range(HTTP_REPORTS)))
    wall = time.perf_counter() - t0
    return {
        "reports": HTTP_REPORTS,
        "wall_s": wall,
        "reports_per_s": HTTP_REPORTS / wall,
        "latency_median_s": statistics.median(latencies),
        "latency_p99_s": latencies[int(0.99 * len(latencies))],
    }


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="fthsdp-bench-journal-"))
    big, empty = root / "long-run", root / "fresh-run"
    make_run(big)
    make_run(empty)
    env = install_fake_slurm(root, {j: f"node{k}" for k, j in JOBS.items()})
    print(f"writing {REPORTS:,} status reports from {REPLICAS:,} replicas ...", flush=True)
    loaded = load(big, REPORTS)
    size_loaded = journal_bytes(big)
    rows_loaded = rows(big)
    print(f"journal after the load: {size_loaded / 1e6:.1f} MB, rows {rows_loaded}")

    replay: list[float] = []
    restarts: dict[str, list[float]] = {"long-run": [], "fresh-run": []}
    for r in range(ROUNDS):
        journal = Journal(big / JOURNAL_FILE)
        t0 = time.perf_counter()
        journal.check()
        journal.rebuild(PolicyConfig(replicas=REPLICAS), JOBS)
        replay.append(time.perf_counter() - t0)
        journal.close()
        for name, run_dir in (("long-run", big), ("fresh-run", empty)):
            seconds, (proc, _) = restart(run_dir, env)
            stop(proc)
            restarts[name].append(seconds)
        print(
            f"round {r}: replay {replay[-1]:.2f} s; restart to first answer: long run "
            f"{restarts['long-run'][-1]:.2f} s, fresh run {restarts['fresh-run'][-1]:.2f} s",
            flush=True,
        )

    seconds, (proc, url) = restart(big, env, poll=True)
    try:
        time.sleep(8)  # the first squeue poll lists every job's nodes (one call for all)
        sample = http_sample(url, read_secret(big / "secret"))
    finally:
        stop(proc)
    size_after = journal_bytes(big)
    print(
        f"real HTTP: {sample['reports']} signed reports at {sample['reports_per_s']:.0f}/s "
        f"(median {sample['latency_median_s'] * 1000:.1f} ms, p99 "
        f"{sample['latency_p99_s'] * 1000:.1f} ms); journal {size_after / 1e6:.1f} MB"
    )

    def summary(values: list[float]) -> dict[str, Any]:
        return {"median": statistics.median(values), "range": [min(values), max(values)]}

    results: dict[str, Any] = {
        "replicas": REPLICAS,
        "reports": REPORTS,
        "report_interval_s": INTERVAL_S,
        "load": loaded,
        "journal_bytes_after_load": size_loaded,
        "rows_after_load": rows_loaded,
        "replay_s": summary(replay),
        "restart_to_first_answer_s": {k: summary(v) for k, v in restarts.items()},
        "restart_runs_s": restarts,
        "http_sample": sample,
        "journal_bytes_after_http": size_after,
        "rows_after_http": rows(big),
        "targets": {"restart_s": 5.0, "journal_bytes": 50_000_000},
    }
    results["targets_met"] = (
        max(restarts["long-run"]) < 5.0 and max(size_loaded, size_after) < 50_000_000
    )
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "control_journal.json").write_text(json.dumps(results, indent=2))
    long_run = results["restart_to_first_answer_s"]["long-run"]
    fresh = results["restart_to_first_answer_s"]["fresh-run"]
    print(
        f"restart after {REPORTS:,} reports: median {long_run['median']:.2f} s (range "
        f"{long_run['range'][0]:.2f}-{long_run['range'][1]:.2f}); empty journal: median "
        f"{fresh['median']:.2f} s; replay alone median {results['replay_s']['median']:.2f} s; "
        f"journal {size_loaded / 1e6:.1f} MB; targets met: {results['targets_met']}"
    )
    return 0 if results["targets_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
