"""Gossip algorithms: pure tensor code, no I/O and no clocks.

The names below are loaded on first use (PEP 562): :mod:`edge.algorithms.graph_needs`, what
an algorithm asks of its graph, is read by checks that run before torch is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from edge.algorithms.adaptive_consensus import AdaptiveConsensusDPSGD
    from edge.algorithms.base import Ack, GossipAlgorithm, InvalidPayload, Payload, ProtocolError
    from edge.algorithms.dpsgd import DPSGD
    from edge.algorithms.ensemble import EnsembleCompression
    from edge.algorithms.gradient_tracking import GradientTracking
    from edge.algorithms.local_sgd import LocalSGD
    from edge.algorithms.push_sum import PlainPushSum, PushSum
    from edge.algorithms.registry import (
        ALGORITHMS,
        algorithm_class,
        check_algorithm_settings,
        create_algorithm,
    )
    from edge.algorithms.robust import ClippedGossip, CSPlusGossip
    from edge.algorithms.robust_push_sum import RobustPushSum
    from edge.algorithms.shared_copy import Choco, QuantizedPushSum, SharedCopyGossip

#: Each public name and the module that defines it.
_HOMES = {
    "AdaptiveConsensusDPSGD": "edge.algorithms.adaptive_consensus",
    **dict.fromkeys(["Ack", "GossipAlgorithm", "InvalidPayload", "Payload", "ProtocolError"],
                    "edge.algorithms.base"),
    "DPSGD": "edge.algorithms.dpsgd",
    "EnsembleCompression": "edge.algorithms.ensemble",
    "GradientTracking": "edge.algorithms.gradient_tracking",
    "LocalSGD": "edge.algorithms.local_sgd",
    **dict.fromkeys(["PlainPushSum", "PushSum"], "edge.algorithms.push_sum"),
    **dict.fromkeys(["ALGORITHMS", "algorithm_class", "check_algorithm_settings",
                     "create_algorithm"], "edge.algorithms.registry"),
    **dict.fromkeys(["ClippedGossip", "CSPlusGossip"], "edge.algorithms.robust"),
    "RobustPushSum": "edge.algorithms.robust_push_sum",
    **dict.fromkeys(["Choco", "QuantizedPushSum", "SharedCopyGossip"],
                    "edge.algorithms.shared_copy"),
}  # fmt: skip


__getattr__ = lazy_exports(__name__, _HOMES)


__all__ = [
    "ALGORITHMS",
    "DPSGD",
    "Ack",
    "AdaptiveConsensusDPSGD",
    "CSPlusGossip",
    "Choco",
    "ClippedGossip",
    "EnsembleCompression",
    "GossipAlgorithm",
    "GradientTracking",
    "InvalidPayload",
    "LocalSGD",
    "Payload",
    "PlainPushSum",
    "ProtocolError",
    "PushSum",
    "QuantizedPushSum",
    "RobustPushSum",
    "SharedCopyGossip",
    "algorithm_class",
    "check_algorithm_settings",
    "create_algorithm",
]
