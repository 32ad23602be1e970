"""``cancelling``: pairwise masks that cancel in the fleet's sum, plus a little independent
noise (DECOR): an observer of the links sees the masks, the fleet's average does not."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, ClassVar

from airgossip.edge.privacy.mechanisms.base import Mechanism, PrivacyParameters

if TYPE_CHECKING:
    from airgossip.edge.privacy.keys import PairSecrets
    from airgossip.edge.privacy.masks import PairMasks
    from airgossip.edge.privacy.plan import NoisePlan, PrivacyGraph


class CancellingMasks(Mechanism):
    """Every agent adds, beside its step and independent noise, a mask per partner drawn
    from a secret the two share, with opposite signs at the two ends. What it is accounted
    for is the worst agent's effective noise against ``[privacy] adversary``
    (:func:`airgossip.edge.privacy.graph.cancelling_noise_multiplier`)."""

    name: ClassVar[str] = "cancelling"
    summary: ClassVar[str] = "pairwise masks that cancel in the sum, plus independent noise"
    needs_graph: ClassVar[bool] = True
    pair_secrets: ClassVar[bool] = True
    own_settings: ClassVar[tuple[str, ...]] = ("mask_multiplier", "mask_ratio", "adversary")

    def plan(
        self,
        settings: PrivacyParameters,
        *,
        rounds: int,
        num_agents: int,
        graph: PrivacyGraph | None,
    ) -> NoisePlan:
        from airgossip.edge.privacy.accounting import calibrate
        from airgossip.edge.privacy.graph import cancelling_noise_multiplier, pair_graph
        from airgossip.edge.privacy.plan import NoisePlan

        assert graph is not None
        pairs = pair_graph(graph.adjacency)
        sigma, mask = settings.noise_multiplier, settings.mask_multiplier
        adversary = settings.adversary

        def effective(s: float, m: float) -> float:
            return cancelling_noise_multiplier(pairs, s, m, adversary)

        ratio = settings.masks_over_noise
        if sigma is not None:
            mask = ratio * sigma if mask is None else mask
            return NoisePlan(sigma, mask, effective(sigma, mask))
        wanted = self.calibrated(settings, self.private_steps(settings, rounds))
        if mask is None:
            # Effective noise is linear in a common scale of both: one evaluation suffices.
            unit = _unit_multiplier(pairs.tobytes(), pairs.shape[0], ratio, adversary)
            sigma = wanted / unit
            return NoisePlan(sigma, ratio * sigma, wanted)
        fixed = mask
        sigma = calibrate(lambda s: 1.0 / effective(s, fixed), 1.0 / wanted)
        return NoisePlan(sigma, fixed, effective(sigma, fixed))

    def masks(
        self,
        agent_id: str,
        *,
        graph: PrivacyGraph | None,
        secrets: PairSecrets | None,
        run_context: bytes,
        numel: int,
    ) -> PairMasks:
        """This agent's masks, one per partner, keyed by the secret they share and the
        run (another run draws other masks)."""
        from airgossip.edge.privacy.accounting import PrivacyError
        from airgossip.edge.privacy.masks import PairMasks

        if secrets is None:
            raise PrivacyError(
                f"privacy mechanism '{self}' needs every agent's identity to agree a key with "
                "each partner: run with TLS (without --insecure), or in one process (--mode "
                "inproc or virtual)"
            )
        assert graph is not None
        partners = graph.partners(agent_id)
        held = secrets
        return PairMasks(agent_id, partners, lambda peer: held.mask_key(peer, run_context), numel)

    def adversary(self, settings: PrivacyParameters) -> str | None:
        return settings.adversary


@lru_cache(maxsize=8)
def _unit_multiplier(pairs: bytes, n: int, ratio: float, adversary: str) -> float:
    """The worst agent's effective multiplier against ``adversary`` with unit independent
    noise and masks ``ratio``."""
    import numpy as np

    from airgossip.edge.privacy.graph import cancelling_noise_multiplier

    matrix = np.frombuffer(pairs, dtype=bool).reshape(n, n)
    return cancelling_noise_multiplier(matrix, 1.0, ratio, adversary)
