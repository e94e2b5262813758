"""Drain, resume and requeue act only on what was read, on every release; every caller of a node
or job query refuses to guess when Slurm's answer cannot be read.

`ScriptedBackend` is the real `CommandBackend` whose one I/O method answers Slurm's queries with
the real captures of `tests/fixtures/slurm/<release>/` and records every command. The unknown
shape fed to each caller is the one that broke fthsdp on 24.11: the grouped `sinfo --json`
(captured on that release), given where per-node records or jobs were expected.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from slurm_captures import NODE_FILE, RELEASES, capture

from slurm.backend import (
    CommandBackend,
    NodeNameError,
    NodeNotFound,
    SlurmCommandError,
    SlurmOutputError,
)
from slurm.errors import InputError

UNKNOWN = capture("24.11", "sinfo_busy.json")
OUR_REASON = "fthsdp: ecc: GPU2 uncorrectable"

Answer = str | SlurmCommandError


class ScriptedBackend(CommandBackend):
    """`CommandBackend` answering from captures; actions succeed and are recorded."""

    def __init__(
        self,
        release: str = "24.11",
        nodes: Answer | None = None,
        jobs: Answer | None = None,
        version: Answer | None = None,
        stage: str = "admin_drain",
    ) -> None:
        super().__init__(retries=1)
        self.answers: dict[str, Answer] = {
            "version": capture(release, "scontrol_version.txt") if version is None else version,
            "nodes": capture(release, f"{NODE_FILE[release]}_{stage}.json")
            if nodes is None
            else nodes,
            "jobs": capture(release, "squeue_states_all_cancelled.json") if jobs is None else jobs,
        }
        self.calls: list[list[str]] = []

    def _run(self, argv: Sequence[str], retry: bool = True) -> str:
        argv = list(argv)
        self.calls.append(argv)
        if argv == ["scontrol", "--version"]:
            kind = "version"
        elif argv[0] == "sinfo" or argv[:3] == ["scontrol", "--json", "show"]:
            kind = "nodes"
        elif argv[:2] == ["squeue", "--json"]:
            kind = "jobs"
        elif argv[0] in ("scontrol", "scancel", "squeue"):
            return ""  # an action (update, requeue, release, cancel) or text squeue: done
        else:
            raise AssertionError(f"unexpected command {argv}")
        answer = self.answers[kind]
        if isinstance(answer, SlurmCommandError):
            raise answer
        return answer

    @property
    def actions(self) -> list[list[str]]:
        """Every command that changes Slurm."""
        return [
            c
            for c in self.calls
            if c[0] == "scancel"
            or (c[0] == "scontrol" and c[1] in ("update", "requeue", "release"))
        ]


# -- drain and resume on each release --------------------------------------------------------


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("node", ["node1", "node4"])
def test_drain_leaves_an_admin_drain_alone(release: str, node: str) -> None:
    backend = ScriptedBackend(release, stage="admin_drain")
    assert backend.drain(node, OUR_REASON) is False
    assert backend.actions == []
    assert backend.resume(node) is False
    assert backend.actions == []


@pytest.mark.parametrize("release", RELEASES)
def test_drain_and_resume_act_on_their_node_after_reading_it(release: str) -> None:
    backend = ScriptedBackend(release, stage="busy")
    assert backend.drain("node3", OUR_REASON) is True
    assert backend.actions == [
        ["scontrol", "update", "NodeName=node3", "State=DRAIN", f"Reason={OUR_REASON}"]
    ]
    # The node was read by name right before the update, and nothing else came between.
    read = backend.calls[-2]
    assert read[0] in ("sinfo", "scontrol") and "node3" in read
    backend.calls.clear()
    assert backend.resume("node4") is True  # drained by fthsdp in this capture
    assert backend.actions == [["scontrol", "update", "NodeName=node4", "State=RESUME"]]
    assert "node4" in backend.calls[-2]
    backend.calls.clear()
    assert backend.resume("node2") is False  # not drained
    assert backend.actions == []


@pytest.mark.parametrize("release", RELEASES)
def test_version_is_read_once_per_backend(release: str) -> None:
    backend = ScriptedBackend(release, stage="busy")
    backend.nodes()
    backend.jobs(["1"])
    backend.drain("node3", OUR_REASON)
    assert backend.calls.count(["scontrol", "--version"]) == 1
    assert str(backend.version()) == capture(release, "scontrol_version.txt").split()[1]


@pytest.mark.parametrize(
    "node", ["node[1-2]", "node[1-4]", "node1,node2", "node1 node2", "", ["node1"], None, 4]
)
def test_drain_and_resume_refuse_anything_but_one_node_name(node: object) -> None:
    backend = ScriptedBackend(stage="busy")
    with pytest.raises(NodeNameError, match="one Slurm node name"):
        backend.drain(node, OUR_REASON)  # type: ignore[arg-type]
    with pytest.raises(NodeNameError, match="one Slurm node name"):
        backend.resume(node)  # type: ignore[arg-type]
    assert backend.calls == []  # not even a read


@pytest.mark.parametrize("reason", ["admin: fan swap", "fthsdp: x\nState=RESUME", None])
def test_drain_writes_only_our_reasons(reason: object) -> None:
    backend = ScriptedBackend(stage="busy")
    with pytest.raises(InputError, match="reason"):
        backend.drain("node3", reason)  # type: ignore[arg-type]
    assert backend.calls == []


def test_a_node_slurm_does_not_show_is_left_alone() -> None:
    backend = ScriptedBackend(stage="busy")
    with pytest.raises(NodeNotFound, match="no record of node node9"):
        backend.drain("node9", OUR_REASON)
    with pytest.raises(NodeNotFound):
        backend.resume("node9")
    assert backend.actions == []


UNREADABLE: list[tuple[str, dict[str, Answer], str]] = [
    ("grouped sinfo as nodes", {"nodes": UNKNOWN}, "no top-level 'nodes'"),
    ("not JSON", {"nodes": "sinfo: error: oops"}, "not JSON"),
    (
        "query failed",
        {"nodes": SlurmCommandError(["scontrol"], 1, "Unable to contact slurm controller")},
        "Unable to contact slurm controller",
    ),
    ("unknown version", {"version": "slurm 27.05.0\n"}, "release 27.05 is not one"),
    ("unparsable version", {"version": "scontrol: fatal: no config\n"}, "no Slurm version"),
]


@pytest.mark.parametrize(("label", "answers", "what"), UNREADABLE, ids=[u[0] for u in UNREADABLE])
def test_unreadable_node_means_no_drain_and_no_resume(
    label: str, answers: dict[str, Answer], what: str
) -> None:
    backend = ScriptedBackend(stage="busy", **answers)  # type: ignore[arg-type]
    with pytest.raises(SlurmCommandError) as info:
        backend.drain("node3", OUR_REASON)
    assert what in str(info.value)
    with pytest.raises(SlurmCommandError):
        backend.resume("node4")
    with pytest.raises(SlurmCommandError):
        backend.nodes()
    assert backend.actions == []


def test_output_error_names_command_and_version() -> None:
    backend = ScriptedBackend("24.11", nodes=UNKNOWN)
    with pytest.raises(SlurmOutputError) as info:
        backend.drain("node3", OUR_REASON)
    assert str(info.value).startswith(
        "scontrol --json show node node3 on Slurm 24.11.5: unexpected output: no top-level 'nodes'"
    )


@pytest.mark.parametrize("release", RELEASES)
def test_jobs_keep_finished_ones(release: str) -> None:
    backend = ScriptedBackend(release)
    jobs = {j.job_id: j.state for j in backend.jobs(["1", "4"])}
    assert jobs == {"1": "CANCELLED", "4": "CANCELLED"}
    (query,) = [c for c in backend.calls if c[0] == "squeue"]
    assert ("--states=all" in query) == (release != "22.05")


# -- callers ---------------------------------------------------------------------------------


@pytest.fixture
def unknown_slurm(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[ScriptedBackend]]:
    """Every backend a caller makes answers nodes and jobs with an unknown shape."""
    made: list[ScriptedBackend] = []

    def factory(*args: object, **kwargs: object) -> ScriptedBackend:
        backend = ScriptedBackend("24.11", nodes=UNKNOWN, jobs=UNKNOWN)
        made.append(backend)
        return backend

    monkeypatch.setattr("slurm.backend.make_backend", factory)
    yield made
    assert all(b.actions == [] for b in made), [b.actions for b in made]


def test_rendezvous_never_guesses_an_address(unknown_slurm: list[ScriptedBackend]) -> None:
    from runtime.rendezvous import RendezvousError, node_address

    with pytest.raises(RendezvousError) as info:
        node_address("nosuchnode-fthsdp1")
    message = str(info.value)
    assert "nosuchnode-fthsdp1 does not resolve" in message
    assert "scontrol --json show node nosuchnode-fthsdp1 on Slurm 24.11.5" in message
    with pytest.raises(RendezvousError, match="shows no address"):
        node_address("nosuchnode-fthsdp1", lookup=lambda name: "")
    assert node_address("nosuchnode-fthsdp1", lookup=lambda name: "10.0.0.3") == "10.0.0.3"


def _health_config(tmp_path: Path, gpu_count: bool) -> Path:
    from prolog_epilog.simulated_hardware import dev_config_toml

    path = tmp_path / "c.toml"
    extra = "" if gpu_count else "[checks.gpu-count]\nexpected = 8\n"
    path.write_text(dev_config_toml(tmp_path) + extra)
    return path


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("mode", "faults"), [("healthcheck", ()), ("prolog", ("ecc",)), ("healthcheck", ("ecc",))]
)
def test_prolog_and_healthcheck_act_on_no_unreadable_node(
    tmp_path: Path, unknown_slurm: list[ScriptedBackend], mode: str, faults: tuple[str, ...]
) -> None:
    from prolog_epilog.entrypoints import run_mode
    from prolog_epilog.simulated_hardware import write_node_inputs

    write_node_inputs(tmp_path, "node4", faults=faults)
    code, record = run_mode(
        mode, str(_health_config(tmp_path, False)), node="node4", env={"SLURMD_NODENAME": "node4"}
    )
    assert record["action"]["action"] == "none"
    assert record["action"]["why"].startswith("node state unreadable: scontrol --json show node")
    assert "Slurm 24.11.5" in record["action"]["why"] and "done" not in record["action"]
    assert code == (1 if faults else 0)


@pytest.mark.timeout(60)
def test_gpu_count_is_an_error_when_slurm_cannot_be_read(
    tmp_path: Path, unknown_slurm: list[ScriptedBackend]
) -> None:
    from prolog_epilog.checks import gpu_count
    from prolog_epilog.entrypoints import run_mode
    from prolog_epilog.simulated_hardware import write_node_inputs

    gpu_count._slurm_gres_count.cache_clear()
    write_node_inputs(tmp_path, "node4")
    _, record = run_mode(
        "check",
        str(_health_config(tmp_path, True)),
        node="node4",
        only=["gpu-count"],
        env={"SLURMD_NODENAME": "node4"},
    )
    (check,) = record["checks"]
    assert check["status"] == "error", check
    assert "expected count unreadable from Slurm" in check["detail"]
    assert "scontrol --json show node node4 on Slurm 24.11.5" in check["detail"]
    gpu_count._slurm_gres_count.cache_clear()


def _run_dir(tmp_path: Path) -> Path:
    from slurm.rundir import JobRecord, RunRecord, write_run

    run = tmp_path / "run"
    run.mkdir(mode=0o700, parents=True)
    write_run(
        RunRecord(
            "r",
            str(run),
            1.0,
            JobRecord("control", "10", "r-control", "control.sbatch"),
            (JobRecord("replica", "1", "r-r00", "replica-00.sbatch", 0),),
        )
    )
    return run


def test_manual_requeue_without_coordinator_does_nothing_on_unreadable_node(
    tmp_path: Path,
) -> None:
    from runtime.control.client import request_requeue

    backend = ScriptedBackend("24.11", nodes=UNKNOWN)
    with pytest.raises(SlurmOutputError, match=r"Slurm 24\.11\.5"):
        request_requeue(_run_dir(tmp_path), 0, backend, drain="node1", reason="bad fan")
    assert backend.actions == []
    with pytest.raises(NodeNameError):
        request_requeue(_run_dir(tmp_path / "b"), 0, backend, drain="node[1-4]", reason="x")
    assert backend.actions == []


@pytest.mark.parametrize("what", ["nodes", "jobs"])
def test_coordinator_actions_do_nothing_on_unreadable_answers(tmp_path: Path, what: str) -> None:
    from runtime.control.coordinator import Coordinator
    from runtime.control.policy import Drain, PolicyConfig, Requeue
    from runtime.control.settings import CoordinatorConfig

    backend = ScriptedBackend("24.11", **{what: UNKNOWN})  # type: ignore[arg-type]
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    config = CoordinatorConfig(run_dir=run, policy=PolicyConfig(replicas=1), poll_jobs=False)
    coord = Coordinator(config, backend)
    try:
        action: Callable[[], object]
        if what == "nodes":
            action = lambda: coord.executor.execute(Drain("node3", OUR_REASON, 0), False)  # noqa: E731
        else:
            action = lambda: coord.executor.execute(Requeue(0, "1", 0), False)  # noqa: E731
        with pytest.raises(SlurmOutputError, match=r"Slurm 24\.11\.5"):
            action()
    finally:
        coord.journal.close()
    assert backend.actions == []


def test_status_shows_drained_as_unknown(tmp_path: Path) -> None:
    from fthsdp_cli.commands.status import _render, full_status

    backend = ScriptedBackend("24.11", nodes=UNKNOWN)
    data = full_status(_run_dir(tmp_path), backend)
    assert data["drained"] is None
    assert "scontrol --json show node on Slurm 24.11.5" in data["drained_unknown"]
    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(_render(data))
    assert "drained: unknown" in console.export_text()
    good = full_status(_run_dir(tmp_path / "b"), ScriptedBackend("24.11", stage="busy"))
    assert good["drained"] == [
        {"node": "node4", "reason": "fthsdp: ecc: uncorrectable errors on GPU 3"}
    ]
    json.dumps(good)


def test_status_while_slurmctld_is_away_shows_the_jobs_unknown_not_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fthsdp_cli.commands.status import full_status
    from runtime.control import client

    away = SlurmCommandError(["squeue", "--json"], 1, "Unable to contact slurm controller")
    backend = ScriptedBackend("24.11", jobs=away)
    # Neither Slurm nor a coordinator: nothing is known, the Slurm error stands.
    with pytest.raises(SlurmCommandError, match="Unable to contact"):
        full_status(_run_dir(tmp_path / "a"), backend)
    rep = {"replica": 0, "phase": "training", "step": 7, "restarts": 0, "nodes": ["node1"]}
    rep |= {"job_id": "1", "relaunches": 0, "requeues": 0, "slurm_requeues": 0}
    view = {"replicas": [{**rep, "last_failure": None}]}
    monkeypatch.setattr(client, "fetch_state", lambda run_dir, timeout=2.0: view)
    data = full_status(_run_dir(tmp_path), backend)
    assert data["replicas"][0]["state"] == "training" and data["replicas"][0]["step"] == 7
    assert data["slurm_unreachable"] and "Unable to contact" in data["slurm_unreachable"]
    assert {j["state"] for j in data["jobs"]} == {"UNKNOWN"}
    assert data["drained"] is None and data["drained_unknown"] == data["slurm_unreachable"]
    assert not [c for c in backend.calls if c[0] == "sinfo" or c[:2] == ["scontrol", "--json"]]
    # Slurm answering in a shape fthsdp does not know is still an error, never "unknown".
    wrong = ScriptedBackend("24.11", jobs='{"jobs": "no"}')
    with pytest.raises(SlurmCommandError):
        full_status(_run_dir(tmp_path / "b"), wrong)


def test_status_command_says_drained_unknown_on_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from fthsdp_cli.commands.status import status

    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setattr(
        "slurm.backend.make_backend", lambda **_: ScriptedBackend("24.11", nodes=UNKNOWN)
    )
    result = CliRunner().invoke(status, [str(_run_dir(tmp_path)), "--json"])
    assert result.exit_code == 0, result.output + result.stderr
    assert json.loads(result.stdout)["drained"] is None
    (line,) = result.stderr.splitlines()
    assert line.startswith("drained nodes unknown: scontrol --json show node on Slurm 24.11.5")
