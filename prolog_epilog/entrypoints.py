"""Slurm's entry points: Prolog, Epilog and HealthCheckProgram (and `python -m` for wrappers).

slurm.conf names programs, not Python functions, so each mode is a console script
(`fthsdp-prolog`, `fthsdp-epilog`, `fthsdp-healthcheck`) and `python -m prolog_epilog.entrypoints
<mode> --config FILE` does the same for a wrapper script with absolute paths (slurmd runs these
as root with its own environment, which lacks any virtualenv).

What each mode does:
- prolog: run the suite (plus the checks the job asks for in its comment `fthsdp-health:a,b` that
  the operator allows in `actions.job_checks_allowed`); on failure drain the node with an
  `fthsdp:` reason, record the failure in state_dir, then exit 1 so Slurm requeues the job. A
  check only the job asked for that errors fails that job (cancelled), never the node.
- epilog: kill the finished job's stray GPU processes, clear its user's /dev/shm, re-check
  (default gpu-count, ecc, xid) so a job that broke a GPU drains the node.
- healthcheck: run the suite; drain on failure; resume a node we drained once it passes (not
  within `prolog_failure_hold_s` of a failure of our prolog, whose "Prolog error" drain it takes
  over as its own).

The three take turns on a node: each run holds an fcntl lock in the root-owned state_dir
(`prolog_epilog.state.node_lock`); a run that cannot get it checks but changes nothing in Slurm.

Nothing here lets a traceback reach slurmd. A broken config or an internal crash is logged and
the run "fails open" (exit 0): a typo in one config file must not drain a whole cluster. A hard
deadline timer ends the process even if something unforeseen blocks. Every run appends one JSON
line to `json_log` for tooling and logs to `log_file` and stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slurm import contract

MODES = ("prolog", "epilog", "healthcheck", "check")
log = logging.getLogger("fthsdp.health")


def setup_logging(log_file: str | None, mode: str) -> None:
    log.setLevel(logging.INFO)
    for h in list(log.handlers):
        log.removeHandler(h)
        h.close()
    fmt = f"fthsdp-{mode}[%(process)d]: %(levelname)s %(message)s"
    err = logging.StreamHandler(sys.stderr)
    err.setFormatter(logging.Formatter(fmt))
    log.addHandler(err)
    if log_file:
        try:
            Path(log_file).parent.mkdir(parents=True, exist_ok=True)
            fh = logging.FileHandler(log_file)
        except OSError as exc:
            log.warning("log file %s unusable: %s", log_file, exc)
        else:
            fh.setFormatter(logging.Formatter("%(asctime)s " + fmt))
            log.addHandler(fh)
    log.propagate = False


def write_json_line(path: str | None, record: dict[str, Any]) -> None:
    line = json.dumps(record, sort_keys=True)
    log.info("result %s", line)
    if path:
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as f:
                f.write(line + "\n")
        except OSError as exc:
            log.warning("json log %s unusable: %s", path, exc)


def _parser(mode: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"fthsdp-{mode}", description=f"fthsdp {mode} health checks")
    p.add_argument("--config", default=os.environ.get(contract.HEALTH_CONFIG), help="TOML config")
    p.add_argument("--node", default=None, help="Slurm node name (default $SLURMD_NODENAME)")
    p.add_argument("--only", default=None, help="comma list of checks instead of the suite")
    p.add_argument("--gpu-source", default="auto", choices=["auto", "nvml", "nvidia-smi"])
    p.add_argument("--no-drain", action="store_true", help="report only; change nothing in Slurm")
    return p


def run_mode(
    mode: str,
    config_path: str | None = None,
    *,
    node: str | None = None,
    only: Sequence[str] | None = None,
    gpu_source: str = "auto",
    drain: bool = True,
    env: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any]]:
    """One prolog/epilog/healthcheck run; returns (exit code, the JSON record). Never raises."""
    from prolog_epilog.config import load_config

    env = dict(os.environ if env is None else env)
    start = time.time()
    record: dict[str, Any] = {"mode": mode, "time": start, "job_id": env.get("SLURM_JOB_ID")}
    try:
        cfg = load_config(config_path, node=node or env.get("SLURMD_NODENAME") or None)
    except Exception as exc:
        setup_logging(None, mode)
        log.error("config unusable, failing open: %s", exc)
        record.update(healthy=None, error=f"config: {exc}", exit=0)
        write_json_line(None, record)
        return 0, record
    setup_logging(cfg.path("log_file"), mode)
    record["node"] = cfg.node
    budget = float(cfg.general["total_budget_s"])
    slurm_timeout = float(cfg.actions["slurm_timeout_s"])
    lock_timeout = float(cfg.actions["lock_timeout_s"])
    # The Epilog also reads the job's drain request and the nodes it is judged by.
    calls = 9 if mode == "epilog" else 6
    hard = lock_timeout + budget + calls * slurm_timeout + 15.0
    fail_code = 1 if cfg.general["on_error"] == "fail" else 0

    def hard_exit() -> None:  # pragma: no cover - only when something blocks unexpectedly
        log.error("hard deadline %.0fs reached; exiting %d", hard, fail_code)
        from prolog_epilog.tools import kill_tools

        kill_tools()
        if mode == "prolog" and fail_code:
            with contextlib.suppress(Exception):
                _record_prolog_failure(cfg, env, "hard deadline reached")
        os._exit(fail_code)

    timer = threading.Timer(hard, hard_exit)
    timer.daemon = True
    timer.start()
    try:
        from prolog_epilog.state import node_lock

        with node_lock(cfg.path("state_dir"), lock_timeout) as unlocked:
            if unlocked is not None:
                # Without the lock (or a trusted state_dir) another hook may be acting on this
                # node: check and report, but change nothing in Slurm.
                log.error("no node lock (%s): checking without acting on Slurm", unlocked)
                record["lock"] = unlocked
            code = _run(mode, cfg, only, gpu_source, drain and unlocked is None, env, record)
    except Exception as exc:
        log.exception("internal error, failing open")
        record.update(error=f"internal: {type(exc).__name__}: {exc}"[:300])
        code = 0
    finally:
        timer.cancel()
        from prolog_epilog.tools import kill_tools

        kill_tools()
    record["exit"] = code
    record["elapsed_s"] = round(time.time() - start, 4)
    write_json_line(cfg.path("json_log"), record)
    return code, record


def _record_prolog_failure(cfg: Any, env: dict[str, str], reason: str | None) -> None:
    """Remember, in the root-owned state_dir, that fthsdp's prolog failed on this node now."""
    from prolog_epilog.state import StateStore

    StateStore(cfg.path("state_dir")).put(
        "prolog_failed", {"at": time.time(), "job_id": env.get("SLURM_JOB_ID"), "reason": reason}
    )


