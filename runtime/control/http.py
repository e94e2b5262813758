"""The coordinator's HTTP face: routes, request authentication, and refusals.

The coordinator's event core (`runtime.control.coordinator`) knows nothing of HTTP; this module
turns requests into its events and its state into answers (aiohttp; no hand-written HTTP):

- `POST /v1/reports`: a `ReplicaReport` signed with that replica's key (derived from
  `run_dir/secret`, see `runtime.control.auth`). It must name the replica's current job; the
  nodes it names are checked against Slurm's record of that job's allocation and replaced by it
  (while Slurm cannot be reached, a fatal report is checked against the allocation Slurm gave
  at its last answer, and what it decides waits for Slurm in the journal).
  Unsigned, forged, stale, replayed, malformed, oversized, foreign and unknown-replica reports
  get a 4xx, change nothing and are only counted in memory (`runtime.control.guard`).
- `POST /v1/requeue`: a `RequeueRequest` signed with the control key (`fthsdp requeue`).
- `GET /v1/replicas/{k}/directive?job=J&restarts=R&launch=L`: what the replica's supervisor does
  after its srun step ended: `relaunch`, `requeue` (exit; the coordinator requeues the job),
  `exit` (for good) or `continue` (no decision yet). Signed with that replica's key, like its
  reports.
- `GET /v1/state`: the run's state for `fthsdp status`, signed with the control key.
- `GET /metrics`: Prometheus metrics of that state (`runtime.control.metrics`); with a bearer
  token when the control job was given one (`--metrics-token-file`).

Every answer to a signed request is signed back under the same key, over the request's method, path
and nonce (`runtime.protocol.answer_headers`): a supervisor acts on no answer it cannot verify.
Every connection sits behind `runtime.control.guard` (header and body deadlines, a per-address and
a total cap that evict unauthenticated connections; a connection is trusted once its signature
verifies, and only a trusted one is kept alive for its peer's next request). Whatever a request sets
off is answered with a 4xx and counted by route template and status, never a 500 or a traceback. The
service binds to the job node's address unless told otherwise (`own_address`); it never listens on
all interfaces by default.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import socket
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from runtime.control.coordinator import Coordinator
from runtime.control.guard import (
    ConnectionGuard,
    GuardedSite,
    StrangerLog,
    guard_middleware,
    raise_open_files,
    route_of,
    trust,
)
from runtime.control.journal.writer import JournalUnavailable
from runtime.control.metrics import aiohttp_handler
from runtime.control.policy import OperatorRequeue, ReportReceived, directive_for
from runtime.control.settings import CoordinatorConfig
from runtime.protocol import (
    CONTROL_KEY,
    JOB_ID,
    MAX_DIRECTIVE_DELAY_S,
    MAX_INT,
    MAX_REPORT_BYTES,
    DirectiveAnswer,
    ReplicaReport,
    RequeueRequest,
    SignatureError,
    answer_headers,
    replica_key_id,
    signed_headers,
    verify,
)
from slurm.backend import SlurmBackend, SlurmCommandError
from slurm.errors import EnvironmentProblem
from slurm.records import unreachable

log = logging.getLogger("fthsdp.coordinator")


def own_address() -> str:
    """This node's own address (what the replicas reach), never the wildcard address."""
    name = socket.gethostname()
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror:
        return "127.0.0.1"
    return str(infos[0][4][0]) if infos else "127.0.0.1"


COORDINATOR_KEY = web.AppKey("coordinator", Coordinator)


class _Refused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _refuse(
    coord: Coordinator,
    request: web.Request,
    status: int,
    reason: str,
    retry_after_s: float | None = None,
) -> web.Response:
    """Answer a refusal; it is counted in memory only (no journal row, no fsync), keyed by
    the route's template and the status (never the raw path, which a stranger chooses)."""
    coord.refusals.add(f"{status} {route_of(request)}", reason, request.remote)
    headers = {"Retry-After": str(round(retry_after_s))} if retry_after_s is not None else None
    return web.json_response({"error": reason}, status=status, headers=headers)


