"""The coordinator's settings: what one run's control plane is configured with, and where from.

`CoordinatorConfig` is everything the coordinator process is started with (addresses, timers,
retry budget, limits). `RunSettings` is what the run directory says about recovery (the policy's
knobs, the replica job ids, the Lighthouse timeouts, the straggler thresholds), read by
`load_run_settings` from what `fthsdp submit` wrote; `fthsdp control` merges its options over
it. Kept apart from the coordinator's event core so that reading a spec never needs the service.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from runtime.control.guard import GuardConfig
from runtime.control.policy import PolicyConfig
from runtime.control.straggler.detect import StragglerConfig
from runtime.control.straggler.evict import EvictionConfig
from slurm import contract
from slurm.errors import InputError
from slurm.privileges import check_setting
from slurm.rundir import read_job_ids, read_json, read_spec_data

RUN_FILE = "run.json"


@dataclass(frozen=True)
class CoordinatorConfig:
    run_dir: Path
    policy: PolicyConfig
    job_ids: dict[int, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 0
    tick_s: float = 1.0
    poll_s: float = 3.0
    poll_jobs: bool = True
    action_retries: int = 5
    action_backoff_s: float = 1.0
    action_backoff_max_s: float = 30.0
    #: The run's step budget (spec `train.steps`): the straggler decision's remaining time.
    total_steps: int | None = None
    #: Straggler detection thresholds, and how an eviction is decided and done (spec
    #: `train.straggler_*`; `min_replicas` is taken from `policy`).
    straggler: StragglerConfig = field(default_factory=StragglerConfig)
    eviction: EvictionConfig = field(default_factory=EvictionConfig)
    #: Connection limits and deadlines for every sender (`runtime.control.guard`).
    guard: GuardConfig = field(default_factory=GuardConfig)
    #: When set, `GET /metrics` requires `Authorization: Bearer <token>`.
    metrics_token: str | None = None
    #: Snapshot and compact the journal after this many events (None: 1,000 or 4 per replica).
    compact_every: int | None = None
    #: A report is answered 503 (Retry-After) at once, before its signature is checked, while
    #: the event loop runs this many seconds late or a journal write waits this long: a leader
    #: (2 s timeout) would give up on it anyway, and shedding it drains the backlog.
    max_queue_s: float = 1.0
    #: How drains are carried out (`slurm.privileges.DRAIN_SETTINGS`; spec `control.drain`).
    drain: str = "auto"


@dataclass(frozen=True)
class RunSettings:
    policy: PolicyConfig
    job_ids: dict[int, str]
    heartbeat_timeout_ms: int = int(contract.DEFAULT_HEARTBEAT_TIMEOUT_S * 1000)
    join_timeout_ms: int = 60000
    total_steps: int | None = None
    straggler: StragglerConfig = field(default_factory=StragglerConfig)
    eviction: EvictionConfig = field(default_factory=EvictionConfig)
    drain: str = "auto"


def straggler_config(
    factor: float | None = None, window_steps: int | None = None, window_s: float | None = None
) -> StragglerConfig:
    """Detection thresholds with the given overrides; the clear level never exceeds `factor`."""
    base = StragglerConfig()
    factor = base.factor if factor is None else float(factor)
    try:
        return replace(
            base,
            factor=factor,
            clear_factor=min(base.clear_factor, factor),
            window_steps=base.window_steps if window_steps is None else int(window_steps),
            window_s=base.window_s if window_s is None else float(window_s),
        )
    except ValueError as exc:
        raise InputError("train.straggler_*", str(exc), "factor > 1, positive windows") from None


def load_run_settings(run_dir: Path) -> RunSettings:
    """The run's recovery settings and replica job ids, from what `fthsdp submit` wrote.

    `spec.json` gives `replicas.count` and the `[train]` knobs; `run.json` (optional, for runs
    not made by `submit`) may hold `replicas` and any other `PolicyConfig` field and wins;
    `jobs.json` maps replicas to job ids (`{"replicas": [{"replica": 0, "job_id": "12"}, ...]}`
    or `{"replicas": {"0": "12"}}`). Without job ids the coordinator learns them from reports.
    """
    settings: dict[str, Any] = {}
    lighthouse: dict[str, Any] = {}  # and total_steps, straggler: RunSettings' keyword fields
    spec = read_spec_data(run_dir)  # checked field by field: a bad file is one line, exit 2
    if spec is not None:
        train = spec.get("train", {})
        if spec.get("control", {}).get("drain") is not None:
            lighthouse["drain"] = check_setting(str(spec["control"]["drain"]), "control.drain")
        settings["replicas"] = int(spec["replicas"]["count"])
        for key in ("min_replicas", "max_restarts_per_replica", "restart_window_s"):
            if key in train:
                settings[key] = train[key]
        for key in ("heartbeat_timeout", "join_timeout"):
            if f"{key}_s" in train:
                lighthouse[f"{key}_ms"] = int(float(train[f"{key}_s"]) * 1000)
        if train.get("steps"):
            lighthouse["total_steps"] = int(train["steps"])
        lighthouse["straggler"] = straggler_config(
            train.get("straggler_factor"),
            train.get("straggler_window_steps"),
            train.get("straggler_window_s"),
        )
        eviction: dict[str, Any] = {}
        if train.get("straggler_requeue_cost_s") is not None:
            eviction["requeue_cost_estimate_s"] = float(train["straggler_requeue_cost_s"])
        if train.get("straggler_mode") in ("drain", "exclude", "report"):
            eviction["mode"] = train["straggler_mode"]
        try:
            lighthouse["eviction"] = EvictionConfig(**eviction)
        except ValueError as exc:
            raise InputError("train.straggler_requeue_cost_s", eviction, str(exc)) from None
    run_file = run_dir / RUN_FILE
    raw = read_json(run_file)  # a trusted run file, like spec.json
    if raw is not None:
        if not isinstance(raw, dict):
            raise InputError(str(run_file), type(raw).__name__, "a JSON object")
        allowed = {f.name for f in fields(PolicyConfig)}
        settings.update({k: v for k, v in raw.items() if k in allowed})
    if "replicas" not in settings:
        raise InputError("RUN_DIR", str(run_dir), "a run directory with spec.json (or run.json)")
    jobs = read_job_ids(run_dir) or {}
    return RunSettings(PolicyConfig(**settings), jobs, **lighthouse)
