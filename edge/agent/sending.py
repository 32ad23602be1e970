"""What an agent sends this round and to whom: shares kept home, ready peers, the message.

An out-neighbour that cannot be reached, or an agent with almost no weight left, keeps its
share at home (:func:`hold_back`); a peer is ready when no message to it is in flight and it
is reachable (or probed this round, :class:`ReadyPeers`); :func:`gossip_message` wraps an
algorithm's payload in the header its receiver checks.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass

import torch

from airgossip.common.topology import Phase
from airgossip.edge.algorithms import Payload
from airgossip.edge.algorithms.push_sum_rules import hold_back_weights
from airgossip.edge.compression import Codec
from airgossip.edge.observability.telemetry import SendEvent
from airgossip.edge.transport.base import GossipMessage, MessageHeader, RejectCode, SendOutcome

#: An out-neighbour that cannot be reached keeps its share at home (a dead peer would swallow
#: a share every round: within a few seconds, all of the fleet's push-sum weight); every this
#: many rounds it gets a zero-weight probe carrying what its edge holds, until one lands.
PROBE_ROUNDS = 4


def hold_back(phase: Phase, peers: Collection[str], *, probe: bool) -> Phase:
    """``phase`` with the share of each of ``peers`` kept at home.

    The weights still sum to one, so push-sum conserves mass. With ``probe`` the peers stay in
    the phase with weight 0: the algorithm then sends them what their edge already holds.
    """
    kept = hold_back_weights(phase.self_weight, phase.out_weights, peers, probe=probe)
    if kept is None:
        return phase
    return Phase(*kept, phase.in_neighbours)


class ReadyPeers(Collection[str]):
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


@dataclass(frozen=True)
class Sender:
    """Who sends: what every header of an agent's messages says about it."""

    agent_id: str
    algorithm: str
    digest: str
    fleet: str
    codec: Codec


def gossip_message(
    sender: Sender,
    round_index: int,
    peer: str,
    payload: Payload,
    *,
    epoch: int,
    lineage: int,
    step: int = 0,
    steps: int = 0,
) -> GossipMessage:
    """``payload`` for ``peer``, encoded (unless the algorithm encoded it) and headed
    (``step``: the gossip step of the round it is sent in, of ``steps`` a round).

    A payload the algorithm encoded carries what the receiver decodes (``payload.vector``):
    the message hands it over to in-process receivers (:class:`GossipMessage`)."""
    encoded = payload.encoded
    decoded: torch.Tensor | None = payload.vector
    if encoded is None:
        encoded = sender.codec.encode(payload.vector)
        decoded = None  # the codec may be lossy: the receiver decodes the bytes
    header = MessageHeader(
        sender=sender.agent_id,
        round=round_index,
        seq=payload.seq,
        base_seq=payload.base_seq,
        algorithm=sender.algorithm,
        codec=encoded.codec,
        numel=encoded.numel,
        payload_bytes=len(encoded.data),
        scalars=payload.scalars,
        fleet_digest=sender.digest,
        codec_meta=encoded.meta,
        receiver=peer,
        fleet=sender.fleet,
        epoch=epoch,
        lineage=lineage,
        step=step,
        steps=steps,
    )
    return GossipMessage(header, encoded.data, decoded)


def send_event(peer: str, round_index: int, outcome: SendOutcome, seconds: float) -> SendEvent:
    """What an observer hears of one finished push."""
    kind = "dropped" if outcome.dropped else "delivered" if outcome.delivered else "failed"
    code = outcome.error.code.value if outcome.error is not None else ""
    return SendEvent(peer, round_index, outcome.wire_bytes, seconds, kind, code)


class Outbox:
    """An agent's pushes in flight and the out-neighbours its pushes do not reach (under the
    agent's lock).

    An edge whose pushes fail would take a share of the agent's weight every round and
    deliver none: within seconds, the whole fleet's weight would sit on it. A peer that
    cannot be reached (``UNAVAILABLE``) keeps its share at home and is probed every
    :data:`PROBE_ROUNDS` rounds; one that refuses (its slots are busy, it does not hear us
    yet) keeps its share at home too, and gets what its edge owes every round until a push
    lands.
    """

    def __init__(self) -> None:
        self.inflight: set[str] = set()
        self.unreachable: set[str] = set()
        self.refusing: set[str] = set()
        self._warned: set[tuple[str, str]] = set()

    def plan(self, round_index: int, phase: Phase, peers: Collection[str], *, starved: bool
             ) -> tuple[Phase, ReadyPeers]:  # fmt: skip
        """This round's phase (shares of unreachable peers kept home, all of them when the
        agent is starved) and the peers a message may go to."""
        probe = round_index % PROBE_ROUNDS == 0
        if self.refusing:
            phase = hold_back(phase, self.refusing, probe=True)
        if self.unreachable:
            phase = hold_back(phase, self.unreachable, probe=probe)
        if starved:  # see STARVED_WEIGHT: flush what edges owe, give nothing new
            phase = hold_back(phase, phase.out_weights, probe=False)
        # Every peer without a message in flight: algorithms may also flush what they still
        # owe a peer that is off this phase (a changed or periodic graph). An unreachable peer
        # is only tried on probe rounds.
        return phase, ReadyPeers(peers, self.inflight, self.unreachable, probe)

    def readdressed(self, peers: dict[str, str], old: dict[str, str]) -> None:
        """A new directory: a peer at a new address (it restarted) is worth a share again."""
        self.unreachable = {p for p in self.unreachable if peers.get(p) == old.get(p)}
        self.refusing = {p for p in self.refusing if peers.get(p) == old.get(p)}

    def finished(self, peer: str, outcome: SendOutcome) -> str:
        """Book a finished push; return a warning worth logging (once per peer and code)."""
        self.inflight.discard(peer)
        if outcome.delivered or outcome.dropped:
            if outcome.delivered:
                self.unreachable.discard(peer)
                self.refusing.discard(peer)
            return ""
        err = outcome.error
        if err is not None and err.code is RejectCode.UNAVAILABLE:
            self.unreachable.add(peer)
            self.refusing.discard(peer)
        elif err is not None:
            self.unreachable.discard(peer)  # it answered, if only to refuse
            self.refusing.add(peer)
        key = (peer, err.code.value if err else "?")
        if key in self._warned or (err is not None and err.kind == "offline"):
            return ""  # said once; an emulated device that is off is no news
        self._warned.add(key)
        return f"push to {peer} failed: {err}"