async def _signed(request: web.Request, coord: Coordinator, keys: str) -> tuple[str, str, bytes]:
    """(key id, nonce, body) of an authentic, fresh, not replayed request signed with a key
    `keys` allows ("control", or "replica" for any replica's own key); `_Refused` otherwise.

    The headers are checked before the body is read, and the body is read under a deadline.
    """
    try:
        key_id, timestamp, _, _ = signed_headers(request.headers)
    except SignatureError as exc:
        raise _Refused(401, str(exc)) from None
    length = request.content_length
    if length is not None and length > MAX_REPORT_BYTES:
        raise _Refused(413, f"body of {length} bytes")
    try:
        if request.content.is_eof():
            body = await request.read()  # it all came with the header: nothing to wait for
        else:
            body = await asyncio.wait_for(request.read(), coord.config.guard.body_timeout_s)
    except web.HTTPRequestEntityTooLarge:
        raise _Refused(413, "body over the limit") from None
    except TimeoutError:
        raise _Refused(408, "body not received in time") from None
    except (ConnectionError, HttpProcessingError) as exc:
        # The sender went away or sent a broken body: counted, never a traceback in the log.
        raise _Refused(400, f"body not received ({type(exc).__name__})") from None
    try:
        nonce = verify(
            coord.auth.key(key_id),
            request.method,
            request.raw_path,
            body,
            request.headers,
            coord.clock(),
        )
    except SignatureError as exc:
        raise _Refused(401, str(exc)) from None
    trust(request)  # it holds a key of this run: the guard no longer evicts its connection
    allowed = key_id == CONTROL_KEY if keys == "control" else key_id.startswith("replica-")
    if not allowed:
        raise _Refused(403, f"key {key_id} may not call {request.method} {request.path}")
    if coord.auth.read_nonce_seen(nonce) or coord.journal.nonce_seen(nonce):
        raise _Refused(409, "replayed nonce")
    if request.method == "GET":
        coord.auth.remember_read(nonce, int(timestamp))
    return key_id, nonce, body


def _answer(
    coord: Coordinator, request: web.Request, key_id: str, nonce: str, body: bytes
) -> web.Response:
    """A JSON answer to a signed request, signed under the request's key for its nonce."""
    signature = answer_headers(
        coord.auth.key(key_id), request.method, request.raw_path, nonce, body
    )
    return web.Response(body=body, content_type="application/json", headers=signature)


def _json_answer(
    coord: Coordinator, request: web.Request, key_id: str, nonce: str, data: Any
) -> web.Response:
    return _answer(coord, request, key_id, nonce, json.dumps(data).encode())


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise _Refused(400, "body is not JSON") from None
    if not isinstance(data, dict):
        raise _Refused(400, "body is not a JSON object")
    return data


async def _checked_nodes(coord: Coordinator, report: ReplicaReport) -> ReplicaReport:
    """The report with Slurm's allocation of its job as `nodes`, and its `failed_node` one of
    them; `_Refused` if it names a node outside the allocation.

    A fatal report asks Slurm now (it may drain a node); a status report takes the last poll's
    answer (asking once for a job not seen yet), and its own `nodes` are never used.
    """
    job_id = report.job_id
    assert job_id is not None
    if report.kind != "fatal":
        known = coord.allocations.get(job_id)
        if known is None:
            with contextlib.suppress(SlurmCommandError, EnvironmentProblem, OSError):
                known = await coord.allocation(job_id)  # once per job; polls refresh it
                coord.allocations.setdefault(job_id, ())
        return replace(report, nodes=list(known or ()))
    try:
        nodes = await coord.allocation(job_id)
    except SlurmCommandError as exc:
        known = coord.allocations.get(job_id)
        if not unreachable(exc) or not known:
            raise _Refused(503, f"cannot read job {job_id} from Slurm: {exc}") from None
        # Slurm is away (stopped, restarting): the allocation it gave at its last answer is
        # what was positively read. The report is taken with its own cause, and the drain and
        # the requeue it decides wait in the journal until Slurm answers (the executor retries).
        log.warning(
            "Slurm unreachable: replica %d's fatal report checked against job %s's last known "
            "allocation %s",
            report.replica,
            job_id,
            ",".join(known[:8]),
        )
        nodes = known
    if nodes is None:
        raise _Refused(409, f"job {job_id} is not in Slurm's queue")
    foreign = sorted(set(report.nodes) - set(nodes))
    if foreign:
        raise _Refused(403, f"nodes {foreign[:3]} are not in job {job_id}'s allocation")
    failed = report.failed_node
    if failed is not None and failed not in nodes:
        # Even for a one-node job: a name outside the allocation is never read as "my node".
        raise _Refused(403, f"node {failed} is not in job {job_id}'s allocation {nodes[:8]}")
    return replace(report, nodes=list(nodes), failed_node=failed)


