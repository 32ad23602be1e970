"""Robust gossip against authenticated insiders, on in-process fleets (the memory transport,
10% loss) with the attack harness of emulation/attacks.py: insiders send forged payloads
through the normal transport, honest agents run the algorithm unchanged."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from airgossip.emulation.attacks import Insiders, fleet_with_insiders, place_insiders
from airgossip.emulation.fleets import preflight
from airgossip.emulation.fleets.inproc import InProcessFleet
from airgossip.emulation.networks import network_for
from airgossip.scenario.config import ConfigError, load_config

INSIDER = 3  # agent-3 lies in the consensus fleets below


def consensus_fleet(
    algorithm: str,
    *,
    topology: str = "complete",
    attack: str | None = None,
    rounds: int = 60,
    options: dict[str, Any] | None = None,
    agents: int = 8,
) -> tuple[InProcessFleet, list[int]]:
    config = load_config(None, {
        "mode": "inproc", "task": {"name": "consensus"}, "agents": agents, "rounds": rounds,
        "topology": topology, "algorithm": algorithm, "algorithm_options": options or {},
        "network": {"loss": 0.1}, "seed": 1,
    })  # fmt: skip
    fleet, liars = fleet_with_insiders(
        config, None if attack is None else lambda _graph: Insiders(attack, (INSIDER,))
    )
    fleet.run()
    return fleet, [i for i in range(agents) if i not in liars]


def honest_estimates(fleet: InProcessFleet, honest: list[int]) -> torch.Tensor:
    return torch.stack([fleet.agents[i].algorithm.estimate().double() for i in honest])


def initial_average(fleet: InProcessFleet, honest: list[int]) -> torch.Tensor:
    """The honest agents' exact average (the consensus task's vectors, from its seed)."""
    vectors = [fleet.agents[i].task.initial_parameters().double() for i in honest]
    return torch.stack(vectors).mean(dim=0)


UNDIRECTED = [("clipped-gossip", "complete"), ("cs-plus-gossip", "complete")]
ROBUST = [*UNDIRECTED, ("robust-push-sum", "exponential")]


@pytest.mark.parametrize(("algorithm", "topology"), ROBUST)
def test_a_huge_value_insider_is_bounded(algorithm: str, topology: str) -> None:
    fleet, honest = consensus_fleet(algorithm, topology=topology, attack="huge")
    estimates = honest_estimates(fleet, honest)
    target = initial_average(fleet, honest)
    # The insider claims 1e6 in every element; the honest agents stay near their own average
    # (robust-push-sum drifts by up to its radius a round: 4.95 after 60 rounds here, where
    # plain push-sum is taken to ~1e5; see docs/algorithms.md).
    bound = 8.0 if algorithm == "robust-push-sum" else 2.0
    assert float((estimates - target).abs().max()) < bound
    # ... and every honest in-neighbour of the insider counted its clipped messages.
    graph = network_for(fleet.config).first_graph()
    victims = [i for i in graph.out_neighbours(INSIDER) if i in honest]
    insider_id = fleet.agents[INSIDER].agent_id
    for i in victims:
        counts = fleet.agents[i].algorithm.clipped_by_sender
        assert counts[insider_id] > 0
        assert counts.most_common(1)[0][0] == insider_id


@pytest.mark.parametrize(
    ("algorithm", "topology"), [("push-sum", "exponential"), ("dpsgd", "complete")]
)
def test_the_same_insider_takes_the_plain_algorithms_over(algorithm: str, topology: str) -> None:
    fleet, honest = consensus_fleet(algorithm, topology=topology, attack="huge", rounds=20)
    assert float(honest_estimates(fleet, honest).abs().max()) > 1e4
    assert not fleet.agents[0].algorithm.clipped_by_sender  # plain algorithms never count


def test_robust_push_sum_without_insiders_is_exact_under_loss() -> None:
    fleet, honest = consensus_fleet("robust-push-sum", topology="exponential", rounds=120)
    estimates = honest_estimates(fleet, honest)
    target = initial_average(fleet, honest)
    error = float((estimates - target).norm(dim=1).max() / target.norm())
    assert error < 1e-9


def test_clipping_that_never_bites_is_dpsgd() -> None:
    plain, honest = consensus_fleet("dpsgd", rounds=20)
    expected = honest_estimates(plain, honest)
    cases: list[tuple[str, dict[str, Any]]] = [
        ("clipped-gossip", {"tau": 1e9}),
        ("clipped-gossip", {"byzantine": 0}),
        ("cs-plus-gossip", {"byzantine": 0}),
    ]
    for algorithm, options in cases:
        fleet, _ = consensus_fleet(algorithm, rounds=20, options=options)
        torch.testing.assert_close(honest_estimates(fleet, honest), expected, rtol=0, atol=1e-12)
        assert not any(a.algorithm.clipped_by_sender for a in fleet.agents)


@pytest.mark.parametrize("algorithm", ["clipped-gossip", "cs-plus-gossip"])
def test_adaptive_clipping_without_insiders_still_agrees(algorithm: str) -> None:
    fleet, honest = consensus_fleet(algorithm, rounds=80)
    estimates = honest_estimates(fleet, honest)
    target = initial_average(fleet, honest)
    assert float((estimates - estimates.mean(dim=0)).norm(dim=1).max()) < 1e-6
    # Clipping honest neighbours under loss moves the agreed value a little, not far.
    assert float((estimates.mean(dim=0) - target).norm() / target.norm()) < 0.1


@pytest.mark.parametrize(
    ("algorithm", "options", "words"),
    [
        ("clipped-gossip", {"tau": -1}, "option 'tau'"),
        ("clipped-gossip", {"radius": 1}, "unknown option 'radius'"),
        ("cs-plus-gossip", {"step": 2}, "option 'step'"),
        ("robust-push-sum", {"byzantine": -1}, "option 'byzantine'"),
        ("robust-push-sum", {"radius_decay": 1.0}, "option 'radius_decay'"),
    ],
)
def test_bad_options_are_refused_in_one_line(
    algorithm: str, options: dict[str, Any], words: str
) -> None:
    with pytest.raises((ConfigError, ValueError)) as err:
        load_config(None, {"algorithm": algorithm, "algorithm_options": options})
    message = str(err.value)
    assert words in message and algorithm in message and "\n" not in message


@pytest.mark.parametrize("algorithm", ["clipped-gossip", "cs-plus-gossip"])
def test_directed_graphs_are_refused(algorithm: str) -> None:
    config = load_config(
        None, {"algorithm": algorithm, "topology": "exponential", "mode": "inproc"}
    )
    with pytest.raises(ConfigError, match="needs an undirected graph"):
        preflight(config)


def test_hub_insiders_sit_at_the_highest_degree() -> None:
    config = load_config(None, {
        "agents": 5, "topology": "edges", "algorithm": "dpsgd",
        "edges": [[0, 1], [1, 0], [0, 2], [2, 0], [0, 3], [3, 0], [3, 4], [4, 3]],
    })  # fmt: skip
    graph = network_for(config).first_graph()
    assert place_insiders("hub-dissensus", 1, graph, 0).indices == (0,)
    assert place_insiders("hub-dissensus", 2, graph, 0).indices == (0, 3)
    with pytest.raises(ValueError, match="unknown attack"):
        Insiders("flood", (1,))
