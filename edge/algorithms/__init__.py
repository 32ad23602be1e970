"""Gossip algorithms: pure tensor code, no I/O and no clocks.

The names below are loaded on first use (PEP 562): :mod:`airgossip.edge.algorithms.graph_needs`,
what an algorithm asks of its graph, is read by checks that run before torch is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airgossip.common.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from airgossip.edge.algorithms.adaptive_consensus import AdaptiveConsensusDPSGD
    from airgossip.edge.algorithms.base import (
        Ack,
        GossipAlgorithm,
        InvalidPayload,
        Payload,
        ProtocolError,
    )
    from airgossip.edge.algorithms.dpsgd import DPSGD
    from airgossip.edge.algorithms.ensemble import EnsembleCompression
    from airgossip.edge.algorithms.gradient_tracking import GradientTracking
    from airgossip.edge.algorithms.local_sgd import LocalSGD
    from airgossip.edge.algorithms.push_sum import PlainPushSum, PushSum
    from airgossip.edge.algorithms.registry import (
        ALGORITHMS,
        algorithm_class,
        check_algorithm_settings,
        create_algorithm,
    )
    from airgossip.edge.algorithms.robust import ClippedGossip, CSPlusGossip
    from airgossip.edge.algorithms.robust_push_sum import RobustPushSum
    from airgossip.edge.algorithms.shared_copy import Choco, QuantizedPushSum, SharedCopyGossip

#: Each public name and the module that defines it.
_HOMES = {
    "AdaptiveConsensusDPSGD": "airgossip.edge.algorithms.adaptive_consensus",
    **dict.fromkeys(["Ack", "GossipAlgorithm", "InvalidPayload", "Payload", "ProtocolError"],
                    "airgossip.edge.algorithms.base"),
    "DPSGD": "airgossip.edge.algorithms.dpsgd",
    "EnsembleCompression": "airgossip.edge.algorithms.ensemble",
    "GradientTracking": "airgossip.edge.algorithms.gradient_tracking",
    "LocalSGD": "airgossip.edge.algorithms.local_sgd",
    **dict.fromkeys(["PlainPushSum", "PushSum"], "airgossip.edge.algorithms.push_sum"),
    **dict.fromkeys(["ALGORITHMS", "algorithm_class", "check_algorithm_settings",
                     "create_algorithm"], "airgossip.edge.algorithms.registry"),
    **dict.fromkeys(["ClippedGossip", "CSPlusGossip"], "airgossip.edge.algorithms.robust"),
    "RobustPushSum": "airgossip.edge.algorithms.robust_push_sum",
    **dict.fromkeys(["Choco", "QuantizedPushSum", "SharedCopyGossip"],
                    "airgossip.edge.algorithms.shared_copy"),
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