async def post_report(request: web.Request) -> web.Response:
    coord = request.app[COORDINATOR_KEY]
    retry = coord.admission()
    if retry is not None:
        # Before anything else: a report that would only queue costs one cheap answer.
        return _refuse(coord, request, 503, "coordinator busy", retry)
    try:
        key_id, nonce, body = await _signed(request, coord, "replica")
        try:
            report = ReplicaReport.from_dict(_json_object(body))
        except (ValueError, TypeError) as exc:
            raise _Refused(400, f"malformed report: {exc}") from None
        if key_id != replica_key_id(report.replica):
            raise _Refused(403, f"key {key_id} may not report for replica {report.replica}")
        r = coord.state.replicas.get(report.replica)
        if r is None:
            raise _Refused(404, f"unknown replica {report.replica}")
        if report.job_id is None:
            raise _Refused(400, "malformed report: field 'job_id' is required")
        if report.job_id != r.job_id:
            # A leftover process of an earlier run, or another user's job: it must not steer.
            raise _Refused(409, f"job {report.job_id} is not replica's job {r.job_id}")
        report = await _checked_nodes(coord, report)
    except _Refused as exc:
        return _refuse(coord, request, exc.status, exc.reason)
    try:
        if not await coord.submit(ReportReceived(report, coord.clock()), nonce=nonce):
            return _refuse(coord, request, 409, "replayed nonce")
    except JournalUnavailable as exc:
        return _refuse(coord, request, 503, f"journal unavailable: {exc}", 30.0)
    await coord.after_report(report)
    r = coord.state.replicas[report.replica]
    return _answer(coord, request, key_id, nonce, _report_answer(r.directive, r.phase))


@functools.lru_cache(maxsize=64)
def _report_answer(directive: str, phase: str) -> bytes:
    """The body of a report's answer: a handful of (directive, phase) pairs, encoded once."""
    return json.dumps({"ok": True, "directive": directive, "phase": phase}).encode()


async def post_requeue(request: web.Request) -> web.Response:
    coord = request.app[COORDINATOR_KEY]
    try:
        key_id, nonce, body = await _signed(request, coord, "control")
        try:
            req = RequeueRequest.from_dict(_json_object(body))
        except (ValueError, TypeError) as exc:
            raise _Refused(400, f"malformed requeue: {exc}") from None
        r = coord.state.replicas.get(req.replica)
        if r is None:
            raise _Refused(404, f"unknown replica {req.replica}")
        if req.drain is not None:
            nodes = None
            if r.job_id is not None:
                try:
                    nodes = await coord.allocation(r.job_id)
                except SlurmCommandError as exc:
                    raise _Refused(503, f"cannot read job {r.job_id}: {exc}") from None
            if not nodes or req.drain not in nodes:
                raise _Refused(
                    403, f"node {req.drain} is not in job {r.job_id}'s allocation {nodes}"
                )
    except _Refused as exc:
        return _refuse(coord, request, exc.status, exc.reason)
    event = OperatorRequeue(req.replica, coord.clock(), req.drain, req.reason[:80])
    try:
        if not await coord.submit(event, nonce=nonce):
            return _refuse(coord, request, 409, "replayed nonce")
    except JournalUnavailable as exc:
        return _refuse(coord, request, 503, f"journal unavailable: {exc}", 30.0)
    answer = {"ok": True, "job_id": coord.state.replicas[req.replica].job_id}
    return _json_answer(coord, request, key_id, nonce, answer)


