"""The coordinator's capacity, this tree against an earlier revision, interleaved.

A change meant to make the coordinator cheaper per report is judged by a ratio measured in the
same run: the two coordinators take turns on the same machine, so a noisy hour moves both. The
revision (`--base`, default HEAD) is checked out into a temporary git worktree; each
measurement is a fresh process that imports `benchmarks/control_load.py` from one of the two
trees, starts that tree's coordinator (1,000 replicas, the in-memory Slurm of `control_load`),
warms it with one report per replica and then has 16 leaders post signed status reports back to
back on kept-alive connections for `--seconds` (what `control_load` calls the capacity). The
leaders share the machine's cores with the coordinator, so the coordinator's CPU time per
answered report is the figure of its own cost; the capacity is what a sender sees.

    python benchmarks/control_capacity.py [--base REV] [--repeat 5] [--seconds 5] [--nice -10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.harness import Run, interleave, ratios, repeats_arg  # noqa: E402

REPLICAS = 1000
SENDERS = 16


def measure(tree: Path, seconds: float, nice: int) -> dict[str, float]:
    """Run in a process of its own (`--measure TREE`): that tree's coordinator and leaders."""
    for name in [m for m in sys.modules if m.split(".")[0] in ("benchmarks", "runtime", "slurm")]:
        del sys.modules[name]  # this script's own tree was imported first
    sys.path.insert(0, str(tree))
    import benchmarks.control_load as load

    assert Path(load.__file__).resolve().is_relative_to(tree.resolve()), load.__file__
    load.raise_limits(nice)
    with load.coordinator_process(REPLICAS) as (proc, _run_dir, leaders):
        leaders.keepalive = True
        cpu0, t0 = load._proc_cpu_s(proc.pid), time.perf_counter()
        capacity = asyncio.run(leaders.closing(load.saturate(leaders, REPLICAS, seconds, SENDERS)))
        cores = (load._proc_cpu_s(proc.pid) - cpu0) / (time.perf_counter() - t0)
    return {"capacity": capacity, "cores": cores}


def measured(tree: Path, seconds: float, nice: int) -> dict[str, float]:
    argv = [sys.executable, __file__, "--measure", str(tree), "--seconds", str(seconds)]
    out = subprocess.run(
        [*argv, "--nice", str(nice)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"control_capacity: the measurement in {tree} failed:\n{out.stderr}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD", help="the git revision to compare against")
    parser.add_argument("--repeat", type=int, default=repeats_arg())
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds of load per run")
    parser.add_argument("--nice", type=int, default=0, help="priority of both sides (root: < 0)")
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.seconds, args.nice)))
        return 0
    rev = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", args.base],
        capture_output=True,
        text=True,
        check=False,
    )
    if rev.returncode != 0:
        print(f"control_capacity: --base {args.base!r} is no revision of {ROOT}", file=sys.stderr)
        return 2
    base_rev = rev.stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--", "runtime", "slurm"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    tree_name = f"this tree ({head}" + (" with uncommitted changes)" if dirty else ")")
    with tempfile.TemporaryDirectory(prefix="fthsdp-capacity-") as tmp:
        base = Path(tmp) / "base"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(base), base_rev],
            check=True,
        )
        try:
            run = Run(
                "control_capacity",
                "Coordinator capacity against an earlier revision",
                f"One coordinator process per measurement ({REPLICAS:,} replicas, in-memory "
                f"Slurm, the SQLite journal with group commit), warmed with one report per "
                f"replica, then {SENDERS} leaders posting signed status reports back to back on "
                f"kept-alive loopback connections for {args.seconds:g} s; the leaders share the "
                f"2 cores with it. Revision {base_rev} against {tree_name}, interleaved "
                f"(rotated order), at nice {args.nice}.",
                args.repeat,
            )
            got = interleave(
                {
                    base_rev: lambda: measured(base, args.seconds, args.nice),
                    "tree": lambda: measured(ROOT, args.seconds, args.nice),
                },
                args.repeat,
            )
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False
            )
    capacity = {name: [g["capacity"] for g in got[name]] for name in got}
    cores = {name: [g["cores"] for g in got[name]] for name in got}
    # The leaders take the rest of the 2 cores, so capacity moves with their share too; the
    # coordinator's CPU time per answered report is its own cost.
    per_report = {
        name: [1000 * c / r for c, r in zip(cores[name], capacity[name], strict=True)]
        for name in got
    }
    figures = [
        ("capacity", capacity, "/s", 0, "capacity ratio"),
        ("coordinator CPU (cores) at capacity", cores, "", 2, None),
        ("coordinator CPU time per report", per_report, "ms", 4, "CPU time per report ratio"),
    ]
    for figure, values, unit, digits, ratio in figures:
        run.row(f"{figure}, {base_rev}", values[base_rev], unit, digits=digits)
        run.row(f"{figure}, {tree_name}", values["tree"], unit, digits=digits)
        if ratio:
            paired = ratios(values, "tree", base_rev)
            run.row(f"{ratio}, {tree_name} / {base_rev} (paired)", paired, "x", digits=2)
    run.extra["base"] = base_rev
    run.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
