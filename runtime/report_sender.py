"""The replica leader's reports to the coordinator: a signed, non-blocking sender.

Group rank 0 of each replica posts `ReplicaReport`s to `{coordinator}/v1/reports`, signed with
its replica's key (`runtime.protocol.sign`: method, path, timestamp, nonce and body; the
coordinator URL and the run secret come from the run directory). A report must carry the
replica's Slurm job id; the coordinator refuses it otherwise. Reports go over one kept-alive
connection (`runtime.persistent_http`). Training never waits on this:
reports go through a bounded queue to a background thread. A 200 is accepted; a 4xx is a
rejection that is logged and dropped (resending the same body would be rejected again); a
connection error keeps the report in a bounded buffer and re-reads the control file, since the
control job may have been requeued to another host. The last report, on a fatal error, is sent
synchronously with a short timeout before the process exits.

How a fatal failure is classified is `runtime.failure_class`.
"""

from __future__ import annotations

import collections
import http.client
import logging
import queue
import threading
import time
from typing import Any

from runtime.env import WorkerEnv
from runtime.persistent_http import PersistentConnection
from runtime.protocol import (
    ReplicaReport,
    check_node,
    replica_key_id,
    sign,
)
from slurm.rundir import SECRET_FILE, read_secret

log = logging.getLogger("fthsdp.reporting")


def fit_report_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """Clip free text to the sizes the coordinator accepts and drop a node name it would refuse
    (a host name that is not a Slurm node name): a fatal report must not be lost to a 400."""
    out = dict(fields)
    if out.get("last_error") is not None:
        out["last_error"] = str(out["last_error"])[:2000]
    if out.get("evidence"):
        out["evidence"] = [str(e)[:500] for e in list(out["evidence"])[:16]]
    node = out.get("failed_node")
    if node is not None:
        try:
            check_node(node, "failed_node")
        except ValueError:
            log.warning("not naming node %r in the report: not a Slurm node name", node)
            out["failed_node"] = None
    return out


class ReportClient:
    """Non-blocking, signed report sender for one replica leader incarnation."""

    def __init__(
        self,
        coordinator: Any,
        secret: bytes,
        replica: int,
        incarnation: str,
        job_id: str | None = None,
        nodes: list[str] | None = None,
        min_interval_s: float = 1.0,
        buffer_size: int = 256,
        http_timeout_s: float = 2.0,
    ) -> None:
        """`coordinator` is a callable returning the current base URL (or None)."""
        self._coordinator = coordinator
        self._secret = secret
        self.replica = replica
        self.incarnation = incarnation
        self.job_id = job_id
        self.nodes = list(nodes or [])
        self.min_interval_s = min_interval_s
        self.http_timeout_s = http_timeout_s
        self._http = PersistentConnection(http_timeout_s)
        self._seq = 0
        self._last_sent = 0.0
        self._last_key: tuple[Any, ...] | None = None
        self._queue: queue.Queue[ReplicaReport | None] = queue.Queue(maxsize=buffer_size)
        self._backlog: collections.deque[ReplicaReport] = collections.deque(maxlen=buffer_size)
        self.accepted = 0
        self.rejected = 0
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="fthsdp-reports", daemon=True)
        self._thread.start()

    @classmethod
    def for_worker(cls, env: WorkerEnv, incarnation: str) -> ReportClient | None:
        """A client when the run has a control file and a secret; None (reports off) otherwise."""
        secret_path = env.run_dir / SECRET_FILE
        if env.control_file is None or not secret_path.exists():
            return None

        def coordinator() -> str | None:
            found = env.endpoints()
            return found.coordinator if found else None

        return cls(
            coordinator,
            read_secret(secret_path),
            env.replica_id,
            incarnation,
            job_id=env.slurm_job_id,
            nodes=list(env.nodes),
        )

    def _make(self, **fields: Any) -> ReplicaReport:
        self._seq += 1
        fields = fit_report_fields(fields)
        return ReplicaReport(
            replica=self.replica,
            incarnation=self.incarnation,
            seq=self._seq,
            job_id=self.job_id,
            nodes=self.nodes,
            **fields,
        )

    def status(self, **fields: Any) -> None:
        """Queue a status report (throttled unless participants/healing/error changed)."""
        key = (fields.get("participants"), fields.get("healing"), fields.get("last_error"))
        now = time.monotonic()
        if key == self._last_key and now - self._last_sent < self.min_interval_s:
            return
        self._last_key = key
        self._last_sent = now
        try:
            self._queue.put_nowait(self._make(kind="status", **fields))
        except queue.Full:
            self.dropped += 1

    def fatal(self, **fields: Any) -> bool:
        """Send the final report now (after flushing what is queued); True if accepted."""
        report = self._make(kind="fatal", **fields)
        self.close(timeout_s=self.http_timeout_s)
        try:
            return self._post(report) == "accepted"
        finally:
            self._http.close()

    def close(self, timeout_s: float = 2.0) -> None:
        with_timeout = time.monotonic() + timeout_s
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout=max(0.0, with_timeout - time.monotonic()))

    def _post(self, report: ReplicaReport) -> str:
        """'accepted', 'rejected' or 'unreachable'."""
        base = self._coordinator()
        if not base:
            return "unreachable"
        body = report.to_json()
        key_id = replica_key_id(self.replica)
        signed = sign(self._secret, key_id, "POST", "/v1/reports", body)
        headers = {"Content-Type": "application/json", **signed}
        try:
            status, answer = self._http.request(base, "POST", "/v1/reports", body, headers)
        except (OSError, ValueError, http.client.HTTPException):
            return "unreachable"
        if status == 200:
            self.accepted += 1
            return "accepted"
        if 400 <= status < 500:
            self.rejected += 1
            log.warning(
                "coordinator rejected report seq=%d: %d %s",
                report.seq,
                status,
                answer[:200].decode("utf-8", "replace"),
            )
            return "rejected"
        return "unreachable"

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=0.5)
            except queue.Empty:
                item = None
                stop = False
            else:
                stop = item is None
            if item is not None:
                if len(self._backlog) == self._backlog.maxlen:
                    self.dropped += 1
                self._backlog.append(item)
            while self._backlog:
                outcome = self._post(self._backlog[0])
                if outcome == "unreachable":
                    break
                self._backlog.popleft()
            if stop:
                return
