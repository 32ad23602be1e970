"""The coordinator's gRPC face: a thin servicer over the membership.

The servicer delegates to :class:`~airgossip.coordinator.membership.Membership`.

Each call is checked in the same order: the join token, the agent id, with TLS the caller's
certificate (an agent registers, heartbeats, watches, reports and leaves only as itself,
:mod:`airgossip.common.security.tls`), the run's roster (an identity the run does not expect is
``PERMISSION_DENIED`` on every call, before it holds any state here:
:mod:`airgossip.coordinator.roster`), then the caller's rate (:mod:`airgossip.coordinator.limits`),
then the arguments; only then does it reach the membership. Requests are parsed from raw bytes
(:func:`airgossip.edge.transport.guard.parsed_service`). Every refusal has its gRPC status and a
message that says what was wrong and what is allowed, a count by method and reason
(``airgossip_coordinator_refusals_total``) and a log line at a bounded rate, never a traceback; a
database that fails under a call is ``UNAVAILABLE``, in one line.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from typing import NoReturn

import grpc

from airgossip.common.security.tls import peer_identity
from airgossip.coordinator.convert import (
    assignment_to_proto,
    record_from_proto,
    snapshot_from_proto,
)
from airgossip.coordinator.database import StoreError
from airgossip.coordinator.limits import RateLimiter, call_limits
from airgossip.coordinator.membership import Membership, WatchEnded
from airgossip.coordinator.refusal import Refusal
from airgossip.coordinator.reports import wrong_length
from airgossip.coordinator.retry import RETRY_AFTER_KEY
from airgossip.coordinator.run import (
    MAX_DECLARED_CHARS,
    MAX_REPORTS_PER_CALL,
    REPORT_ESTIMATE_LIMIT,
    check_estimate,
    disagreements,
)
from airgossip.edge.observability.stats import RoundRecord
from airgossip.edge.transport.guard import RefusalCounts, RefusalLog
from airgossip.protos import coordinator_pb2, coordinator_pb2_grpc

log = logging.getLogger("airgossip.coordinator")

#: Agent ids end up in SQL rows, Prometheus labels and log lines: keep them plain.
AGENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")


class CoordinatorServicer(coordinator_pb2_grpc.CoordinatorServicer):
    """gRPC face of :class:`Membership`: checks who calls, how often, tokens and arguments,
    then delegates.

    Parameters
    ----------
    membership:
        The membership it serves.
    token:
        Join token every call must carry (empty: none).
    secure:
        Calls come over mutual TLS: each may only act for its certificate's identity.
    refusals:
        Where refused calls are counted (the metrics read it).
    limiter:
        How often each identity may call each method (default: :func:`call_limits` for the
        membership's heartbeat interval).
    """

    def __init__(
        self,
        membership: Membership,
        *,
        token: str = "",
        secure: bool = False,
        refusals: RefusalCounts | None = None,
        limiter: RateLimiter | None = None,
    ) -> None:
        self.membership = membership
        self.token = token
        self.secure = secure
        self.refusals = refusals if refusals is not None else RefusalCounts()
        interval = membership.liveness.heartbeat_interval_s
        self.limiter = limiter if limiter is not None else RateLimiter(call_limits(interval))
        self._log = RefusalLog(log)
        self._closed = False

    def refuse(
        self,
        context: grpc.ServicerContext,
        method: str,
        code: str,
        reason: str,
        kind: str,
        *,
        retry_after_s: float | None = None,
    ) -> NoReturn:
        """Count, log (rate-limited) and end the call with ``code`` and ``reason``
        (``retry_after_s``: when the caller may call again, in the trailing metadata).

        ``NOT_FOUND`` is counted but not logged: it is how an agent that was declared dead or
        left learns to register again, part of the protocol rather than bad input.
        """
        self.refusals.add(method, kind)
        if code != "NOT_FOUND":
            self._log.note(kind, f"{method}: {code}: {reason}")
        if retry_after_s is not None:
            context.set_trailing_metadata(((RETRY_AFTER_KEY, f"{retry_after_s:.3f}"),))
        context.abort(getattr(grpc.StatusCode, code), reason)
        raise AssertionError("context.abort always raises")

    def _abort(self, context: grpc.ServicerContext, method: str, refusal: Refusal) -> NoReturn:
        self.refuse(context, method, refusal.code, refusal.reason, refusal.code.lower())

    def _failed(self, context: grpc.ServicerContext, method: str, err: StoreError) -> NoReturn:
        self.refuse(
            context, method, "UNAVAILABLE",
            f"the coordinator cannot keep this now: {str(err)[:240]}", "database",
        )  # fmt: skip

    def undecodable(self, method: str) -> None:
        """Count (and log, rate-limited) a request that did not parse."""
        self.refusals.add(method, "undecodable")
        self._log.note("undecodable", f"{method}: a request that is not a {method} message")

    def _check_caller(
        self, method: str, agent_id: str, token: str, context: grpc.ServicerContext
    ) -> None:
        """The caller may act for ``agent_id`` (right token, valid id, and with TLS the id of
        its certificate), ``agent_id`` is one of the run's members, and the caller has not
        used up its rate of ``method``."""
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
        try:
            self.membership.roster.check(agent_id)
        except Refusal as refusal:
            self.refuse(context, method, refusal.code, refusal.reason, "not_member")
        if not self.limiter.allow(agent_id, method):
            self.refuse(
                context, method, "RESOURCE_EXHAUSTED",
                f"{agent_id} calls too often: {self.limiter.describe(method)}; back off",
                "rate_limit", retry_after_s=self.limiter.wait_s(method),
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
        if request.estimate_length > REPORT_ESTIMATE_LIMIT:
            self.refuse(
                context, "Register", "INVALID_ARGUMENT",
                f"estimate_length {request.estimate_length}: round reports carry at most "
                f"{REPORT_ESTIMATE_LIMIT} elements (a sketch of larger models)",
                "estimate_length",
            )  # fmt: skip
        membership = self.membership
        try:
            epoch = membership.register(
                request.agent_id, request.address, request.fleet_digest,
                request.metrics_address, estimate_length=request.estimate_length,
            )  # fmt: skip
        except Refusal as refusal:
            self._abort(context, "Register", refusal)
        except StoreError as err:
            self._failed(context, "Register", err)
        liveness = membership.liveness
        return coordinator_pb2.RegisterReply(
            epoch=epoch,
            expected_agents=membership.expected,
            heartbeat_interval_s=liveness.heartbeat_interval_s,
            heartbeat_timeout_s=liveness.heartbeat_timeout_s,
        )

    def Heartbeat(
        self, request: coordinator_pb2.HeartbeatRequest, context: grpc.ServicerContext
    ) -> coordinator_pb2.HeartbeatReply:
        self._check_caller("Heartbeat", request.agent_id, request.token, context)
        if len(request.stats.links) > self.membership.max_agents:
            self.refuse(
                context, "Heartbeat", "INVALID_ARGUMENT",
                f"{len(request.stats.links)} links reported; at most "
                f"{self.membership.max_agents}",
                "stats",
            )  # fmt: skip
        try:
            stats = snapshot_from_proto(request.stats) if request.HasField("stats") else None
        except ValueError as err:
            self.refuse(context, "Heartbeat", "INVALID_ARGUMENT", str(err)[:300], "stats")
        try:
            epoch = self.membership.heartbeat(request.agent_id, stats, request.assignment_epoch)
        except Refusal as refusal:
            self._abort(context, "Heartbeat", refusal)
        return coordinator_pb2.HeartbeatReply(epoch=epoch)

    def WatchNeighbours(
        self, request: coordinator_pb2.WatchRequest, context: grpc.ServicerContext
    ) -> Iterator[coordinator_pb2.Assignment]:
        agent_id = request.agent_id
        self._check_caller("WatchNeighbours", agent_id, request.token, context)
        membership = self.membership
        context.add_callback(membership.wake)
        try:
            generation = membership.open_watch(agent_id)
        except Refusal as refusal:
            self._abort(context, "WatchNeighbours", refusal)
        sent = -1
        while context.is_active() and not self._closed:
            try:
                news = membership.next_assignment(agent_id, generation, sent, timeout_s=1.0)
            except WatchEnded:
                return
            except Refusal as refusal:
                self.refuse(context, "WatchNeighbours", refusal.code, refusal.reason, "not_found")
            if news is not None:
                sent, assignment = news
                yield assignment_to_proto(assignment)

    def Leave(
        self, request: coordinator_pb2.LeaveRequest, context: grpc.ServicerContext
    ) -> coordinator_pb2.LeaveReply:
        self._check_caller("Leave", request.agent_id, request.token, context)
        try:
            self.membership.leave(request.agent_id, request.reason[:64])
        except StoreError as err:
            self._failed(context, "Leave", err)
        return coordinator_pb2.LeaveReply()

    # -- the run --------------------------------------------------------------------------------
    def GetRun(
        self, request: coordinator_pb2.RunRequest, context: grpc.ServicerContext
    ) -> coordinator_pb2.RunReply:
        self._check_caller("GetRun", request.agent_id, request.token, context)
        run = self.membership.run
        if request.declared_json and run.scenario:
            self._check_declared(request.agent_id, request.declared_json, context)
        status = self.membership.status()
        return coordinator_pb2.RunReply(
            run_id=run.run_id,
            scenario_json=json.dumps(dict(run.scenario)) if run.scenario else "",
            expected_agents=self.membership.expected,
            rounds=run.rounds,
            started_unix=status.started_unix or 0.0,
            registered_agents=status.registered,
            finished_agents=status.finished,
            complete=status.complete,
            fleet_round=status.fleet_round,
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
            differ = disagreements(self.membership.run.scenario or {}, declared)
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
        # An estimate of another length than the run's is refused before it is decoded.
        length = self.membership.estimate_length
        for report in request.rounds:
            size = len(report.estimate)
            if size and size % 8 == 0 and size != 8 * (length or 0):
                self._abort(context, "Report", wrong_length(report.round, size // 8, length))
        records: list[RoundRecord] = []
        try:
            for report in request.rounds:
                record = record_from_proto(request.agent_id, report)
                if record.estimate is not None:
                    check_estimate(record.estimate)
                records.append(record)
        except ValueError as err:
            self.refuse(context, "Report", "INVALID_ARGUMENT", str(err)[:300], "reports")
        try:
            held = self.membership.report(request.agent_id, records)
        except Refusal as refusal:
            self._abort(context, "Report", refusal)
        except StoreError as err:
            self._failed(context, "Report", err)
        return coordinator_pb2.ReportReply(rounds_held=held)

    def close(self) -> None:
        """End every watch stream (the server stops)."""
        self._closed = True
        self.membership.wake()
