"""Reading a run directory for `fthsdp report`: the progress files, the journal, jobs.json.

Only files are read, never Slurm, so a report can be made of a run whose cluster is gone, and
of a live run without disturbing it. Every reader is strict: a file that is missing where the
run must have one, or that is not what fthsdp writes, raises `RunFileError` (one line naming the
file and what is wrong; exit 2). One allowance, for a live run: a progress file's last line
without its newline is being written and is skipped.

A run submitted to Slurm (it has `jobs.json`) must have its control journal; a local run
(`fthsdp run --local`) has none and is read from its progress files alone.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.report.timeline import (
    Action,
    EffectiveTime,
    Fault,
    JournalFacts,
    Mark,
    ProgressFacts,
    Segment,
    effective_time,
    journal_facts,
    merge_faults,
    progress_facts,
    segments,
    step_rate,
)
from runtime.worker.outputs import FINISHED_MARKER
from slurm.rundir import JOBS_FILE, RunFileError, RunRecord, read_run

PROGRESS_DIR = "progress"
_PROGRESS_NAME = re.compile(r"r(\d+)\.jsonl")


def read_progress(path: Path) -> list[dict[str, Any]]:
    """The records of one progress file, in file order; `RunFileError` naming the line that is
    not a record (a JSON object with a number `t` and a string `event`)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise RunFileError(path, f"cannot be read ({exc.strerror or exc})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    elif lines:
        lines.pop()  # the last line is still being written
    records = []
    for n, line in enumerate(lines, 1):
        try:
            rec = json.loads(line)
        except ValueError as exc:
            raise RunFileError(path, f"line {n} is not JSON ({exc}): {line[:60]!r}") from None
        if not isinstance(rec, dict):
            raise RunFileError(path, f"line {n} is not a JSON object: {line[:60]!r}")
        t, event = rec.get("t"), rec.get("event")
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not isinstance(event, str):
            raise RunFileError(path, f"line {n} lacks a number 't' and a string 'event'")
        metrics = rec.get("metrics")
        if metrics is not None and not (
            isinstance(metrics, dict)
            and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in metrics.values()
            )
        ):
            raise RunFileError(path, f"line {n}: 'metrics' is not an object of numbers")
        records.append(rec)
    return records


def progress_files(run_dir: Path) -> dict[int, Path]:
    """replica -> its progress file (`progress/rK.jsonl`)."""
    folder = run_dir / PROGRESS_DIR
    if not folder.is_dir():
        return {}
    out = {}
    for path in sorted(folder.iterdir()):
        found = _PROGRESS_NAME.fullmatch(path.name)
        if found:
            out[int(found.group(1))] = path
    return out


def foreign_metrics(
    run_dir: Path, replicas: int
) -> tuple[dict[int, dict[str, dict[int, float]]], int]:
    """replica -> metric -> step -> value from a foreign torchft trainer's own JSONL progress
    files (`[train] progress_file`, one per replica group, written by its rank 0), and how many
    lines were skipped. A line counts when it is a JSON object with an integer `step` and a
    `metrics` object within `runtime.report.metrics`' bounds; any other line is skipped, as the
    supervisor skips it: the trainer's file, not fthsdp's to fail on."""
    from runtime.foreign import progress_path
    from runtime.report.metrics import MetricError, check_metrics
    from slurm.rundir import read_spec_data

    spec = read_spec_data(run_dir) or {}
    train = spec.get("train") or {}
    template = train.get("progress_file")
    if train.get("mode") != "torchft" or not isinstance(template, str):
        return {}, 0
    out: dict[int, dict[str, dict[int, float]]] = {}
    skipped = 0
    for k in range(replicas):
        path = progress_path(template, run_dir, k)
        try:
            lines = path.read_text(errors="replace").split("\n")[:-1]  # whole lines only
        except OSError:
            continue  # not written yet, or on a node-local disk
        for line in lines:
            try:
                data = json.loads(line)
                step, metrics = data["step"], data["metrics"]
                if isinstance(step, bool) or not isinstance(step, int):
                    raise TypeError("step")
                values = check_metrics(metrics, str(path))
            except (ValueError, TypeError, KeyError, AttributeError, MetricError):
                skipped += '"metrics"' in line  # a line without metrics is only a step
                continue
            for name, value in values.items():
                out.setdefault(k, {}).setdefault(name, {})[step] = value
    return out, skipped


