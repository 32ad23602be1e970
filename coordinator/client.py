"""An agent's side of the coordinator: register, heartbeat, follow its neighbour assignment.

The coordinator is optional at run time. When it cannot be reached the agent keeps gossiping
with the neighbours it has; this client retries in the background with exponential backoff
and full jitter (capped at a quarter of the heartbeat timeout, so that a coordinator that
comes back hears from every agent well before it would time one out), registers again when the
coordinator returns, and registers again whenever the coordinator says it does not know the
agent (it was declared dead, or the coordinator lost its database).
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from coordinator.convert import assignment_from_proto, snapshot_to_proto
from edge.security import COORDINATOR_IDENTITY, TlsCredentials, dial
from edge.telemetry import AgentSnapshot
from edge.topology import Assignment
from protos import coordinator_pb2, coordinator_pb2_grpc

log = logging.getLogger(__name__)

#: gRPC codes that mean "try again later" rather than "you are refused".
RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
#: Channel options. Keepalive notices a coordinator host that vanished without closing the
#: stream. gRPC's own reconnect backoff grows to two minutes, and while it waits every call
#: fails at once without dialling: capped at one second (one TCP handshake per second to a
#: missing coordinator), a coordinator that comes back is reached within a second.
CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
]


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
    """Registers one agent, sends its heartbeats and streams its assignments into a callback.

    Parameters
    ----------
    address:
        The coordinator's ``host:port``.
    agent_id:
        This agent's id.
    token:
        Join token.
    security:
        This agent's TLS credentials (the coordinator must prove it is ``coordinator``);
        None dials in plaintext.
    backoff_cap_s:
        Longest pause between retries while the coordinator is unreachable (lowered to a
        quarter of the heartbeat timeout the coordinator announces).
    """

    def __init__(
        self,
        address: str,
        agent_id: str,
        *,
        token: str = "",
        security: TlsCredentials | None = None,
        backoff_cap_s: float = 5.0,
    ) -> None:
        self.address = address
        self.agent_id = agent_id
        self.token = token
        self.backoff_cap_s = backoff_cap_s
        self.heartbeat_interval_s = 2.0
        self.heartbeat_timeout_s = 10.0
        self._channel = dial(address, COORDINATOR_IDENTITY, security, CHANNEL_OPTIONS)
        self._stub = coordinator_pb2_grpc.CoordinatorStub(self._channel)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._call: grpc.Future | None = None
        self._request: coordinator_pb2.RegisterRequest | None = None
        self._register_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._lost = False
        self.epoch_held = 0
        self.registrations = 0
        self._refusals: set[grpc.StatusCode] = set()

    # -- registration ------------------------------------------------------------------------
    def register(
        self,
        own_address: str,
        digest: str,
        *,
        metrics_address: str = "",
        timeout_s: float = 60.0,
    ) -> None:
        """Register, retrying while the coordinator is unreachable for up to ``timeout_s``.

        Raises
        ------
        CoordinatorError
            When the coordinator refuses, or stays unreachable for ``timeout_s``.
        """
        self._request = coordinator_pb2.RegisterRequest(
            agent_id=self.agent_id,
            address=own_address,
            token=self.token,
            fleet_digest=digest,
            metrics_address=metrics_address,
        )
        deadline = time.monotonic() + timeout_s
        for delay in backoff_delays(cap=self.backoff_cap_s):
            try:
                self._register_once()
                return
            except grpc.RpcError as err:
                if err.code() not in RETRYABLE:
                    raise CoordinatorError(err.code(), err.details() or "") from None
                if time.monotonic() + delay > deadline:
                    raise CoordinatorError(
                        err.code(), f"no coordinator at {self.address} after {timeout_s:.0f} s"
                    ) from None
                if self._stop.wait(delay):
                    raise CoordinatorError(
                        grpc.StatusCode.CANCELLED, "stopped while registering"
                    ) from None

    def _register_once(self) -> None:
        assert self._request is not None, "register() first"
        with self._register_lock:
            reply = self._stub.Register(self._request, timeout=5.0)
            self.registrations += 1
            if reply.heartbeat_interval_s > 0:
                self.heartbeat_interval_s = reply.heartbeat_interval_s
            if reply.heartbeat_timeout_s > 0:
                self.heartbeat_timeout_s = reply.heartbeat_timeout_s

    def _register_again(self, why: str) -> bool:
        """One registration attempt from a background thread; never raises."""
        if self._request is None or self._stop.is_set():
            return False
        try:
            self._register_once()
        except grpc.RpcError as err:
            if err.code() not in self._refusals:  # once per kind: it is retried every interval
                self._refusals.add(err.code())
                level = logging.INFO if err.code() in RETRYABLE else logging.ERROR
                log.log(level, "%s: registering again (%s) failed: %s: %s",
                        self.agent_id, why, err.code().name, err.details())  # fmt: skip
            return False
        self._refusals.clear()
        log.info("%s: registered again with %s (%s)", self.agent_id, self.address, why)
        return True

    def _cap(self) -> float:
        return max(0.05, min(self.backoff_cap_s, self.heartbeat_timeout_s / 4))

    def _lost_contact(self, code: grpc.StatusCode) -> None:
        with self._state_lock:
            if self._lost:
                return
            self._lost = True
        log.warning(
            "%s: coordinator at %s unreachable (%s); gossiping on with cached neighbours "
            "(epoch %d), retrying with backoff",
            self.agent_id, self.address, code.name, self.epoch_held,
        )  # fmt: skip

    def _regained_contact(self) -> bool:
        with self._state_lock:
            was_lost, self._lost = self._lost, False
        return was_lost

    # -- assignments -------------------------------------------------------------------------
    def follow(self, on_assignment: Callable[[Assignment], None]) -> None:
        """Stream assignments into ``on_assignment`` from a background thread until closed."""
        self._start(self._follow, on_assignment, name="coordinator-watch")

    def _start(self, target: Callable[..., None], *args: object, name: str) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _follow(self, on_assignment: Callable[[Assignment], None]) -> None:
        delays = backoff_delays(cap=self._cap())
        request = coordinator_pb2.WatchRequest(agent_id=self.agent_id, token=self.token)
        while not self._stop.is_set():
            try:
                self._call = self._stub.WatchNeighbours(request)
                for proto in self._call:
                    if proto.ready:
                        assignment = assignment_from_proto(proto)
                        on_assignment(assignment)
                        self.epoch_held = assignment.epoch
                    delays = backoff_delays(cap=self._cap())
            except grpc.RpcError as err:
                if self._stop.is_set():
                    return
                if err.code() == grpc.StatusCode.NOT_FOUND:
                    self._register_again("the coordinator did not know this agent")
                elif err.code() in RETRYABLE:
                    self._lost_contact(err.code())
                else:
                    log.warning("%s: assignment stream: %s", self.agent_id, err.code())
            except ValueError as err:
                log.warning("%s: unusable assignment from coordinator: %s", self.agent_id, err)
                if self._call is not None:
                    self._call.cancel()
            self._stop.wait(next(delays))

    def wait_ready(self, has_assignment: Callable[[], bool], timeout_s: float) -> bool:
        """Poll ``has_assignment`` until it is true or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self._stop.is_set():
            if has_assignment():
                return True
            time.sleep(0.02)
        return has_assignment()

    # -- heartbeats --------------------------------------------------------------------------
    def start_heartbeats(self, report: Callable[[], AgentSnapshot]) -> None:
        """Send a heartbeat with ``report()`` every interval from a background thread."""
        self._start(self._heartbeats, report, name="coordinator-heartbeat")

    def heartbeat(self, report: AgentSnapshot) -> int:
        """One heartbeat; return the coordinator's epoch (raises ``grpc.RpcError``)."""
        request = coordinator_pb2.HeartbeatRequest(
            agent_id=self.agent_id,
            token=self.token,
            stats=snapshot_to_proto(report),
            assignment_epoch=self.epoch_held,
        )
        reply = self._stub.Heartbeat(request, timeout=max(1.0, self.heartbeat_interval_s))
        return int(reply.epoch)

    def _heartbeats(self, report: Callable[[], AgentSnapshot]) -> None:
        delays: Iterator[float] | None = None
        warned: set[grpc.StatusCode] = set()
        while not self._stop.is_set():
            wait = self.heartbeat_interval_s
            try:
                self.heartbeat(report())
                delays = None
                if self._regained_contact():
                    log.info("%s: coordinator at %s is back", self.agent_id, self.address)
                    self._register_again("the coordinator came back")
            except grpc.RpcError as err:
                code = err.code()
                if self._stop.is_set():
                    return
                if code == grpc.StatusCode.NOT_FOUND:
                    if self._register_again("the coordinator did not know this agent"):
                        wait = 0.0
                elif code in RETRYABLE:
                    self._lost_contact(code)
                    delays = delays or backoff_delays(cap=self._cap())
                    wait = next(delays)
                elif code not in warned:
                    warned.add(code)
                    log.warning("%s: heartbeat refused: %s", self.agent_id, err.details())
            except Exception:  # a bad report must not end the heartbeats
                log.exception("%s: heartbeat failed", self.agent_id)
            self._stop.wait(wait)

    # -- leaving -----------------------------------------------------------------------------
    def cancel(self) -> None:
        """Stop retrying and following, from any thread (a signal handler too); no waiting."""
        self._stop.set()

    def leave(self) -> None:
        """Tell the coordinator this agent leaves; stops heartbeats and re-registration."""
        self._stop.set()
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
        for thread in self._threads:
            thread.join(timeout=5.0)
