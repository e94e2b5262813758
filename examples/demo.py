"""`make demo`: a GPU fault mid-run on a real (local) Slurm; only the broken replica is requeued.

With root and Slurm (slurm-wlm, munge) this starts the dev cluster with health gating in
`.devcluster/` (`fthsdp cluster up --health`: 4 nodes of 8 simulated GPUs each, the project's
Prolog/Epilog/HealthCheckProgram), submits `examples/demo.toml` (3 replicas, each with a CPU
helper component; the fourth node is the spare), waits until every replica trains, then breaks
replica 1's node with an Xid 79 (`fthsdp cluster inject NODE --fault xid79`). The run's status is
shown live (the `fthsdp status` table) until it finishes; then a summary (steps, failures,
requeues, the healthy replicas' stall, final weights, ledger) and the drained node's reason, as
`sinfo -R` shows it. The jobs are cancelled and the cluster stopped in any case.

As on a site, root only starts the cluster, runs the hooks and plays the operator (the fault,
`sinfo -R`). The run belongs to an ordinary account (`fthsdp-user`, the tests' job user, made as
a system account without login if missing): it submits, watches (`fthsdp status --watch
--json`, which the demo draws), reads the journal, writes the report and cancels, all through
the site install (`--site PREFIX`, which `make demo` builds once), in a folder of its own under
`.devcluster/users/`. Root reads only the run's plain files.

Without root or Slurm it says why and runs the same story on local processes instead:
`fthsdp run --local examples/tiny.toml --steps 600 --kill-replica 1 --at-step 60`.

Exit code 0 when the run finished with agreeing weights, an exactly-once ledger and exactly one
requeue (replica 1's), with replicas 0 and 2 never restarted. It never ends in a traceback: a
control job that fails stops the demo at once with one line naming the failure and its log file
(e.g. `logs/control-1.err`), and so do the overall deadline and a cluster that cannot start.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # user_harness: the job user, as the stories make it

import user_harness  # noqa: E402
from rich.console import Console, Group  # noqa: E402
from rich.live import Live  # noqa: E402
from rich.table import Table  # noqa: E402
from rich.text import Text  # noqa: E402

from prolog_epilog import dev_health  # noqa: E402
from slurm import devcluster  # noqa: E402

CLUSTER_DIR = REPO / ".devcluster"
USERS_DIR = CLUSTER_DIR / "users"
USER = user_harness.JOB_USER
RUN_DIR = USERS_DIR / USER / "demo"
SPEC = REPO / "examples" / "demo.toml"
VICTIM = 1
INJECT_AT_STEP = 40
RUN_TIMEOUT_S = 420
#: The longest `fthsdp status --watch` may go without a snapshot (Slurm retries included).
STATUS_TIMEOUT_S = 90
# A pipe (`make demo | tee`) gets 80 columns by default: too narrow for the status table.
console = Console()


def local_fallback(why: str) -> int:
    console.print(f"[yellow]No dev cluster here[/]: {why}.")
    console.print(
        "Running the same story on local processes instead: "
        "fthsdp run --local examples/tiny.toml --steps 600 --kill-replica 1 --at-step 60"
    )
    cmd = [sys.executable, "-m", "fthsdp_cli", "run", "--local", "examples/tiny.toml"]
    cmd += ["--steps", "600"]
    cmd += ["--kill-replica", "1", "--at-step", "60"]
    env = {**os.environ, "PYTHONPATH": _pythonpath()}
    code = subprocess.run(cmd, cwd=REPO, env=env, check=False).returncode
    if code == 0:
        console.print("the run's report:")
        report = [sys.executable, "-m", "fthsdp_cli", "report", "--png", "runs/tiny"]
        code = subprocess.run(report, cwd=REPO, env=env, check=False).returncode
    return code


def _pythonpath() -> str:
    return os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)


def start_cluster() -> devcluster.DevClusterConfig:
    """`fthsdp cluster up --health --dir .devcluster` on free ports (a leftover demo cluster in
    the same folder is stopped first)."""
    if (CLUSTER_DIR / devcluster.CONFIG_FILE).exists():
        old = devcluster.DevClusterConfig.load(CLUSTER_DIR)
        if devcluster.live_daemons(old):
            console.print("stopping a dev cluster left over in .devcluster/")
            devcluster.down(old)
    base = devcluster.free_port_block(5, start=16817)
    cfg = dev_health.with_health(
        devcluster.DevClusterConfig(
            directory=CLUSTER_DIR, nodes=4, ctld_port=base, slurmd_base_port=base + 1
        )
    )
    with console.status("starting the dev cluster (4 nodes x 8 GPUs, health-gated)"):
        devcluster.up(cfg)
    console.print(f"[green]dev cluster up[/] in {CLUSTER_DIR}: export SLURM_CONF={cfg.conf_path}")
    return cfg


def user_home(user: str) -> Path:
    """`USERS_DIR/user`: the job user's own folder (0700), inside root's world-traversable one,
    emptied of an earlier demo's run."""
    USERS_DIR.mkdir(mode=0o755, exist_ok=True)
    USERS_DIR.chmod(0o755)
    home = USERS_DIR / user
    if home.exists():
        shutil.rmtree(home)
    return user_harness.user_folder(USERS_DIR, user, user)


