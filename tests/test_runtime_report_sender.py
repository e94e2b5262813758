"""`runtime.report_sender`: the worker's report client against a real local HTTP server."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from launch_env import BASE

from runtime.env import parse_env
from runtime.protocol import derive_key, replica_key_id, verify
from runtime.report_sender import ReportClient
from slurm.rundir import create_secret


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
