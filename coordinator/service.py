"""A running coordinator: the ``Coordinator`` service, gRPC health, liveness and metrics.

:class:`CoordinatorServer` puts it together: the servicer
(:class:`~airgossip.coordinator.servicer.CoordinatorServicer`) and gRPC health on one port, a
liveness thread that declares silent agents dead the moment their timeout passes, and (optionally)
an HTTP port with Prometheus metrics, service discovery and a JSON view of the fleet, which can be
put behind TLS and basic auth (:class:`~airgossip.common.http.HttpSecurity`). It is
never in the data path. Callers reach the fleet and the run through its methods
(:meth:`CoordinatorServer.view`, :meth:`CoordinatorServer.status`,
:meth:`CoordinatorServer.round_records`, ...), never through its parts.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from concurrent import futures
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2

from airgossip.common.http import HttpSecurity, MetricsServer
from airgossip.common.ports import ensure_bindable
from airgossip.common.security.tls import TlsCredentials, add_port
from airgossip.common.stacks import thread_stacks
from airgossip.common.topology import TopologySwitcher
from airgossip.coordinator.database import StoreError
from airgossip.coordinator.limits import RateLimit, RateLimiter
from airgossip.coordinator.membership import FleetView, LivenessSettings, Membership
from airgossip.coordinator.observability import metrics_server
from airgossip.coordinator.policy import TopologySpec, make_policy
from airgossip.coordinator.roster import Roster
from airgossip.coordinator.run import MAX_REQUEST_BYTES, RunSpec
from airgossip.coordinator.servicer import CoordinatorServicer
from airgossip.coordinator.store import FleetStore
from airgossip.coordinator.views import RunStatus
from airgossip.edge.observability.stats import RoundRecord
from airgossip.edge.transport.guard import HealthService, RefusalCounts, parsed_service
from airgossip.protos import coordinator_pb2

__all__ = ["CoordinatorServer", "CoordinatorServicer", "TopologySpec"]

SERVICE_NAME = "airgossip.v1.Coordinator"
#: Seconds :meth:`CoordinatorServer.stop` waits, past the grace, for gRPC's handlers to end.
STOP_WAIT_S = 10.0
log = logging.getLogger("airgossip.coordinator")

#: Server threads beyond the one each agent's watch stream holds, for unary calls: heartbeats
#: never queue behind streams.
SPARE_THREADS = 32
#: How late a liveness sweep may wake on a busy host before the lateness counts as the
#: coordinator's own stall (:meth:`Membership.credit_stall`).
STALL_SLACK_S = 0.1
#: Server keepalive: notice a watcher whose device vanished without closing its connection.
KEEPALIVE = [
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
]


class CoordinatorServer:
    """A running coordinator.

    Parameters
    ----------
    expected:
        Agents to wait for before the first graph is built.
    topology:
        The topology (see :data:`airgossip.coordinator.policy.POLICIES`).
    listen:
        ``host:port`` of the gRPC service; port 0 picks a free port.
    token:
        Join token agents must present (empty: none).
    security:
        The coordinator's TLS credentials (identity ``coordinator``); None serves plaintext.
    db:
        SQLite file to persist the fleet in (None: a private temporary file, gone at stop).
    liveness:
        Heartbeat interval and timeout handed to agents.
    metrics_listen:
        ``host:port`` for ``/metrics``, ``/sd`` and ``/fleet`` (None: no HTTP port).
    metrics_security:
        TLS and basic auth in front of the HTTP port (None: plain HTTP).
    max_agents:
        Most agents the coordinator accepts (each holds a stream and a server thread).
    run:
        The run: its id, the scenario it hands every agent, its rounds (default: a new id,
        no scenario; agents bring their own).
    switcher:
        A ``[switching]`` schedule the fleet follows, from ``topology`` (its first graph) on,
        driven by the agents' round reports (None: the graph changes only with membership).
    rate_limits:
        How often each identity may call each method (None: :func:`~airgossip.coordinator.limits.
        call_limits` for the heartbeat interval; methods left out are not limited).
    roster:
        The identities that may call (default: ``agent-0`` .. ``agent-(expected-1)``, the
        ids launchers give; :meth:`Roster.anyone` admits any); every other is refused
        ``PERMISSION_DENIED``.

    Raises
    ------
    OSError
        A port that cannot be bound (one-line reason).
    airgossip.coordinator.store.StoreError
        A database that cannot be used or that holds another fleet.
    airgossip.common.topology.TopologyError
        An unknown or impossible topology.
    ValueError
        A roster that names fewer agents than ``expected``.
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
        metrics_security: HttpSecurity | None = None,
        max_agents: int = 1024,
        run: RunSpec | None = None,
        switcher: TopologySwitcher | None = None,
        rate_limits: Mapping[str, RateLimit] | None = None,
        roster: Roster | None = None,
    ) -> None:
        policy = make_policy(topology, switcher)
        if roster is not None:
            roster.check_fits(expected)
        ensure_bindable(listen)
        refusals = RefusalCounts()
        self._store = FleetStore(db)
        try:
            self._membership = Membership(
                expected=expected,
                spec=topology,
                policy=policy,
                store=self._store,
                liveness=liveness,
                max_agents=max(max_agents, expected),
                run=run,
                roster=roster,
            )
            self.metrics: MetricsServer | None = None
            if metrics_listen:
                self.metrics = metrics_server(
                    self._membership.view,
                    metrics_listen,
                    refusals=refusals.snapshot,
                    security=metrics_security,
                )
        except BaseException:
            self._store.close()
            raise
        self.metrics_address = self.metrics.address if self.metrics is not None else ""
        limiter = RateLimiter(rate_limits) if rate_limits is not None else None
        self.servicer = CoordinatorServicer(
            self._membership,
            token=token,
            secure=security is not None,
            refusals=refusals,
            limiter=limiter,
        )
        self._server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=self._membership.max_agents + SPARE_THREADS,
                thread_name_prefix="coord",
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
            self._store.close()
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
        self._membership.grant_grace()
        self._reaper.start()
        return self.address

    def _reap(self) -> None:
        """Declare agents dead as soon as their heartbeat timeout passes."""
        membership = self._membership
        while not self._stop.is_set():
            due = membership.next_expiry()
            now = membership.clock()
            wait = 1.0 if due is None else min(1.0, max(0.0, due - now))
            if self._stop.wait(wait + 0.01):
                return
            try:
                # Woken later than asked: the coordinator was not running for the
                # difference (less a scheduler's usual lateness), and nobody's silence
                # over it counts against them.
                membership.credit_stall(membership.clock() - now - wait - STALL_SLACK_S)
                membership.expire()
            except StoreError as err:  # a failing disk: said once a sweep, in one line
                log.error("liveness sweep: %s", err)
            except Exception:  # the liveness thread must outlive any one bad repair
                log.exception("liveness sweep failed")

    # -- the fleet and its run, for launchers and the CLI ---------------------------------------
    @property
    def run_id(self) -> str:
        """The run's id (a database that holds a run keeps its id)."""
        return self._membership.run.run_id

    @property
    def restored(self) -> bool:
        """Whether the fleet was taken back from the database."""
        return self._membership.restored

    @property
    def roster(self) -> Roster:
        """The identities the run admits."""
        return self._membership.roster

    @property
    def liveness(self) -> LivenessSettings:
        """The heartbeat interval and timeout handed to agents."""
        return self._membership.liveness

    def registered(self) -> int:
        """Agents alive or finished (what a launcher waits for)."""
        return self._membership.registered()

    def status(self) -> RunStatus:
        """How far the run is."""
        return self._membership.status()

    def view(self) -> FleetView:
        """A consistent snapshot of the fleet."""
        return self._membership.view()

    def round_records(self) -> dict[str, list[RoundRecord]]:
        """Every agent's round records of the run, in round order (read from the database;
        for the results)."""
        return self._membership.run_records()

    def latest_records(self) -> dict[str, RoundRecord]:
        """Every agent's latest round record, without its estimate (for progress: cheap to
        poll, where :meth:`round_records` reads every estimate)."""
        return self._membership.latest_records()

    def set_edges(self, pairs: Iterable[tuple[str, str]]) -> int:
        """Assign an explicit edge list (``edges`` topology); return the new epoch."""
        return self._membership.set_edges(pairs)

    def stop(self, grace_s: float = 1.0) -> None:
        """Stop serving (watch streams end, calls in flight get ``grace_s``), then close the
        database."""
        self._stop.set()
        self._health.enter_graceful_shutdown()
        self.servicer.close()
        if not self._server.stop(grace_s).wait(grace_s + STOP_WAIT_S):
            # A handler that does not end would hold the process: said, with where it is.
            log.warning(
                "coordinator: gRPC handlers still running %g s after stopping; threads:\n%s",
                grace_s + STOP_WAIT_S, thread_stacks(),
            )  # fmt: skip
        if self.metrics is not None:
            self.metrics.stop()
        self._store.close()
