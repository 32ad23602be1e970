"""An agent's side of the coordinator: register, then follow its neighbour assignment.

The coordinator is optional at run time: when the stream breaks the agent keeps its cached
neighbours, and this client retries with exponential backoff and jitter in the background.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from coordinator.convert import assignment_from_proto
from edge.topology import Assignment
from protos import coordinator_pb2, coordinator_pb2_grpc

log = logging.getLogger(__name__)

#: gRPC codes that mean "try again later" rather than "you are refused".
RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


class CoordinatorError(RuntimeError):
    """The coordinator refused this agent (wrong token, full fleet, different task...)."""

    def __init__(self, code: grpc.StatusCode, reason: str) -> None:
        super().__init__(f"coordinator refused: {code.name}: {reason}")
        self.code = code
        self.reason = reason


def backoff_delays(base: float = 0.1, cap: float = 5.0) -> Iterator[float]:
    """Exponential backoff with full jitter: uniform(0, min(cap, base * 2**k))."""
    attempt = 0
    while True:
        yield random.uniform(0, min(cap, base * 2**attempt))
        attempt += 1


class CoordinatorClient:
    """Registers one agent and streams its assignments into a callback."""

    def __init__(self, address: str, agent_id: str, *, token: str = "") -> None:
        self.address = address
        self.agent_id = agent_id
        self.token = token
        self._channel = grpc.insecure_channel(address)
        self._stub = coordinator_pb2_grpc.CoordinatorStub(self._channel)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._call: grpc.Future | None = None

    def register(self, own_address: str, digest: str, *, timeout_s: float = 60.0) -> None:
        """Register, retrying while the coordinator is unreachable for up to ``timeout_s``."""
        request = coordinator_pb2.RegisterRequest(
            agent_id=self.agent_id, address=own_address, token=self.token, fleet_digest=digest
        )
        deadline = time.monotonic() + timeout_s
        for delay in backoff_delays():
            try:
                self._stub.Register(request, timeout=5.0)
                return
            except grpc.RpcError as err:
                if err.code() not in RETRYABLE:
                    raise CoordinatorError(err.code(), err.details() or "") from None
                if time.monotonic() + delay > deadline:
                    raise CoordinatorError(
                        err.code(), f"no coordinator at {self.address} after {timeout_s:.0f} s"
                    ) from None
                time.sleep(delay)

    def follow(self, on_assignment: Callable[[Assignment], None]) -> None:
        """Stream assignments into ``on_assignment`` from a background thread until closed."""
        self._thread = threading.Thread(
            target=self._follow, args=(on_assignment,), name="coordinator-watch", daemon=True
        )
        self._thread.start()

    def _follow(self, on_assignment: Callable[[Assignment], None]) -> None:
        delays = backoff_delays()
        request = coordinator_pb2.WatchRequest(agent_id=self.agent_id, token=self.token)
        while not self._stop.is_set():
            try:
                self._call = self._stub.WatchNeighbours(request)
                for proto in self._call:
                    if proto.ready:
                        on_assignment(assignment_from_proto(proto))
                    delays = backoff_delays()
            except grpc.RpcError as err:
                if self._stop.is_set():
                    return
                log.info("%s: coordinator stream broke (%s); retrying", self.agent_id, err.code())
            except ValueError as err:
                log.warning("%s: unusable assignment from coordinator: %s", self.agent_id, err)
            self._stop.wait(next(delays))

    def wait_ready(self, has_assignment: Callable[[], bool], timeout_s: float) -> bool:
        """Poll ``has_assignment`` until it is true or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self._stop.is_set():
            if has_assignment():
                return True
            time.sleep(0.02)
        return has_assignment()

    def leave(self) -> None:
        # Leaving a coordinator that is gone is not an error.
        with contextlib.suppress(grpc.RpcError):
            self._stub.Leave(
                coordinator_pb2.LeaveRequest(agent_id=self.agent_id, token=self.token), timeout=2.0
            )

    def close(self) -> None:
        self._stop.set()
        if self._call is not None:
            self._call.cancel()
        self._channel.close()
