"""The algorithms by the name users pick with ``--algorithm``, and building one by name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from airgossip.edge.algorithms.adaptive_consensus import AdaptiveConsensusDPSGD
from airgossip.edge.algorithms.base import GossipAlgorithm, parse_algorithm_options
from airgossip.edge.algorithms.dpsgd import DPSGD
from airgossip.edge.algorithms.ensemble import EnsembleCompression
from airgossip.edge.algorithms.gradient_tracking import GradientTracking
from airgossip.edge.algorithms.local_sgd import LocalSGD
from airgossip.edge.algorithms.push_sum import PlainPushSum, PushSum
from airgossip.edge.algorithms.robust import ClippedGossip, CSPlusGossip
from airgossip.edge.algorithms.robust_push_sum import RobustPushSum
from airgossip.edge.algorithms.shared_copy import Choco, QuantizedPushSum
from airgossip.edge.compression import Codec

#: Algorithms by the name users pick with ``--algorithm``.
ALGORITHMS: dict[str, type[GossipAlgorithm]] = {
    cls.name: cls
    for cls in (
        PushSum,
        PlainPushSum,
        DPSGD,
        AdaptiveConsensusDPSGD,
        QuantizedPushSum,
        Choco,
        GradientTracking,
        LocalSGD,
        EnsembleCompression,
        ClippedGossip,
        CSPlusGossip,
        RobustPushSum,
    )
}


def algorithm_class(name: str) -> type[GossipAlgorithm]:
    """The class of algorithm ``name``; ``ValueError`` naming the allowed ones."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm '{name}'; choose one of: {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]


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
    cls = algorithm_class(name)
    cls.check_codec(codec)
    parse_algorithm_options(name, cls.options_model, options)
