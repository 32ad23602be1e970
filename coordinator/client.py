"""An agent's side of the coordinator: register, heartbeat, follow its neighbour assignment.

The coordinator is optional at run time. When it cannot be reached the agent keeps gossiping
with the neighbours it has; this client retries in the background with exponential backoff
and full jitter (capped at a quarter of the heartbeat timeout, so that a coordinator that
comes back hears from every agent well before it would time one out), registers again when the
coordinator returns, and registers again whenever the coordinator says it does not know the
agent (it was declared dead, or the coordinator lost its database).

It also carries the agent's part of the run: it fetches the run's scenario before the agent
is built (:meth:`CoordinatorClient.fetch_run`), reports the agent's round records after each
heartbeat (:meth:`CoordinatorClient.record` is a stats sink), and at the end sends the final
report and leaves as finished (:meth:`CoordinatorClient.finish`). Every wait says what it
waits for, every few seconds.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import grpc

from airgossip.common.security.tls import COORDINATOR_IDENTITY, TlsCredentials, dial
from airgossip.common.topology import Assignment
from airgossip.coordinator.convert import RunInfo, assignment_from_proto, snapshot_to_proto
from airgossip.coordinator.report_queue import ReportQueue
from airgossip.coordinator.retry import RETRYABLE, backoff_delays, retry_after
from airgossip.coordinator.run import REASON_FINISHED, JsonObject, report_length
from airgossip.edge.agent.waiting import WaitReporter
from airgossip.edge.observability.stats import RoundRecord
from airgossip.edge.observability.telemetry import AgentSnapshot
from airgossip.protos import coordinator_pb2, coordinator_pb2_grpc

__all__ = ["CoordinatorClient", "CoordinatorError", "RunInfo"]

log = logging.getLogger(__name__)

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

T = TypeVar("T")

#: How often a finished agent asks whether the run is complete (a coordinator that ends a
#: run keeps answering a little longer than this).
STATUS_POLL_S = 1.0


class CoordinatorError(RuntimeError):
    """The coordinator refused this agent (wrong token, full fleet, different task...)."""

    def __init__(self, code: grpc.StatusCode, reason: str) -> None:
        super().__init__(f"coordinator refused: {code.name}: {reason}")
        self.code = code
        self.reason = reason


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
        self._reports = ReportQueue(agent_id, self._send_batch)

    # -- the run -----------------------------------------------------------------------------
    def fetch_run(self, declared: JsonObject | None, *, timeout_s: float = 60.0) -> RunInfo:
        """The run and its scenario, waiting (with backoff, saying so) for a coordinator
        that cannot be reached yet. ``declared``: the settings this agent was started with,
        which the coordinator compares with the fleet's.

        Raises
        ------
        CoordinatorError
            When the coordinator refuses (the reason names the settings that disagree), or
            stays unreachable for ``timeout_s``.
        """
        request = coordinator_pb2.RunRequest(
            agent_id=self.agent_id,
            token=self.token,
            declared_json=json.dumps(declared) if declared else "",
        )
        reply = self._retrying(
            lambda: self._stub.GetRun(request, timeout=5.0), "the run from", timeout_s
        )
        return RunInfo.from_proto(reply)

    def run_status(self) -> RunInfo | None:
        """How far the run is now (None when the coordinator does not answer)."""
        try:
            request = coordinator_pb2.RunRequest(agent_id=self.agent_id, token=self.token)
            return RunInfo.from_proto(self._stub.GetRun(request, timeout=2.0))
        except grpc.RpcError:
            return None

    def _retrying(self, call: Callable[[], T], what: str, timeout_s: float) -> T:
        """``call()`` until it answers, retrying while the coordinator is unreachable, with a
        line every few seconds that says so (since when, the backoff's next pause)."""
        deadline = time.monotonic() + timeout_s
        waiting = WaitReporter(self.agent_id, f"{what} the coordinator at {self.address}")
        for attempt, delay in enumerate(backoff_delays(cap=self.backoff_cap_s), start=1):
            try:
                return call()
            except grpc.RpcError as err:
                wait = retry_after(err)
                if err.code() not in RETRYABLE and wait is None:
                    raise CoordinatorError(err.code(), err.details() or "") from None
                delay = max(delay, wait or 0.0)
                if time.monotonic() + delay > deadline:
                    raise CoordinatorError(
                        err.code(), f"no coordinator at {self.address} after {timeout_s:.0f} s"
                    ) from None
                waiting.tick(
                    f"{err.code().name}; attempt {attempt}, next in {delay:.1f} s (backoff up "
                    f"to {self.backoff_cap_s:g} s, giving up after {timeout_s:.0f} s)"
                )
                if self._stop.wait(delay):
                    raise CoordinatorError(
                        grpc.StatusCode.CANCELLED, f"stopped while waiting for {what} coordinator"
                    ) from None
        raise AssertionError("backoff_delays never ends")

    # -- round reports -----------------------------------------------------------------------
    def record(self, record: RoundRecord) -> None:
        """Queue a round record for the coordinator (a stats sink: the agent's telemetry
        hands it every record); the heartbeat thread sends what is queued."""
        self._reports.record(record)

    def pending_reports(self) -> int:
        """Round reports not yet acknowledged by the coordinator."""
        return self._reports.pending()

    def send_reports(self) -> None:
        """Send every queued report, in batches (raises ``grpc.RpcError``; what was not
        acknowledged stays queued)."""
        self._reports.send()

    def _send_batch(self, batch: list[coordinator_pb2.RoundReport]) -> None:
        request = coordinator_pb2.ReportRequest(
            agent_id=self.agent_id, token=self.token, rounds=batch
        )
        self._stub.Report(request, timeout=max(5.0, self.heartbeat_interval_s))

    # -- registration ------------------------------------------------------------------------
    def register(
        self,
        own_address: str,
        digest: str,
        *,
        metrics_address: str = "",
        model_numel: int = 0,
        timeout_s: float = 60.0,
    ) -> None:
        """Register, retrying while the coordinator is unreachable for up to ``timeout_s``.

        ``model_numel``: elements of the agent's model, which fix the length of the estimates
        its round reports carry (0: its reports carry none).

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
            estimate_length=report_length(model_numel),
        )
        self._retrying(self._register_once, "registration with", timeout_s)

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
        """Poll ``has_assignment`` until it is true or ``timeout_s`` passes, saying every
        few seconds how full the fleet is."""
        deadline = time.monotonic() + timeout_s
        waiting = WaitReporter(self.agent_id, "the fleet to fill")
        while time.monotonic() < deadline and not self._stop.is_set():
            if has_assignment():
                return True
            if waiting.due():
                run = self.run_status()
                waiting.tick(
                    f"{run.registered} of {run.expected_agents} agents registered"
                    if run is not None
                    else f"the coordinator at {self.address} does not answer"
                )
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
        # Half the coordinator's timeout: a busy coordinator (one process answering a large
        # fleet on loaded cores) may take seconds to answer, and a heartbeat given up before
        # that is silence the coordinator counts; the next one waits while this one is out.
        deadline = max(1.0, self.heartbeat_interval_s, self.heartbeat_timeout_s / 2)
        reply = self._stub.Heartbeat(request, timeout=deadline)
        return int(reply.epoch)

    def _heartbeats(self, report: Callable[[], AgentSnapshot]) -> None:
        delays: Iterator[float] | None = None
        warned: set[grpc.StatusCode] = set()
        while not self._stop.is_set():
            wait = self.heartbeat_interval_s
            try:
                self.heartbeat(report())
                self.send_reports()
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
                elif (asked := retry_after(err)) is not None:
                    wait = max(wait, asked)  # called too often: the coordinator says when
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

    def leave(self, reason: str = "") -> None:
        """Tell the coordinator this agent leaves; stops heartbeats and re-registration."""
        self._stop.set()
        # Leaving a coordinator that is gone is not an error.
        with contextlib.suppress(grpc.RpcError):
            request = coordinator_pb2.LeaveRequest(
                agent_id=self.agent_id, token=self.token, reason=reason
            )
            self._stub.Leave(request, timeout=2.0)

    def finish(self, timeout_s: float = 30.0) -> bool:
        """After the last round: send every report still queued (the final one with them),
        retrying with backoff for up to ``timeout_s`` and saying so, then leave as finished.
        Return whether every report arrived."""
        self._stop.set()  # no more heartbeats: the agent is done, not alive
        delivered = self._deliver_reports(timeout_s)
        with contextlib.suppress(grpc.RpcError):
            request = coordinator_pb2.LeaveRequest(
                agent_id=self.agent_id, token=self.token, reason=REASON_FINISHED
            )
            self._stub.Leave(request, timeout=2.0)
        return delivered

    def _deliver_reports(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        waiting = WaitReporter(
            self.agent_id, f"the coordinator at {self.address} to take its last round reports"
        )
        for attempt, delay in enumerate(backoff_delays(cap=self.backoff_cap_s), start=1):
            try:
                self.send_reports()
                return True
            except grpc.RpcError as err:
                asked = retry_after(err)
                delay = max(delay, asked or 0.0)
                retry = err.code() in RETRYABLE or asked is not None
                if not retry or time.monotonic() + delay > deadline:
                    log.warning(
                        "%s: %d round reports not delivered: %s: %s", self.agent_id,
                        self.pending_reports(), err.code().name, err.details(),
                    )  # fmt: skip
                    return False
                waiting.tick(f"{err.code().name}; attempt {attempt}, next in {delay:.1f} s")
                time.sleep(delay)
        raise AssertionError("backoff_delays never ends")

    def close(self) -> None:
        """Stop every background thread and close the channel."""
        self._stop.set()
        if self._call is not None:
            self._call.cancel()
        self._channel.close()
        for thread in self._threads:
            thread.join(timeout=5.0)
