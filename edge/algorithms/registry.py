"""The algorithms by the name users pick with ``--algorithm``, and building one by name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airgossip.common.plugins import PluginRegistry

if TYPE_CHECKING:
    import torch

    from airgossip.edge.algorithms.base import GossipAlgorithm
    from airgossip.edge.compression import Codec

#: Algorithms by the name users pick with ``--algorithm``, in the order help texts list them:
#: one line each (the class declares the same ``name``); a class is imported when looked up.
ALGORITHMS: PluginRegistry[type[GossipAlgorithm]] = PluginRegistry(
    "algorithm",
    {
        "push-sum": "airgossip.edge.algorithms.push_sum:PushSum",
        "push-sum-plain": "airgossip.edge.algorithms.push_sum:PlainPushSum",
        "dpsgd": "airgossip.edge.algorithms.dpsgd:DPSGD",
        "dpsgd-ac": "airgossip.edge.algorithms.adaptive_consensus:AdaptiveConsensusDPSGD",
        "quantized-push-sum": "airgossip.edge.algorithms.shared_copy:QuantizedPushSum",
        "choco": "airgossip.edge.algorithms.shared_copy:Choco",
        "gradient-tracking": "airgossip.edge.algorithms.gradient_tracking:GradientTracking",
        "local-sgd": "airgossip.edge.algorithms.local_sgd:LocalSGD",
        "ensemble": "airgossip.edge.algorithms.ensemble:EnsembleCompression",
        "clipped-gossip": "airgossip.edge.algorithms.robust:ClippedGossip",
        "cs-plus-gossip": "airgossip.edge.algorithms.robust:CSPlusGossip",
        "robust-push-sum": "airgossip.edge.algorithms.robust_push_sum:RobustPushSum",
    },
)


def algorithm_class(name: str) -> type[GossipAlgorithm]:
    """The class of algorithm ``name``; ``ValueError`` naming the allowed ones."""
    return ALGORITHMS.get_plugin(name)


def create_algorithm(
    name: str,
    initial: torch.Tensor,
    *,
    dtype: torch.dtype,
    codec: Codec | None = None,
    seed: int = 0,
    options: Mapping[str, Any] | None = None,
    shared_start: bool = False,
) -> GossipAlgorithm:
    """Build the algorithm ``name`` around initial parameters; ``ValueError`` if unknown or
    given options or a codec it cannot use (see :class:`GossipAlgorithm` for the arguments)."""
    return algorithm_class(name)(
        initial, dtype=dtype, codec=codec, seed=seed, options=options, shared_start=shared_start
    )


def check_algorithm_settings(name: str, codec: Codec, options: Mapping[str, Any]) -> None:
    """Everything about an algorithm's settings that can be checked without a model."""
    from airgossip.edge.algorithms.base import parse_algorithm_options

    cls = algorithm_class(name)
    cls.check_codec(codec)
    parse_algorithm_options(name, cls.options_model, options)
