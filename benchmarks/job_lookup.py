"""A mass failure's job checks against a real slurmctld: one squeue a report, or one for all.

When a leaf switch or a power distribution unit fails, every leader behind it sends its fatal
report at once, and the coordinator checks each against Slurm's allocation of the report's job
before it decides anything. This runs that check for `--jobs` (default 100) jobs at once against
the dev cluster's slurmctld, two ways, interleaved:

- `one call each`: each lookup its own `CommandBackend.jobs([job])` in the event loop's default
  thread pool (what the coordinator did before `runtime.control.job_lookup`);
- `batched`: every lookup through one `JobLookup`, which asks for the jobs that came together
  in one call.

Figures: the time until every lookup has its answer, the slowest single lookup, and the squeue
calls made. The jobs are held (`sbatch --hold`), so they stay queued and cost no CPU; the
cluster is a fresh local dev cluster (root, slurm-wlm, munge) that is brought down at the end.

    python benchmarks/job_lookup.py [--repeat 5] [--jobs 100]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.harness import Run, interleave, ratios, repeats_arg  # noqa: E402
from runtime.control.job_lookup import JobLookup  # noqa: E402
from slurm import devcluster  # noqa: E402
from slurm.backend import CommandBackend  # noqa: E402
from slurm.records import JobInfo  # noqa: E402


class CountingBackend(CommandBackend):
    """A `CommandBackend` that counts its squeue calls."""

    calls = 0

    def jobs(self, job_ids: Any = (), name: str | None = None) -> list[JobInfo]:
        self.calls += 1
        return super().jobs(job_ids, name)


def submit_held(count: int, partition: str) -> list[str]:
    ids = []
    for _ in range(count):
        out = subprocess.run(
            ["sbatch", "--parsable", "--hold", "-p", partition, "-n1", "--wrap", "sleep 600"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
        ids.append(out.strip().split(";")[0])
    return ids


async def lookups(ask: Callable[[str], Awaitable[list[JobInfo]]], ids: list[str]) -> list[float]:
    """Every id looked up at once through `ask`; the seconds until each had its own job."""
    start = time.perf_counter()

    async def one(job_id: str) -> float:
        infos = await ask(job_id)
        assert any(i.base_id == job_id for i in infos), job_id
        return time.perf_counter() - start

    return list(await asyncio.gather(*(one(j) for j in ids)))


async def each_alone(backend: CommandBackend, ids: list[str]) -> list[float]:
    loop = asyncio.get_running_loop()
    return await lookups(lambda j: loop.run_in_executor(None, backend.jobs, [j]), ids)


async def batched(backend: CommandBackend, ids: list[str]) -> list[float]:
    return await lookups(JobLookup(backend.jobs).jobs, ids)


def measure(way: str, ids: list[str]) -> dict[str, float]:
    backend = CountingBackend(retries=1, timeout=60.0)
    backend.version()  # cached before the clock starts, as in a running coordinator
    start = time.perf_counter()
    done = asyncio.run(each_alone(backend, ids) if way == "alone" else batched(backend, ids))
    out = {
        "all_s": time.perf_counter() - start,
        "slowest_s": max(done),
        "calls": float(backend.calls),
    }
    print(f"  {way}: {out}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=repeats_arg())
    parser.add_argument("--jobs", type=int, default=100)
    args = parser.parse_args()
    run = Run(
        "job_lookup",
        "A mass failure's job checks against slurmctld",
        f"{args.jobs} held jobs on a fresh local dev cluster (Slurm on the host, 4 nodes); "
        f"{args.jobs} lookups of one job each start at once, as the coordinator's checks of a "
        "mass failure's fatal reports do: each its own `CommandBackend.jobs([job])` call in the "
        "event loop's default thread pool (before), or all through one `JobLookup` (now), "
        "interleaved. A lookup counts only once its own job is in the answer.",
        args.repeat,
    )
    with tempfile.TemporaryDirectory(prefix="fthsdp-bench-") as tmp:
        os.chmod(tmp, 0o755)  # slurmctld runs as slurm and reads slurm.conf from here
        base = devcluster.free_port_block(6, start=25000 + (os.getpid() % 100) * 10)
        cfg = devcluster.DevClusterConfig(
            directory=Path(tmp) / "cluster", ctld_port=base, slurmd_base_port=base + 1
        )
        with devcluster.running_cluster(cfg) as running:
            os.environ["SLURM_CONF"] = str(running.conf_path)
            ids = submit_held(args.jobs, running.partition)
            try:
                got = interleave(
                    {
                        "alone": lambda: measure("alone", ids),
                        "batched": lambda: measure("batched", ids),
                    },
                    args.repeat,
                )
            finally:
                subprocess.run(["scancel", *ids], capture_output=True, timeout=60, check=False)
    labels = {"alone": "one call each", "batched": "batched"}
    for way in ("alone", "batched"):
        at = labels[way]
        run.row(f"every lookup answered, {at}", [g["all_s"] for g in got[way]], "s", digits=3)
        run.row(f"slowest lookup, {at}", [g["slowest_s"] for g in got[way]], "s", digits=3)
        run.row(f"squeue calls, {at}", [g["calls"] for g in got[way]], "", digits=0)
    all_s = {w: [g["all_s"] for g in got[w]] for w in got}
    run.row(
        "every lookup answered, batched / one call each (paired)",
        ratios(all_s, "batched", "alone"),
        "x",
    )
    run.extra["runs"] = got
    run.write()


if __name__ == "__main__":
    main()
