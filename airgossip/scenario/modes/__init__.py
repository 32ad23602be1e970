"""The settings tables of fleet modes: ``[ray]``, ``[containers]``, one module each.

A fleet mode with settings of its own declares them as a :class:`ModeSettings` model in a
module here, named by its ``table`` (the mode's name), and registers it with one line in
:data:`MODE_TABLES`; its fleet (``airgossip.emulation.fleets``) declares the same model as
its ``settings_model`` and reads the run's table with ``config.mode_settings(Model)``. A
scenario's tables are validated with the run's other settings, before any fleet or torch is
imported, and a table no mode declares is refused by name. Nothing else changes for a new
mode: the run's config (:class:`~airgossip.scenario.config.RunConfig`) keeps every declared
table it is given, and writes each at the top level of ``config.json`` and ``results.json``
as the scenario had it.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from airgossip.common.plugins import PluginRegistry


class ModeSettings(BaseModel):
    """A fleet mode's settings table; ``table`` is its name in a scenario (the mode's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    table: ClassVar[str]


_HERE = "airgossip.scenario.modes"

#: Every mode's settings table by name (the mode's); the models (no torch) load with the first
#: run config, which holds every table, its defaults where a scenario has none.
MODE_TABLES: PluginRegistry[type[ModeSettings]] = PluginRegistry(
    "mode table",
    {
        "containers": f"{_HERE}.containers:ContainerSettings",
        "ray": f"{_HERE}.ray:RaySettings",
    },
    declares="table",
)
