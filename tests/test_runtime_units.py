"""Table tests for the runtime's pure parts: env contract, failure classification,
Young/Daly, the report client (against a real local HTTP server) and the node watchdog."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from runtime.checkpoint import suggest
from runtime.env import EnvError, Timeouts, parse_env, read_control, slurm_port
from runtime.failure_class import classify_failure, classify_text
from runtime.protocol import ExitCode, derive_key, replica_key_id, verify
from runtime.report_sender import ReportClient
from runtime.sim.reliability import young_daly_interval_s
from runtime.watchdog import NodeWatchdog, verdict_of
from slurm.rundir import create_secret

BASE = {
    "FTHSDP_RUN_DIR": "/tmp/run",
    "FTHSDP_REPLICA_ID": "1",
    "FTHSDP_NUM_REPLICAS": "2",
    "FTHSDP_LIGHTHOUSE": "http://127.0.0.1:29510",
    "RANK": "1",
    "WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29600",
}


# ---------------------------------------------------------------- env
def test_env_local_launcher_contract() -> None:
    env = parse_env(BASE)
    assert (env.replica_id, env.num_replicas, env.rank, env.world_size) == (1, 2, 1, 2)
    assert env.master_port == 29600 and not env.is_leader
    assert env.timeouts == Timeouts(2.0, 5.0, 10.0, 60.0)


def test_env_slurm_ranks_and_rendezvous() -> None:
    raw = {
        k: v
        for k, v in BASE.items()
        if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    raw.update(
        SLURM_PROCID="3",
        SLURM_NTASKS="4",
        SLURM_LOCALID="1",
        SLURM_STEP_NODELIST="node[3-4]",
        SLURM_JOB_ID="1234",
    )
    env = parse_env(raw)
    assert (env.rank, env.world_size, env.local_rank) == (3, 4, 1)
    assert env.master_addr == "node3" and env.nodes == ("node3", "node4")
    assert env.master_port == slurm_port("1234") == 21234


@pytest.mark.parametrize(
    ("change", "variable"),
    [
        ({"FTHSDP_REPLICA_ID": "2"}, "FTHSDP_REPLICA_ID"),
        ({"FTHSDP_REPLICA_ID": "x"}, "FTHSDP_REPLICA_ID"),
        ({"FTHSDP_RUN_DIR": ""}, "FTHSDP_RUN_DIR"),
        ({"FTHSDP_NUM_REPLICAS": "0"}, "FTHSDP_NUM_REPLICAS"),
        ({"RANK": "2"}, "RANK"),
        ({"MASTER_PORT": None}, "MASTER_PORT"),
        ({"FTHSDP_MIN_REPLICAS": "3"}, "FTHSDP_MIN_REPLICAS"),
        ({"FTHSDP_ALLREDUCE_TIMEOUT_S": "1"}, "FTHSDP_ALLREDUCE_TIMEOUT_S"),
        ({"FTHSDP_QUORUM_TIMEOUT_S": "4"}, "FTHSDP_ALLREDUCE_TIMEOUT_S"),
        ({"FTHSDP_HEALTH_CHECKS": "xid,nvlink"}, "FTHSDP_HEALTH_CHECKS"),
        ({"FTHSDP_LIGHTHOUSE": None}, "FTHSDP_CONTROL_FILE"),
        ({"RANK": None, "WORLD_SIZE": None}, "RANK"),
    ],
)
def test_env_errors_name_the_variable(change: dict[str, str | None], variable: str) -> None:
    raw = {**BASE, **change}
    with pytest.raises(EnvError) as info:
        parse_env({k: v for k, v in raw.items() if v is not None})
    assert info.value.variable == variable


def test_control_file_reread(tmp_path: Path) -> None:
    control = tmp_path / "control.json"
    env = parse_env({**BASE, "FTHSDP_CONTROL_FILE": str(control), "FTHSDP_LIGHTHOUSE": ""})
    assert env.endpoints() is None
    control.write_text(json.dumps({"lighthouse": "http://a:1", "coordinator": "http://a:2"}))
    found = env.endpoints()
    assert found is not None and found.lighthouse == "http://a:1"
    control.write_text(json.dumps({"lighthouse": "http://b:1"}))  # control job requeued
    found = read_control(control)
    assert found is not None and found.lighthouse == "http://b:1" and found.coordinator is None
    control.write_text("{half")
    assert read_control(control) is None


# ---------------------------------------------------------------- failure classes
@pytest.mark.parametrize(
    ("text", "failure", "code"),
    [
        ("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus", "node", 11),
        ("CUDA error: uncorrectable ECC error encountered", "node", 11),
        ("gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer", "process", 10),
        ("NCCL watchdog: collective operation timed out", "process", 10),
        ("ZeroDivisionError: division by zero", None, 1),
    ],
)
def test_classify_text(text: str, failure: str | None, code: int) -> None:
    verdict = classify_text(text, "node1")
    assert (verdict.failure, int(verdict.exit_code)) == (failure, code)
    assert verdict.evidence


def test_classify_carried_exit_code_wins() -> None:
    from runtime.worker.errors import FatalWorkerError

    exc = FatalWorkerError("quorum failed", ExitCode.PROCESS_FAULT, ["timeout"])
    assert classify_failure(exc, "n").exit_code is ExitCode.PROCESS_FAULT
    node = FatalWorkerError("xid 79", ExitCode.NODE_FAULT, ["xid: 79"])
    verdict = classify_failure(node, "n")
    assert (verdict.failure, verdict.evidence) == ("node", ["xid: 79"])


# ---------------------------------------------------------------- checkpoint interval
@pytest.mark.parametrize(
    ("write_s", "mtbf_s", "expected"),
    [(10.0, 3600.0, 261.70), (1.0, 100.0, 13.48), (300.0, 100.0, 100.0)],
)
def test_young_daly(write_s: float, mtbf_s: float, expected: float) -> None:
    assert young_daly_interval_s(write_s, mtbf_s) == pytest.approx(expected, abs=0.01)


def test_suggestion_uses_elapsed_as_mtbf_bound_without_failures() -> None:
    s = suggest(write_s=2.0, failures=0, elapsed_s=800.0, step_s=0.5)
    assert s.mtbf_is_lower_bound and s.mtbf_s == 800.0
    assert s.interval_steps == round(s.interval_s / 0.5)
    assert ">=" in s.line()
    assert not suggest(2.0, 4, 800.0, 0.5).mtbf_is_lower_bound


# ---------------------------------------------------------------- reports
class _Coordinator(BaseHTTPRequestHandler):
    secret = b""
    received: ClassVar[list[dict[str, Any]]] = []
    status = 200

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        key = derive_key(self.secret, replica_key_id(1))
        verify(key, "POST", self.path, body, dict(self.headers.items()))
        type(self).received.append(json.loads(body))
        self.send_response(type(self).status)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.timeout(30)
def test_report_client_signs_buffers_and_resends(tmp_path: Path) -> None:
    secret = create_secret(tmp_path / "secret")
    _Coordinator.secret = secret
    _Coordinator.received = []
    url: list[str | None] = [None]  # coordinator not up yet: reports are buffered
    queued = threading.Event()
    asked = threading.Semaphore(0)  # released each time the sender looks, once both are queued

    def coordinator() -> str | None:
        if queued.is_set():
            asked.release()
        return url[0]

    client = ReportClient(coordinator, secret, replica=1, incarnation="abc", min_interval_s=0)
    server = HTTPServer(("127.0.0.1", 0), _Coordinator)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    try:
        client.status(step=1, participants=2, healing=False)
        client.status(step=2, participants=1, healing=True)
        queued.set()
        # The sender looks for the coordinator once per pass while it holds reports: two looks
        # after both were queued mean both were taken from the queue, found no coordinator and
        # were kept (neither counted as sent nor dropped); the resend below shows them in order.
        assert asked.acquire(timeout=10) and asked.acquire(timeout=10)
        assert (client.accepted, client.rejected, client.dropped) == (0, 0, 0)
        thread.start()
        url[0] = f"http://127.0.0.1:{server.server_address[1]}"
        assert client.fatal(step=3, failure="node", exit_code=11, evidence=["xid: 79"])
        kinds = [(r["seq"], r["kind"], r["step"]) for r in _Coordinator.received]
        assert kinds == [(1, "status", 1), (2, "status", 2), (3, "fatal", 3)]
        assert _Coordinator.received[-1]["evidence"] == ["xid: 79"]
        # a 4xx is a rejection: logged and dropped, never retried
        _Coordinator.status = 403
        rejected = ReportClient(lambda: url[0], secret, 1, "def", min_interval_s=0)
        assert not rejected.fatal(step=4)
        assert rejected.rejected == 1
    finally:
        _Coordinator.status = 200
        if thread.is_alive():  # shutdown() waits for a serve_forever that never started
            server.shutdown()
        server.server_close()


def test_report_client_off_without_control_file(tmp_path: Path) -> None:
    env = parse_env({**BASE, "FTHSDP_RUN_DIR": str(tmp_path)})
    assert ReportClient.for_worker(env, "x") is None


# ---------------------------------------------------------------- watchdog
@dataclass
class _Check:
    name: str
    status: str
    detail: str


@dataclass
class _Suite:
    healthy: bool
    checks: list[_Check]
    drain_reason: str | None


def test_verdict_of_suite() -> None:
    assert verdict_of(_Suite(True, [_Check("xid", "pass", "")], None)) is None
    bad = _Suite(
        False,
        [_Check("xid", "fail", "Xid 79 on GPU 3"), _Check("ecc", "pass", "")],
        "fthsdp: xid: 79",
    )
    assert verdict_of(bad) == ("fthsdp: xid: 79", ["xid: Xid 79 on GPU 3"])


@pytest.mark.timeout(20)
def test_watchdog_reports_node_fault_once() -> None:
    calls: list[dict[str, Any]] = []
    faults: list[tuple[str, list[str]]] = []

    def run_checks(**kwargs: Any) -> _Suite:
        calls.append(kwargs)
        healthy = len(calls) < 3
        return _Suite(
            healthy,
            [_Check("ecc", "pass" if healthy else "fail", "2 DBE")],
            None if healthy else "fthsdp: ecc: uncorrectable",
        )

    dog = NodeWatchdog(
        ["xid", "gpu-count", "ecc", "nvlink"],
        lambda r, e: faults.append((r, e)),
        interval_s=0.05,
        run_checks=run_checks,
        options={"gpu_source": "smi"},
    )
    dog.start()
    deadline = time.monotonic() + 10
    while not faults and time.monotonic() < deadline:
        time.sleep(0.05)
    dog.stop()
    assert faults == [("fthsdp: ecc: uncorrectable", ["ecc: 2 DBE"])]
    assert calls[0]["only"] == ["xid", "gpu-count", "ecc"]  # only the cheap checks
    assert calls[0]["gpu_source"] == "smi"
    assert dog.verdict == faults[0]


@pytest.mark.timeout(60)
def test_watchdog_on_simulated_node_sees_xid(tmp_path: Path) -> None:
    """The real prolog_epilog checks on the dev cluster's simulated hardware: healthy, then an
    Xid 79 (GPU fell off the bus) becomes a node-fault verdict naming the check."""
    from prolog_epilog.simulated_hardware import dev_config_toml, write_node_inputs
    from runtime.watchdog import check_options

    write_node_inputs(tmp_path, "node1", gpus=8)
    config = tmp_path / "health.toml"
    config.write_text(dev_config_toml(tmp_path))
    options = check_options({"FTHSDP_HEALTH_CONFIG": str(config), "SLURMD_NODENAME": "node1"})
    dog = NodeWatchdog(["xid", "gpu-count", "ecc"], lambda r, e: None, options=options)
    dog._since = time.time() - 5
    assert dog.check_once() is None
    write_node_inputs(tmp_path, "node1", gpus=8, faults=["xid79"])
    found = dog.check_once()
    assert found is not None
    reason, evidence = found
    assert reason.startswith("fthsdp:")
    assert any("xid" in e.lower() or "gpu-count" in e for e in evidence), evidence


# ---------------------------------------------------------------- rendezvous under srun
def _srun_env(tmp_path: Path, rank: int, world: int, nodes: str = "node[3-4]") -> dict[str, str]:
    raw = {
        k: v
        for k, v in BASE.items()
        if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    raw.update(
        FTHSDP_RUN_DIR=str(tmp_path),
        SLURM_PROCID=str(rank),
        SLURM_NTASKS=str(world),
        SLURM_STEP_NODELIST=nodes,
        SLURM_JOB_ID="19",
        FTHSDP_INCARNATION="19.0.1",
    )
    return raw


def test_rendezvous_ports_depend_on_incarnation_and_skip_busy_ones() -> None:
    from runtime import rendezvous

    first = list(rendezvous.candidate_ports("run/r1/19.0.1"))
    assert first == list(rendezvous.candidate_ports("run/r1/19.0.1"))  # deterministic
    assert first[:4] != list(rendezvous.candidate_ports("run/r1/19.0.2"))[:4]
    assert first[:4] != list(rendezvous.candidate_ports("other/r1/19.0.1"))[:4]
    assert all(20000 <= p < 60000 for p in first)
    busy = set(first[:3])
    assert rendezvous.pick_port("run/r1/19.0.1", free=lambda p: p not in busy) == first[3]
    with pytest.raises(rendezvous.RendezvousError):
        rendezvous.pick_port("k", free=lambda p: False)


def test_rendezvous_unresolvable_node_asks_slurm(tmp_path: Path) -> None:
    from runtime import rendezvous

    asked: list[str] = []

    def lookup(name: str) -> str:
        asked.append(name)
        return "127.0.0.1"

    env = parse_env(_srun_env(tmp_path, 0, 1, "nosuchnode-fthsdp[1-2]"))
    addr, port = rendezvous.resolve(env, _srun_env(tmp_path, 0, 1), lookup=lookup)
    assert (addr, asked) == ("127.0.0.1", ["nosuchnode-fthsdp1"])
    assert 20000 <= port < 60000
    assert not (tmp_path / "rendezvous").exists()  # one rank: nothing to publish
    # A name that resolves is used as is; RANK-style launches keep what they were given.
    assert rendezvous.node_address("localhost", lookup=lambda n: "x") == "localhost"
    local = parse_env(BASE)
    assert rendezvous.resolve(local) == ("127.0.0.1", 29600)


def test_rendezvous_rank0_publishes_others_wait_for_their_incarnation(tmp_path: Path) -> None:
    from runtime import rendezvous

    lookup = lambda name: "10.0.0.3"  # noqa: E731
    raw1 = _srun_env(tmp_path, 1, 2, "nosuchnode-fthsdp[3-4]")
    env1 = parse_env(raw1)
    # A file left by an earlier launch is never used.
    (tmp_path / "rendezvous").mkdir()
    (tmp_path / "rendezvous" / "r1.json").write_text(
        json.dumps({"incarnation": "19.0.0", "addr": "old", "port": 1})
    )
    got: list[tuple[str, int]] = []
    waiter = threading.Thread(target=lambda: got.append(rendezvous.resolve(env1, raw1, lookup)))
    waiter.start()
    time.sleep(0.3)
    assert not got
    raw0 = _srun_env(tmp_path, 0, 2, "nosuchnode-fthsdp[3-4]")
    published = rendezvous.resolve(parse_env(raw0), raw0, lookup, free=lambda p: True)
    waiter.join(10)
    assert got == [published] and published[0] == "10.0.0.3"