def job_user(home: Path, site: Path, cfg: devcluster.DevClusterConfig) -> user_harness.SiteUser:
    """The run's owner: every command of the run (submit, status, journal, report, cancel) is
    this account's, through the site install, with none of root's environment (jobs inherit
    it: sbatch --export=ALL). Root reads only the run's plain files."""
    knobs = {"SLURM_CONF": str(cfg.conf_path)}
    knobs["TINY_STEP_SLEEP_S"] = os.environ.get("TINY_STEP_SLEEP_S", "0.1")
    return user_harness.SiteUser(USER, site, home, knobs)


def fthsdp(user: user_harness.SiteUser, *args: str, timeout: float = 120) -> str:
    """`fthsdp ARGS` as the run's owner, in the checkout: its stdout, or DemoFailure with its
    last line."""
    r = user.fthsdp(*args, timeout=timeout, cwd=REPO)
    if r.returncode != 0:
        last = (r.stderr or r.stdout).strip().splitlines()[-1:] or [f"exit {r.returncode}"]
        raise DemoFailure(f"fthsdp {args[0]} as {user.user} failed ({r.returncode}): {last[0]}")
    return r.stdout


class StatusStream:
    """`fthsdp status RUN --watch --json` as the job user: one snapshot a second, read by a
    thread so that a status that stops answering cannot stall the demo."""

    def __init__(self, user: user_harness.SiteUser) -> None:
        argv = [str(user.prefix / "bin" / "fthsdp"), "status", str(RUN_DIR), "--watch", "--json"]
        self.proc = subprocess.Popen(
            user_harness.user_argv(user.user, [*argv, "--interval", "1"]),
            env=user.env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next(self, timeout: float) -> dict[str, Any]:
        """The next snapshot; DemoFailure when status ended or said nothing for `timeout`."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise DemoFailure(f"fthsdp status gave no snapshot in {timeout:.0f} s") from None
        if line is None:
            self.proc.wait(timeout=10)
            err = (self.proc.stderr.read() if self.proc.stderr else "").strip().splitlines()
            why = err[-1] if err else f"exit {self.proc.returncode}"
            raise DemoFailure(f"fthsdp status ended: {why}")
        data: dict[str, Any] = json.loads(line)
        return data

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


def progress_commits(run_dir: Path, replica: int) -> list[dict[str, Any]]:
    path = run_dir / "progress" / f"r{replica}.jsonl"
    out = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("event") == "commit":
            out.append(rec)
    return out


def healthy_stall(run_dir: Path, t_fault: float, t_back: float) -> float:
    """Longest wait between two commits of replicas 0 and 2 during the outage, minus their
    median step time."""
    worst = 0.0
    for k in (0, 2):
        ts = [float(c["t"]) for c in progress_commits(run_dir, k)]
        steps = [b - a for a, b in itertools.pairwise(ts)]
        median = statistics.median(steps) if steps else 0.0
        inside = [t for t in ts if t_fault <= t <= t_back]
        marks = [t_fault, *inside, t_back]
        gap = max((b - a for a, b in itertools.pairwise(marks)), default=0.0)
        worst = max(worst, gap - median)
    return worst


def rejoined_at(run_dir: Path, t_fault: float) -> float | None:
    """When replica 1's new incarnation first committed a step after the fault."""
    commits = progress_commits(run_dir, VICTIM)
    before = {c.get("incarnation") for c in commits if float(c["t"]) < t_fault}
    for c in commits:
        if float(c["t"]) >= t_fault and c.get("incarnation") not in before:
            return float(c["t"])
    return None


class DemoFailure(Exception):
    """The demo cannot go on; its message is the one line the user sees."""


#: Slurm states of a control job that will not run again.
_ENDED = ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "GONE")


