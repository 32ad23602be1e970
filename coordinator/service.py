"""The coordinator's gRPC face: a thin servicer over :class:`~coordinator.membership.Fleet`.

:class:`CoordinatorServer` puts it together: the ``Coordinator`` service and gRPC health on
one port, a liveness thread that declares silent agents dead the moment their timeout
passes, and (optionally) an HTTP port with Prometheus metrics, service discovery and a JSON
view of the fleet. It is never in the data path.

With TLS (``security``) every call is bound to the caller's certificate: an agent registers,
heartbeats, watches and leaves only as itself (:mod:`edge.security.tls`). Requests are parsed
from raw bytes (:func:`edge.transport.guard.parsed_service`); every refusal has its gRPC
status, a count by method and reason (``airgossip_coordinator_refusals_total``) and a log
line at a bounded rate, never a traceback.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Iterable, Iterator
from concurrent import futures
from pathlib import Path
from typing import NoReturn

import grpc
from grpc_health.v1 import health_pb2

from coordinator.convert import assignment_to_proto, record_from_proto, snapshot_from_proto
from coordinator.membership import FINISHED, Fleet, FleetView, LivenessSettings, Refusal
from coordinator.observability import metrics_server
from coordinator.policy import TopologySpec, make_policy
from coordinator.run import (
    MAX_DECLARED_CHARS,
    MAX_REPORTS_PER_CALL,
    MAX_REQUEST_BYTES,
    RunSpec,
    check_estimate,
    disagreements,
)
from coordinator.store import FleetStore
from edge.observability.metrics import MetricsServer
from edge.security.tls import TlsCredentials, add_port, peer_identity
from edge.topology import TopologySwitcher
from edge.transport.grpc_transport import ensure_bindable
from edge.transport.guard import HealthService, RefusalCounts, RefusalLog, parsed_service
from protos import coordinator_pb2, coordinator_pb2_grpc

__all__ = ["CoordinatorServer", "CoordinatorServicer", "TopologySpec"]

SERVICE_NAME = "airgossip.v1.Coordinator"
log = logging.getLogger("airgossip.coordinator")

#: Agent ids end up in SQL rows, Prometheus labels and log lines: keep them plain.
AGENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")
#: Server threads beyond the one each agent's watch stream holds, for unary calls: heartbeats
#: never queue behind streams.
SPARE_THREADS = 32
#: Server keepalive: notice a watcher whose device vanished without closing its connection.
KEEPALIVE = [
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
]


class CoordinatorServicer(coordinator_pb2_grpc.CoordinatorServicer):
    """gRPC face of :class:`Fleet`: checks who calls, tokens and arguments, then delegates.

    Parameters
    ----------
    fleet:
        The membership it serves.
    token:
        Join token every call must carry (empty: none).
    secure:
        Calls come over mutual TLS: each may only act for its certificate's identity.
    refusals:
        Where refused calls are counted (the metrics read it).
    """

    def __init__(
        self,
        fleet: Fleet,
        *,
        token: str = "",
        secure: bool = False,
        refusals: RefusalCounts | None = None,
    ) -> None:
        self.fleet = fleet
        self.token = token
        self.secure = secure
        self.refusals = refusals if refusals is not None else RefusalCounts()
        self._log = RefusalLog(log)
        self._closed = False

    def refuse(
        self, context: grpc.ServicerContext, method: str, code: str, reason: str, kind: str
    ) -> NoReturn:
        """Count, log (rate-limited) and end the call with ``code`` and ``reason``.

        ``NOT_FOUND`` is counted but not logged: it is how an agent that was declared dead or
        left learns to register again, part of the protocol rather than bad input.
        """
        self.refusals.add(method, kind)
        if code != "NOT_FOUND":
            self._log.note(kind, f"{method}: {code}: {reason}")
        context.abort(getattr(grpc.StatusCode, code), reason)
        raise AssertionError("context.abort always raises")

    def _abort(self, context: grpc.ServicerContext, method: str, refusal: Refusal) -> NoReturn:
        self.refuse(context, method, refusal.code, refusal.reason, refusal.code.lower())

    def undecodable(self, method: str) -> None:
        self.refusals.add(method, "undecodable")
        self._log.note("undecodable", f"{method}: a request that is not a {method} message")

    def _check_caller(
        self, method: str, agent_id: str, token: str, context: grpc.ServicerContext
    ) -> None:
        """The caller may act for ``agent_id``: right token, valid id, and with TLS the id of
        its certificate."""
        if self.token and token != self.token:
            self.refuse(context, method, "UNAUTHENTICATED", "wrong or missing join token", "token")
        if not AGENT_ID.fullmatch(agent_id):
            self.refuse(
                context, method, "INVALID_ARGUMENT",
                f"agent id {agent_id[:64]!r} is not valid: 1-128 letters, digits or ._:@- "
                "starting with a letter or digit",
                "agent_id",
            )  # fmt: skip
        if self.secure:
            identity = peer_identity(context)
            if identity != agent_id:
                self.refuse(
                    context, method, "PERMISSION_DENIED",
                    f"this certificate is {identity!r}'s; it cannot act for {agent_id!r}",
                    "identity_mismatch",
                )  # fmt: skip

    def Register(
        self, request: coordinator_pb2.RegisterRequest, context: grpc.ServicerContext
    ) -> coordinator_pb2.RegisterReply:
        self._check_caller("Register", request.agent_id, request.token, context)
        if not 0 < len(request.address) <= 255 or len(request.metrics_address) > 255:
            self.refuse(
                context, "Register", "INVALID_ARGUMENT",
                "address (and metrics_address, when given) must be host:port, at most 255 chars",
                "address",
            )  # fmt: skip
        try:
            epoch = self.fleet.register(
                request.agent_id, request.address, request.fleet_digest, request.metrics_address
            )
        except Refusal as refusal:
            self._abort(context, "Register", refusal)
        liveness = self.fleet.liveness
        return coordinator_pb2.RegisterReply(
            epoch=epoch,
            expected_agents=self.fleet.expected,
            heartbeat_interval_s=liveness.heartbeat_interval_s,
            heartbeat_timeout_s=liveness.heartbeat_timeout_s,
        )

    def Heartbeat(
        self, request: coordinator_pb2.HeartbeatRequest, context: grpc.ServicerContext
    ) -> coordinator_pb2.HeartbeatReply:
        self._check_caller("Heartbeat", request.agent_id, request.token, context)
        if len(request.stats.links) > self.fleet.max_agents:
            self.refuse(
                context, "Heartbeat", "INVALID_ARGUMENT",
                f"{len(request.stats.links)} links reported; at most {self.fleet.max_agents}",
                "stats",
            )  # fmt: skip
        try:
            stats = snapshot_from_proto(request.stats) if request.HasField("stats") else None
        except ValueError as err:
            self.refuse(context, "Heartbeat", "INVALID_ARGUMENT", str(err)[:300], "stats")
        try:
            epoch = self.fleet.heartbeat(request.agent_id, stats, request.assignment_epoch)
        except Refusal as refusal:
            self._abort(context, "Heartbeat", refusal)
        return coordinator_pb2.HeartbeatReply(epoch=epoch)

    def WatchNeighbours(
        self, request: coordinator_pb2.WatchRequest, context: grpc.ServicerContext
    ) -> Iterator[coordinator_pb2.Assignment]:
        self._check_caller("WatchNeighbours", request.agent_id, request.token, context)
        fleet = self.fleet
        context.add_callback(self._wake)
        with fleet.changed:
            member = fleet.members.get(request.agent_id)
            if member is None:
                self._abort(
                    context,
                    "WatchNeighbours",
                    Refusal("NOT_FOUND", f"agent '{request.agent_id}' is not registered"),
                )
            # A newer stream for the same agent (it reconnected) ends this one, so half-open
            # connections never pile up server threads.
            member.watch_generation += 1
            generation = member.watch_generation
            fleet.changed.notify_all()
        sent = -1
        while context.is_active() and not self._closed:
            with fleet.changed:
                member = fleet.members[request.agent_id]
                if member.watch_generation != generation:
                    return
                if not member.alive and member.record.state != FINISHED:
                    self.refuse(
                        context, "WatchNeighbours", "NOT_FOUND",
                        f"agent '{request.agent_id}' was declared {member.record.state}; "
                        "register again",
                        "not_found",
                    )  # fmt: skip
                assignment = fleet.assignments.get(request.agent_id)
                epoch = fleet.epoch
                if epoch == sent or assignment is None:
                    fleet.changed.wait(timeout=1.0)
                    continue
            sent = epoch
            yield assignment_to_proto(assignment)

    def Leave(
        self, request: coordinator_pb2.LeaveRequest, context: grpc.ServicerContext
    ) -> coordinator_pb2.LeaveReply:
        self._check_caller("Leave", request.agent_id, request.token, context)
        self.fleet.leave(request.agent_id, request.reason[:64])
        return coordinator_pb2.LeaveReply()

    # -- the run --------------------------------------------------------------------------------
    def GetRun(
        self, request: coordinator_pb2.RunRequest, context: grpc.ServicerContext
    ) -> coordinator_pb2.RunReply:
        self._check_caller("GetRun", request.agent_id, request.token, context)
        run = self.fleet.run
        if request.declared_json and run.scenario:
            self._check_declared(request.agent_id, request.declared_json, context)
        status = self.fleet.status()
        return coordinator_pb2.RunReply(
            run_id=run.run_id,
            scenario_json=json.dumps(dict(run.scenario)) if run.scenario else "",
            expected_agents=self.fleet.expected,
            rounds=run.rounds,
            started_unix=status.started_unix or 0.0,
            registered_agents=status.registered,
            finished_agents=status.finished,
            complete=status.complete,
            fleet_round=self.fleet.log.fleet_round(),
        )

    def _check_declared(
        self, agent_id: str, declared_json: str, context: grpc.ServicerContext
    ) -> None:
        """The settings an agent was started with agree with the fleet's scenario."""

        def invalid(reason: str) -> NoReturn:
            self.refuse(context, "GetRun", "INVALID_ARGUMENT", reason, "declared")

        if len(declared_json) > MAX_DECLARED_CHARS:
            invalid(f"declared_json holds more than {MAX_DECLARED_CHARS} characters")
        try:
            declared = json.loads(declared_json)
        except (json.JSONDecodeError, RecursionError) as err:
            invalid(f"declared_json: {str(err)[:200]}")
        if not isinstance(declared, dict):
            invalid("declared_json is not an object")
        try:
            differ = disagreements(self.fleet.run.scenario or {}, declared)
        except RecursionError:
            invalid("declared_json nests too deep")
        if differ:
            self.refuse(
                context, "GetRun", "FAILED_PRECONDITION",
                f"{agent_id}'s settings disagree with the fleet's: {'; '.join(differ)} (start "
                "it with only the coordinator's address, the token and its index, and it runs "
                "the fleet's scenario)",
                "settings",
            )  # fmt: skip

    def Report(
        self, request: coordinator_pb2.ReportRequest, context: grpc.ServicerContext
    ) -> coordinator_pb2.ReportReply:
        self._check_caller("Report", request.agent_id, request.token, context)
        if len(request.rounds) > MAX_REPORTS_PER_CALL:
            self.refuse(
                context, "Report", "INVALID_ARGUMENT",
                f"{len(request.rounds)} round reports in one call; at most {MAX_REPORTS_PER_CALL}",
                "reports",
            )  # fmt: skip
        try:
            records = [record_from_proto(request.agent_id, r) for r in request.rounds]
            for record in records:
                if record.estimate is not None:
                    check_estimate(record.estimate)
        except ValueError as err:
            self.refuse(context, "Report", "INVALID_ARGUMENT", str(err)[:300], "reports")
        try:
            held = self.fleet.report(request.agent_id, records)
        except Refusal as refusal:
            self._abort(context, "Report", refusal)
        return coordinator_pb2.ReportReply(rounds_held=held)

    def _wake(self) -> None:
        with self.fleet.changed:
            self.fleet.changed.notify_all()

    def close(self) -> None:
        self._closed = True
        self._wake()


