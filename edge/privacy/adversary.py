"""Whom the cancelling mechanism's epsilon is against (DECOR's SecLDP, ``docs/privacy.md``),
a leaf that settings and the graph computations both read.

``curious-agent``: any one agent of the fleet that also reads every link (it knows its own
noise and the secrets of its own pairs); ``eavesdropper``: an observer of every link that is
no agent (it knows no pair's secret and no agent's noise), as the coordinator.
"""

from __future__ import annotations

from typing import Literal, get_args

Adversary = Literal["curious-agent", "eavesdropper"]
ADVERSARIES: tuple[str, ...] = get_args(Adversary)