def _run(
    mode: str,
    cfg: Any,
    only: Sequence[str] | None,
    gpu_source: str,
    act: bool,
    env: dict[str, str],
    record: dict[str, Any],
) -> int:
    """One run under the node lock; `act` False: change nothing in Slurm."""
    from prolog_epilog import actions
    from prolog_epilog.gpu_source import make_source
    from prolog_epilog.runner import run_checks
    from prolog_epilog.state import StateStore
    from slurm.backend import SlurmCommandError, make_backend

    backend = make_backend(timeout=float(cfg.actions["slurm_timeout_s"]), retries=2, backoff=0.5)
    kind = gpu_source if gpu_source != "auto" else cfg.general["gpu_source"]
    source = make_source(kind, cfg.path("nvidia_smi"))
    names = (
        list(only) if only else (cfg.epilog["checks"] if mode == "epilog" else cfg.default_checks)
    )
    # What a job asks for (its comment; FTHSDP_HEALTH_CHECKS if the hook's environment carries
    # one) runs only from the operator's allow-list, and only its faults count against the node.
    asked: list[str] = []
    if env.get(contract.HEALTH_CHECKS):
        asked += env[contract.HEALTH_CHECKS].split(",")
    job_id = env.get("SLURM_JOB_ID", "")
    if mode == "prolog" and cfg.actions["job_comment_checks"] and job_id and not only:
        asked += actions.job_requested_checks(actions.job_comment(job_id, backend))
    added, refused = actions.requested_checks(asked, cfg.actions["job_checks_allowed"], names)
    if refused:
        log.warning("job asked for checks not in actions.job_checks_allowed, ignored: %s", refused)
    if asked:
        record["requested"] = {"added": added, "refused": refused}
    names = names + added
    if mode == "epilog":
        ep = cfg.epilog
        record["cleanup"] = actions.epilog_cleanup(
            source,
            env,
            float(ep["kill_grace_s"]),
            bool(ep["kill_stray_gpu_processes"]),
            bool(ep["clean_dev_shm"]),
            min(5.0, float(cfg.general["timeout_s"])),
        )
    request = None
    if mode == "epilog" and job_id and not only:
        request = _judge_drain_request(cfg, env, job_id, backend, act, record)
        if request is not None and request[1].action == "recheck":
            names = list(dict.fromkeys([*cfg.default_checks, *names]))
    full = run_checks(names, cfg, mode=mode, source=source)
    suite, job_errors = actions.split_verdict(full, added, cfg.general["on_error"])
    if request is not None and request[1].action == "recheck" and suite.drain_reason:
        from prolog_epilog.drain_requests import annotate

        user = request[1].record.user if request[1].record else "?"
        suite = dataclasses.replace(suite, drain_reason=annotate(suite.drain_reason, job_id, user))
    record.update(suite.to_dict())
    for c in suite.checks:
        level = logging.INFO if c.status in ("pass", "skip") else logging.WARNING
        log.log(level, "%s %s: %s", c.name, c.status, c.detail)
    state = StateStore(cfg.path("state_dir"))
    passes = int(state.get("passes", 0)) + 1 if suite.healthy else 0
    state.put("passes", passes)
    if mode == "prolog" and not suite.healthy:
        _record_prolog_failure(cfg, env, suite.drain_reason)
    if job_errors and mode == "prolog":
        why = "; ".join(f"{c.name}: {c.detail}" for c in job_errors)
        why = f"health check the job asked for could not run on {cfg.node}: {why}"
        record["job_errors"] = why
        if suite.healthy and act and cfg.actions["job_check_error"] == "cancel":
            record["job_cancelled"] = actions.fail_job(job_id, why, backend)
    drain_enabled = act and bool(cfg.actions["drain"]) and mode != "check"
    node_info = None
    trusted = request[1] if request is not None and request[1].action == "drain" else None
    needs_node = (
        (not suite.healthy and drain_enabled)
        or (act and suite.healthy and mode == "healthcheck")
        or (trusted is not None and drain_enabled)
    )
    if needs_node:
        try:
            node_info = backend.node(cfg.node)
        except SlurmCommandError as exc:  # unreadable: no action on a guess
            log.error("node %s: state unreadable, no drain or resume: %s", cfg.node, exc)
            record["action"] = {"action": "none", "why": f"node state unreadable: {exc}"[:300]}
            return 0 if suite.healthy else 1
    hold = None
    if mode == "healthcheck" and node_info is not None:
        failed = state.get("prolog_failed")
        since = actions.prolog_failure(failed, time.time())
        if actions.claimable(node_info, since, float(cfg.actions["prolog_error_claim_s"])):
            detail = str(failed.get("reason") or "failed") if isinstance(failed, dict) else ""
            detail = detail.removeprefix("fthsdp: ")
            if actions.claim_prolog_error(cfg.node, detail, backend):
                record["claimed"] = actions.PROLOG_ERROR
                try:
                    node_info = backend.node(cfg.node)
                except SlurmCommandError as exc:
                    log.error("node %s: state unreadable after claim: %s", cfg.node, exc)
                    return 0 if suite.healthy else 1
        if since is not None and since < float(cfg.actions["prolog_failure_hold_s"]):
            hold = f"fthsdp's prolog failed here {since:.0f}s ago"
        hold = hold or _requested_hold(cfg, state, node_info)
    decision = actions.decide(
        mode,
        suite,
        node_info,
        passes,
        int(cfg.actions["resume_after_passes"]),
        drain_enabled,
        hold,
    )
    if trusted is not None and suite.healthy and drain_enabled and trusted.reason:
        decision = actions.Decision("drain", "a trusted drain request", trusted.reason)
    record["action"] = {"action": decision.action, "why": decision.why}
    if decision.action != "none" and act:
        done = actions.apply(decision, cfg.node, backend)
        record["action"]["done"] = done
        if decision.action == "resume" and done:
            state.put("prolog_failed", None)
            if state.get("requested_drain") is not None:
                state.put("requested_drain", None)
        if (
            decision.action == "drain"
            and done
            and decision.reason == getattr(trusted, "reason", None)
        ):
            state.put("requested_drain", {"at": time.time(), "reason": decision.reason})
    return 0 if suite.healthy else 1


