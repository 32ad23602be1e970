"""``dp-sgd``: local DP-SGD, each agent's own noise on each of its steps (Opacus)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from airgossip.edge.privacy.mechanisms.base import Mechanism, PrivacyParameters

if TYPE_CHECKING:
    from airgossip.edge.privacy.plan import NoisePlan, PrivacyGraph


class DpSgd(Mechanism):
    """Every agent noises every private step as if it trained alone: its guarantee holds
    against anyone who sees its models, on any graph."""

    name: ClassVar[str] = "dp-sgd"
    summary: ClassVar[str] = "local DP-SGD through Opacus: each agent's own noise, every step"
    one_step: ClassVar[bool] = False

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
        return NoisePlan(sigma, accounted_multiplier=sigma)
