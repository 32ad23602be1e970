"""The edge agent: composes a task, a gossip algorithm, a transport and a stats sink.

One round is ``local_step`` (train on the de-biased estimate) -> ``push`` (split mass, send
one message per out-neighbour, at most one in flight per edge) -> ``wait_for_neighbours``
(bounded staleness: wait a little for in-neighbours that fall behind, never for ever) ->
``mix`` (fold in whatever has arrived) -> ``report``. :meth:`Agent.run` loops over rounds
on the wall clock; an in-process driver calls the same phases in lock step. There is no
global barrier: an agent never waits on anything but its own in-neighbours, and not for
longer than ``wait_timeout_s``.

The agent is also the transport's :class:`~edge.transport.base.InboundHandler`: every
incoming message passes :class:`~edge.agent.admission.Admission` before it can touch the
gossip state, and the algorithm then refuses what does not fit the edge or would leave the
state out of bounds. Every refusal is counted by reason and logged at a bounded rate.

With a :class:`~edge.agent.checkpoints.CheckpointStore` the agent writes its whole state
(:class:`~edge.agent.checkpointing.AgentState`) every ``checkpoint_interval_s`` (and, for
algorithms that need it, before every send) and can :meth:`Agent.resume` from the newest
intact checkpoint after a crash.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator
from functools import partial

import torch

from edge.agent.admission import Admission
from edge.agent.checkpointing import AgentState, Checkpointer
from edge.agent.checkpoints import CheckpointError, CheckpointStore
from edge.agent.lineage import EdgeLineages, Verdict, new_incarnation
from edge.algorithms import (
    Ack,
    GossipAlgorithm,
    InvalidPayload,
    Payload,
    ProtocolError,
)
from edge.compression import Codec
from edge.config.settings import AgentSettings
from edge.observability.stats import Counters, RoundRecord, StatsSink, probe_estimate
from edge.observability.telemetry import AgentObserver, ReceiveEvent, SendEvent, StepEvent
from edge.tasks import Distiller, Task, TrainConfig
from edge.topology import Assignment, Phase
from edge.transport.base import (
    GossipMessage,
    MessageHeader,
    RejectCode,
    Rejected,
    SendOutcome,
    Transport,
)
from edge.transport.guard import RefusalLog

log = logging.getLogger(__name__)

#: Rounds without hearing from an in-neighbour after which the agent stops waiting for it.
PATIENCE_ROUNDS = 4
#: An agent that starts while its fleet is under way (a restart) skips ahead to its peers'
#: round when they are more than this many rounds (beyond its staleness) ahead.
REJOIN_GAP_ROUNDS = 8
#: How long an agent that has heard from no peer after its first round waits to hear one
#: before it goes on alone (its out-neighbours are gone, say, and in-neighbours not yet back).
REJOIN_WAIT_S = 5.0
#: An out-neighbour that cannot be reached keeps its share at home (a dead peer would swallow
#: a share every round: within a few seconds, all of the fleet's push-sum weight); every this
#: many rounds it gets a zero-weight probe carrying what its edge holds, until one lands.
PROBE_ROUNDS = 4


def hold_back(phase: Phase, peers: Collection[str], *, probe: bool) -> Phase:
    """``phase`` with the share of each of ``peers`` kept at home.

    The weights still sum to one, so push-sum conserves mass. With ``probe`` the peers stay in
    the phase with weight 0: the algorithm then sends them what their edge already holds.
    """
    held = {p: w for p, w in phase.out_weights.items() if p in peers}
    if not held:
        return phase
    out = {
        p: 0.0 if p in held else w for p, w in phase.out_weights.items() if probe or p not in held
    }
    return Phase(phase.self_weight + sum(held.values()), out, phase.in_neighbours)


class _Ready(Collection[str]):
    """The peers a message may go to now: in the directory, no message in flight, and
    reachable (or probed this round). A membership view: algorithms only ask ``peer in
    ready``, and building a list over a large fleet's directory every round costs O(n)."""

    def __init__(
        self, peers: Collection[str], inflight: set[str], unreachable: set[str], probe: bool
    ) -> None:
        self._peers, self._inflight, self._unreachable, self._probe = (
            peers, inflight, unreachable, probe,
        )  # fmt: skip

    def __contains__(self, peer: object) -> bool:
        return (
            peer in self._peers
            and peer not in self._inflight
            and (self._probe or peer not in self._unreachable)
        )

    def __iter__(self) -> Iterator[str]:
        return (p for p in self._peers if p in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class Agent:
    """One edge agent.

    Parameters
    ----------
    agent_id:
        Unique id in the fleet.
    task:
        The workload (model, data, training, evaluation).
    algorithm:
        Gossip state and rules, built around the task's initial parameters.
    transport:
        Moves messages to peers and back.
    settings:
        Rounds, pacing and codec.
    stats:
        Where round records go (optional).
    clock:
        Monotonic seconds; wall-clock by default.
    observer:
        Gets plain events (sends, local steps, receptions) as they happen (optional).
    fleet:
        The fleet's name on the wire (:func:`edge.security.tls.fleet_of`); messages naming
        another are refused.
    checkpoints:
        Where the agent keeps its checkpoints (None: it keeps none).
    checkpoint_interval_s:
        How often it writes one (at the end of a round).
    incarnation:
        This agent process's incarnation (:func:`~edge.agent.lineage.new_incarnation`);
        0 for agents that never restart (in-process fleets).
    """

    def __init__(
        self,
        agent_id: str,
        *,
        task: Task,
        algorithm: GossipAlgorithm,
        transport: Transport,
        settings: AgentSettings,
        stats: StatsSink | None = None,
        clock: Callable[[], float] = time.monotonic,
        digest: str = "",
        observer: AgentObserver | None = None,
        fleet: str = "",
        checkpoints: CheckpointStore | None = None,
        checkpoint_interval_s: float = 5.0,
        incarnation: int = 0,
    ) -> None:
        self.agent_id = agent_id
        self.task = task
        self.algorithm = algorithm
        self.transport = transport
        self.settings = settings
        self.stats = stats
        self.clock = clock
        self.digest = digest
        self.observer = observer
        self.fleet = fleet
        self.checkpointer = (
            Checkpointer(checkpoints, interval_s=checkpoint_interval_s, clock=clock)
            if checkpoints is not None
            else None
        )
        self.lineages = EdgeLineages(incarnation)
        self.codec: Codec = algorithm.codec
        self.address = ""
        self.round = 0
        self._assignment: Assignment | None = None
        self._lock = threading.RLock()
        self._progress = threading.Condition(self._lock)
        self._heard: dict[str, int] = {}
        #: Latest round each peer named (messages, acknowledgements): where the fleet is.
        self._peer_rounds: dict[str, int] = {}
        self._rejoining = False
        self._inflight: set[str] = set()
        self._counters = Counters()
        self._warned: set[tuple[str, str]] = set()
        self._stopped = threading.Event()
        self._started_at = clock()
        self._last_metrics: dict[str, float] = {}
        self._disagreement: float | None = None
        self._unreachable: set[str] = set()
        self._refusals = RefusalLog(log)
        self.admission = Admission(
            agent_id,
            fleet=fleet,
            digest=digest,
            algorithm=algorithm.name,
            block_numel=algorithm.block_numel,
            max_blocks=algorithm.max_blocks,
            dtype=algorithm.dtype,
            refuse=self.refused,
        )

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> str:
        """Start receiving; return the address peers should dial."""
        self.address = self.transport.start(self)
        return self.address

    def set_assignment(self, assignment: Assignment) -> None:
        """Install (or replace) the peer directory and mixing schedule; thread-safe."""
        incoming = frozenset(p for phase in assignment.schedule for p in phase.in_neighbours)
        with self._progress:
            old = self._assignment.peers if self._assignment is not None else {}
            # A peer at a new address (it restarted) is worth a full share again.
            self._unreachable = {
                p for p in self._unreachable if assignment.peers.get(p) == old.get(p)
            }
            self.admission.set_in_neighbours(incoming, self.round)
            self._assignment = assignment
            self._progress.notify_all()

    @property
    def assignment(self) -> Assignment | None:
        return self._assignment

    def stop(self) -> None:
        """Ask :meth:`run` to return after the current phase."""
        self._stopped.set()
        with self._progress:
            self._progress.notify_all()

    def close(self) -> None:
        self.stop()
        self.transport.close()

    # -- the round ---------------------------------------------------------------------------
    def begin(self) -> None:
        """Start the clock of this run and report round 0 (the initial state)."""
        self._started_at = self.clock()
        self.report(0)

    def run(self) -> None:
        """Run the remaining rounds on the wall clock, reporting round 0 first (unless it
        resumed from a checkpoint); write a last checkpoint when it stops.

        After its first round, an agent that finds its fleet well ahead (it restarted while
        the fleet went on) skips ahead to its peers' round (see :meth:`catch_up`).
        """
        if self.round == 0:
            self.begin()
        self._rejoining = True
        while self.round < self.settings.rounds and not self._stopped.is_set():
            self.run_round(self.round + 1)
            if self._rejoining:
                self.catch_up(wait_s=REJOIN_WAIT_S)
        if self.checkpointer is not None:
            self.checkpoint()

    def rejoin(self, fleet_round: int) -> None:
        """Skip ahead to ``fleet_round`` (where the fleet is, as its coordinator or peers
        say) when it is more than :data:`REJOIN_GAP_ROUNDS` (beyond the staleness bound)
        ahead. A fleet in its last :data:`REJOIN_GAP_ROUNDS` rounds is not joined: there
        would be no rounds left to learn from it, and the agent runs its own."""
        if fleet_round > self.settings.rounds - REJOIN_GAP_ROUNDS:
            return
        if fleet_round - self.round > self.settings.staleness + REJOIN_GAP_ROUNDS:
            log.info(
                "%s: rejoining the fleet at round %d (it was at round %d)",
                self.agent_id, fleet_round, self.round,
            )  # fmt: skip
            with self._lock:
                self.round = fleet_round - 1

    def catch_up(self, wait_s: float = 0.0) -> None:
        """Skip ahead to the fleet's round when peers are more than
        :data:`REJOIN_GAP_ROUNDS` (beyond the staleness bound) ahead; decided once, as soon
        as peers have named their rounds (acknowledgements, messages), waiting at most
        ``wait_s`` for the first. The fleet's round is the median of its peers' latest, so
        that one peer cannot move it."""
        with self._progress:
            self._progress.wait_for(
                lambda: bool(self._peer_rounds) or self._stopped.is_set(), timeout=wait_s
            )
            rounds = sorted(self._peer_rounds.values())
        if not rounds:
            if wait_s > 0:
                self._rejoining = False  # no peer answers: go on alone
            return  # nothing heard yet: decide after the next round's exchanges
        self._rejoining = False
        self.rejoin(rounds[len(rounds) // 2])

    def run_round(self, round_index: int) -> None:
        self.local_step(round_index)
        self.push(round_index)
        self.wait_for_neighbours(round_index)
        self.mix(round_index)
        if self.report_due(round_index):
            self.report(round_index)
        if self.checkpointer is not None and self.checkpointer.due():
            self.checkpoint()

    def report_due(self, round_index: int) -> bool:
        """Whether ``round_index`` is evaluated and reported (every ``eval_every`` rounds and
        the last); drivers that run the phases themselves ask this after ``mix``."""
        return round_index % self.settings.eval_every == 0 or round_index == self.settings.rounds

    def local_step(self, round_index: int) -> None:
        began = self.clock()
        with self._lock:
            start = self.algorithm.estimate().to(torch.float32)
        with torch.enable_grad():  # whatever the caller's mode: drivers gossip under no_grad
            result = self.task.train(start, TrainConfig(round_index, self.settings.rounds))
        with self._lock:
            if result.parameters is not start:  # a task that trains nothing returns its input
                delta = result.parameters.detach().to(device="cpu", dtype=torch.float32) - start
                self.algorithm.apply_update(delta)
            self.algorithm.on_local_step(round_index, result.metrics)
        self._last_metrics.update(result.metrics)
        if self.observer is not None:
            self.observer.on_step(StepEvent(round_index, self.clock() - began))

    def push(self, round_index: int) -> None:
        with self._lock:
            self.round = round_index
            assignment = self._assignment
            if assignment is None:
                return
            phase = self.algorithm.schedule(round_index, assignment.phase(round_index))
            probe = round_index % PROBE_ROUNDS == 0
            if self._unreachable:
                phase = hold_back(phase, self._unreachable, probe=probe)
            if self.algorithm.starved():  # see STARVED_WEIGHT: flush what edges owe, give none
                phase = hold_back(phase, phase.out_weights, probe=False)
            # Every peer without a message in flight: algorithms may also flush what they
            # still owe a peer that is off this phase (a changed or periodic graph). An
            # unreachable peer is only tried on probe rounds.
            ready = _Ready(assignment.peers, self._inflight, self._unreachable, probe)
            payloads = self.algorithm.share(phase, ready)
            self._inflight.update(payloads)
            lineages = {peer: self.lineages.outgoing(peer) for peer in payloads}
        for peer, payload in payloads.items():
            message = self._message(round_index, peer, payload, assignment.epoch, lineages[peer])
            address = assignment.peers.get(peer, "")
            sent = partial(self._sent, peer, round_index, self.clock())
            self.transport.send(peer, address, message, sent)

    def _message(
        self, round_index: int, peer: str, payload: Payload, epoch: int, lineage: int
    ) -> GossipMessage:
        encoded = payload.encoded
        if encoded is None:
            encoded = self.codec.encode(payload.vector)
        header = MessageHeader(
            sender=self.agent_id,
            round=round_index,
            seq=payload.seq,
            base_seq=payload.base_seq,
            algorithm=self.algorithm.name,
            codec=encoded.codec,
            numel=encoded.numel,
            payload_bytes=len(encoded.data),
            scalars=payload.scalars,
            fleet_digest=self.digest,
            codec_meta=encoded.meta,
            receiver=peer,
            fleet=self.fleet,
            epoch=epoch,
            lineage=lineage,
        )
        return GossipMessage(header, encoded.data)

    def _sent(self, peer: str, round_index: int, began: float, outcome: SendOutcome) -> None:
        with self._progress:
            self._inflight.discard(peer)
            c = self._counters
            c.messages_sent += 1
            c.bytes_sent += outcome.wire_bytes
            self._progress.notify_all()
            if outcome.delivered and outcome.ack is not None:
                self._acknowledged(peer, outcome.ack)
                self._unreachable.discard(peer)
            elif outcome.dropped:
                c.messages_dropped += 1
            else:
                c.messages_failed += 1
                err = outcome.error
                if err is not None and err.code is RejectCode.UNAVAILABLE:
                    self._unreachable.add(peer)
                elif err is not None:
                    self._unreachable.discard(peer)  # it answered, if only to refuse
                key = (peer, err.code.value if err else "?")
                if key not in self._warned:
                    self._warned.add(key)
                    log.warning("%s: push to %s failed: %s", self.agent_id, peer, err)
            if self.observer is not None:
                kind = "delivered" if outcome.delivered else "failed"
                kind = "dropped" if outcome.dropped else kind
                code = outcome.error.code.value if outcome.error is not None else ""
                seconds = self.clock() - began
                event = SendEvent(peer, round_index, outcome.wire_bytes, seconds, kind, code)
                self.observer.on_send(event)

    def _acknowledged(self, peer: str, ack: Ack) -> None:
        """Take ``peer``'s acknowledgement (under the lock): the algorithm's, or the edge
        started over in a new lineage when the receiver could not place our message."""
        self._peer_rounds[peer] = ack.round
        if not ack.start_over:
            self.algorithm.on_ack(peer, ack)
            return
        ours = self.lineages.outgoing(peer)
        lineage = self.lineages.start_over(peer, ack.lineage)
        self.algorithm.restart_out_edge(peer)
        if ack.lineage > ours:
            log.warning(
                "%s: %s holds a newer lineage of our edge (%d) than ours (%d): is another "
                "process running as %s?", self.agent_id, peer, ack.lineage, ours, self.agent_id,
            )  # fmt: skip
        else:
            log.info("%s: starting the edge to %s over (lineage %d)", self.agent_id, peer, lineage)

    def wait_for_neighbours(self, round_index: int) -> None:
        """Wait (at most ``wait_timeout_s``) until this round's sends are done and
        in-neighbours are within ``staleness`` rounds.

        On fast links that keeps agents near lock step; on slow ones the wait times out and
        sending overlaps with the next round's work. In the last round the agent waits for
        its in-neighbours' last messages too (no staleness), so that the final estimate
        holds everything they sent.
        """
        timeout = self.settings.wait_timeout_s
        if timeout <= 0:
            return
        deadline = self.clock() + timeout
        with self._progress:
            while not self._stopped.is_set():
                remaining = deadline - self.clock()
                if self.neighbours_ready(round_index) or remaining <= 0:
                    return
                self._progress.wait(remaining)

    def neighbours_ready(self, round_index: int) -> bool:
        """Whether the wait of ``round_index`` is over: its sends are done and in-neighbours
        are within ``staleness`` rounds (non-blocking; event-driven drivers poll this)."""
        last = round_index >= self.settings.rounds
        need = round_index - (0 if last else self.settings.staleness)
        with self._lock:
            assignment = self._assignment
            if assignment is None:
                return True
            if self._inflight:
                return False
            phase = self.algorithm.schedule(round_index, assignment.phase(round_index))
            heard, oldest = self._heard, need - PATIENCE_ROUNDS
            return not any(oldest <= heard.get(p, 0) < need for p in phase.in_neighbours)

    def mix(self, round_index: int) -> None:
        with self._lock:
            # How far the mix moves the estimate measures the disagreement with in-neighbours;
            # computed only for reported rounds, and only for an observer (metrics, heartbeats).
            due = self.observer is not None and self.report_due(round_index)
            before = self.algorithm.estimate() if due else None
            self.algorithm.mix()
            if before is not None:
                change = torch.linalg.vector_norm(self.algorithm.estimate() - before)
                scale = torch.linalg.vector_norm(before)
                self._disagreement = float(change / scale) if scale > 0 else float(change)
            teachers = self.algorithm.teachers()
            if teachers:
                start = self.algorithm.estimate().to(torch.float32)
        if teachers:
            self._distill(round_index, start, teachers)

    def _distill(self, round_index: int, start: torch.Tensor, teachers: list[torch.Tensor]) -> None:
        """Ensemble compression: train the model towards its teachers' averaged outputs."""
        task = self.task
        assert isinstance(task, Distiller)  # build_agent refuses tasks that cannot distil
        models = [t.to(torch.float32) for t in teachers]
        with torch.enable_grad():
            result = task.distill(start, models, TrainConfig(round_index, self.settings.rounds))
        delta = result.parameters.detach().to(device="cpu", dtype=torch.float32) - start
        with self._lock:
            self.algorithm.apply_update(delta)
        self._last_metrics.update(result.metrics)

    def report(self, round_index: int, *, final: bool = False) -> RoundRecord:
        """Evaluate the current estimate and hand a record to the stats sink."""
        with self._lock:
            estimate = self.algorithm.estimate()
            scalars = self.algorithm.scalars()
            if self._disagreement is not None:
                scalars["disagreement"] = self._disagreement
            counters = self._counters.copy()
        evaluation = self.task.evaluate(estimate.to(torch.float32))
        metrics = {**self._last_metrics, **evaluation.metrics}
        record = RoundRecord(
            agent_id=self.agent_id,
            round=round_index,
            wall_s=self.clock() - self._started_at,
            metrics=metrics,
            scalars=scalars,
            final=final or round_index == self.settings.rounds,
            estimate=probe_estimate(estimate.numpy(), self.settings.seed),
            counters=counters,
        )
        if self.stats is not None:
            self.stats.record(record)
        return record

    # -- checkpoints -------------------------------------------------------------------------
    def _state(self) -> AgentState:
        """Everything a restarted agent needs (call under the lock)."""
        return AgentState(
            agent_id=self.agent_id,
            digest=self.digest,
            round=self.round,
            counters=self._counters.copy(),
            model=self.algorithm.estimate().to(torch.float32),
            algorithm=self.algorithm.state_dict(),
            incarnation=self.lineages.incarnation,
        )

    def _write(self, state: AgentState) -> None:
        assert self.checkpointer is not None
        self.checkpointer.write(state)

    def checkpoint(self) -> None:
        """Write a checkpoint now (atomically; see :mod:`edge.agent.checkpoints`)."""
        if self.checkpointer is None:
            raise RuntimeError("this agent keeps no checkpoints")
        with self._lock:
            state = self._state()
        self._write(state)

    def resume(self) -> int | None:
        """Take up the newest intact checkpoint, if any; return its round (None: none).

        The agent takes up its own state as the checkpoint holds it, however old, and starts
        every edge over as a new incarnation (:mod:`edge.agent.lineage`): nothing it sends
        or absorbs mixes its edges' history before the restart with its peers'. A corrupt
        newer checkpoint is reported (a warning naming it and why) and the one before it
        used.

        Raises
        ------
        CheckpointError
            No checkpoint is intact, or the newest is another agent's, task's or algorithm's.
        """
        if self.checkpointer is None:
            return None
        loaded = self.checkpointer.load(self.agent_id, self.digest)
        if loaded is None:
            return None
        state, path = loaded
        try:
            with self._lock:
                self.algorithm.load_state_dict(state.algorithm)
                self.round = state.round
                self._counters = state.counters.copy()
                previous = max(self.lineages.incarnation, state.incarnation)
                self.lineages.restart(new_incarnation(previous))
        except (KeyError, TypeError, ValueError) as err:
            raise CheckpointError(f"checkpoint {path} cannot be resumed: {err}") from None
        log.info("%s: resumed round %d from %s", self.agent_id, self.round, path)
        return self.round

    def counters(self) -> Counters:
        """A copy of what this agent has sent and received so far."""
        with self._lock:
            return self._counters.copy()

    # -- receiving (InboundHandler) -----------------------------------------------------------
    def refused(self, error: Rejected) -> None:
        with self._lock:
            self._counters.messages_rejected += 1
        self._refusals.note(error.kind, f"{self.agent_id}: {error.code.value}: {error.reason}")
        if self.observer is not None:
            self.observer.on_receive(ReceiveEvent(False, code=error.code.value, reason=error.kind))

    def accepts(self, sender: str) -> None:
        self.admission.check_sender(sender, self.round, assigned=self._assignment is not None)

    def admit(self, header: MessageHeader) -> None:
        assignment = self._assignment
        epoch = assignment.epoch if assignment is not None else None
        self.admission.check_header(header, self.round, epoch)

    def deliver(self, message: GossipMessage) -> Ack:
        header = message.header  # transports call admit(header) first
        payload = self.admission.decode(message)
        sender = header.sender
        with self._progress:
            verdict = self.lineages.admit(sender, header.lineage, header.base_seq)
            if verdict is Verdict.NEW:
                self.algorithm.forget_in_edge(sender)
            try:
                if verdict is Verdict.START_OVER:
                    raise ProtocolError(f"lineage {header.lineage} measured from {header.base_seq}")
                ack = self.algorithm.receive(sender, payload)
            except ProtocolError as err:
                # Not a refusal: the sender starts the edge over (edge.agent.lineage).
                self._refusals.note("start_over", f"{self.agent_id}: from {sender}: {err}")
                return Ack(0, 0, False, self.round, self.lineages.incoming(sender), start_over=True)
            except InvalidPayload as err:
                raise self.admission.reject(
                    RejectCode.INVALID_ARGUMENT, str(err), err.reason
                ) from None
            self._counters.messages_received += 1
            if self.observer is not None:
                self.observer.on_receive(
                    ReceiveEvent(True, header.sender, payload_bytes=header.payload_bytes)
                )
            self._peer_rounds[sender] = header.round
            if header.round > self._heard.get(sender, 0):
                self._heard[sender] = header.round
                self._progress.notify_all()
            lineage = self.lineages.incoming(sender)
            return Ack(ack.last_seq, ack.base_seq, ack.absorbed, self.round, lineage)