def _requested_hold(cfg: Any, state: Any, node: Any) -> str | None:
    """Why HealthCheckProgram keeps a `requested` drain a while longer (None: it need not); the
    drain's time is the one the Epilog recorded for this very reason, else from now on."""
    from prolog_epilog.drain_requests import resume_hold

    if node is None or not node.drained_by_us:
        return None
    saved = state.get("requested_drain")
    at = None
    if isinstance(saved, dict) and saved.get("reason") == node.reason:
        value = saved.get("at")
        if isinstance(value, int | float) and not isinstance(value, bool):
            at = float(value)
    hold, since = resume_hold(
        node.reason, at, time.time(), float(cfg.actions["drain_request_hold_s"])
    )
    if since is not None and since != at:
        state.put("requested_drain", {"at": since, "reason": node.reason})
    return hold


def _judge_drain_request(
    cfg: Any, env: dict[str, str], job_id: str, backend: Any, act: bool, record: dict[str, Any]
) -> tuple[Any, Any] | None:
    """Read the ending job's drain request from slurmctld and judge it (`drain_requests.judge`),
    recording it in the ledger before anything is done about it, so it is acted on at most once.
    Returns (request, verdict), or None when the job's comment holds no request. Every refusal
    is one log line; nothing here changes the Epilog's exit."""
    from prolog_epilog import actions
    from prolog_epilog import drain_requests as dr
    from slurm import drain_request
    from slurm.backend import SlurmCommandError
    from slurm.errors import InputError

    user = dr.job_user(env)
    try:
        request = drain_request.parse(actions.ending_job_comment(env, job_id, backend))
    except InputError as exc:
        verdict = dr.Verdict("refuse", f"malformed request: {exc}")
        log.warning(dr.refusal_line(job_id, user, cfg.node, verdict.why))
        record["drain_request"] = dr.as_record(verdict, None)
        return None
    if request is None:
        return None
    policy = str(cfg.actions["drain_requests"])
    limit = int(cfg.actions["drain_requests_per_user_day"])
    if not act or not cfg.actions["drain"]:
        why = "this run may not act on Slurm" if not act else "draining is off (actions.drain)"
        verdict = dr.Verdict("refuse", why)
    else:
        # Slurm is asked about nodes only for a request `judge` may accept: every node of a
        # large job runs this Epilog at once, and all but one refuse on the node name.
        asks = policy in ("recheck", "trust") and bool(user) and request.node == cfg.node
        node_info = None
        if asks:
            try:
                node_info = backend.node(cfg.node)
            except SlurmCommandError as exc:
                log.error("node %s unreadable for a drain request: %s", cfg.node, exc)
        drained_for = None
        if asks and policy == "trust" and user:
            try:
                drained_for = dr.nodes_drained_for(user, backend.nodes())
            except SlurmCommandError as exc:
                log.error("nodes unreadable for a drain request: %s", exc)
        ledger = dr.Ledger(cfg.path("state_dir"))
        try:
            # Under the node lock already: the ledger's own lock is only ever briefly contended.
            with ledger.locked(min(5.0, float(cfg.actions["lock_timeout_s"]))):
                events: list[dr.Event] | None
                try:
                    events = ledger.read()
                except dr.LedgerError as exc:
                    log.error("drain requests refused until an operator fixes it: %s", exc)
                    events = None
                now = time.time()
                verdict = dr.judge(
                    request,
                    policy=policy,
                    job=job_id,
                    user=user,
                    node=cfg.node,
                    events=events,
                    limit=limit,
                    node_info=node_info,
                    user_drained=drained_for,
                    now=now,
                )
                if verdict.record is not None and events is not None:
                    ledger.write([*events, verdict.record], now)
        except dr.LedgerError as exc:
            log.error("drain-request ledger: %s", exc)
            verdict = dr.Verdict("refuse", f"the drain-request ledger is unusable: {exc}")
    record["drain_request"] = {**dr.as_record(verdict, request), "user": user}
    if verdict.action in ("refuse", "skip"):
        line = dr.refusal_line(job_id, user, cfg.node, verdict.why)
        log.log(logging.INFO if verdict.action == "skip" else logging.WARNING, line)
    else:
        log.warning(
            "drain request accepted: job %s user %s node %s kind %s: %s",
            job_id,
            user,
            cfg.node,
            request.kind,
            verdict.why,
        )
    return request, verdict


