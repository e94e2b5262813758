"""No traceback for a user: every command answers bad input and a broken environment in one line.

Exit codes (documented in `fthsdp --help` and docs/operators.md): 2 bad input, 3 the environment
failed (Slurm unreachable, a command missing, a timeout), 1 a bug (one line that says how to
see the traceback: `FTHSDP_DEBUG=1`). The table runs every command with bad inputs in-process;
the probes a new user hits first run the real console script. A failed submit leaves no
half-written run directory, and a submitted run directory is private to its owner.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from submit_harness import RecordingBackend

from fthsdp_cli.main import COMMANDS, EXIT_CODES, cli, one_line
from slurm.backend import SlurmCommandError
from slurm.errors import EnvironmentProblem, InputError
from slurm.spec import load_spec
from slurm.submit import check_slurm_conf, submit_run

ROOT = Path(__file__).resolve().parent.parent
SPECS = Path(__file__).with_name("specs")
FTHSDP = [sys.executable, "-m", "fthsdp_cli"]
RUN_SET = "job.run_dir={run}"


@pytest.fixture
def empty_conf(tmp_path: Path) -> Path:
    path = tmp_path / "empty.conf"
    path.write_text("")
    return path


def _bad_run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "badrun"
    run.mkdir()
    (run / "jobs.json").write_text('["x"]')
    return run


def _good_run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "goodrun"
    run.mkdir()
    record = {
        "name": "t",
        "run_dir": str(run),
        "submitted_at": 1.0,
        "control": {"role": "control", "job_id": "1", "job_name": "t-control", "script": "c"},
        "replicas": [
            {"role": "replica", "job_id": "2", "job_name": "t-r00", "script": "r", "replica": 0}
        ],
    }
    (run / "jobs.json").write_text(json.dumps(record))
    return run


# (command line, expected exit code, what the line must say); {tmp}, {bad}, {good} filled in.
TABLE: list[tuple[list[str], int, str]] = [
    (["render", "/nonexistent.toml"], 2, "SPEC"),
    (["render", "{tmp}/not.toml"], 2, "valid TOML"),
    (["render", str(SPECS / "cpu.toml"), "--set", "replicas.count=x"], 2, "replicas.count"),
    (["submit", "/nonexistent.toml"], 2, "SPEC"),
    (["submit", str(SPECS / "cpu.toml"), "--set", "job.run_dir={tmp}/r"], 3, "SLURM_CONF"),
    (["status", "/nonexistent-run-dir"], 2, "jobs.json"),
    (["status", "{bad}"], 2, "jobs.json"),
    (["status", "{good}"], 3, "SLURM_CONF"),
    (["cancel", "/nonexistent-run-dir"], 2, "jobs.json"),
    (["cancel", "{bad}"], 2, "jobs.json"),
    (["cancel", "{good}"], 3, "SLURM_CONF"),
    (["requeue", "/nonexistent-run-dir", "--replica", "0"], 2, "does not exist"),
    (["requeue", "{bad}", "--replica", "0"], 2, "jobs.json"),
    (["requeue", "{good}", "--replica", "0"], 3, "SLURM_CONF"),
    (["requeue", "{good}", "--replica", "7"], 3, "SLURM_CONF"),
    (["events", "/nonexistent-run-dir"], 2, "does not exist"),
    (["events", "{good}"], 2, "control.sqlite"),
    (["report", "/nonexistent-run-dir"], 2, "RUN_DIR"),
    (["report", "{good}"], 2, "control.sqlite"),
    (["check", "--config", "/nonexistent.toml"], 2, "--config"),
    (["check", "--only", "bogus"], 2, "bogus"),
    (["check", "--sysfs-root", "/nope", "--only", "infiniband"], 2, "--sysfs-root"),
    (["check", "--kernel-log", "/nope", "--only", "xid"], 2, "--kernel-log"),
    (["simulate", "--gpus", "-1"], 2, "gpus"),
    (["doctor", "--spec", "/nonexistent.toml"], 2, "SPEC"),
    (["run", "--local", "/nonexistent.toml"], 2, ""),
    (["control", "--run-dir", "/nonexistent-run-dir"], 2, "does not exist"),
    (["control", "--run-dir", "{tmp}", "--no-poll"], 2, "spec.json"),
    (["replica", "--run-dir", "{tmp}", "--replica", "-1", "true"], 2, "replica"),
    (["cluster", "inject", "node1", "--fault", "bogus", "--dir", "{tmp}"], 2, "fault"),
    (["prolog", "--config", "/nonexistent.toml", "--no-drain", "--only", "disk"], 0, ""),
    (["nosuchcommand"], 2, "No such command"),
]
CPU = str(SPECS / "cpu.toml")
# Options out of range or unusable: refused before any work, naming the option.
TABLE += [
    (["render", CPU, "--out", "/proc/nope"], 2, "--out"),
    (["render", CPU, "--replica", "-1"], 2, "--replica"),
    (["render", CPU, "--replica", "9"], 2, "--replica"),
    (["submit", CPU, "--set", "replicas.count=0"], 2, "replicas.count"),
    (["status", "{good}", "--watch", "--interval", "-1"], 2, "--interval"),
    (["status", "{good}", "--watch", "--interval", "0"], 2, "--interval"),
    (["status", "{good}", "--interval", "x"], 2, "--interval"),
    (["events", "{good}", "--last", "-1"], 2, "--last"),
    (["events", "{good}", "--last", "0"], 2, "--last"),
    (["requeue", "{good}", "--replica", "-1"], 2, "--replica"),
    (["cancel"], 2, "RUN_DIR"),
    (["simulate", "--plot", "/nonexistent/x.png"], 2, "--plot"),
    (["simulate", "--plot", "{tmp}/x.txt"], 2, "--plot"),
    (["simulate", "--sweep-replicas", "1,x"], 2, "--sweep-replicas"),
    (["simulate", "--mtbf-minutes", "0"], 2, "--mtbf-minutes"),
    (["simulate", "--runs", "0"], 2, "--runs"),
    (["run", CPU, "--steps", "-1"], 2, "--steps"),
    (["run", CPU, "--steps", "0"], 2, "--steps"),
    (["run", CPU, "--timeout", "-5"], 2, "--timeout"),
    (["run", CPU, "--kill-replica", "1", "--at-step", "500", "--steps", "200"], 2, "--at-step"),
    (["run", CPU, "--kill-replica", "1"], 2, "--at-step"),
    (["run", CPU, "--kill-replica", "9", "--at-step", "5"], 2, "--kill-replica"),
    (["run", CPU, "--replicas", "0"], 2, "--replicas"),
    (["run", CPU, "--slow-factor", "0.5"], 2, "--slow-factor"),
    (["run", CPU, "--chaos-mtbf", "0"], 2, "--chaos-mtbf"),
    (["run", CPU, "--restart-delay", "-1"], 2, "--restart-delay"),
    (["check", "--only", ""], 2, "--only"),
    (["doctor", "--timeout", "0"], 2, "--timeout"),
    (["cluster", "status", "--dir", "{tmp}"], 2, "--dir"),
    (["cluster", "inject", "node9", "--fault", "xid79", "--dir", "{tmp}"], 2, "--dir"),
    (["cluster", "heal", "node1", "--dir", "{tmp}"], 2, "--dir"),
    (["cluster", "up", "--nodes", "0", "--dir", "{tmp}"], 2, "nodes"),
    (["control"], 2, "RUN_DIR"),
    (["control", "/nonexistent-run-dir"], 2, "does not exist"),
    (["control", "{tmp}", "--no-poll"], 2, "spec.json"),
    (["control", "{tmp}", "--run-dir", "{tmp}"], 2, "not both"),
    (["control", "{tmp}", "--heartbeat-timeout", "-1"], 2, "--heartbeat-timeout"),
    (["control", "{tmp}", "--heartbeat-timeout", "2", "--heartbeat-timeout-ms", "9"], 2, "both"),
    (["control", "{tmp}", "--straggler-window", "0"], 2, "--straggler-window"),
    (["control", "{tmp}", "--replicas", "0"], 2, "--replicas"),
    (["control", "{tmp}", "--lighthouse-port", "70000"], 2, "--lighthouse-port"),
    (["replica", "{tmp}", "--replica", "-1", "--", "true"], 2, "replica"),
    (["replica", "{tmp}", "--replica", "0"], 2, "COMMAND"),
    (["replica", "--run-dir", "/nonexistent-run-dir", "--replica", "0", "--", "true"], 2, "exist"),
]


def test_table_covers_every_command() -> None:
    assert {args[0] for args, _, _ in TABLE} >= set(COMMANDS) - {"epilog", "healthcheck"}


@pytest.mark.parametrize(
    ("args", "code", "says"), TABLE, ids=[" ".join(a[:2]) + f" ->{c}" for a, c, _ in TABLE]
)
def test_command_bad_input_is_one_line(
    args: list[str], code: int, says: str, tmp_path: Path, empty_conf: Path
) -> None:
    (tmp_path / "not.toml").write_text("[job\n")
    fill = {
        "tmp": str(tmp_path),
        "bad": str(_bad_run_dir(tmp_path)),
        "good": str(_good_run_dir(tmp_path)),
    }
    argv = [a.format(**fill) for a in args]
    r = CliRunner().invoke(cli, argv, env={"SLURM_CONF": str(empty_conf)})
    assert r.exit_code == code, r.output
    if code == 2 and args[0] != "prolog":
        assert len(r.output.strip().splitlines()) == 1, r.output  # no usage block either
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output
    errors = [line for line in r.output.splitlines() if line.startswith("Error")]
    if code in (2, 3) and args[0] != "nosuchcommand":
        assert len(errors) == 1, r.output
        assert says in errors[0], r.output
    if code == 3:
        assert not (tmp_path / "r").exists()  # submit wrote nothing


@pytest.mark.parametrize(
    ("env", "args"),
    [
        ({}, ["render", "/nonexistent.toml"]),
        ({}, ["status", "/nonexistent-run-dir"]),
        ({}, ["simulate", "--gpus", "-1"]),
        ({"SLURM_CONF": "{empty}"}, ["submit", "examples/tiny.toml", "--set", "job.run_dir={run}"]),
        (
            {"SLURM_CONF": "{missing}"},
            ["submit", "examples/tiny.toml", "--set", "job.run_dir={run}"],
        ),
    ],
)
def test_first_hour_probes_print_no_traceback(
    env: dict[str, str], args: list[str], tmp_path: Path, empty_conf: Path
) -> None:
    """The real console path, as a new user (and the project's stop hook) runs it."""
    run = tmp_path / "probe-run"
    fill = {"empty": str(empty_conf), "missing": str(tmp_path / "nope.conf"), "run": str(run)}
    full_env = {**os.environ, **{k: v.format(**fill) for k, v in env.items()}}
    full_env.pop("FTHSDP_DEBUG", None)
    r = subprocess.run(
        [*FTHSDP, *[a.format(**fill) for a in args]],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=full_env,
    )
    assert "Traceback" not in r.stdout + r.stderr
    assert r.returncode in (2, 3), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not run.exists()


def test_internal_error_is_one_line_unless_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    import slurm.spec

    def broken(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("division by zero\nsecond line")

    monkeypatch.setattr(slurm.spec, "load_spec", broken)
    monkeypatch.delenv("FTHSDP_DEBUG", raising=False)
    r = CliRunner().invoke(cli, ["render", str(SPECS / "cpu.toml")])
    assert r.exit_code == 1
    assert r.output.strip().splitlines() == [
        "Error: internal error: ZeroDivisionError: division by zero "
        "(set FTHSDP_DEBUG=1 for the traceback)"
    ]
    r = CliRunner().invoke(cli, ["render", str(SPECS / "cpu.toml")], env={"FTHSDP_DEBUG": "1"})
    assert isinstance(r.exception, ZeroDivisionError)


@pytest.mark.parametrize(
    ("exc", "code", "line"),
    [
        (InputError("replicas.count", 0, "must be >= 1"), 2, "replicas.count: got 0; must be >= 1"),
        (
            SlurmCommandError(
                ["sbatch", "--parsable", "x.sbatch"],
                1,
                "sbatch: error: Batch job submission failed: Unable to contact slurm controller"
                " (connect failure)\nmore",
            ),
            3,
            "Slurm command 'sbatch --parsable' failed: sbatch: error: Batch job submission "
            "failed: Unable to contact slurm controller (connect failure) (slurmctld is not "
            "answering; for the dev cluster: 'fthsdp cluster status')",
        ),
        (
            SlurmCommandError(["squeue", "--json"], 127, "squeue: command not found"),
            3,
            "Slurm command 'squeue --json' failed: squeue: command not found",
        ),
        (
            SlurmCommandError(["scontrol", "requeue", "5"], -1, "timed out after 30s"),
            3,
            "Slurm command 'scontrol requeue' failed: timed out after 30s"
            " (slurmctld is not answering; for the dev cluster: 'fthsdp cluster status')",
        ),
        (
            SlurmCommandError(
                ["squeue", "--json"],
                1,
                "squeue: error: slurm_load_jobs: Unable to contact slurm controller "
                "(connect failure)",
            ),
            3,
            "Slurm command 'squeue --json' failed: squeue: error: slurm_load_jobs: Unable to "
            "contact slurm controller (connect failure) (slurmctld is not answering; for the dev "
            "cluster: 'fthsdp cluster status')",
        ),
        (EnvironmentProblem("port 80 in use"), 3, "port 80 in use"),
        (PermissionError(13, "Permission denied", "/runs/x"), 3, "Permission denied /runs/x"),
        (KeyError("k"), 1, "internal error: KeyError: 'k' (set FTHSDP_DEBUG=1 for the traceback)"),
    ],
)
def test_exception_to_one_line(exc: Exception, code: int, line: str) -> None:
    assert one_line(exc) == (line, code)


def test_exit_codes_are_in_the_help() -> None:
    r = CliRunner().invoke(cli, ["--help"])
    assert r.exit_code == 0
    flat = " ".join(r.output.split())
    assert " ".join(EXIT_CODES.split()) in flat
    for fragment in ("2 bad input", "3 the environment", "FTHSDP_DEBUG=1"):
        assert fragment in flat


@pytest.mark.parametrize(
    ("content", "problem"), [(None, "No such file"), ("", "empty"), ("dir", "not a file")]
)
def test_slurm_conf_is_checked_before_any_slurm_command(
    tmp_path: Path, content: str | None, problem: str
) -> None:
    conf = tmp_path / "slurm.conf"
    if content == "dir":
        conf.mkdir()
    elif content is not None:
        conf.write_text(content)
    with pytest.raises(EnvironmentProblem) as info:
        check_slurm_conf({"SLURM_CONF": str(conf)})
    assert problem in str(info.value) and str(conf) in str(info.value)
    conf2 = tmp_path / "ok.conf"
    conf2.write_text("ClusterName=x\n")
    check_slurm_conf({"SLURM_CONF": str(conf2)})
    check_slurm_conf({})


@pytest.mark.parametrize("ok", [0, 2])
def test_failed_submit_leaves_no_new_run_dir(tmp_path: Path, ok: int) -> None:
    run = tmp_path / "runs" / "new"
    spec = load_spec(SPECS / "cpu.toml", [f"job.run_dir={run}"])
    backend = RecordingBackend(fail_at=ok)
    with pytest.raises(SlurmCommandError):
        submit_run(spec, backend)
    assert not run.exists()
    assert backend.cancelled == [j.job_id for j in backend.queue]


def test_failed_submit_restores_an_existing_run_dir(tmp_path: Path) -> None:
    run = tmp_path / "run"
    spec = load_spec(SPECS / "cpu.toml", [f"job.run_dir={run}"])
    run.mkdir()
    jobs = json.dumps({"name": "cpu", "run_dir": str(run), "control": None, "replicas": []})
    old = {"secret": "old-key", "spec.json": "{}", "jobs.json": jobs, "control.sbatch": "#!x"}
    for name, text in old.items():
        (run / name).write_text(text)
    (run / "notes.txt").write_text("mine")
    with pytest.raises(SlurmCommandError):
        submit_run(spec, RecordingBackend(fail_at=1), force=True)  # a finished run: --force
    assert {p.name: p.read_text() for p in run.iterdir() if p.is_file()} == {
        **old,
        "notes.txt": "mine",
    }
    assert not [p for p in run.rglob("*") if p.is_file() and p.parent != run]  # all put back


def test_submitted_run_dir_is_private(tmp_path: Path) -> None:
    run = tmp_path / "run"
    spec = load_spec(SPECS / "cpu.toml", [f"job.run_dir={run}"])
    submit_run(spec, RecordingBackend())

    def mode(p: Path) -> int:
        return stat.S_IMODE(p.stat().st_mode)

    assert mode(run) == 0o700 and mode(run / "logs") == 0o700
    for name in ("secret", "spec.json", "jobs.json"):
        assert mode(run / name) == 0o600, name
    for script in run.glob("*.sbatch"):
        assert mode(script) & 0o077 == 0, script
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == []


def test_slurm_without_a_config_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_CONF", raising=False)
    exc = SlurmCommandError(
        ["sbatch", "--parsable", "x.sbatch"],
        1,
        "sbatch: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
        "sbatch: error: fetch_config: DNS SRV lookup failed\n"
        "sbatch: fatal: Could not establish a configuration source",
    )
    message, code = one_line(exc)
    assert code == 3
    assert "fatal: Could not establish a configuration source" in message
    assert "SLURM_CONF is not set" in message and "fthsdp cluster up" in message
