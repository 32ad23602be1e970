"""``central``: the noise a trusted curator would add to the fleet's sum, shared out."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, ClassVar

from airgossip.edge.privacy.mechanisms.base import Mechanism, PrivacyParameters

if TYPE_CHECKING:
    from airgossip.edge.privacy.plan import NoisePlan, PrivacyGraph


class CentralReference(Mechanism):
    """The central-DP reference: each of ``n`` agents adds ``1/sqrt(n)`` of the curator's
    noise, so the fleet's sum carries it. It protects nothing from neighbours, who see
    every agent's model: a figure to compare the others with."""

    name: ClassVar[str] = "central"
    summary: ClassVar[str] = "a trusted curator's noise on the fleet's sum (a reference)"
    caveat: ClassVar[str | None] = "a trusted curator's figure: neighbours see every model"

    def plan(
        self,
        settings: PrivacyParameters,
        *,
        rounds: int,
        num_agents: int,
        graph: PrivacyGraph | None,
    ) -> NoisePlan:
        from airgossip.edge.privacy.plan import NoisePlan

        sigma = self.calibrated(settings, self.private_steps(settings, rounds))
        return NoisePlan(sigma / math.sqrt(num_agents), accounted_multiplier=sigma)
