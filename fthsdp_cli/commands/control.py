"""`fthsdp control` (the control-plane job) and `fthsdp replica` (a replica job's supervisor).

Both are thin: they parse options and call `runtime.control.service.serve` and
`runtime.control.supervisor.loop.Supervisor`. Neither imports torch: the Lighthouse runs as
torchft's `torchft_lighthouse` binary in a child process.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import click

_RUN_DIR = click.Path(file_okay=False, exists=True, path_type=Path)


def _run_dir(f: Callable[..., None]) -> Callable[..., None]:
    """RUN_DIR as the first argument, as in status, cancel, requeue and events.

    `--run-dir DIR` is the older spelling, kept (hidden) for scripts rendered before. With it,
    every positional word belongs to the command that follows (`replica ... -- srun ...`)."""

    @functools.wraps(f)
    def wrapper(
        *args: Any, run_dir_arg: str | None, run_dir_opt: Path | None, **kwargs: Any
    ) -> None:
        from slurm.errors import InputError

        if run_dir_opt is not None:
            if run_dir_arg is not None and "command" in kwargs:
                kwargs["command"] = (run_dir_arg, *kwargs["command"])
            elif run_dir_arg is not None:
                raise InputError("RUN_DIR", run_dir_arg, "RUN_DIR or --run-dir, not both")
            return f(*args, run_dir=run_dir_opt, **kwargs)
        if run_dir_arg is None:
            raise InputError("RUN_DIR", None, "the run's directory (missing)")
        ctx = click.get_current_context()
        run_dir = _RUN_DIR.convert(run_dir_arg, None, ctx)
        return f(*args, run_dir=run_dir, **kwargs)

    wrapper = click.option("--run-dir", "run_dir_opt", type=_RUN_DIR, default=None, hidden=True)(
        wrapper
    )
    return click.argument("run_dir_arg", metavar="RUN_DIR", required=False)(wrapper)


@click.command()
@_run_dir
@click.option(
    "--lighthouse-port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="The Lighthouse gate's public port (the Lighthouse itself listens on 127.0.0.1); "
    "0 = a free port.",
)
@click.option(
    "--coordinator-port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="0 = a free port.",
)
@click.option(
    "--bind",
    default=None,
    help="Address to listen on (default: this node's own address, never all interfaces).",
)
@click.option(
    "--replicas",
    type=click.IntRange(min=1),
    default=None,
    help="Replica count (default: the run's spec).",
)
@click.option(
    "--min-replicas",
    type=click.IntRange(min=1),
    default=None,
    help="Replicas a quorum needs (default: the run's spec, else 1).",
)
@click.option(
    "--heartbeat-timeout",
    "heartbeat_timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds without a heartbeat before the Lighthouse drops a replica. Default: the "
    "spec's train.heartbeat_timeout_s.",
)
@click.option("--heartbeat-timeout-ms", type=click.IntRange(min=1), default=None, hidden=True)
@click.option(
    "--join-timeout",
    "join_timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds a quorum waits for joining replicas. Default: the spec's train.join_timeout_s.",
)
@click.option("--join-timeout-ms", type=click.IntRange(min=1), default=None, hidden=True)
@click.option("--straggler-factor", type=float, default=None, help="Default: the spec's (1.5).")
@click.option(
    "--straggler-window",
    "straggler_window_steps",
    type=click.IntRange(min=1),
    default=None,
    help="Steps a replica must stay slow to be a straggler. Default: the spec's (50).",
)
@click.option(
    "--straggler-window-steps",
    "straggler_window_steps_old",
    type=click.IntRange(min=1),
    default=None,
    hidden=True,
)
@click.option("--straggler-window-s", type=float, default=None, help="Default: the spec's (300).")
@click.option(
    "--straggler-requeue-cost-s",
    type=float,
    default=None,
    help="Requeue cost assumed until the run measured one. Default: the spec's (120).",
)
@click.option(
    "--straggler-mode",
    type=click.Choice(["drain", "exclude", "report"]),
    default=None,
    help="Evict by draining the slow node, by keeping the job off it, or only report. "
    "Default: the spec's (drain).",
)
@click.option(
    "--metrics-token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="FTHSDP_METRICS_TOKEN_FILE",
    default=None,
    help="Require `Authorization: Bearer <token>` on GET /metrics, the token read from this "
    "file (env FTHSDP_METRICS_TOKEN_FILE, e.g. from the spec's [job].env).",
)
@click.option(
    "--drain",
    type=click.Choice(["auto", "direct", "request"]),
    envvar="FTHSDP_DRAIN",
    default=None,
    help="Drain nodes directly, or ask root's Epilog through the job's comment; auto decides "
    "by this user's Slurm rights (env FTHSDP_DRAIN). Default: the spec's control.drain (auto).",
)
@click.option("--no-lighthouse", is_flag=True, help="Run only the coordinator.")
@click.option("--no-poll", is_flag=True, help="Do not poll squeue (no Slurm here).")
@click.option(
    "--restart-in-place",
    is_flag=True,
    help="Run the control plane as the child of a keeper that restarts it in place when it is "
    "killed or crashes (what the rendered control job runs; runtime.control.keeper).",
)
def control(
    run_dir: Path,
    lighthouse_port: int,
    coordinator_port: int,
    bind: str | None,
    replicas: int | None,
    min_replicas: int | None,
    heartbeat_timeout_s: float | None,
    heartbeat_timeout_ms: int | None,
    join_timeout_s: float | None,
    join_timeout_ms: int | None,
    straggler_factor: float | None,
    straggler_window_steps: int | None,
    straggler_window_steps_old: int | None,
    straggler_window_s: float | None,
    straggler_requeue_cost_s: float | None,
    straggler_mode: str | None,
    metrics_token_file: Path | None,
    drain: str | None,
    no_lighthouse: bool,
    no_poll: bool,
    restart_in_place: bool,
) -> None:
    """Run the run's control plane: torchft's Lighthouse and the coordinator, until stopped.

    It ends by itself (exit 0) once every replica's job has finished (completed, failed,
    cancelled, left out or gone from Slurm) for FTHSDP_CONTROL_FINISH_GRACE_S seconds (30;
    "never" keeps it up). Everything it creates in the run directory (journal, logs,
    control.json) is private to the run's user (umask 077). A journal it cannot read stops it
    with exit code 2 and a line that names the file; Slurm does not requeue a job for its exit
    code, so it does not loop.
    """
    from runtime.control.event_loop import freeze_startup_heap, loop_factory
    from runtime.control.event_loop import run as run_loop
    from runtime.control.http import own_address
    from runtime.control.policy import PolicyConfig
    from runtime.control.service import LighthouseConfig, serve
    from runtime.control.settings import (
        CoordinatorConfig,
        RunSettings,
        load_run_settings,
        straggler_config,
    )
    from runtime.control.straggler.evict import EvictionMode
    from slurm.errors import InputError
    from slurm.rundir import check_control_inputs

    loop_factory()  # a bad FTHSDP_EVENT_LOOP is named before anything starts
    heartbeat_timeout_ms = _ms("--heartbeat-timeout", heartbeat_timeout_s, heartbeat_timeout_ms)
    join_timeout_ms = _ms("--join-timeout", join_timeout_s, join_timeout_ms)
    straggler_window_steps = straggler_window_steps or straggler_window_steps_old
    from runtime.control.keeper import CHILD_ENV, Keeper, die_with_parent

    if restart_in_place and os.environ.get(CHILD_ENV) != "1":
        sys.exit(Keeper([sys.executable, "-m", "fthsdp_cli", *sys.argv[1:]]).run())
    die_with_parent()
    os.umask(0o077)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    run_dir = run_dir.resolve()
    check_control_inputs(run_dir)
    token = _metrics_token(metrics_token_file) if metrics_token_file else None
    try:
        settings = load_run_settings(run_dir)
    except InputError:
        if replicas is None:
            raise
        settings = RunSettings(PolicyConfig(replicas=replicas), {})
    policy = settings.policy
    if replicas is not None:
        policy = replace(policy, replicas=replicas)
    if min_replicas is not None:
        policy = replace(policy, min_replicas=min_replicas)
    if policy.min_replicas > policy.replicas or policy.min_replicas < 1:
        raise InputError("min_replicas", policy.min_replicas, f"1..{policy.replicas}")
    straggler = settings.straggler
    straggler = straggler_config(
        straggler.factor if straggler_factor is None else straggler_factor,
        straggler.window_steps if straggler_window_steps is None else straggler_window_steps,
        straggler.window_s if straggler_window_s is None else straggler_window_s,
    )
    eviction = settings.eviction
    if straggler_requeue_cost_s is not None:
        if not 0 <= straggler_requeue_cost_s < float("inf"):
            raise InputError("--straggler-requeue-cost-s", straggler_requeue_cost_s, ">= 0 seconds")
        eviction = replace(eviction, requeue_cost_estimate_s=straggler_requeue_cost_s)
    if straggler_mode is not None:
        eviction = replace(eviction, mode=cast(EvictionMode, straggler_mode))
    host = bind or own_address()
    config = CoordinatorConfig(
        run_dir=run_dir,
        policy=policy,
        job_ids=settings.job_ids,
        host=host,
        port=coordinator_port,
        poll_jobs=not no_poll,
        total_steps=settings.total_steps,
        straggler=straggler,
        eviction=eviction,
        metrics_token=token,
        drain=drain or settings.drain,
    )
    lighthouse = None
    if not no_lighthouse:
        lighthouse = LighthouseConfig(
            host=host,
            port=lighthouse_port,
            min_replicas=policy.min_replicas,
            heartbeat_timeout_ms=heartbeat_timeout_ms or settings.heartbeat_timeout_ms,
            join_timeout_ms=join_timeout_ms or settings.join_timeout_ms,
        )
    freeze_startup_heap()
    run_loop(serve(config, lighthouse, finish_grace_s=_finish_grace()))


def _ms(option: str, seconds: float | None, old_ms: int | None) -> int | None:
    """Milliseconds for the Lighthouse from an option in seconds or its older `-ms` spelling."""
    from slurm.errors import InputError

    if seconds is not None and old_ms is not None:
        raise InputError(option, seconds, f"{option} or {option}-ms, not both")
    return old_ms if seconds is None else max(1, round(seconds * 1000))


#: Seconds the run must stay finished before the control job exits (0: at once; "never": not).
FINISH_GRACE_ENV = "FTHSDP_CONTROL_FINISH_GRACE_S"


def _finish_grace() -> float | None:
    from slurm.errors import InputError

    raw = os.environ.get(FINISH_GRACE_ENV, "30").strip()
    if raw == "never":
        return None
    try:
        grace = float(raw)
    except ValueError:
        grace = -1.0
    if not 0 <= grace < float("inf"):
        raise InputError(FINISH_GRACE_ENV, raw, "seconds >= 0, or never")
    return grace


def _metrics_token(path: Path) -> str:
    from slurm.errors import InputError

    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise InputError("--metrics-token-file", str(path), f"a readable file ({exc})") from None
    if not 16 <= len(token) <= 512 or not token.isprintable() or " " in token:
        raise InputError("--metrics-token-file", str(path), "16-512 printable characters")
    return token


@click.command(context_settings={"ignore_unknown_options": True})
@_run_dir
@click.option("--replica", required=True, type=int, help="This replica's index.")
@click.option(
    "--decision-wait", default=30.0, show_default=True, help="Seconds to await a verdict."
)
@click.option(
    "--requeue-wait",
    default=180.0,
    show_default=True,
    help="Seconds to wait for Slurm to stop this job once it is requeued.",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def replica(
    run_dir: Path,
    replica: int,
    decision_wait: float,
    requeue_wait: float,
    command: tuple[str, ...],
) -> None:
    """Run one replica's step (COMMAND, usually `srun ...`) under its supervisor.

    When the step fails, the supervisor reports it and asks the coordinator whether to relaunch it
    here, exit so the job is requeued, or exit for good.
    """
    from runtime.control.supervisor.config import SupervisorConfig
    from runtime.control.supervisor.loop import Supervisor
    from slurm.errors import InputError
    from slurm.rundir import check_run_dir, read_control

    if replica < 0:
        raise InputError("--replica", replica, "a replica index >= 0")
    if not command:
        raise InputError("COMMAND", "", "the replica's step to run, e.g. -- srun ...")
    check_run_dir(run_dir)
    read_control(run_dir)  # a corrupt control file stops here, not in a requeue loop
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = SupervisorConfig.from_env(run_dir.resolve(), replica, list(command))
    config.decision_wait_s = decision_wait
    config.requeue_wait_s = requeue_wait
    sys.exit(Supervisor(config).run())
