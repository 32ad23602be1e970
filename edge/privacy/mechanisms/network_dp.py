"""``network-dp``: independent noise once per round, and gossip (Muffliato): an agent's
update reaches a curious agent through many mixing steps, each adding others' noise."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, ClassVar

from airgossip.edge.privacy.mechanisms.base import Mechanism, PrivacyParameters

if TYPE_CHECKING:
    import numpy as np

    from airgossip.edge.privacy.accounting import Ledger
    from airgossip.edge.privacy.plan import NoisePlan, PrivacyGraph


class NetworkDp(Mechanism):
    """Pairwise network DP on one fixed graph, accounted exactly as one Gaussian mechanism
    over the run with a sensitivity per pair of agents (:mod:`airgossip.edge.privacy.graph`)."""

    name: ClassVar[str] = "network-dp"
    summary: ClassVar[str] = "noise once per round and gossip: pairwise DP of the graph"
    every_round: ClassVar[bool] = True
    needs_graph: ClassVar[bool] = True
    fixed_graph: ClassVar[bool] = True
    opacus_accounted: ClassVar[bool] = False

    def plan(
        self,
        settings: PrivacyParameters,
        *,
        rounds: int,
        num_agents: int,
        graph: PrivacyGraph | None,
    ) -> NoisePlan:
        from airgossip.edge.privacy.accounting import calibrate
        from airgossip.edge.privacy.plan import NoisePlan, mean_pair_epsilon, network_of

        assert graph is not None
        network = network_of(graph, rounds)
        sigma, delta = settings.noise_multiplier, settings.delta
        if sigma is None:
            assert settings.target_epsilon is not None
            sigma = calibrate(
                lambda s: mean_pair_epsilon(network, rounds, s, delta), settings.target_epsilon
            )
        return NoisePlan(sigma, network=network)

    def complete(self, plan: NoisePlan, *, rounds: int, graph: PrivacyGraph | None) -> NoisePlan:
        from dataclasses import replace

        from airgossip.edge.privacy.plan import network_of

        assert graph is not None
        return replace(plan, network=network_of(graph, rounds))

    def ledger(
        self,
        plan: NoisePlan,
        settings: PrivacyParameters,
        *,
        graph: PrivacyGraph | None,
        agent_id: str,
        restarted: bool,
    ) -> Ledger:
        """Epsilon towards every other agent, from this agent's row of the sensitivities
        (an agent restarted from a checkpoint gets local DP's figure: see
        :class:`~airgossip.edge.privacy.accounting.NetworkLedger`)."""
        from airgossip.edge.privacy.accounting import NetworkLedger

        assert graph is not None and plan.network is not None
        index = graph.ids.index(agent_id)
        network = plan.network

        def row(rounds: int) -> np.ndarray:
            values: np.ndarray = network.at(rounds)[index].copy()
            values[index] = math.nan
            return values

        return NetworkLedger(row, plan.noise_multiplier, settings.delta, local=restarted)

    def accountant(self, settings: PrivacyParameters) -> str:
        return "gaussian"