def read_journal_facts(run_dir: Path, replicas: int) -> tuple[JournalFacts, dict[str, Any]]:
    """The journal's facts and the coordinator's state rebuilt from it (as `/v1/state` shows
    it), through the journal's own reader; `RunFileError` when it is missing or corrupt."""
    from runtime.control.journal.schema import JOURNAL_FILE
    from runtime.control.journal.store import Journal
    from runtime.control.policy import PolicyConfig

    path = run_dir / JOURNAL_FILE
    if not path.is_file():
        raise RunFileError(
            path, "missing: a submitted run's control job writes it; has the control job started?"
        )
    journal = Journal(path)
    try:
        journal.check()
        events = journal.events()
        actions = [(a.event_seq, a.action, a.status) for a in journal.actions()]
        state, _, _ = journal.rebuild(PolicyConfig(replicas=max(1, replicas)))
    finally:
        journal.close()
    view = state.to_dict()
    reps = view["replicas"]
    view["quorum_id"] = max((r["quorum_id"] for r in reps), default=-1)
    view["participants"] = max((r["participants"] for r in reps), default=0)
    cursors = [r["cursor"] for r in reps if r["cursor"] is not None]
    view["cursor"] = max(cursors) if cursors else None
    view["url"] = "(read from the journal)"
    return journal_facts(events, actions), view


@dataclass
class Lane:
    """One replica over the run: its jobs, nodes, state segments, faults and actions."""

    replica: int
    jobs: list[str]
    nodes: list[str]
    segments: list[Segment]
    faults: list[Fault]
    actions: list[Action]
    last_step: int | None
    incarnations: int
    finished: bool


@dataclass
class RunReport:
    """Everything `fthsdp report` draws, as plain data."""

    name: str
    run_dir: str
    kind: str  # "slurm" or "local"
    start: float
    end: float
    finished: bool
    made_at: float
    lanes: list[Lane]
    faults: list[Fault]
    step_rate: list[tuple[float, float]]
    #: metric name -> replica -> [(step, value)]
    metrics: dict[str, dict[int, list[tuple[int, float]]]]
    effective: EffectiveTime
    #: the status table's data (the shape `fthsdp status --json` prints)
    status: dict[str, Any] = field(default_factory=dict)
    #: what the reader skipped, in words
    notes: list[str] = field(default_factory=list)


