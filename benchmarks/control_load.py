"""Control plane under load: one coordinator, 1,000 replica leaders reporting every second.

A real coordinator (`runtime.control.coordinator.start_coordinator`: aiohttp, the SQLite journal,
the policy, signatures) runs in its own process with an in-memory Slurm backend that stamps the
time of every drain/requeue call; this process plays the leaders. Every report is a
`ReplicaReport` signed with its replica's key by `runtime.control.report.sign`, the calls
`runtime.reporting.ReportClient` makes, posted over real HTTP on loopback on a fresh connection
(as a leader's urllib does). Before the load, one report goes through a real `ReportClient`,
so a change of the wire protocol stops the benchmark instead of measuring refusals.

Each repeat: `WINDOW_S` seconds of 1,000 status reports per second (each of the 1,000 steady
replicas once a second, phases spread over the second), and in its middle a burst of 100 fatal
node-fault reports at once from 100 other replicas (a fresh group each repeat). Figures: report
latency p50/p99, reports/s answered, refused or lost reports, the coordinator's CPU (cores) and
RSS, journal growth (extrapolated to an hour), and fatal report -> Slurm requeue call.
Target: p99 < 100 ms at 1,000 reports/s on this machine, no report lost.

    python benchmarks/control_load.py [--repeat 5] [--replicas 1000] [--window 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.harness import Run, repeats_arg  # noqa: E402

BURST = 100
JOB0 = 500000


def job_of(replica: int) -> str:
    return str(JOB0 + replica)


def node_of(replica: int) -> str:
    return f"n{replica:05d}"


# ------------------------------------------------------------------ the coordinator process
class MemoryBackend:
    """Slurm as a dict: every job RUNNING on its own node; actions stamped to a JSON-lines file."""

    def __init__(self, replicas: int, log_path: Path) -> None:
        from slurm.records import JobInfo

        self._jobs = {
            job_of(k): JobInfo(job_of(k), f"r{k}", "RUNNING", node_of(k), 0, "")
            for k in range(replicas)
        }
        self._lock = threading.Lock()
        self._log = open(log_path, "a", buffering=1)  # noqa: SIM115

    def _stamp(self, action: str, target: str) -> None:
        self._log.write(json.dumps({"t": time.time(), "action": action, "target": target}) + "\n")

    def jobs(self, job_ids: Iterable[str] = (), name: str | None = None) -> list[Any]:
        want = set(job_ids)
        with self._lock:
            return [j for i, j in self._jobs.items() if not want or i in want]

    def nodes(self, names: Iterable[str] = ()) -> list[Any]:
        return []

    def drain(self, node: str, reason: str) -> bool:
        self._stamp("drain", node)
        return True

    def resume(self, node: str) -> bool:
        return True

    def requeue(self, job_id: str) -> None:
        from dataclasses import replace

        with self._lock:
            j = self._jobs[job_id]
            self._jobs[job_id] = replace(j, state="PENDING", restarts=j.restarts + 1)
        self._stamp("requeue", job_id)

    def release(self, job_id: str, exclude: Sequence[str] = ()) -> None:
        self._stamp("release", job_id)

    def cancel(self, job_ids: Iterable[str]) -> None:
        for j in job_ids:
            self._stamp("cancel", j)

    def submit(self, script: Path, args: Sequence[str] = ()) -> str:
        raise NotImplementedError("the benchmark submits nothing")


async def serve(run_dir: Path, replicas: int) -> None:
    from runtime.control.coordinator import CoordinatorConfig, start_coordinator
    from runtime.control.policy import PolicyConfig

    policy = PolicyConfig(
        replicas=replicas, min_replicas=1, report_timeout_s=3600.0, start_timeout_s=3600.0
    )
    config = CoordinatorConfig(
        run_dir=run_dir,
        policy=policy,
        job_ids={k: job_of(k) for k in range(replicas)},
        port=0,
        poll_s=3.0,
    )
    backend = MemoryBackend(replicas, run_dir / "actions.jsonl")
    running = await start_coordinator(config, backend)
    (run_dir / "url.tmp").write_text(running.url)
    (run_dir / "url.tmp").rename(run_dir / "url")
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await running.close()


# ------------------------------------------------------------------ the leaders
def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _journal_bytes(run_dir: Path) -> int:
    return sum(p.stat().st_size for p in run_dir.glob("control.sqlite*") if p.is_file())


class Leaders:
    """Signed reports of many replicas, posted with aiohttp on fresh connections."""

    def __init__(self, url: str, secret: bytes) -> None:
        self.url = url
        self.secret = secret
        self.seq: dict[int, int] = {}

    def request(self, report: Any) -> tuple[bytes, dict[str, str]]:
        from runtime.control.report import replica_key_id, sign

        body = report.to_json()
        headers = sign(self.secret, replica_key_id(report.replica), "POST", "/v1/reports", body)
        return body, {"Content-Type": "application/json", **headers}

    def status(self, k: int) -> Any:
        from runtime.control.report import ReplicaReport

        n = self.seq[k] = self.seq.get(k, 0) + 1
        return ReplicaReport(
            replica=k,
            incarnation=f"load{k}",
            seq=n,
            job_id=job_of(k),
            nodes=[node_of(k)],
            step=n,
            participants=1000,
            healing=False,
            step_time_s=1.0,
            compute_s=0.9,
            allreduce_wait_s=0.1,
            rank_compute_s=[0.9],
            cursor=n * 8,
        )

    def fatal(self, k: int) -> Any:
        from runtime.control.report import ExitCode, ReplicaReport

        n = self.seq[k] = self.seq.get(k, 0) + 1
        return ReplicaReport(
            replica=k,
            incarnation=f"load{k}",
            seq=n,
            kind="fatal",
            job_id=job_of(k),
            nodes=[node_of(k)],
            step=n,
            failure="node",
            failed_node=node_of(k),
            evidence=["Xid 79: GPU has fallen off the bus"],
            exit_code=int(ExitCode.NODE_FAULT),
            last_error="Xid 79",
        )

    async def post(self, http: Any, report: Any) -> tuple[int, float, float]:
        """(status or -1, latency s, send time) of one report."""
        import aiohttp

        body, headers = self.request(report)
        sent = time.time()
        t0 = time.perf_counter()
        try:
            async with http.post(self.url + "/v1/reports", data=body, headers=headers) as resp:
                await resp.read()
                status = resp.status
        except (TimeoutError, aiohttp.ClientError, OSError):
            status = -1
        return status, time.perf_counter() - t0, sent


async def window(leaders: Leaders, steady: int, seconds: float, burst: list[int]) -> dict[str, Any]:
    """Every steady replica reports once a second for `seconds`; the burst lands mid-way."""
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=10)
    results: list[tuple[int, float, float]] = []
    fatal_sent: dict[int, tuple[int, float]] = {}
    phases = {k: random.random() for k in range(steady)}
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        tasks: list[asyncio.Task[Any]] = []
        start = time.perf_counter()
        due = sorted((phases[k], k) for k in range(steady))
        ticks = int(seconds)
        burst_at = seconds / 2
        burst_done = not burst

        async def one(report: Any) -> None:
            results.append(await leaders.post(http, report))

        async def fatal_one(k: int) -> None:
            status, _latency, sent = await leaders.post(http, leaders.fatal(k))
            fatal_sent[k] = (status, sent)

        for tick in range(ticks):
            for phase, k in due:
                at = start + tick + phase
                delay = at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if not burst_done and tick + phase >= burst_at:
                    tasks += [asyncio.ensure_future(fatal_one(b)) for b in burst]
                    burst_done = True
                tasks.append(asyncio.ensure_future(one(leaders.status(k))))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
    return {"results": results, "fatal": fatal_sent, "elapsed_s": elapsed}


def percentile(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def action_times(run_dir: Path, action: str) -> dict[str, float]:
    out: dict[str, float] = {}
    path = run_dir / "actions.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        rec = json.loads(line)
        if rec["action"] == action:
            out.setdefault(rec["target"], rec["t"])
    return out


def check_protocol(url: str, secret: bytes, replica: int) -> None:
    """One report through the real ReportClient must be accepted, or the figures are moot."""
    from runtime.reporting import ReportClient

    client = ReportClient(
        lambda: url,
        secret,
        replica,
        f"load{replica}",
        job_id=job_of(replica),
        nodes=[node_of(replica)],
    )
    client.status(step=0, participants=1)
    client.close(timeout_s=10)
    if client.accepted != 1:
        raise SystemExit(
            f"control_load: the coordinator did not accept a ReportClient report "
            f"(accepted {client.accepted}, rejected {client.rejected}); protocol changed?"
        )


async def warm_up(leaders: Leaders, replicas: int) -> None:
    """One status report from every replica (so each is training and its job is known)."""
    import aiohttp

    connector = aiohttp.TCPConnector(limit=64, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as http:
        got = await asyncio.gather(
            *(leaders.post(http, leaders.status(k)) for k in range(replicas))
        )
    bad = [s for s, _, _ in got if s != 200]
    if bad:
        raise SystemExit(f"control_load: warm-up reports refused: {bad[:5]} ({len(bad)})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--replicas", type=int, default=1000, help="steady reporters")
    parser.add_argument("--window", type=float, default=10.0, help="seconds of load per repeat")
    parser.add_argument("--repeat", type=int, default=repeats_arg())
    args = parser.parse_args()
    steady, repeats = args.replicas, args.repeat
    total = steady + BURST * repeats
    if args.serve:
        asyncio.run(serve(args.serve, int(os.environ["CONTROL_LOAD_REPLICAS"])))
        return 0
    import resource

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    run_dir = Path(tempfile.mkdtemp(prefix="fthsdp-control-load-"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CONTROL_LOAD_REPLICAS": str(total)}
    log = open(run_dir / "coordinator.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(run_dir)], env=env, stdout=log, stderr=log
    )
    try:
        deadline = time.monotonic() + 60
        while not (run_dir / "url").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"control_load: coordinator did not start; see {run_dir}")
            time.sleep(0.1)
        url = (run_dir / "url").read_text()
        from runtime.control.report import read_secret

        secret = read_secret(run_dir / "secret")
        check_protocol(url, secret, 0)
        leaders = Leaders(url, secret)
        leaders.seq[0] = 1
        asyncio.run(warm_up(leaders, total))
        run = Run(
            "control_load",
            "Control plane under load",
            f"One coordinator process (aiohttp, SQLite journal with WAL and synchronous=FULL, "
            f"in-memory Slurm backend), {steady:,} replica leaders each sending a signed status "
            f"report once a second for {args.window:g} s per repeat over fresh loopback "
            f"connections, and mid-window a burst of {BURST} fatal node-fault reports at once "
            f"from {BURST} other replicas ({total:,} replicas configured). The leaders share the "
            "2 cores with the coordinator, so latencies include the load generator's own lag.",
            repeats,
        )
        per: dict[str, list[float]] = {
            k: []
            for k in (
                "p50",
                "p99",
                "max",
                "rps",
                "lost",
                "refused",
                "cpu",
                "rss",
                "journal_h",
                "fatal_p50",
                "fatal_max",
                "drain_p50",
                "fatal_latency_p50",
            )
        }
        for i in range(repeats):
            burst = list(range(steady + BURST * i, steady + BURST * (i + 1)))
            cpu0, bytes0, t0 = _proc_cpu_s(proc.pid), _journal_bytes(run_dir), time.perf_counter()
            got = asyncio.run(window(leaders, steady, args.window, burst))
            cpu1, bytes1, t1 = _proc_cpu_s(proc.pid), _journal_bytes(run_dir), time.perf_counter()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                requeued = action_times(run_dir, "requeue")
                if all(job_of(b) in requeued for b in burst):
                    break
                time.sleep(0.1)
            requeued, drained = action_times(run_dir, "requeue"), action_times(run_dir, "drain")
            lat = [lt for s, lt, _ in got["results"] if s == 200]
            to_action = [
                requeued[job_of(b)] - got["fatal"][b][1]
                for b in burst
                if job_of(b) in requeued and b in got["fatal"]
            ]
            to_drain = [
                drained[node_of(b)] - got["fatal"][b][1]
                for b in burst
                if node_of(b) in drained and b in got["fatal"]
            ]
            fatal_ok = sum(1 for s, _ in got["fatal"].values() if s == 200)
            per["p50"].append(percentile(lat, 50) * 1000)
            per["p99"].append(percentile(lat, 99) * 1000)
            per["max"].append(max(lat) * 1000)
            per["rps"].append(len(lat) / got["elapsed_s"])
            per["lost"].append(sum(1 for s, _, _ in got["results"] if s == -1))
            per["refused"].append(sum(1 for s, _, _ in got["results"] if s not in (200, -1)))
            per["cpu"].append((cpu1 - cpu0) / (t1 - t0))
            per["rss"].append(_proc_rss_mib(proc.pid))
            per["journal_h"].append((bytes1 - bytes0) / (t1 - t0) * 3600 / 2**20)
            per["fatal_p50"].append(statistics.median(to_action) if to_action else float("nan"))
            per["fatal_max"].append(max(to_action) if to_action else float("nan"))
            per["drain_p50"].append(statistics.median(to_drain) if to_drain else float("nan"))
            print(
                f"  repeat {i + 1}/{repeats}: {len(lat)} ok in {got['elapsed_s']:.1f} s, p50 "
                f"{per['p50'][-1]:.1f} ms p99 {per['p99'][-1]:.1f} ms, lost {per['lost'][-1]:.0f}, "
                f"refused {per['refused'][-1]:.0f}, cpu {per['cpu'][-1]:.2f}, fatal accepted "
                f"{fatal_ok}/{BURST}, requeued {len(to_action)}/{BURST}, fatal->requeue p50 "
                f"{per['fatal_p50'][-1]:.3f} s",
                flush=True,
            )
            if len(to_action) != BURST or fatal_ok != BURST:
                run.notes.append(
                    f"- Repeat {i + 1}: {fatal_ok} of {BURST} fatal reports accepted and "
                    f"{len(to_action)} requeued within 30 s."
                )
        run.row("report latency p50", per["p50"], "ms", digits=3)
        run.row("report latency p99", per["p99"], "ms", "< 100 ms", digits=3)
        run.row("report latency max", per["max"], "ms", digits=3)
        run.row("reports answered per second", per["rps"], "/s", "≥ 1,000", digits=0)
        run.row("reports lost (no answer) per window", per["lost"], "", "0", digits=0)
        run.row("reports refused per window", per["refused"], "", "0", digits=0)
        run.row("coordinator CPU (cores)", per["cpu"], "", digits=2)
        run.row("coordinator RSS", per["rss"], "MiB", digits=0)
        run.row("journal growth (extrapolated)", per["journal_h"], "MiB/h", digits=0)
        run.row(f"fatal report → requeue call, median of {BURST}", per["fatal_p50"], "s")
        run.row(f"fatal report → requeue call, slowest of {BURST}", per["fatal_max"], "s")
        run.row(f"fatal report → drain call, median of {BURST}", per["drain_p50"], "s")
        p99 = statistics.median(per["p99"])
        rps = statistics.median(per["rps"])
        ok = p99 < 100 and rps >= 0.95 * steady and max(per["lost"]) == 0
        run.notes.append(
            f"- Target p99 < 100 ms at {steady:,} reports/s with no report lost: "
            + ("met." if ok else f"missed (median p99 {p99:.0f} ms, {rps:,.0f} reports/s).")
        )
        run.extra["journal_bytes_end"] = _journal_bytes(run_dir)
        run.extra["replicas_configured"] = total
        run.extra["window_s"] = args.window
        run.write()
        return 0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


if __name__ == "__main__":
    sys.exit(main())