def last_line(path: Path) -> str:
    """The last non-empty line of a log (clipped), or "" when it cannot be read."""
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
    except OSError:
        return ""
    found = [line for line in lines if line]
    return found[-1][:200] if found else ""


def control_failure(data: dict[str, Any]) -> str | None:
    """One line when the run's control job ended (failed, cancelled, gone) before the run did."""
    control = next((j for j in data.get("jobs", []) if j.get("role") == "control"), None)
    if control is None or str(control.get("state", "")).upper() not in _ENDED:
        return None
    log = RUN_DIR / "logs" / f"control-{control['job_id']}.err"
    why = last_line(log)
    shown = log.relative_to(REPO) if log.is_relative_to(REPO) else log
    return f"control job {control['job_id']}: {control['state']}; see {shown}" + (
        f": {why}" if why else ""
    )


def watch(
    cfg: devcluster.DevClusterConfig, user: user_harness.SiteUser
) -> tuple[float, dict[str, Any]]:
    """Show the run live (the job user's `fthsdp status`); inject the fault, as the operator,
    once every replica trains; return when the run ends."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    stream = StatusStream(user)
    try:
        return _watch(cfg, stream, deadline)
    finally:
        stream.close()


def _watch(
    cfg: devcluster.DevClusterConfig, stream: StatusStream, deadline: float
) -> tuple[float, dict[str, Any]]:
    from fthsdp_cli.commands.status import _render
    from runtime.control.inject import inject

    t_fault = 0.0
    note = Text("waiting for every replica to train ...")
    data = stream.next(STATUS_TIMEOUT_S)
    with Live(Group(_render(data), note), console=console, refresh_per_second=2) as live:
        while time.monotonic() < deadline:
            data = stream.next(STATUS_TIMEOUT_S)
            reps = data["replicas"]
            if not t_fault and all(
                r["state"] == "training" and (r["step"] or 0) >= INJECT_AT_STEP for r in reps
            ):
                node = reps[VICTIM]["nodes"][0]
                inject(dev_health.hardware_dir(cfg), node, "xid79", cfg.gpus_per_node)
                t_fault = time.time()
                live.console.print(
                    f"[red]injected Xid 79 into {node}[/] (replica {VICTIM}, step "
                    f"{reps[VICTIM]['step']}): fthsdp cluster inject {node} --fault xid79"
                )
                note = Text(f"replica {VICTIM}'s node {node} lost a GPU; watching the recovery")
            if reps and all(r["slurm_state"] == "COMPLETED" for r in reps):
                live.update(Group(_render(data), Text("run finished")))
                return t_fault, data
            failed = control_failure(data)
            if failed is not None:
                raise DemoFailure(failed)
            live.update(Group(_render(data), note))
    logs = RUN_DIR.relative_to(REPO) / "logs"
    raise DemoFailure(f"the run did not finish within {RUN_TIMEOUT_S} s; see {logs}/")


def summarize(user: user_harness.SiteUser, t_fault: float, data: dict[str, Any]) -> bool:
    from runtime.verdict import check_ledger, final_weights_agree
    from slurm.backend import make_backend
    from slurm.spec import load_spec

    target = load_spec(SPEC).train.steps
    requeues = [
        (job, status)
        for kind, job, status in user_harness.journal_actions_of(user, RUN_DIR)
        if kind == "Requeue"
    ]
    reps = {r["replica"]: r for r in data["replicas"]}
    ledger = check_ledger(RUN_DIR, target)
    weights = final_weights_agree(RUN_DIR, sorted(reps))
    back = rejoined_at(RUN_DIR, t_fault) if t_fault else None
    stall = healthy_stall(RUN_DIR, t_fault, back) if t_fault and back else None
    failures = sum((r["requeues"] or 0) + (r["relaunches"] or 0) for r in reps.values())
    others_untouched = all(reps[k]["restarts"] == 0 for k in reps if k != VICTIM)
    only_victim = requeues == [(reps[VICTIM]["job_id"], "done")]

    console.print()
    table = Table(title="demo summary", show_header=False)
    table.add_column("what")
    table.add_column("value")
    table.add_row("steps committed", f"{ledger.steps} of {target}")
    table.add_row("failures handled", str(failures))
    table.add_row("requeues", f"{len(requeues)} (job {', '.join(j for j, _ in requeues) or '-'})")
    table.add_row(
        "replicas 0 and 2", "never restarted" if others_untouched else "RESTARTED (unexpected)"
    )
    if back is not None:
        table.add_row("fault -> replica 1 training again", f"{back - t_fault:.1f} s")
    table.add_row("healthy replicas' longest stall", "-" if stall is None else f"{stall:.1f} s")
    table.add_row("final weights agree", "yes" if weights else "NO")
    table.add_row("ledger (exactly-once data)", "ok" if ledger.ok else "; ".join(ledger.problems))
    console.print(table)
    drained = [n for n in make_backend(timeout=20).nodes() if n.drained]
    console.print("sinfo -R:")
    console.print(f"{'REASON':<50} {'NODELIST'}", highlight=False)
    for n in drained:
        console.print(f"{n.reason:<50} {n.name}", highlight=False, markup=False)
    return weights and ledger.ok and only_victim and others_untouched


def cleanup(cfg: devcluster.DevClusterConfig | None, user: user_harness.SiteUser | None) -> None:
    """The user cancels the run; if that fails the operator cancels the user's jobs."""
    if cfg is None:
        return
    try:
        if user is None:
            raise DemoFailure("no run submitted")
        if (RUN_DIR / "jobs.json").exists():
            fthsdp(user, "cancel", str(RUN_DIR))
    except (DemoFailure, OSError, subprocess.SubprocessError) as exc:
        console.print(f"(cancel: {exc})")
        subprocess.run(["scancel", "--user", USER], timeout=30, check=False)
    stopped = devcluster.down(cfg)
    console.print(f"dev cluster stopped ({len(stopped)} daemons); files kept in {CLUSTER_DIR}")


