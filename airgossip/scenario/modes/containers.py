"""``[containers]``: how ``mode = "containers"`` runs its agents (its fleet:
``airgossip.emulation.fleets.containers``)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from airgossip.scenario.modes import ModeSettings


class ContainerSettings(ModeSettings):
    """``[containers]``: how ``mode = "containers"`` runs its agents."""

    table: ClassVar[str] = "containers"

    image: str = Field(
        "airgossip:latest",
        min_length=1,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$",
        description="the agent image (docker-compose build, or deploy/docker/build)",
    )
    net_admin: bool = Field(
        True,
        description="give agents NET_ADMIN so each shapes its links in the kernel (without "
        "it they shape them in the agent)",
    )
