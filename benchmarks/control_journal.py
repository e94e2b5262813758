"""Benchmark: journal size and control-job restart time after a long run.

1,000 replicas send 1,000,000 status reports (each replica every 10 s of simulated time, about
2.8 h), written through the journal API the way the coordinator writes them: the policy step,
one journal record per report with its nonce, a snapshot and compaction every
`compaction_interval(1000)` (4,000) events, placed so that the last one leaves the longest tail
to replay (3,999 reports). The volume is loaded without an fsync per commit (the
figures measured here do not depend on it); everything after that runs durable.

Then, interleaved for 5 repeats: a restarted control process (`fthsdp control --no-lighthouse
--no-poll`, a real process on loopback) on that journal, and one on an empty journal of the same
1,000-replica run: seconds from the process start to its first answer to a signed
`GET /v1/state`. Also the in-process replay (`Journal.rebuild`) alone, and a real-HTTP sample:
2,000 signed status reports from all 1,000 replicas to the restarted coordinator, with the
journal size after them.

Targets: the restarted coordinator answers in under 5 s; the journal (database + WAL) is under
50 MB. Prints medians and ranges over the repeats (`--repeat N`, default 5) and writes
benchmarks/results/control_journal.json and benchmarks/figures/control_journal.json.
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

from benchmarks.harness import Run, interleave, repeats_arg  # noqa: E402
from runtime.control.coordinator import compaction_interval  # noqa: E402
from runtime.control.journal.schema import JOURNAL_FILE  # noqa: E402
from runtime.control.journal.store import Journal  # noqa: E402
from runtime.control.policy import PolicyConfig, ReportReceived, RunState, step  # noqa: E402
from runtime.protocol import CONTROL_KEY, ReplicaReport, replica_key_id, sign  # noqa: E402
from slurm.rundir import read_secret  # noqa: E402

REPLICAS = 1000
REPORTS = 1_000_000
INTERVAL_S = 10.0
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
        "latencies_s": latencies,
    }


def main() -> int:
    repeats = repeats_arg()
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
    run = Run(
        "control_journal",
        "Control-plane journal",
        f"{REPLICAS:,} replicas, {REPORTS:,} status reports (each replica every "
        f"{INTERVAL_S:.0f} s of simulated time) written through the journal API as the "
        "coordinator writes them, a snapshot and compaction every 4,000 events placed so that "
        "the last one leaves 3,999 reports to replay (the worst case). Then, interleaved: a "
        "restarted control process on that journal and one on an empty journal of the same "
        "run, timed from process start to the first answer to a signed `GET /v1/state`; the "
        "in-process replay alone; and a real-HTTP sample of "
        f"{HTTP_REPORTS:,} signed reports from all replicas (8 senders).",
        repeats,
    )

    def replay() -> float:
        journal = Journal(big / JOURNAL_FILE)
        t0 = time.perf_counter()
        journal.check()
        journal.rebuild(PolicyConfig(replicas=REPLICAS), JOBS)
        seconds = time.perf_counter() - t0
        journal.close()
        return seconds

    def restarted(run_dir: Path) -> float:
        seconds, (proc, _) = restart(run_dir, env)
        stop(proc)
        return seconds

    got = interleave(
        {
            "replay": replay,
            "long-run": lambda: restarted(big),
            "fresh-run": lambda: restarted(empty),
        },
        repeats,
    )
    _, (proc, url) = restart(big, env, poll=True)
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
    run.row(f"restart to first answer after {REPORTS:,} reports", got["long-run"], "s", "< 5 s", 2)
    run.row("restart to first answer, empty journal", got["fresh-run"], "s", "", 2)
    run.row("replay alone (quick_check, snapshot, 3,999 events)", got["replay"], "s", "", 2)
    run.row(
        f"journal (database + WAL) after {REPORTS:,} reports",
        [size_loaded / 1e6],
        "MB",
        "< 50 MB",
        1,
    )
    run.row(
        f"real HTTP: {HTTP_REPORTS:,} signed reports, latency",
        [v * 1000 for v in sample["latencies_s"]],
        "ms",
    )
    run.notes.append(
        f"- Loading the {REPORTS:,} reports took {loaded['load_s']:.0f} s without an fsync per "
        f"commit ({loaded['compactions']} compactions). Rows after it: {rows_loaded} (nonces: "
        f"the last 600 s). Real HTTP sample: {sample['reports_per_s']:.0f} reports/s, p99 "
        f"{sample['latency_p99_s'] * 1000:.0f} ms; journal {size_after / 1e6:.1f} MB after it."
    )
    run.notes.append(
        "- Before snapshots and compaction (measured when the problem was found): 20,000 events "
        "took 6.5 s to replay with 3 replicas and 56.5 s with 32 (every report kept, the whole "
        "state deep-copied per event). The size and the replay are now bounded by the replica "
        "count: the snapshot, at most 4 events per replica since it, the nonces of the last "
        "600 s, and the events that decided something (kept with their actions). "
        "`tests/test_control_journal.py` kills a real process with SIGKILL at 5 moments of a "
        "120,000-event compaction: every decision survives and the replayed state is unchanged."
    )
    sample_out = {k: v for k, v in sample.items() if k != "latencies_s"}
    run.extra.update(
        replicas=REPLICAS,
        reports=REPORTS,
        load=loaded,
        journal_bytes_after_load=size_loaded,
        rows_after_load=rows_loaded,
        http_sample=sample_out,
        journal_bytes_after_http=size_after,
        rows_after_http=rows(big),
    )
    ok = max(got["long-run"]) < 5.0 and max(size_loaded, size_after) < 50_000_000
    run.extra["targets_met"] = ok
    run.write()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