async def get_directive(request: web.Request) -> web.Response:
    coord = request.app[COORDINATOR_KEY]
    try:
        replica = int(request.match_info["k"])
        job = request.query.get("job") or None
        restarts = int(request.query.get("restarts", "0"))
        launch = int(request.query.get("launch", "0"))
        if job is not None and not JOB_ID.fullmatch(job):
            raise ValueError(job)
        if not (0 <= restarts <= MAX_INT and 0 <= launch <= MAX_INT):
            raise ValueError(restarts)
    except ValueError:
        return _refuse(coord, request, 400, "bad replica/job/restarts/launch")
    try:
        key_id, nonce, body = await _signed(request, coord, "replica")
        if key_id != replica_key_id(replica):
            raise _Refused(403, f"key {key_id} may not ask for replica {replica}'s directive")
        if body:
            raise _Refused(400, "GET directive takes no body")
    except _Refused as exc:
        return _refuse(coord, request, exc.status, exc.reason)
    if replica not in coord.state.replicas:
        return _refuse(coord, request, 404, f"unknown replica {replica}")
    directive, delay = directive_for(coord.state, replica, job, restarts, launch)
    answer = DirectiveAnswer(directive, min(delay, MAX_DIRECTIVE_DELAY_S), restarts, launch)
    return _answer(coord, request, key_id, nonce, answer.to_json())


async def get_state(request: web.Request) -> web.Response:
    coord = request.app[COORDINATOR_KEY]
    try:
        key_id, nonce, body = await _signed(request, coord, "control")
        if body:
            raise _Refused(400, "GET /v1/state takes no body")
    except _Refused as exc:
        return _refuse(coord, request, exc.status, exc.reason)
    return _json_answer(coord, request, key_id, nonce, coord.state_view())


def make_app(coord: Coordinator) -> web.Application:
    app = web.Application(
        client_max_size=MAX_REPORT_BYTES, middlewares=[guard_middleware(coord.refusals)]
    )
    app[COORDINATOR_KEY] = coord
    app.router.add_post("/v1/reports", post_report)
    app.router.add_post("/v1/requeue", post_requeue)
    app.router.add_get("/v1/replicas/{k}/directive", get_directive)
    app.router.add_get("/v1/state", get_state)
    metrics = aiohttp_handler(coord.registry, coord.state_view)
    token = coord.config.metrics_token

    async def get_metrics(request: web.Request) -> web.Response:
        if token is not None:
            # aiohttp decodes header bytes that are not UTF-8 with surrogate escapes.
            given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(given, f"Bearer {token}".encode()):
                return _refuse(coord, request, 401, "metrics need the bearer token")
            trust(request)
        return await metrics(request)

    app.router.add_get("/metrics", get_metrics)
    return app


@dataclass
class RunningCoordinator:
    coordinator: Coordinator
    runner: web.AppRunner
    url: str
    site: GuardedSite

    async def serve(self) -> None:
        """Start answering, after `start_coordinator(..., serve=False)`."""
        await self.site.serve()

    async def close(self) -> None:
        await self.runner.cleanup()
        await self.coordinator.stop()


async def start_coordinator(
    config: CoordinatorConfig, backend: SlurmBackend | None = None, serve: bool = True
) -> RunningCoordinator:
    """Start the service on `config.host:config.port` (port 0 = a free one). With
    `serve=False` its port is bound but refuses connections until `RunningCoordinator.serve`."""
    coord = Coordinator(config, backend)
    await coord.start()
    runner = web.AppRunner(
        make_app(coord),
        access_log=None,
        keepalive_timeout=config.guard.keepalive_s,
        logger=StrangerLog(coord.refusals),
        max_line_size=4096,
        max_field_size=4096,
        max_headers=32,
    )
    await runner.setup()
    cap = raise_open_files(config.guard.max_connections)
    guard = ConnectionGuard(config.guard, coord.refusals, cap)
    site = GuardedSite(runner, config.host, config.port, guard, serve=serve)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        await coord.stop()
        raise
    port = int(runner.addresses[0][1]) if runner.addresses else config.port
    host = config.host if ":" not in config.host else f"[{config.host}]"
    return RunningCoordinator(coord, runner, f"http://{host}:{port}", site)
