"""An agent's round reports on their way to the coordinator: queued, sent in batches.

The agent's telemetry hands every round record to :meth:`ReportQueue.record` (a stats
sink); the client's heartbeat thread sends what is queued after each heartbeat, and the
agent sends the rest when it finishes. A batch stays queued until the coordinator
acknowledges it, so a lost reply sends it again (the coordinator takes a repeated call as
received, :mod:`airgossip.coordinator.reports`). A batch the coordinator refuses as it is (bad
argument, past the run, not the run's estimate length, rounds gone back) is dropped with one
log line: sending it again would block every later report. While the coordinator cannot be
reached, at most :data:`MAX_PENDING_REPORTS` wait; the oldest go first.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

import grpc

from airgossip.coordinator.convert import record_to_proto
from airgossip.coordinator.run import (
    MAX_REPORTS_PER_CALL,
    REPORT_BATCH_BYTES,
    REPORT_ESTIMATE_LIMIT,
)
from airgossip.edge.observability.stats import RoundRecord
from airgossip.protos import coordinator_pb2

log = logging.getLogger(__name__)

#: Round reports an agent keeps while the coordinator cannot be reached (the oldest go first).
MAX_PENDING_REPORTS = 10_000
#: Codes with which the coordinator refuses a batch as it is: it is dropped, not sent again.
REFUSED_AS_IS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.FAILED_PRECONDITION,
}

#: Sends one batch (raises ``grpc.RpcError``).
SendBatch = Callable[[list[coordinator_pb2.RoundReport]], None]


class ReportQueue:
    """Round reports waiting for the coordinator; thread-safe.

    Parameters
    ----------
    agent_id:
        Whose reports (named in log lines).
    send:
        Sends one batch to the coordinator.
    """

    def __init__(self, agent_id: str, send: SendBatch) -> None:
        self.agent_id = agent_id
        self._send = send
        self._pending: deque[coordinator_pb2.RoundReport] = deque()
        self._pending_lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._dropped = 0

    def record(self, record: RoundRecord) -> None:
        """Queue a round record (a stats sink)."""
        report = record_to_proto(record, estimate_limit=REPORT_ESTIMATE_LIMIT)
        with self._pending_lock:
            self._pending.append(report)
            if len(self._pending) > MAX_PENDING_REPORTS:
                self._pending.popleft()
                self._dropped += 1
                if self._dropped == 1:
                    log.warning(
                        "%s: more than %d round reports wait for the coordinator; dropping the "
                        "oldest", self.agent_id, MAX_PENDING_REPORTS,
                    )  # fmt: skip

    def pending(self) -> int:
        """Reports not yet acknowledged."""
        with self._pending_lock:
            return len(self._pending)

    def _batch(self) -> list[coordinator_pb2.RoundReport]:
        with self._pending_lock:
            batch: list[coordinator_pb2.RoundReport] = []
            size = 0
            for report in self._pending:
                if batch and (len(batch) >= MAX_REPORTS_PER_CALL or size > REPORT_BATCH_BYTES):
                    break
                batch.append(report)
                size += len(report.estimate) + 256
            return batch

    def send(self) -> None:
        """Send every queued report, in batches (raises ``grpc.RpcError``; what was not
        acknowledged stays queued, what was refused as it is is dropped)."""
        with self._send_lock:
            while batch := self._batch():
                try:
                    self._send(batch)
                except grpc.RpcError as err:
                    if err.code() not in REFUSED_AS_IS:
                        raise
                    log.warning(
                        "%s: the coordinator refused %d round reports: %s", self.agent_id,
                        len(batch), err.details(),
                    )  # fmt: skip
                with self._pending_lock:
                    for _ in batch:
                        self._pending.popleft()
