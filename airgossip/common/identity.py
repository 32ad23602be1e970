"""Agent identities: how fleets name their agents, and the order ids sort in."""

from __future__ import annotations

import re
from collections.abc import Iterable

#: Prefix of the ids launchers give their agents (``agent-0``, ``agent-1``, ...).
AGENT_PREFIX = "agent-"


def agent_id(index: int) -> str:
    """The id of the agent at ``index`` of a fleet a launcher starts."""
    return f"{AGENT_PREFIX}{index}"


def agent_ids(count: int) -> list[str]:
    """The ids of a fleet of ``count`` agents, in index order."""
    return [agent_id(i) for i in range(count)]


def natural_key(name: str) -> list[object]:
    """Sort key that orders ``agent-2`` before ``agent-10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def natural_order(ids: Iterable[str]) -> tuple[str, ...]:
    """``ids`` sorted by :func:`natural_key`."""
    return tuple(sorted(ids, key=natural_key))
