"""The edge agent: composes a task, a gossip algorithm, a transport and a stats sink.

One round is ``local_step`` (train on the de-biased estimate) -> ``push`` (split mass, send
one message per out-neighbour, at most one in flight per edge) -> wait (bounded staleness:
a little for in-neighbours that fall behind, never for ever; :meth:`Agent.neighbours_ready`)
-> ``mix`` (fold in whatever has arrived) -> ``report``. An agent process runs the rounds on
the wall clock (:class:`~airgossip.edge.agent.runner.WallClockRunner`); an in-process driver calls
the same phases in lock step or on a virtual clock. There is no global barrier: an agent never waits
on anything but its own in-neighbours, and not for longer than ``wait_timeout_s``.

The agent is also the transport's :class:`~airgossip.edge.transport.base.InboundHandler`
(:mod:`airgossip.edge.agent.inbound`): every incoming message passes
:class:`~airgossip.edge.agent.admission.Admission` before it can touch the gossip state, and the
algorithm then refuses what does not fit the edge or would leave the state out of bounds. Every
refusal is counted by reason and logged at a bounded rate.

With a :class:`~airgossip.edge.agent.checkpoints.CheckpointStore` the agent writes its own state
(:class:`~airgossip.edge.agent.checkpointing.AgentState`) every ``checkpoint_interval_s`` and can
:meth:`Agent.resume` from the newest usable checkpoint after a crash (intact, MACed, of its
own fleet, run and task, values in bounds; else the one before, else it starts fresh),
starting every edge over (:mod:`airgossip.edge.agent.resuming`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import partial

import torch

from airgossip.common.topology import Assignment, Phase
from airgossip.edge.agent.admission import Admission
from airgossip.edge.agent.checkpointing import Checkpointer
from airgossip.edge.agent.checkpoints import CheckpointStore
from airgossip.edge.agent.inbound import InboundSide
from airgossip.edge.agent.influence import InNeighbourWatch
from airgossip.edge.agent.lineage import EdgeLineages
from airgossip.edge.agent.mixing_steps import StepCount, mixing_steps, step_position
from airgossip.edge.agent.pacing import PATIENCE_ROUNDS, step_heard, wait_over
from airgossip.edge.agent.rejoin import LATE_WEIGHT
from airgossip.edge.agent.resuming import CheckpointSide
from airgossip.edge.agent.sending import Outbox, Sender, gossip_message, send_event
from airgossip.edge.algorithms import Ack, GossipAlgorithm
from airgossip.edge.compression import Codec
from airgossip.edge.energy import EnergyLedger
from airgossip.edge.observability.stats import Counters, RoundRecord, StatsSink, probe_estimate
from airgossip.edge.observability.telemetry import AgentObserver, StepEvent
from airgossip.edge.settings import AgentSettings
from airgossip.edge.tasks import Distiller, Task, TrainConfig
from airgossip.edge.transport.base import SendOutcome, Transport
from airgossip.edge.transport.guard import RefusalLog

log = logging.getLogger(__name__)


class Agent(InboundSide, CheckpointSide):
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
        The fleet's name on the wire (:func:`airgossip.common.security.tls.fleet_of`); messages
        naming another are refused.
    checkpoints:
        Where the agent keeps its checkpoints (None: it keeps none).
    checkpoint_interval_s:
        How often it writes one (at the end of a round).
    incarnation:
        This agent process's incarnation (:func:`~airgossip.edge.agent.lineage.new_incarnation`);
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
        self._sender = Sender(agent_id, algorithm.name, digest, fleet, algorithm.codec)
        self.codec: Codec = algorithm.codec
        self.address = ""
        self.round = 0
        #: Its state carries the fleet's past: a checkpoint taken up, or it joined late.
        self.holds_past = False
        self._assignment: Assignment | None = None
        self._lock = threading.RLock()
        #: Notified whenever a push finishes or a message arrives (drivers wait on it).
        self.progress = self._progress = threading.Condition(self._lock)
        #: Latest (round, gossip step) each in-neighbour sent: its step position
        #: (:func:`step_position`) at the agent's current count is where it is.
        self._heard: dict[str, tuple[int, int]] = {}
        #: Gossip steps (push, wait, mix) this round, latched at its local step from
        #: :attr:`step_count` (:mod:`airgossip.edge.agent.mixing_steps`); drivers read it.
        self.mixing_steps = 1
        self.step_count = StepCount(settings.mixing_steps)
        #: Latest round each peer named (messages, acknowledgements): where the fleet is.
        self._peer_rounds: dict[str, int] = {}
        self.outbox = Outbox()
        self._counters = Counters()
        self._stopped = threading.Event()
        self._started_at = clock()
        self._last_metrics: dict[str, float] = {}
        self._disagreement: float | None = None
        self._refusals = RefusalLog(log)
        self.admission = Admission.of(
            agent_id, algorithm, fleet=fleet, digest=digest, refuse=self.refused
        )
        self.watch = InNeighbourWatch(algorithm, observer)
        #: What it spends (a driver that emulates its device attaches one and passes on its
        #: seconds computing: :meth:`EnergyLedger.computed`); None: not accounted.
        self.energy: EnergyLedger | None = None
        #: An emulated device that is off (its driver says when): messages are refused as
        #: unavailable, and push-sum's senders keep their mass for a later try.
        self.offline = False

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
            self.outbox.readdressed(assignment.peers, old)
            self.admission.set_in_neighbours(incoming, self.round)
            self.watch.set_in_neighbours(incoming)
            self._assignment = assignment
            self.step_count.rule = mixing_steps(
                self.settings.mixing_steps,
                several_mixes=self.algorithm.several_mixes and getattr(self.task, "trains", True),
                lambda2=assignment.lambda2,
                period=len(assignment.schedule),
                message_bytes=self.algorithm.numel * self.algorithm.dtype.itemsize,
            )
            self._latch_steps()
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

    # -- for drivers ---------------------------------------------------------------------------
    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stopped.is_set()

    def peer_rounds(self) -> dict[str, int]:
        """The latest round each peer named (messages, acknowledgements), by peer: one entry
        per agent id, however many messages it sent."""
        with self._lock:
            return dict(self._peer_rounds)

    def peers_in_reach(self) -> int:
        """How many distinct peers its schedule exchanges with (in- and out-neighbours of
        every phase): the most that can name their rounds to it."""
        with self._lock:
            assignment = self._assignment
            if assignment is None:
                return 0
            peers = {p for phase in assignment.schedule for p in phase.in_neighbours}
            peers.update(p for phase in assignment.schedule for p in phase.out_weights)
            peers.discard(self.agent_id)
            return len(peers)

    def skip_to(self, round_index: int) -> None:
        """Make ``round_index`` the last round this agent ran: it rejoins a fleet ahead, with
        :data:`~airgossip.edge.agent.rejoin.LATE_WEIGHT` when it took up no checkpoint."""
        with self._lock:
            self.round = round_index
            if not self.holds_past:
                self.algorithm.join_late(LATE_WEIGHT)
                self.holds_past = True

    def report_due(self, round_index: int) -> bool:
        """Whether ``round_index`` is evaluated and reported (every ``eval_every`` rounds and
        the last); drivers that run the phases themselves ask this after ``mix``."""
        return self.settings.reports(round_index)

    def _latch_steps(self) -> None:
        """Take the round's gossip steps from :attr:`step_count` (under the lock)."""
        self.mixing_steps = self.step_count.now()

    def _step_phase(self, assignment: Assignment, round_index: int, step: int
                    ) -> tuple[int, Phase]:  # fmt: skip
        """Gossip step ``step`` of ``round_index``: its position and its phase (the
        algorithm's schedule of the graph's phase there; under the lock)."""
        position = step_position(round_index, step, self.mixing_steps)
        return position, self.algorithm.schedule(round_index, assignment.phase(position))

    def _heard_at(self, phase: Phase) -> list[int]:
        """Where each in-neighbour of ``phase`` is, as the position of the latest step it
        sent at this agent's count (0: never heard; under the lock)."""
        steps, heard = self.mixing_steps, self._heard
        return [
            step_position(r, min(s, steps - 1), steps) if (r, s) != (0, 0) else 0
            for r, s in (heard.get(p, (0, 0)) for p in phase.in_neighbours)
        ]

    def costs_measured(self, local_s: float, steps_s: list[float]) -> None:
        """A driver on a real clock says what this round's local step and each of its gossip
        steps took (see :class:`~airgossip.edge.agent.mixing_steps.StepCount`)."""
        with self._lock:
            decided = self.step_count.measured(local_s, steps_s)
        if decided:
            log.info("%s %s", self.agent_id, decided)

    def local_step(self, round_index: int) -> None:
        began = self.clock()
        with self._lock:
            self._latch_steps()
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

    def push(self, round_index: int, step: int = 0) -> None:
        """Send gossip step ``step`` (from 0, below :attr:`mixing_steps`) of ``round_index``."""
        with self._lock:
            self.round = round_index
            assignment = self._assignment
            if assignment is None:
                return
            phase, ready = self.outbox.plan(
                round_index,
                self._step_phase(assignment, round_index, step)[1],
                assignment.peers,
                starved=self.algorithm.starved(),
            )
            payloads = self.algorithm.share(phase, ready)
            self.outbox.inflight.update(payloads)
            lineages = {peer: self.lineages.outgoing(peer) for peer in payloads}
            # Said where the fleet must agree on a count (not on a static graph: 0 bytes).
            steps = self.mixing_steps if self.step_count.rule > 1 else 0
        for peer, payload in payloads.items():
            message = gossip_message(
                self._sender, round_index, peer, payload,
                epoch=assignment.epoch, lineage=lineages[peer], step=step,
                steps=steps,
            )  # fmt: skip
            address = assignment.peers.get(peer, "")
            sent = partial(self._sent, peer, round_index, self.clock())
            self.transport.send(peer, address, message, sent)

    def _sent(self, peer: str, round_index: int, began: float, outcome: SendOutcome) -> None:
        with self._progress:
            warning = self.outbox.finished(peer, outcome)
            c = self._counters
            c.messages_sent += 1
            c.bytes_sent += outcome.wire_bytes
            if self.energy is not None:
                self.energy.sent(peer, outcome.wire_bytes)
            self._progress.notify_all()
            if outcome.delivered and outcome.ack is not None:
                self._acknowledged(peer, outcome.ack)
            elif outcome.dropped:
                c.messages_dropped += 1
            else:
                c.messages_failed += 1
            if warning:
                log.warning("%s: %s", self.agent_id, warning)
            if self.observer is not None:
                seconds = self.clock() - began
                self.observer.on_send(send_event(peer, round_index, outcome, seconds))

    def _acknowledged(self, peer: str, ack: Ack) -> None:
        """Take ``peer``'s acknowledgement (under the lock)."""
        self._peer_rounds[peer] = ack.round
        held = self.lineages.acknowledged(self.algorithm, peer, ack)
        if held:
            log.warning(
                "%s: %s holds a newer lineage of our edge (%d) than ours: is another "
                "process running as %s?", self.agent_id, peer, held, self.agent_id,
            )  # fmt: skip
        elif held is not None:
            log.info("%s: starting the edge to %s over", self.agent_id, peer)

    def neighbours_ready(self, round_index: int, step: int = 0) -> bool:
        """Whether the wait of ``round_index`` (its gossip step ``step``) is over: its sends
        are done and in-neighbours are within ``staleness`` rounds (non-blocking; event-driven
        drivers poll this).

        An in-neighbour more than :data:`~airgossip.edge.agent.pacing.PATIENCE_ROUNDS` behind
        is not waited for (it is gone, or restarting), as long as another one is within reach;
        when every in-neighbour is that far behind, the wait runs to its timeout
        (:func:`~airgossip.edge.agent.pacing.wait_over`). At ``pace = "async"`` a round waits for
        its own sends only (a device sends no faster than its links carry), and the last
        round for the in-neighbours' last messages too.

        At several gossip steps per round (:attr:`mixing_steps`) the same holds step by step:
        each step waits for the in-neighbours of its phase, counted in steps
        (:func:`~airgossip.edge.agent.mixing_steps.step_position`), ``staleness`` rounds'
        worth of steps allowed; a further step of a round then waits briefly for its
        in-neighbours' same step too (:meth:`step_heard`).
        """
        last = round_index >= self.settings.rounds
        with self._lock:
            steps = self.mixing_steps
            assignment = self._assignment
            if assignment is None:
                return True
            if self.outbox.inflight:
                return False
            if not last and self.settings.pace == "async":
                return True  # at its own pace: its in-neighbours' rounds are not waited for
            position, phase = self._step_phase(assignment, round_index, step)
            need = position - (0 if last else self.settings.staleness * steps)
            return wait_over(self._heard_at(phase), need, PATIENCE_ROUNDS * steps)

    def step_heard(self, round_index: int, step: int) -> bool:
        """Whether a further gossip step (``step`` > 0) of ``round_index`` holds its
        in-neighbours' same step, those that keep up
        (:func:`~airgossip.edge.agent.pacing.step_heard`; non-blocking). Drivers wait for it
        after :meth:`neighbours_ready`, briefly
        (:class:`~airgossip.edge.agent.mixing_steps.StepWaits`)."""
        with self._lock:
            steps = self.mixing_steps
            assignment = self._assignment
            if assignment is None or steps == 1:
                return True
            position, phase = self._step_phase(assignment, round_index, step)
            return step_heard(self._heard_at(phase), position, steps)

    def mix(self, round_index: int, step: int = 0) -> None:
        with self._lock:
            # How far the mix moves the estimate measures the disagreement with in-neighbours;
            # computed only for reported rounds (a round's first mix, where the local step has
            # just moved it), and only for an observer (metrics, heartbeats).
            due = self.observer is not None and step == 0 and self.report_due(round_index)
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
            if self.step_count.rule > 1:
                scalars["mixing_steps"] = float(self.mixing_steps)
            counters = self._counters.copy()
        evaluation = self.task.evaluate(estimate.to(torch.float32))
        metrics = {**self._last_metrics, **evaluation.metrics}
        if self.energy is not None:
            metrics.update(self.energy.figures())
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

    def counters(self) -> Counters:
        """A copy of what this agent has sent and received so far."""
        with self._lock:
            return self._counters.copy()
