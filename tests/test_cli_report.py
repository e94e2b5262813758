"""`fthsdp report RUN_DIR`: the page it writes from a run directory's files, and its bad input.

Run directories are built here from the records a run writes: progress files (`rK.jsonl`), and
for a submitted run `jobs.json` and a real control journal written through `Journal`. A
missing or corrupt file is one line naming it, exit 2, and no report (nor a temporary file) is
left behind.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from test_report_timeline import XID_FATAL

from fthsdp_cli.main import cli
from runtime.control.journal.store import Journal
from runtime.control.policy import Drain, JobObserved, ReportReceived, Requeue
from runtime.protocol import ReplicaReport
from slurm.rundir import JobRecord, RunRecord, write_run

T0 = 1_800_000_000.0
SPECS = Path(__file__).with_name("specs")


def _progress(run: Path, replica: int, records: list[dict[str, Any]]) -> None:
    folder = run / "progress"
    folder.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in records)
    (folder / f"r{replica}.jsonl").write_text(text)


def _records(inc: str, t: float, steps: range, metrics: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"t": t, "event": "start", "incarnation": inc, "step": 0}]
    for i, step in enumerate(steps):
        at = t + 1 + i * 0.5
        if metrics:
            loss = {"loss": 1.0 / (step + 1)}
            out.append(
                {"t": at, "event": "metrics", "incarnation": inc, "step": step, "metrics": loss}
            )
        out.append({"t": at, "event": "commit", "incarnation": inc, "step": step, "healing": False})
    return out


def local_run(tmp_path: Path, metrics: bool = True) -> Path:
    """Two replicas; replica 1 is killed after step 9 and comes back at step 20."""
    run = tmp_path / "run"
    done = {"t": T0 + 30, "event": "done", "incarnation": "a0", "step": 40}
    _progress(run, 0, [*_records("a0", T0, range(40), metrics), done])
    again = _records("b1", T0 + 10, range(20, 40), metrics)
    done1 = {**done, "incarnation": "b1"}
    _progress(run, 1, [*_records("a1", T0, range(10), metrics), *again, done1])
    (run / "finished").write_text("40")
    return run


def slurm_run(tmp_path: Path) -> Path:
    """A submitted run: jobs.json, a journal with a node fault, its drain and requeue."""
    run = tmp_path / "srun"
    run.mkdir()
    jobs = [
        JobRecord("replica", str(10 + k), f"t-r{k:02d}", f"replica-{k:02d}.sbatch", k)
        for k in range(2)
    ]
    control = JobRecord("control", "9", "t-control", "control.sbatch")
    write_run(RunRecord("t", str(run), T0 - 5, control, tuple(jobs)))
    _progress(run, 0, _records("a0", T0, range(30), False))
    _progress(
        run, 1, _records("a1", T0, range(8), False) + _records("b1", T0 + 12, range(20, 30), False)
    )
    journal = Journal.in_run_dir(run)
    try:
        journal.record(JobObserved(1, "11", 0, "RUNNING", T0, ("node2",)), [], now=T0)
        journal.record(
            ReportReceived(XID_FATAL, T0 + 4.2),
            [Drain("node2", "fthsdp: xid: Xid 79", 1), Requeue(1, "11", 0)],
            now=T0 + 4.2,
        )
        journal.record(JobObserved(1, "11", 1, "PENDING", T0 + 6), [], now=T0 + 6)
    finally:
        journal.close()
    return run


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, ["report", *args])


def test_local_run_report_has_lanes_faults_metrics_and_status(tmp_path: Path) -> None:
    run = local_run(tmp_path)
    r = invoke(str(run))
    assert r.exit_code == 0, r.output
    assert r.output.strip() == str(run / "report.html")
    page = (run / "report.html").read_text()
    for k in (0, 1):
        assert f'class="lane" id="lane-{k}"' in page
    assert page.count('class="fault"') == 1
    assert "processes ended without a final record" in page
    assert 'id="metric-loss"' in page and "no-metrics" not in page
    assert 'id="step-rate"' in page and 'id="effective"' in page
    assert "local launcher" in page and "replica" in page  # the status table
    assert "http://" not in page and "https://" not in page  # nothing to fetch
    assert [p.name for p in run.iterdir() if p.name.startswith(".")] == []


def test_a_run_without_metrics_says_none_were_recorded(tmp_path: Path) -> None:
    run = local_run(tmp_path, metrics=False)
    out = tmp_path / "elsewhere.html"
    r = invoke(str(run), "--out", str(out))
    assert r.exit_code == 0, r.output
    page = out.read_text()
    assert 'id="no-metrics"' in page and "No metrics were recorded" in page
    assert not (run / "report.html").exists()


def test_submitted_run_report_reads_the_journal(tmp_path: Path) -> None:
    run = slurm_run(tmp_path)
    r = invoke(str(run), "--png")
    assert r.exit_code == 0, r.output
    page = (run / "report.html").read_text()
    assert page.count('class="fault"') == 1  # the journal's fault replaces the progress one
    assert "node fault on node2, exit 11: fthsdp: xid: Xid 79" in page
    assert 'class="action drain"' in page and 'class="action requeue"' in page
    assert "job 11 on node2" in page
    # The status table, from the journal; the policy chose the kind, the leader gave the detail.
    assert "drained node2: fthsdp: fault: xid: Xid 79" in page
    assert (run / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_replica_without_progress_file_trains_by_its_status_reports(tmp_path: Path) -> None:
    """A foreign torchft trainer writes no progress file: its supervisor's status reports in
    the journal say when it trained."""
    run = slurm_run(tmp_path)
    (run / "progress" / "r0.jsonl").unlink()
    journal = Journal.in_run_dir(run)
    try:
        for seq in range(5):
            report = ReplicaReport(0, "progress:x", seq, job_id="10", step=seq)
            journal.record(ReportReceived(report, T0 + seq), [], now=T0 + seq)
    finally:
        journal.close()
    r = invoke(str(run))
    assert r.exit_code == 0, r.output
    page = (run / "report.html").read_text()
    lane = page.split('id="lane-0"')[1].split("</g>")[0]
    assert 'class="segment training"' in lane


def _no_progress(run: Path) -> None:
    for p in (run / "progress").iterdir():
        p.unlink()
    (run / "progress").rmdir()


#: (progress file replaced, its new text, what the error says); None: the folder is removed.
SPOILED: list[tuple[str | None, str, str]] = [
    ("r1.jsonl", '{"t": 1, "event": "start"}\n{not json\n', "line 2 is not JSON"),
    ("r0.jsonl", "[1, 2]\n", "line 1 is not a JSON object"),
    ("r0.jsonl", '{"event": "start"}\n', "lacks a number 't'"),
    ("r0.jsonl", '{"t": 1, "event": "m", "metrics": {"loss": "x"}}\n', "not an object of numbers"),
    (None, "", "no progress files"),
]


@pytest.mark.parametrize(("name", "text", "says"), SPOILED)
def test_corrupt_or_missing_progress_is_one_line_exit_2(
    tmp_path: Path, name: str | None, text: str, says: str
) -> None:
    run = local_run(tmp_path)
    path = run / "progress" / (name or "")
    if name is None:
        _no_progress(run)
    else:
        path.write_text(text)
    r = invoke(str(run), "--png")
    assert r.exit_code == 2, r.output
    assert len(r.output.strip().splitlines()) == 1, r.output
    assert str(path).rstrip("/") in r.output and says in r.output, r.output
    assert not (run / "report.html").exists() and not (run / "report.png").exists()
    assert [p.name for p in run.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize(
    ("spoil", "says"),
    [
        (lambda p: p.unlink(), "missing"),
        (lambda p: p.write_bytes(b"this is not a database" * 100), "control journal is unreadable"),
    ],
    ids=["missing", "not sqlite"],
)
def test_missing_or_corrupt_journal_is_one_line_exit_2(
    tmp_path: Path, spoil: Any, says: str
) -> None:
    run = slurm_run(tmp_path)
    journal = run / "control.sqlite"
    for extra in ("control.sqlite-wal", "control.sqlite-shm"):
        (run / extra).unlink(missing_ok=True)
    spoil(journal)
    r = invoke(str(run))
    assert r.exit_code == 2, r.output
    assert len(r.output.strip().splitlines()) == 1, r.output
    assert str(journal) in r.output and says in r.output, r.output
    assert not (run / "report.html").exists()


def test_a_live_run_reads_up_to_the_line_being_written(tmp_path: Path) -> None:
    run = local_run(tmp_path)
    (run / "finished").unlink()
    path = run / "progress" / "r0.jsonl"
    path.write_text(path.read_text() + '{"t": 1800000031.0, "event": "com')
    r = invoke(str(run))
    assert r.exit_code == 0, r.output
    assert "live, as of" in (run / "report.html").read_text()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["/nonexistent-run-dir"], "RUN_DIR"),
        (["{run}", "--out", "/nonexistent-dir/r.html"], "--out"),
        (["{run}", "--out", "{run}/r.png", "--png"], "--out"),
    ],
)
def test_bad_arguments_are_one_line_exit_2(tmp_path: Path, args: list[str], says: str) -> None:
    run = local_run(tmp_path)
    r = invoke(*(a.format(run=run) for a in args))
    assert r.exit_code == 2, r.output
    assert len(r.output.strip().splitlines()) == 1 and says in r.output, r.output


def test_a_submitted_run_before_any_progress_shows_its_replicas_pending(tmp_path: Path) -> None:
    run = slurm_run(tmp_path)
    for path in (run / "progress").iterdir():
        path.unlink()
    r = invoke(str(run))
    assert r.exit_code == 0, r.output
    page = (run / "report.html").read_text()
    for k in (0, 1):
        lane = page.split(f'id="lane-{k}"')[1].split("</g>")[0]
        assert 'class="segment pending"' in lane
    assert "live, as of" in page and "fewer than two committed steps" in page


def test_a_torchft_trainer_s_metrics_come_from_its_own_progress_file(tmp_path: Path) -> None:
    """`[train] progress_file` lines may carry `"metrics"`: kept within the same bounds as
    `ft.record`'s; a line with unusable metrics is skipped (and counted), never fatal."""
    from slurm.spec import load_spec

    run = slurm_run(tmp_path)
    template = "{dump_dir}/progress.jsonl"
    toml = tmp_path / "torchft.toml"
    text = (SPECS / "torchft.toml").read_text()
    toml.write_text(re.sub(r"(?m)^progress_regex = .*$", f'progress_file = "{template}"', text))
    spec = load_spec(toml, [f"job.run_dir={run}"])
    (run / "spec.json").write_text(json.dumps(spec.to_dict()))
    from runtime.foreign import progress_path

    lines = [
        {"step": 1, "metrics": {"loss": 2.0}},
        {"step": 2, "metrics": {"loss": 1.0, "bad name": 3}},
        {"step": 3},
        {"step": 4, "metrics": {"loss": 0.5}},
    ]
    for k in (0, 1):
        path = progress_path(template, run, k)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 5, "metr')
    r = invoke(str(run))
    assert r.exit_code == 0, r.output
    page = (run / "report.html").read_text()
    assert 'id="metric-loss"' in page and "bad name" not in page
    assert "2 lines of the torchft trainer progress files: unusable metrics, skipped" in page
