"""`fthsdp run --local` owns its processes and its run directory.

- SIGTERM or SIGINT stops every process it started (the Lighthouse and each worker run in their
  own session; afterwards no process of those sessions is left, read from /proc) and prints the
  summary so far, never `Aborted!` or a traceback; the exit code is the shell's for the signal.
- A run directory that holds a run submitted to Slurm (jobs.json, and a control.json naming a
  Lighthouse that is gone) is left alone: the local run goes to its `local/` subdirectory, never
  reads that control.json, and counts one failure for one kill.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), TINY_STEP_SLEEP_S="0.1", COLUMNS="100")


def _stat(pid: str) -> tuple[int, int] | None:
    """(parent pid, session id) of a live process, None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[1]), int(fields[3])


def _processes() -> dict[int, tuple[int, int]]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (found := _stat(entry)) is not None:
            out[int(entry)] = found
    return out


def _descendants(root: int) -> set[int]:
    table = _processes()
    found, frontier = set(), {root}
    while frontier:
        children = {p for p, (parent, _) in table.items() if parent in frontier} - found
        found |= children
        frontier = children
    return found


def _committed(run_dir: Path) -> bool:
    path = run_dir / "progress" / "r0.jsonl"
    return path.exists() and '"commit"' in path.read_text()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("sig", "as_json"), [(signal.SIGTERM, True), (signal.SIGINT, False)], ids=["term", "int"]
)
def test_signal_stops_every_process_and_prints_the_summary(
    tmp_path: Path, sig: signal.Signals, as_json: bool
) -> None:
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "fthsdp_cli", "run", "--local", "examples/tiny.toml"]
    argv += ["--steps", "5000", "--run-dir", str(run_dir)] + (["--json"] if as_json else [])
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    sessions: set[int] = set()
    try:
        deadline = time.monotonic() + 200
        while not _committed(run_dir) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        assert _committed(run_dir), "no step committed within 200 s"
        started = _descendants(proc.pid)
        sessions = {s for p, (_, s) in _processes().items() if p in started}
        assert len(started) >= 5  # the Lighthouse and 2 replicas x 2 ranks
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # Every process it started, and anything they started, is gone.
    left = {p for p, (_, s) in _processes().items() if s in sessions and s != os.getsid(0)}
    assert left == set(), f"left running: {left}"
    assert proc.returncode == 128 + sig, err[-2000:]
    assert "Traceback" not in err and "Aborted!" not in err + out
    if as_json:
        summary = json.loads(out)
        assert summary["signal"] == sig
        assert summary["error"].startswith(f"stopped by {sig.name}")
        assert summary["steps"] >= 1 and not summary["ok"]
    else:
        assert "run summary" in out and "steps" in out
        assert f"stopped by {sig.name}" in err


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_submitted_runs_directory_is_left_alone(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # What a finished `fthsdp submit` left: its record and a control.json whose Lighthouse and
    # coordinator are gone.
    jobs = {"name": "tiny", "run_dir": str(run_dir), "control": None, "replicas": []}
    (run_dir / "jobs.json").write_text(json.dumps(jobs))
    stale = {"lighthouse": "http://127.0.0.1:9", "coordinator": "http://127.0.0.1:9"}
    (run_dir / "control.json").write_text(json.dumps(stale))
    (run_dir / "finished").write_text("200")
    argv = [sys.executable, "-m", "fthsdp_cli", "run", "--local", "examples/tiny.toml"]
    argv += ["--steps", "30", "--kill-replica", "1", "--at-step", "10"]
    argv += ["--run-dir", str(run_dir), "--json", "--timeout", "240"]
    r = subprocess.run(
        argv, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=280, check=False
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"this local run uses {run_dir / 'local'}" in r.stderr
    summary = json.loads(r.stdout)
    assert summary["steps"] == 30 and summary["ok"]
    assert [f["kind"] for f in summary["failures"]] == ["injected"]
    assert (run_dir / "local" / "progress" / "r0.jsonl").exists()
    # The submitted run's files are untouched.
    assert json.loads((run_dir / "control.json").read_text()) == stale
    assert (run_dir / "finished").read_text() == "200"
    assert not (run_dir / "progress").exists()