def site_install(value: str) -> Path:
    """`--site`: a site install's prefix (`make site-install`), whose `bin/fthsdp` the job user
    runs; exit 2 naming it otherwise."""
    prefix = Path(value)
    runnable = os.access(prefix / "bin" / "python", os.X_OK)
    if not (prefix / "bin" / "fthsdp").is_file() or not runnable:
        raise argparse.ArgumentTypeError(
            f"{value}: not a site install (no bin/fthsdp, bin/python); make site-cache makes one"
        )
    return prefix


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"demo: {message}\n")  # bad input is one line, not usage and a line


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = _OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", type=site_install, help="the site install the job user runs")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    os.chdir(REPO)
    problems = devcluster.missing_prerequisites()
    if problems:
        return local_fallback("; ".join(problems))
    if args.site is None:
        console.print("demo: --site PREFIX is needed: make demo builds the site install")
        return 2
    from slurm.backend import SlurmCommandError
    from slurm.errors import EnvironmentProblem, InputError

    cfg: devcluster.DevClusterConfig | None = None
    user: user_harness.SiteUser | None = None
    ok = False
    try:
        user_harness.ensure_user(USER)
        cfg = start_cluster()
        os.environ["SLURM_CONF"] = str(cfg.conf_path)  # the operator's own Slurm calls
        user = job_user(user_home(USER), args.site, cfg)
        fthsdp(user, "submit", str(SPEC), "--set", f"job.run_dir={RUN_DIR}", timeout=180)
        record = json.loads(fthsdp(user, "status", str(RUN_DIR), "--json"))
        jobs = record.get("jobs", [])
        ids = ", ".join(j["job_id"] for j in jobs if j.get("role") == "replica")
        control = next((j["job_id"] for j in jobs if j.get("role") == "control"), "-")
        console.print(
            f"submitted {SPEC.name} as {USER} (site install {args.site}): control job "
            f"{control}, replica jobs {ids}"
        )
        t_fault, data = watch(cfg, user)
        ok = summarize(user, t_fault, data)
        console.print("the run's report (written by its user):")
        console.print(fthsdp(user, "report", str(RUN_DIR)).strip(), highlight=False)
    except user_harness.UserSetupError as exc:
        console.print(f"[red]demo failed:[/] {exc}", highlight=False)
        return 3
    except (
        DemoFailure,
        user_harness.UserCommandError,
        EnvironmentProblem,
        InputError,
        SlurmCommandError,
        OSError,
    ) as exc:
        console.print(f"[red]demo failed:[/] {exc}", highlight=False)
        return 1
    finally:
        cleanup(cfg, user)
    console.print("[green]demo ok[/]" if ok else "[red]demo: something is off (see above)[/]")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