def _main(mode: str, argv: Sequence[str] | None) -> int:
    args = _parser(mode).parse_args(list(sys.argv[1:] if argv is None else argv))
    only = [c for c in args.only.split(",") if c] if args.only else None
    code, _ = run_mode(
        mode,
        args.config,
        node=args.node,
        only=only,
        gpu_source=args.gpu_source,
        drain=not args.no_drain,
    )
    return code


def prolog_main(argv: Sequence[str] | None = None) -> int:
    """`fthsdp-prolog`: Slurm Prolog (PrologFlags=Alloc)."""
    return _main("prolog", argv)


def epilog_main(argv: Sequence[str] | None = None) -> int:
    """`fthsdp-epilog`: Slurm Epilog."""
    return _main("epilog", argv)


def healthcheck_main(argv: Sequence[str] | None = None) -> int:
    """`fthsdp-healthcheck`: Slurm HealthCheckProgram."""
    return _main("healthcheck", argv)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m prolog_epilog.entrypoints MODE [options]`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ("prolog", "epilog", "healthcheck"):
        sys.stderr.write(
            "usage: python -m prolog_epilog.entrypoints prolog|epilog|healthcheck [--config FILE]\n"
        )
        return 2
    return _main(args[0], args[1:])


if __name__ == "__main__":
    sys.exit(main())
