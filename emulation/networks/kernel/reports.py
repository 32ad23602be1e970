"""What the kernel applied and measured, as ``kernel.json`` holds it: one agent's share (an
agent that shapes its own links), a namespace fleet's, a container fleet's."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from airgossip.common.security.private_files import write_private


class _Report(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def write(self, path: Path) -> None:
        """Write the report as JSON (fields never set left out)."""
        data = self.model_dump(mode="json", exclude_unset=True)
        write_private(path, json.dumps(data, indent=2) + "\n")


class LinkSummary(_Report):
    """One directed link: what was applied and what the receiver's counters measured."""

    sender: str
    receiver: str
    packets_seen: int
    packets_dropped: int
    bytes_delivered: int
    busy_s: float
    busy_bytes: int
    applied_loss_weighted: float
    applied_rate_busy: float
    drop_rate: float | None
    model_loss: float | None
    throughput_bps: float | None
    model_rate_bps: float | None


class AgentKernelReport(_Report):
    """One agent's kernel shaping (``<id>.kernel.json``): its in-links, or why it shaped
    its links in the agent instead (``kernel`` false and a ``reason``)."""

    kernel: bool
    agent: str
    reason: str | None = None
    device: str | None = None
    netem: bool | None = None
    unapplied: list[str] = []
    controller_errors: list[str] = []
    links: list[LinkSummary] = []

    @classmethod
    def read(cls, path: Path, agent_id: str) -> AgentKernelReport:
        """The report an agent left at ``path``; one saying it shaped nothing in the kernel
        when there is none (or it cannot be read)."""
        try:
            return cls.model_validate_json(path.read_text())
        except (OSError, ValidationError):
            return cls(agent=agent_id, kernel=False)


class NamespaceKernelReport(_Report):
    """A namespace fleet's ``kernel.json``: every directed link, shaped from outside."""

    netem: bool
    unapplied: list[str]
    controller_errors: list[str]
    links: list[LinkSummary]


class ContainerKernelReport(_Report):
    """A container fleet's ``kernel.json``: every agent's in-links, gathered."""

    agents_shaping_in_kernel: int
    #: Agents that shaped their links in the agent, with why.
    fallback: dict[str, str]
    unapplied: list[str]
    controller_errors: list[str]
    links: list[LinkSummary]

    @classmethod
    def gather(cls, agents: Sequence[AgentKernelReport]) -> ContainerKernelReport:
        """The fleet's report from each agent's."""
        return cls(
            agents_shaping_in_kernel=sum(1 for a in agents if a.kernel),
            fallback={a.agent: a.reason or "" for a in agents if not a.kernel},
            unapplied=sorted({u for a in agents for u in a.unapplied}),
            controller_errors=[e for a in agents for e in a.controller_errors][:5],
            links=[link for a in agents for link in a.links],
        )
