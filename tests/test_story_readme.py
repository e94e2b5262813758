"""The README's "Using it" block, run in its order against a real dev cluster.

The block is read from README.md, so the test follows the README: every line runs through bash
as a user would type it, from a scratch folder that holds only `examples/` (so `runs/tiny` is
the test's own), and must exit 0 (or the code the README documents) with no traceback. As on a
site, root runs only the first line (`cluster up`, which the README marks as root's); every
other line runs as the unprivileged job user with the site install's `fthsdp` first on PATH and
nothing of root's environment. What the test adds to a line, and why:

- `cluster up` gets free ports (`--port/--slurmd-port`) and a scratch `--dir` (through
  `FTHSDP_CLUSTER_DIR`): the defaults may belong to another cluster on a shared host.
- `submit` and `run` get `--set train.steps=40`: the README's 200 steps only make it slower.
- `status --watch` runs until interrupted by design: it is read for two snapshots through a pipe
  (one per interval, which is what a pipe must get), then sent SIGINT, which ends it with 0.
- `requeue` and `events` wait until the replica's job runs and the control job has opened its
  journal: a user reads `status` first; the test polls `status --json` instead.
- `check --json` reads GPUs: on a machine without them it exits 1 (unhealthy, documented);
  its JSON is checked either way.

No line is skipped. The cluster is stopped at the end, even on failure.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cpu_load import cpu_burners
from user_harness import BASE_PATH, user_argv, user_env, user_folder

from slurm import devcluster

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
STEPS = ["--set", "train.steps=40"]
TERMINAL = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "GONE", "NODE_FAIL", "OUT_OF_MEMORY"}


def using_it_block(text: str) -> list[str]:
    """The command lines of the first fenced bash block under `## Using it`, in order."""
    section = text.split("\n## Using it\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```bash\n(.*?)\n```", section, re.S)
    if match is None:
        raise AssertionError("README.md: no ```bash block under '## Using it'")
    return [line.strip() for line in match.group(1).splitlines() if line.strip()]


def command_words(line: str) -> list[str]:
    """The words of a line without its trailing comment (`eval "$(X)"` gives X's words)."""
    words = shlex.split(line, comments=True)
    if words[:1] == ["eval"]:
        inner = re.fullmatch(r"\$\((.*)\)", words[1])
        assert inner, line
        return shlex.split(inner.group(1))
    return words


def test_the_block_is_found_and_is_all_fthsdp() -> None:
    lines = using_it_block(README.read_text())
    assert len(lines) >= 8
    for line in lines:
        words = command_words(line)
        assert words[0] == "fthsdp", line  # the test below knows how to run each of them
    assert command_words(lines[0])[:3] == ["fthsdp", "cluster", "up"]  # the cluster first


def _no_traceback(r: subprocess.CompletedProcess[str], line: str) -> None:
    assert "Traceback" not in r.stdout + r.stderr, (line, r.stderr)


class Shell:
    """Runs README lines through bash in the job user's scratch folder with the site install's
    `fthsdp` first; `as_root` is for the one line the README gives root."""

    def __init__(
        self, work: Path, user: str, env: dict[str, str], root_env: dict[str, str]
    ) -> None:
        self.work = work
        self.user = user
        self.env = env
        self.root_env = root_env

    def argv(self, line: str) -> list[str]:
        return user_argv(self.user, ["bash", "-c", line])

    def run(self, line: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return self._run(self.argv(line), self.env, line, timeout)

    def as_root(self, line: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return self._run(["bash", "-c", line], self.root_env, line, timeout)

    def _run(
        self, argv: list[str], env: dict[str, str], line: str, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(
            argv, cwd=self.work, env=env, capture_output=True, text=True, timeout=timeout
        )
        _no_traceback(r, line)
        return r

    def status(self) -> dict[str, Any]:
        r = self.run("fthsdp status runs/tiny --json")
        assert r.returncode == 0, r.stderr
        data: dict[str, Any] = json.loads(r.stdout)
        return data

    def wait(self, what: str, predicate: Callable[[dict[str, Any]], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: dict[str, Any] = {}
        while time.monotonic() < deadline:
            last = self.status()
            if predicate(last):
                return
            time.sleep(2)
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}: {last}")


def _with(line: str, extra: list[str]) -> str:
    return f"{line.split('#', 1)[0].rstrip()} {shlex.join(extra)}"


@pytest.fixture
def scratch(
    site_dir: Path, job_users: tuple[str, str], site_install: Path, user_base: Path
) -> Iterator[tuple[Shell, Path]]:
    user = job_users[0]
    work = user_folder(user_base, user, "work")
    (work / "examples").symlink_to(ROOT / "examples")
    cluster_dir = site_dir / "cluster"
    bin_dir = site_install / "bin"
    known = {"FTHSDP_CLUSTER_DIR": str(cluster_dir), "PATH": f"{bin_dir}:{BASE_PATH}"}
    root_env = {**os.environ, **known}
    for key in ("FTHSDP_DEBUG", "SLURM_CONF"):
        root_env.pop(key, None)
    try:
        yield Shell(work, user, user_env(user, work, known), root_env), cluster_dir
    finally:
        if (cluster_dir / devcluster.CONFIG_FILE).exists():
            devcluster.down(devcluster.DevClusterConfig.load(cluster_dir))


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_readme_using_it_runs_in_order(scratch: tuple[Shell, Path]) -> None:
    from tests.conftest import _require_slurm

    _require_slurm()
    with cpu_burners(2):  # a new user's machine is busy: the block must work the first time
        _run_using_it(*scratch)


def _run_using_it(sh: Shell, cluster_dir: Path) -> None:
    ran = []
    for line in using_it_block(README.read_text()):
        words = command_words(line)
        ran.append(words[1])
        if words[1:3] == ["cluster", "up"]:
            base = devcluster.free_port_block(6, start=26000 + (os.getpid() % 200) * 10)
            ports = ["--port", str(base), "--slurmd-port", str(base + 1)]
            r = sh.as_root(
                line.replace("fthsdp cluster up", f"fthsdp cluster up {shlex.join(ports)}").split(
                    "#", 1
                )[0]
                + '; echo "SLURM_CONF=$SLURM_CONF"',
                timeout=180,
            )
            assert r.returncode == 0, r.stderr
            conf = cluster_dir / "etc" / "slurm.conf"
            assert r.stdout.splitlines()[-1] == f"SLURM_CONF={conf}", r.stdout
            sh.env["SLURM_CONF"] = str(conf)
            # In another shell, as the user: the README's way to find the running cluster.
            tail = sh.run("fthsdp cluster status | tail -1")
            assert tail.stdout.strip() == f"export SLURM_CONF={conf}", tail.stdout
        elif words[1] == "submit":
            r = sh.run(_with(line, STEPS), timeout=180)
            assert r.returncode == 0, r.stderr
        elif words[1] == "status" and "--watch" in words:
            _watch_two_snapshots(sh, line)
        elif words[1] == "requeue":
            sh.wait(
                "replica 1 running",
                lambda s: any(j["replica"] == 1 and j["state"] == "RUNNING" for j in s["jobs"]),
                300,
            )
            r = sh.run(line)
            assert r.returncode == 0, r.stderr
            assert "requeued" in r.stdout
        elif words[1] == "events":
            deadline = time.monotonic() + 180
            while not (sh.work / "runs" / "tiny" / "control.sqlite").exists():
                assert time.monotonic() < deadline, "the control job never opened its journal"
                time.sleep(2)
            r = sh.run(line)
            assert r.returncode == 0, r.stderr
            assert r.stdout.strip(), "an empty journal"
        elif words[1] == "cancel":
            r = sh.run(line)
            assert r.returncode == 0, r.stderr
            assert r.stdout.startswith("cancelled "), r.stdout
            sh.wait(
                "every job of the run ended",
                lambda s: all(j["state"] in TERMINAL for j in s["jobs"]),
                120,
            )
            again = sh.run(line)
            assert again.returncode == 0, again.stderr
            assert again.stdout.splitlines()[0] == "nothing left to cancel", again.stdout
        elif words[1] == "check":
            r = sh.run(line)
            assert r.returncode in (0, 1), r.stderr
            verdict = json.loads(r.stdout)
            assert verdict["healthy"] is (r.returncode == 0)
        elif words[1] == "run":
            r = sh.run(_with(line, STEPS), timeout=900)
            assert r.returncode == 0, (r.stdout, r.stderr)
        else:
            r = sh.run(line, timeout=300)
            assert r.returncode == 0, (line, r.stderr)
    assert ran[0] == "cluster" and "run" in ran
    # When the cluster is down, the README's `eval "$(fthsdp cluster status | tail -1)"` evaluates
    # a shell comment, and the status says so with exit 1.
    devcluster.down(devcluster.DevClusterConfig.load(cluster_dir))
    down = sh.run("fthsdp cluster status | tail -1; exit ${PIPESTATUS[0]}")
    assert down.returncode == 1
    assert down.stdout.strip().startswith("#"), down.stdout
    evaluated = sh.run('eval "$(fthsdp cluster status | tail -1)"; echo "ok:$SLURM_CONF"')
    assert evaluated.stdout.strip() == f"ok:{sh.env['SLURM_CONF']}", evaluated.stdout


def _watch_two_snapshots(sh: Shell, line: str) -> None:
    """`status --watch` into a pipe: one snapshot per interval, then SIGINT ends it cleanly."""
    proc = subprocess.Popen(
        sh.argv(f"exec {line.split('#', 1)[0]}"),
        cwd=sh.work,
        env=sh.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        titles = 0
        deadline = time.monotonic() + 120
        while titles < 2 and time.monotonic() < deadline:
            text = proc.stdout.readline()
            if not text:
                break
            titles += text.strip().startswith("run tiny")
        assert titles >= 2, "status --watch printed fewer than two snapshots into a pipe"
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        err = proc.stderr.read() if proc.stderr else ""
        assert proc.returncode == 0, err
        assert "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
