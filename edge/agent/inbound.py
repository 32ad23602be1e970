"""The agent as its transport's inbound handler: every incoming message passes admission,
then its lineage and the algorithm, before it touches the gossip state; every refusal is
counted by reason and logged at a bounded rate."""

from __future__ import annotations

import threading

from airgossip.common.topology import Assignment
from airgossip.edge.agent.admission import Admission
from airgossip.edge.agent.influence import InNeighbourWatch
from airgossip.edge.agent.lineage import EdgeLineages
from airgossip.edge.agent.mixing_steps import StepCount
from airgossip.edge.algorithms import Ack, GossipAlgorithm, InvalidPayload
from airgossip.edge.energy import EnergyLedger
from airgossip.edge.observability.stats import Counters
from airgossip.edge.observability.telemetry import AgentObserver, ReceiveEvent
from airgossip.edge.transport.base import GossipMessage, MessageHeader, RejectCode, Rejected
from airgossip.edge.transport.guard import RefusalLog
from airgossip.edge.transport.wire import wire_bytes


class InboundSide:
    """The :class:`~airgossip.edge.transport.base.InboundHandler` methods of
    :class:`~airgossip.edge.agent.agent.Agent`. The state they share with the rest of the
    agent is declared here and set by ``Agent.__init__``."""

    agent_id: str
    round: int
    algorithm: GossipAlgorithm
    observer: AgentObserver | None
    admission: Admission
    watch: InNeighbourWatch
    lineages: EdgeLineages
    energy: EnergyLedger | None
    offline: bool
    _assignment: Assignment | None
    _lock: threading.RLock
    _progress: threading.Condition
    _counters: Counters
    _heard: dict[str, tuple[int, int]]
    step_count: StepCount
    _peer_rounds: dict[str, int]
    _refusals: RefusalLog

    def refused(self, error: Rejected) -> None:
        with self._lock:
            self._counters.messages_rejected += 1
        self._refusals.note(error.kind, f"{self.agent_id}: {error.code.value}: {error.reason}")
        if self.observer is not None:
            event = ReceiveEvent(False, error.sender, code=error.code.value, reason=error.kind)
            self.observer.on_receive(event)

    def accepts(self, sender: str) -> None:
        self.admission.check_sender(sender, self.round, assigned=self._assignment is not None)

    def admit(self, header: MessageHeader) -> None:
        if self.offline:  # an emulated device that is off takes nothing in (nor counts it)
            raise Rejected(
                RejectCode.UNAVAILABLE, f"{self.agent_id} is off (its device's availability)",
                kind="offline",
            )  # fmt: skip
        assignment = self._assignment
        epoch = assignment.epoch if assignment is not None else None
        self.admission.check_header(header, self.round, epoch)

    def deliver(self, message: GossipMessage) -> Ack:
        header = message.header  # transports call admit(header) first
        payload = self.admission.decode(message)
        sender = header.sender
        with self._progress:
            before = self.watch.before(sender)
            try:
                ack, why = self.lineages.receive(self.algorithm, sender, header.lineage, payload)
            except InvalidPayload as err:
                raise self.admission.reject(
                    RejectCode.INVALID_ARGUMENT, str(err), err.reason, sender
                ) from None
            if ack is None:  # not a refusal: the sender starts the edge over
                self._refusals.note("start_over", f"{self.agent_id}: from {sender}: {why}")
                return Ack(0, 0, False, self.round, self.lineages.incoming(sender), start_over=True)
            self._counters.messages_received += 1
            if self.energy is not None:
                self.energy.received(sender, wire_bytes(message))
            if self.observer is not None:
                size = header.payload_bytes
                event = self.watch.received(sender, payload, size, ack.absorbed, before)
                self.observer.on_receive(event)
            self._peer_rounds[sender] = header.round
            if (header.round, header.step) > self._heard.get(sender, (0, 0)):
                self._heard[sender] = (header.round, header.step)
                self._progress.notify_all()
            self.step_count.hear(header.steps)
            lineage = self.lineages.incoming(sender)
            return Ack(ack.last_seq, ack.base_seq, ack.absorbed, self.round, lineage)