class CoordinatorServer:
    """A running coordinator.

    Parameters
    ----------
    expected:
        Agents to wait for before the first graph is built.
    topology:
        The topology (see :data:`coordinator.policy.POLICIES`).
    listen:
        ``host:port`` of the gRPC service; port 0 picks a free port.
    token:
        Join token agents must present (empty: none).
    security:
        The coordinator's TLS credentials (identity ``coordinator``); None serves plaintext.
    db:
        SQLite file to persist the fleet in (None: memory only).
    liveness:
        Heartbeat interval and timeout handed to agents.
    metrics_listen:
        ``host:port`` for ``/metrics``, ``/sd`` and ``/fleet`` (None: no HTTP port).
    max_agents:
        Most agents the coordinator accepts (each holds a stream and a server thread).
    run:
        The run: its id, the scenario it hands every agent, its rounds (default: a new id,
        no scenario; agents bring their own).
    switcher:
        A ``[switching]`` schedule the fleet follows, from ``topology`` (its first graph) on,
        driven by the agents' round reports (None: the graph changes only with membership).

    Raises
    ------
    OSError
        A port that cannot be bound (one-line reason).
    coordinator.store.StoreError
        A database that cannot be used or that holds another fleet.
    edge.topology.TopologyError
        An unknown or impossible topology.
    """

    def __init__(
        self,
        *,
        expected: int,
        topology: TopologySpec,
        listen: str = "127.0.0.1:0",
        token: str = "",
        security: TlsCredentials | None = None,
        db: str | Path | None = None,
        liveness: LivenessSettings | None = None,
        metrics_listen: str | None = None,
        max_agents: int = 1024,
        run: RunSpec | None = None,
        switcher: TopologySwitcher | None = None,
    ) -> None:
        policy = make_policy(topology, switcher)
        ensure_bindable(listen)
        refusals = RefusalCounts()
        self.store = FleetStore(db)
        try:
            self.fleet = Fleet(
                expected=expected,
                spec=topology,
                policy=policy,
                store=self.store,
                liveness=liveness,
                max_agents=max(max_agents, expected),
                run=run,
            )
            self.metrics: MetricsServer | None = (
                metrics_server(self.fleet.view, metrics_listen, refusals=refusals.snapshot)
                if metrics_listen
                else None
            )
        except BaseException:
            self.store.close()
            raise
        self.metrics_address = self.metrics.address if self.metrics is not None else ""
        self.servicer = CoordinatorServicer(
            self.fleet, token=token, secure=security is not None, refusals=refusals
        )
        self._server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=self.fleet.max_agents + SPARE_THREADS, thread_name_prefix="coord"
            ),
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.server_handshake_timeout_ms", 10_000),
                ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
                *KEEPALIVE,
            ],
        )
        service = coordinator_pb2.DESCRIPTOR.services_by_name["Coordinator"]
        self._health = HealthService()
        self._server.add_generic_rpc_handlers(
            (
                parsed_service(service, self.servicer, self.servicer.undecodable),
                self._health.handler(),
            )
        )
        host, _, _ = listen.rpartition(":")
        try:
            port = add_port(self._server, listen, security)
        except RuntimeError as err:
            port, reason = 0, str(err)
        else:
            reason = "the port is in use"
        if port == 0:
            if self.metrics is not None:
                self.metrics.stop()
            self.store.close()
            raise OSError(f"cannot listen on {listen}: {reason}")
        self.address = f"{host or '127.0.0.1'}:{port}"
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name="coord-liveness", daemon=True)

    def start(self) -> str:
        """Serve; return the gRPC address."""
        self._server.start()
        for service in ("", SERVICE_NAME):
            self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        if self.metrics is not None:
            self.metrics.start()
        self.fleet.grant_grace()
        self._reaper.start()
        return self.address

    def _reap(self) -> None:
        """Declare agents dead as soon as their heartbeat timeout passes."""
        while not self._stop.is_set():
            due = self.fleet.next_expiry()
            wait = 1.0 if due is None else min(1.0, max(0.0, due - self.fleet.clock()))
            if self._stop.wait(wait + 0.01):
                return
            try:
                self.fleet.expire()
            except Exception:  # the liveness thread must outlive any one bad repair
                log.exception("liveness sweep failed")

    def set_edges(self, pairs: Iterable[tuple[str, str]]) -> int:
        """Assign an explicit edge list (``edges`` topology); return the new epoch."""
        return self.fleet.set_edges(pairs)

    def view(self) -> FleetView:
        return self.fleet.view()

    def stop(self, grace_s: float = 1.0) -> None:
        self._stop.set()
        self._health.enter_graceful_shutdown()
        self.servicer.close()
        self._server.stop(grace_s).wait()
        if self.metrics is not None:
            self.metrics.stop()
        self.store.close()
