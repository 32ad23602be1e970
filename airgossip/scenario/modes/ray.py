"""``[ray]``: where and how ``mode = "ray"`` runs its agents as Ray actors (its fleet:
``airgossip.emulation.fleets.ray_fleet``)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, field_validator

from airgossip.scenario.modes import ModeSettings


def ray_address_problem(address: str) -> str | None:
    """What is wrong with a Ray address (``[ray] address``, ``--ray-address``,
    ``RAY_ADDRESS``), in one line, or None: ``auto``, ``local``, ``host:port`` or
    ``ray://host:port`` (torch-free: the CLI asks before anything heavy is imported)."""
    if address in ("auto", "local"):
        return None
    rest = address.removeprefix("ray://")
    host, colon, port = rest.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")  # [::1]:6379
    if (
        colon
        and host
        and not any(c.isspace() or c in "/@?#" for c in host)
        and port.isdigit()
        and 1 <= int(port) <= 65535
    ):
        return None
    return (
        f"bad Ray address '{address}': give auto, local, host:port or ray://host:port "
        "(port 1..65535)"
    )


class RaySettings(ModeSettings):
    """``[ray]``: where and how ``mode = "ray"`` runs its agents as Ray actors."""

    table: ClassVar[str] = "ray"

    address: str | None = Field(
        None,
        min_length=1,
        description="the cluster to join: 'auto', 'ray://host:port' or 'host:port' ('local' "
        "or none: start a local Ray on loopback); --ray-address and RAY_ADDRESS set it too",
    )
    num_cpus: float = Field(1.0, gt=0, le=1024, description="CPUs Ray reserves per agent")
    num_gpus: float = Field(0.0, ge=0, le=64, description="GPUs Ray reserves per agent")
    agents_per_host: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="agents one host actor forks from its one import of torch (none: the "
        "fleet split evenly over the cluster's nodes, one host each)",
    )
    placement: Literal["spread", "strict-spread", "pack"] = Field(
        "spread",
        description="spread the agents over the nodes, one agent per node (strict-spread), "
        "or pack them onto few",
    )
    max_restarts: int = Field(
        3, ge=-1, description="restarts of an agent's actor whose node died (-1: no limit)"
    )
    checkpoints: Path | None = Field(
        None,
        description="a folder on storage every node shares for the agents' checkpoints "
        "(none: shipped to a checkpoint store actor beside the driver)",
    )
    checkpoint_interval_s: float = Field(5.0, gt=0, le=3600)

    @field_validator("address")
    @classmethod
    def _known_address(cls, address: str | None) -> str | None:
        problem = ray_address_problem(address) if address is not None else None
        if problem is not None:
            raise ValueError(problem)
        return address