def build_report(run_dir: Path, now: float | None = None) -> RunReport:
    """Read `run_dir` and derive the report; `RunFileError` for a missing or corrupt file."""
    now = time.time() if now is None else now
    record: RunRecord | None = read_run(run_dir) if (run_dir / JOBS_FILE).exists() else None
    files = progress_files(run_dir)
    if record is None and not files:
        raise RunFileError(
            run_dir / PROGRESS_DIR,
            f"no progress files (rK.jsonl) and no {JOBS_FILE}: not a run directory, "
            "or a run that has not started",
        )
    finished = (run_dir / FINISHED_MARKER).exists()
    known = [*files, *(r.replica or 0 for r in (record.replicas if record else ()))]
    n_replicas = max(known, default=0) + 1
    records = {k: read_progress(p) for k, p in files.items()}
    facts: dict[int, ProgressFacts] = {
        k: progress_facts(k, records.get(k, []), finished) for k in range(n_replicas)
    }
    journal, view = (
        read_journal_facts(run_dir, n_replicas) if record is not None else (JournalFacts(), {})
    )
    times = [t for f in facts.values() for t in (f.first_t, f.last_t) if t is not None]
    times += [m.t for ms in journal.marks.values() for m in ms]
    start = min(times, default=record.submitted_at if record else now)
    if record is not None and record.submitted_at:
        start = min(start, record.submitted_at)
    end = max(times, default=start) if finished else max(now, max(times, default=start))
    faults = merge_faults((f for p in facts.values() for f in p.faults), journal.faults)
    lanes = []
    for k in range(n_replicas):
        marks: list[Mark] = [*facts[k].marks, *journal.marks.get(k, [])]
        if k not in files:  # no progress file: its leader's status reports say when it trained
            marks += journal.reported.get(k, [])
        if record is not None:  # submitted: its job waits in Slurm's queue until it starts
            marks.insert(0, Mark(record.submitted_at or start, "pending"))
        jobs = list(journal.jobs.get(k, []))
        if record is not None:
            first = next((r.job_id for r in record.replicas if r.replica == k), None)
            if first and first not in jobs:
                jobs.insert(0, first)
        lanes.append(
            Lane(
                replica=k,
                jobs=jobs,
                nodes=journal.nodes.get(k, []) if record is not None else ["local processes"],
                segments=segments(marks, end),
                faults=[f for f in faults if f.replica == k],
                actions=[a for a in journal.actions if a.replica == k],
                last_step=facts[k].last_step,
                incarnations=len(facts[k].incarnations),
                finished=facts[k].finished,
            )
        )
    metrics: dict[str, dict[int, list[tuple[int, float]]]] = {}
    foreign, skipped = foreign_metrics(run_dir, n_replicas) if record else ({}, 0)
    for k in range(n_replicas):
        for name, by_step in {**facts[k].metrics, **foreign.get(k, {})}.items():
            metrics.setdefault(name, {})[k] = sorted(by_step.items())
    report = RunReport(
        name=record.name if record else run_dir.name,
        run_dir=str(run_dir),
        kind="slurm" if record else "local",
        start=start,
        end=end,
        finished=finished,
        made_at=now,
        lanes=lanes,
        faults=faults,
        step_rate=step_rate(
            [
                *(c for f in facts.values() for c in f.commits),
                *(c for k, cs in journal.reported_commits.items() if k not in files for c in cs),
            ]
        ),
        metrics=dict(sorted(metrics.items())),
        effective=effective_time({lane.replica: lane.segments for lane in lanes}, start, end),
        notes=[f"{skipped} lines of the torchft trainer progress files: unusable metrics, skipped"]
        if skipped
        else [],
    )
    report.status = status_data(report, record, view)
    return report


def status_data(
    report: RunReport, record: RunRecord | None, view: dict[str, Any]
) -> dict[str, Any]:
    """The status table's data without Slurm: jobs.json and the journal's state for a submitted
    run (through the same merge `fthsdp status` uses), the progress files for a local run."""
    from runtime.control.client import merge_status

    if record is not None:
        base = {
            "name": record.name,
            "run_dir": record.run_dir,
            "submitted_at": record.submitted_at,
            "jobs": [
                {
                    "role": j.role,
                    "replica": j.replica,
                    "job_id": j.job_id,
                    "job_name": j.job_name,
                    "state": "" if j.role == "replica" else "not asked (files only)",
                    "nodes": [],
                    "restarts": None,
                    "reason": None,
                }
                for j in record.jobs
            ],
        }
        return merge_status(base, view, [])
    rows = []
    for lane in report.lanes:
        state = "done" if lane.finished else (lane.segments[-1].state if lane.segments else "-")
        rows.append(
            {
                "replica": lane.replica,
                "job_id": None,
                "state": state,
                "slurm_state": None,
                "nodes": lane.nodes,
                "step": lane.last_step,
                "restarts": max(0, lane.incarnations - 1),
                "relaunches": None,
                "requeues": None,
                "last_failure": lane.faults[-1].cause if lane.faults else None,
            }
        )
    return {
        "name": report.name,
        "run_dir": report.run_dir,
        "submitted_at": report.start,
        "jobs": [],
        "replicas": rows,
        "drained": [],
        "coordinator": None,
        "quorum_id": None,
        "participants": None,
        "cursor": None,
    }
