"""The coordinator: agents register and are told their neighbours.

It waits until the expected number of agents has registered, builds the topology over them
(node ``i`` is the ``i``-th id in natural order: ``agent-2`` before ``agent-10``) and streams
each agent its :class:`~edge.topology.Assignment`. It is never in the data path.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from coordinator.convert import assignment_to_proto
from edge.topology import Assignment, assignments_for_graph, build_graph
from edge.transport.grpc_transport import ensure_bindable
from protos import coordinator_pb2, coordinator_pb2_grpc

SERVICE_NAME = "airgossip.v1.Coordinator"


def natural_key(agent_id: str) -> list[object]:
    """Sort key that orders ``agent-2`` before ``agent-10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", agent_id)]


@dataclass(frozen=True)
class TopologySpec:
    """The graph the coordinator builds once the fleet is complete."""

    name: str = "exponential"
    seed: int = 0
    edges: tuple[tuple[int, int], ...] = ()
    p: float | None = None
    #: Mixing weights the fleet's algorithm needs (``metropolis-hastings`` for dpsgd, choco).
    scheme: str = "column-stochastic"


@dataclass
class _Member:
    address: str
    digest: str


@dataclass
class FleetState:
    """Registrations and the current assignments (guarded by the servicer's condition)."""

    expected: int
    topology: TopologySpec
    members: dict[str, _Member] = field(default_factory=dict)
    assignments: dict[str, Assignment] = field(default_factory=dict)
    epoch: int = 0

    @property
    def ready(self) -> bool:
        return bool(self.assignments)

    def rebuild(self) -> None:
        ids = sorted(self.members, key=natural_key)
        graph = build_graph(
            self.topology.name,
            len(ids),
            seed=self.topology.seed,
            edges=list(self.topology.edges) or None,
            p=self.topology.p,
        )
        self.epoch += 1
        self.assignments = assignments_for_graph(
            graph,
            {i: self.members[i].address for i in ids},
            epoch=self.epoch,
            scheme=self.topology.scheme,
        )


class CoordinatorServicer(coordinator_pb2_grpc.CoordinatorServicer):
    """gRPC face of :class:`FleetState`."""

    def __init__(self, expected: int, topology: TopologySpec, *, token: str = "") -> None:
        if expected < 1:
            raise ValueError(f"the coordinator needs to expect at least 1 agent, got {expected}")
        self.state = FleetState(expected, topology)
        self.token = token
        self._changed = threading.Condition()
        self._closed = False

    def _check_token(self, token: str, context: grpc.ServicerContext) -> None:
        if self.token and token != self.token:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "wrong or missing join token")

    def Register(
        self, request: coordinator_pb2.RegisterRequest, context: grpc.ServicerContext
    ) -> coordinator_pb2.RegisterReply:
        self._check_token(request.token, context)
        if not request.agent_id or not request.address:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "agent_id and address are required")
        with self._changed:
            state = self.state
            digests = {m.digest for aid, m in state.members.items() if aid != request.agent_id}
            if digests and request.fleet_digest not in digests:
                context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"agent '{request.agent_id}' runs a different task or initial parameters "
                    f"than the fleet (digest {request.fleet_digest!r})",
                )
            known = request.agent_id in state.members
            if not known and len(state.members) >= state.expected:
                context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the fleet is full ({state.expected} agents)",
                )
            previous = state.members.get(request.agent_id)
            state.members[request.agent_id] = _Member(request.address, request.fleet_digest)
            moved = previous is not None and previous.address != request.address
            if len(state.members) == state.expected and (not state.ready or moved):
                state.rebuild()
            self._changed.notify_all()
            return coordinator_pb2.RegisterReply(epoch=state.epoch, expected_agents=state.expected)

    def WatchNeighbours(
        self, request: coordinator_pb2.WatchRequest, context: grpc.ServicerContext
    ) -> Iterator[coordinator_pb2.Assignment]:
        self._check_token(request.token, context)
        context.add_callback(self._wake)
        sent = -1
        while context.is_active() and not self._closed:
            with self._changed:
                if request.agent_id not in self.state.members:
                    context.abort(
                        grpc.StatusCode.NOT_FOUND, f"agent '{request.agent_id}' is not registered"
                    )
                assignment = self.state.assignments.get(request.agent_id)
                epoch = self.state.epoch
                if epoch == sent:
                    self._changed.wait(timeout=1.0)
                    continue
            sent = epoch
            if assignment is not None:
                yield assignment_to_proto(assignment)

    def Leave(
        self, request: coordinator_pb2.LeaveRequest, context: grpc.ServicerContext
    ) -> coordinator_pb2.LeaveReply:
        self._check_token(request.token, context)
        return coordinator_pb2.LeaveReply()

    def _wake(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def close(self) -> None:
        self._closed = True
        self._wake()


class CoordinatorServer:
    """A running coordinator: the servicer on a gRPC server with the health service."""

    def __init__(
        self,
        *,
        expected: int,
        topology: TopologySpec,
        listen: str = "127.0.0.1:0",
        token: str = "",
    ) -> None:
        self.servicer = CoordinatorServicer(expected, topology, token=token)
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=expected + 16, thread_name_prefix="coord"),
            options=[("grpc.so_reuseport", 0)],
        )
        coordinator_pb2_grpc.add_CoordinatorServicer_to_server(self.servicer, self._server)
        self._health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        host, _, _ = listen.rpartition(":")
        ensure_bindable(listen)
        try:
            port = self._server.add_insecure_port(listen)
        except RuntimeError as err:
            raise OSError(f"cannot listen on {listen}: {err}") from err
        if port == 0:
            raise OSError(f"cannot listen on {listen}: the port is in use")
        self.address = f"{host or '127.0.0.1'}:{port}"

    def start(self) -> str:
        self._server.start()
        for service in ("", SERVICE_NAME):
            self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        return self.address

    def stop(self, grace_s: float = 1.0) -> None:
        self._health.enter_graceful_shutdown()
        self.servicer.close()
        self._server.stop(grace_s).wait()
