"""Who an agent hears from: its assigned in-neighbours, and former ones for a while."""

from __future__ import annotations

import pytest

from airgossip.common.topology import Assignment, Phase
from airgossip.edge.agent import FORMER_ROUNDS, Agent, build_agent
from airgossip.edge.settings import AgentSettings, TaskSettings
from airgossip.edge.transport import MessageHeader, Rejected
from airgossip.edge.transport.memory import InMemoryNetwork, InMemoryTransport

SETTINGS = AgentSettings(task=TaskSettings(name="consensus", dim=4), rounds=10)


def agent() -> Agent:
    return build_agent("agent-0", index=0, num_agents=4, settings=SETTINGS,
                       transport=InMemoryTransport(InMemoryNetwork(), "agent-0"))  # fmt: skip


def directed(epoch: int, incoming: tuple[str, ...], outgoing: tuple[str, ...]) -> Assignment:
    peers = {p: f"mem://{p}" for p in (*incoming, *outgoing)}
    weight = 1 / (len(outgoing) + 1)
    return Assignment(epoch, peers, (Phase(weight, dict.fromkeys(outgoing, weight), incoming),))


def header(a: Agent, sender: str) -> MessageHeader:
    return MessageHeader(sender, 1, 1, 0, "push-sum", "float64", 4, 32, {"y": 0.5}, a.digest,
                         receiver="agent-0")  # fmt: skip


def refusal(a: Agent, sender: str) -> str | None:
    try:
        a.admit(header(a, sender))
    except Rejected as err:
        return err.kind
    return None


def test_only_in_neighbours_are_heard_and_former_ones_for_a_while() -> None:
    a = agent()
    assert refusal(a, "agent-1") == "no_neighbours"
    a.set_assignment(directed(1, incoming=("agent-1",), outgoing=("agent-2",)))
    assert refusal(a, "agent-1") is None
    assert refusal(a, "agent-2") == "not_in_neighbour"  # an out-neighbour only: not heard
    assert refusal(a, "agent-3") == "not_in_neighbour"
    a.round = 100
    a.set_assignment(directed(2, incoming=("agent-3",), outgoing=("agent-2",)))
    assert refusal(a, "agent-3") is None
    assert refusal(a, "agent-1") is None  # may still deliver what its edge owes
    a.round = 100 + FORMER_ROUNDS + 1
    assert refusal(a, "agent-1") == "not_in_neighbour"
    a.set_assignment(directed(3, incoming=("agent-1", "agent-3"), outgoing=("agent-2",)))
    assert refusal(a, "agent-1") is None  # an in-neighbour again


@pytest.mark.parametrize(
    ("field", "value", "kind"),
    [("receiver", "agent-5", "wrong_receiver"), ("fleet", "elsewhere", "wrong_fleet"),
     ("round", 2**60, "sequence")],
)  # fmt: skip
def test_the_header_binds_the_message_to_its_edge_and_fleet(
    field: str, value: object, kind: str
) -> None:
    import dataclasses

    a = agent()
    a.set_assignment(directed(1, incoming=("agent-1",), outgoing=("agent-2",)))
    with pytest.raises(Rejected) as info:
        a.admit(dataclasses.replace(header(a, "agent-1"), **{field: value}))
    assert info.value.kind == kind
