"""`make test`'s long part: the host's slow tier and the release matrix, in lanes side by side.

Both are dominated by waits on dev clusters and multi-process training, so they run in two lanes
at once: the host's `slurm or slow` tests, and beside them every other release of the matrix, one
after the other, then a few multi-process tests that need no Slurm (`BESIDE_THE_RELEASES`), which
even the two lanes out. Every lane starts its own dev clusters (their own folders, ports and munge
sockets). The first lane streams to the terminal; each release writes to its own log, printed
when it ends, so pytest progress lines never interleave. `--serial` runs every part one after the
other. Four lanes were tried and overloaded the two cores (docs/benchmarks.md).

Each part gets `FTHSDP_TEST_LANES`, the number of lanes running at once: the stories that promise
to work on a busy machine start only the CPU burners that the other lanes do not already stand
for (`tests/cpu_load.py`). And `FTHSDP_HEAVY_SLOTS`, one per core: the heavy tests (`slow`,
`one_release`) of every lane take turns for that many machine-wide slots
(`tests/machine_slots.py`), while the light dev-cluster tests run beside them.

On SIGINT or SIGTERM every part gets SIGINT (pytest's KeyboardInterrupt runs the fixtures'
teardown, which stops their dev clusters), then SIGKILL after a grace. Each part runs in its own
process group with SIGINT at its default, even when `make` itself was started with it ignored
(a background job of a non-interactive shell), so that the tests' own SIGINTs reach their
children.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO

GRACE_S = 120.0


@dataclass
class Part:
    """One pytest run (or a release's `make test-slurm`) of the tier."""

    name: str
    argv: list[str]
    log: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    took_s: float = 0.0
    rc: int | None = None
    out: IO[bytes] | None = field(default=None, repr=False)
    env: dict[str, str] = field(default_factory=dict)

    def start(self) -> None:
        print(f"== {self.name}: {' '.join(self.argv)}", flush=True)
        if self.log is not None:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            self.out = self.log.open("ab")
            print(f"   (its output goes to {self.log}, printed when it ends)", flush=True)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            self.argv,
            stdout=self.out,
            stderr=subprocess.STDOUT if self.out is not None else None,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **self.env} if self.env else None,
            start_new_session=True,
            preexec_fn=_default_sigint,
        )

    def poll(self) -> bool:
        """True once the part has ended (and records how)."""
        if self.proc is None or self.rc is not None:
            return self.rc is not None
        rc = self.proc.poll()
        if rc is None:
            return False
        self.rc, self.took_s = rc, time.monotonic() - self.started
        if self.out is not None:
            self.out.close()
        return True

    def signal_group(self, sig: int) -> None:
        if self.proc is not None and self.rc is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _matrix_parts(make: str, others: Sequence[str], log_dir: Path) -> list[Part]:
    return [
        Part(
            f"slurm-marked tests on Slurm {version}",
            [
                make,
                "--no-print-directory",
                "test-slurm",
                f"VERSION={version}",
                "MARKS=slurm and not one_release",
            ],
            log=log_dir / f"slurm-{version}.log",
        )
        for version in others
    ]


#: Multi-process tests that need no Slurm, run after the releases in their lane rather than in
#: the host's; the others (the torchft protocol stories) run in the host's lane, so that the
#: two lanes take about as long (docs/benchmarks.md).
BESIDE_THE_RELEASES = (
    "tests/test_quality_short.py",
    "tests/test_report_browser.py",
    "tests/test_story_straggler_local.py",
    "tests/test_story_foreign_local.py",
    "tests/test_story_local_signals.py",
    "tests/test_control_journal.py",
)


def lanes(python: str, matrix: list[Part], log_dir: Path, serial: bool) -> list[list[Part]]:
    """The parts of the slow tier, lane by lane; each part told how many lanes run at once."""
    ignored = [f"--ignore={path}" for path in BESIDE_THE_RELEASES]
    host = Part(
        "slurm and slow tests on the host",
        [python, "-m", "pytest", "--durations=15", *ignored, "-m", "slurm or slow"],
    )
    beside = Part(
        "multi-process tests without Slurm",
        [python, "-m", "pytest", "--durations=15", *BESIDE_THE_RELEASES, "-m", "slow"],
        log=log_dir / "beside-the-releases.log",
    )
    # Two lanes: four (the host's tier split in two, each release apart) took the load average
    # past 15 and the heavy stories failed for want of CPU (docs/benchmarks.md).
    plan = [[host, *matrix, beside]] if serial else [[host], [*matrix, beside]]
    # Beside each other, the heavy tests of all lanes take turns: one per core at a time.
    heavy = "0" if serial else str(os.cpu_count() or 2)
    for lane in plan:
        for part in lane:
            part.env["FTHSDP_TEST_LANES"] = str(len(plan))
            part.env["FTHSDP_HEAVY_SLOTS"] = heavy
    return plan


def _other_releases(python: str) -> list[str]:
    r = subprocess.run(
        [python, "-m", "slurm.release_chroot", "others"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if r.returncode != 0:
        raise SystemExit(f"slow_tiers: `slurm.release_chroot others` failed: {r.stderr.strip()}")
    return r.stdout.split()


def run(lanes: list[list[Part]]) -> int:
    """Run each lane's parts in order, the lanes beside each other; rc 0 only if all passed."""
    stopping = False

    def stop(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        if not stopping:
            print(f"slow_tiers: signal {signum}: stopping every part", file=sys.stderr, flush=True)
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    parts = [part for lane in lanes for part in lane]
    pending = [list(lane) for lane in lanes]
    current: list[Part | None] = [None] * len(lanes)
    kill_at: float | None = None
    while any(pending) or any(c is not None for c in current):
        if stopping and kill_at is None:
            pending = [[] for _ in lanes]
            for live in filter(None, current):
                live.signal_group(signal.SIGINT)
            kill_at = time.monotonic() + GRACE_S
        if kill_at is not None and time.monotonic() > kill_at:
            for live in filter(None, current):
                live.signal_group(signal.SIGKILL)
        for i, part in enumerate(current):
            if part is not None and part.poll():
                _report_end(part)
                current[i] = None
            if current[i] is None and pending[i]:
                nxt = pending[i].pop(0)
                nxt.start()
                current[i] = nxt
        time.sleep(0.5)
    for done in parts:
        state = f"rc {done.rc} in {done.took_s / 60:.1f} min" if done.rc is not None else "not run"
        print(f"== {done.name}: {state}", flush=True)
    if stopping:
        return 130
    return 0 if all(done.rc == 0 for done in parts) else 1


def _report_end(part: Part) -> None:
    if part.log is not None and part.log.exists():
        print(f"== {part.name} ended (rc {part.rc}); its output:", flush=True)
        sys.stdout.flush()
        with part.log.open("rb") as f:
            sys.stdout.buffer.write(f.read())
        sys.stdout.buffer.flush()
        part.log.unlink()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", required=True, help="the venv's interpreter")
    p.add_argument("--make", default=os.environ.get("MAKE", "make"))
    p.add_argument("--log-dir", type=Path, default=Path("build/test-logs"))
    p.add_argument("--serial", action="store_true", help="one part after the other")
    a = p.parse_args(argv)
    matrix: list[Part] = []
    if os.geteuid() != 0:
        print("not root: skipping the Slurm release matrix", flush=True)
    else:
        matrix = _matrix_parts(a.make, _other_releases(a.python), a.log_dir)
    return run(lanes(a.python, matrix, a.log_dir, a.serial))


if __name__ == "__main__":
    sys.exit(main())
