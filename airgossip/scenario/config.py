"""Scenario configuration: one TOML file for a fleet run, flags on top, validated up front.

Data only: what the settings mean is up to the networks (``airgossip.emulation.networks``) and the
fleets (``airgossip.emulation.fleets``), which this module does not know.

Example scenario (every key optional)::

    agents = 16
    topology = "exponential"
    algorithm = "push-sum"
    rounds = 40
    seed = 1
    mode = "process"

    [task]
    name = "digits"
    partition = "dirichlet"
    alpha = 0.5

    [network]
    loss = 0.1
    latency_ms = 5

    [switching]            # optional: change the graph during the run
    topologies = ["complete", "ring"]
    at_rounds = [33]       # or: trigger = "loss-plateau", threshold = 0.05

    [[device_classes]]     # optional: uneven devices (airgossip.scenario.devices)
    name = "pi"
    fraction = 0.25
    speed = 0.25
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from types import UnionType
from typing import Any, TypeVar, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    SerializationInfo,
    SerializeAsAny,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from airgossip.common.topology import TOPOLOGIES, SwitchingSettings
from airgossip.edge.availability import OnlineSchedule
from airgossip.edge.settings import AgentSettings, TaskSettings
from airgossip.scenario.devices import HOST, DeviceClass, assign_classes, check_classes
from airgossip.scenario.errors import ConfigError as ConfigError
from airgossip.scenario.errors import format_validation_error
from airgossip.scenario.files import Settings as Settings
from airgossip.scenario.files import merge as merge
from airgossip.scenario.files import read_scenario as read_scenario
from airgossip.scenario.modes import MODE_TABLES, ModeSettings
from airgossip.scenario.wireless import WirelessSettings

M = TypeVar("M", bound=ModeSettings)

#: Message loss a run that emulates every link on one machine (``airgossip run``) applies when
#: its scenario says nothing: a lossy network is what the emulator is for.
EMULATED_LOSS = 0.1
#: Defaults under the scenario of agents on real links (devices, with ``airgossip agent`` and
#: ``airgossip coordinator``): nothing emulated; a scenario's ``[network]`` table still asks
#: for loss, latency or a rate limit on top of the real links.
REAL_LINKS: Settings = {"network": {"loss": 0.0}}


class NetworkSettings(BaseModel):
    """``[network]``: impairments applied to every directed link on the sending side."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    loss: float = Field(EMULATED_LOSS, ge=0, lt=1, description="message loss probability per link")
    latency_ms: float = Field(0.0, ge=0, le=600_000)
    jitter_ms: float = Field(0.0, ge=0, le=600_000)
    bandwidth_mbps: float = Field(0.0, ge=0, description="0 means unlimited")


class TransportSettings(BaseModel):
    """``[transport]``: how agents with real gRPC (every mode but inproc and virtual) move
    their payloads."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bulk_bytes: int | None = Field(
        None,
        ge=0,
        le=1 << 40,
        description="payloads of at least this many bytes leave the gRPC call for a data "
        "connection of their own, on the same certificates (the bulk path: "
        "docs/performance.md); unset: the transport's default (1 MiB in plaintext, 64 MiB "
        "over mutual TLS: where the bulk path pays); 0: every payload over the call, no data "
        "port",
    )


class RunConfig(AgentSettings):
    """A whole fleet run: the agents' settings plus fleet size, graph, network and mode."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agents: int = Field(8, ge=1, le=100_000)
    topology: str = "exponential"
    edges: list[tuple[int, int]] | None = Field(None, description="for topology = 'edges'")
    edge_probability: float | None = Field(None, gt=0, le=1, description="for erdos-renyi")
    network: NetworkSettings = Field(default_factory=NetworkSettings)
    wireless: WirelessSettings | None = Field(
        None, description="wireless channel model; replaces [network] and the topology"
    )
    mode: str = Field(
        "process", description="how agents run: a fleet mode (airgossip.emulation.fleets)"
    )
    switching: SwitchingSettings | None = Field(
        None, description="change the gossip graph during the run (its first graph is the topology)"
    )
    #: The fleet modes' own tables (``[ray]``, ``[containers]``: :mod:`airgossip.scenario.modes`)
    #: by name; written at the top level, as a scenario has them.
    modes: dict[str, SerializeAsAny[ModeSettings]] = Field(
        default_factory=lambda: {name: MODE_TABLES[name]() for name in MODE_TABLES}
    )
    transport: TransportSettings = Field(default_factory=TransportSettings)
    device_classes: list[DeviceClass] = Field(
        default_factory=list,
        description="agents' device classes: compute speed and power (airgossip.scenario.devices)",
    )
    out: Path | None = None

    @model_validator(mode="before")
    @classmethod
    def _gather_mode_tables(cls, data: Any) -> Any:
        """A scenario's mode tables (``[ray]``) into ``modes``, where they are validated."""
        if not isinstance(data, dict) or not any(key in MODE_TABLES for key in data):
            return data
        tables = {key: value for key, value in data.items() if key in MODE_TABLES}
        rest = {key: value for key, value in data.items() if key not in MODE_TABLES}
        modes = rest.get("modes")
        return {**rest, "modes": {**(modes if isinstance(modes, dict) else {}), **tables}}

    @field_validator("modes", mode="before")
    @classmethod
    def _declared_tables(cls, value: Any) -> dict[str, ModeSettings]:
        if not isinstance(value, dict):
            raise ValueError("mode tables must be tables")
        tables: dict[str, ModeSettings] = {}
        for name, table in value.items():
            if name not in MODE_TABLES:
                raise ValueError(MODE_TABLES.unknown(name))
            model = MODE_TABLES[name]
            try:
                tables[name] = table if isinstance(table, model) else model.model_validate(table)
            except ValidationError as err:
                raise PydanticCustomError(
                    "mode_table",
                    "{problems}",
                    {"problems": format_validation_error(err, within=name)},
                ) from None
        # every declared table, its defaults where none was given: a run read back from its
        # config.json equals the run
        return {name: tables.get(name) or MODE_TABLES[name]() for name in MODE_TABLES}

    @model_serializer(mode="wrap")
    def _tables_at_top(self, handler: SerializerFunctionWrapHandler,
                       info: SerializationInfo) -> dict[str, Any]:  # fmt: skip
        """Each mode's table at the top level, as a scenario writes it (a table left empty by
        leaving defaults out is not written)."""
        data: dict[str, Any] = handler(self)
        if "modes" not in data:  # left out (included fields, or defaults excluded)
            return data
        for name, table in data.pop("modes").items():
            if table or not info.exclude_defaults:
                data[name] = table
        return data

    def mode_settings(self, model: type[M]) -> M:
        """The run's ``model`` table (a mode's settings), its defaults where the scenario has
        none."""
        table = self.modes.get(model.table)
        return table if isinstance(table, model) else model()

    def with_mode_settings(self, table: ModeSettings) -> RunConfig:
        """This run with ``table`` in place of its mode table of that name."""
        return self.model_copy(update={"modes": {**self.modes, table.table: table}})

    @field_validator("topology")
    @classmethod
    def _known_topology(cls, value: str) -> str:
        if value not in TOPOLOGIES:
            raise ValueError(f"unknown topology '{value}'; choose one of: {', '.join(TOPOLOGIES)}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _topology_from_switching(cls, data: Any) -> Any:
        """With ``[switching]`` and no ``topology``, the run's topology is the schedule's
        first (so every consumer of ``topology`` sees the graph the run starts on)."""
        if not isinstance(data, dict) or "topology" in data:
            return data
        switching = data.get("switching")
        if isinstance(switching, SwitchingSettings):
            first: Any = switching.topologies[0]
        elif isinstance(switching, dict) and isinstance(switching.get("topologies"), list):
            first = switching["topologies"][0] if switching["topologies"] else None
        else:
            return data
        return {**data, "topology": first} if isinstance(first, str) else data

    @model_validator(mode="after")
    def _one_first_graph(self) -> RunConfig:
        switching = self.switching
        if switching is None:
            return self
        if self.wireless is not None:
            raise ValueError(
                "[switching] needs [network] links: a wireless network's graph comes from its "
                "channel model"
            )
        first = switching.topologies[0]
        if self.topology != first:
            raise ValueError(
                f"the run starts on the first topology of [switching], '{first}', and topology "
                f"says '{self.topology}'; leave topology out or make them agree"
            )
        return self

    @model_validator(mode="after")
    def _classes_fit(self) -> RunConfig:
        check_classes(self.device_classes, self.agents)
        return self

    def device_class(self, index: int) -> DeviceClass:
        """The device class of agent ``index`` (:data:`~airgossip.scenario.devices.HOST`
        where the scenario has none)."""
        if not self.device_classes:
            return HOST
        return self._assigned()[index]

    def wait_timeout_of(self, index: int) -> float:
        """Agent ``index``'s longest wait for in-neighbours per round: its device class's,
        or the run's."""
        own = self.device_class(index).wait_timeout_s
        return self.wait_timeout_s if own is None else own

    def online_schedule(self, index: int) -> OnlineSchedule | None:
        """When agent ``index`` is on, by its device class (None: always)."""
        return self.device_class(index).availability.schedule(self.seed, index)

    def device_assignment(self) -> list[DeviceClass]:
        """Every agent's device class, by index (drawn once per scenario and kept: asking
        for each agent of a large fleet costs no more than asking once)."""
        if not self.device_classes:
            return [HOST] * self.agents
        return list(self._assigned())

    def _assigned(self) -> tuple[DeviceClass, ...]:
        classes = tuple(c.model_dump_json() for c in self.device_classes)
        return _assignment(classes, self.agents, self.seed)

    @property
    def network_kind(self) -> str:
        """Which network the links are: ``wireless`` with a ``[wireless]`` table, else
        ``static`` (the one place that asks)."""
        return "static" if self.wireless is None else "wireless"

    @property
    def emulates_links(self) -> bool:
        """Whether anything is emulated on the links (a loss, latency, jitter or rate limit,
        or a wireless channel)."""
        n = self.network
        return self.wireless is not None or bool(
            n.loss or n.latency_ms or n.jitter_ms or n.bandwidth_mbps
        )

    def agent_settings(self) -> AgentSettings:
        return AgentSettings.model_validate(
            self.model_dump(include=set(AgentSettings.model_fields))
        )


@functools.lru_cache(maxsize=16)
def _assignment(classes: tuple[str, ...], agents: int, seed: int) -> tuple[DeviceClass, ...]:
    """:func:`assign_classes` of the classes (as JSON), kept for the scenarios in use."""
    models = [DeviceClass.model_validate_json(c) for c in classes]
    return tuple(assign_classes(models, agents, seed))


#: The keys a scenario may hold: each table's keys in its model's order, a nested table
#: (or, under ``"[]"``, the tables of an array) by its own keys, None where any value goes.
KeyTree = dict[str, "KeyTree | None"]


def setting_keys(model: type[BaseModel] = RunConfig) -> KeyTree:
    """The keys ``model`` accepts, its closed tables (``extra="forbid"``) walked down; a
    run's mode tables by their own names.

    The CLI refuses a misspelled key with it before torch is imported (this module imports
    neither torch nor SciPy)."""
    keys = {name: _field_keys(field.annotation) for name, field in model.model_fields.items()}
    if issubclass(model, RunConfig):
        del keys["modes"]
        keys.update({name: setting_keys(MODE_TABLES[name]) for name in MODE_TABLES})
    return keys


def _field_keys(annotation: Any) -> KeyTree | None:
    options = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else ()
    tables = [a for a in options or (annotation,) if a is not type(None)]
    if len(tables) != 1:
        return None
    (table,) = tables
    if get_origin(table) is list and len(get_args(table)) == 1:
        items = _field_keys(get_args(table)[0])
        return {"[]": items} if items is not None else None
    if isinstance(table, type) and issubclass(table, BaseModel):
        return setting_keys(table) if table.model_config.get("extra") == "forbid" else None
    return None


def load_config(
    path: Path | None = None,
    overrides: Settings | None = None,
    *,
    base: Settings | None = None,
    real_links: bool = False,
) -> RunConfig:
    """``base`` (a wireless scenario) + scenario file (optional) + flag overrides ->
    validated :class:`RunConfig`. ``real_links``: the agents talk over real links (devices),
    where nothing is emulated unless the scenario asks (:data:`REAL_LINKS`); otherwise every
    link is emulated, with :data:`EMULATED_LOSS` unless the scenario says otherwise."""
    data = merge(REAL_LINKS if real_links else {}, base or {})
    data = merge(data, read_scenario(path) if path is not None else {})
    data = merge(data, overrides or {})
    try:
        return with_private_defaults(RunConfig.model_validate(data))
    except ValidationError as err:
        source = f"scenario {path}" if path is not None else "settings"
        raise ConfigError(f"bad {source}: {format_validation_error(err)}") from None


def private_defaults(task: str) -> dict[str, JsonValue]:
    """The options a ``[privacy]`` run of built-in task ``task`` uses where ``[task]`` sets
    none (its ``private_defaults``: digits' step size); none for a user's own task."""
    from airgossip.edge.tasks.registry import BUILTIN_TASKS  # torch: only where a run is private

    factory = BUILTIN_TASKS.get(task)
    return dict(getattr(factory, "private_defaults", {}))


def with_private_defaults(config: RunConfig) -> RunConfig:
    """``config`` with its task's private defaults filled in where ``[privacy]`` is on and
    ``[task]`` leaves them unset: a private round is one clipped, noisy step on the whole
    shard, which the task's own step size (for several small local steps) leaves far behind
    (docs/privacy.md). Resolved here, once per run: the result carries the values as if
    written (``config.json``, ``results.json``), so every agent runs them and a config read
    back is unchanged; a value the user set is kept."""
    if not config.privacy.enabled:
        return config
    options = config.task.options
    missing = {k: v for k, v in private_defaults(config.task.name).items() if k not in options}
    if not missing:
        return config
    task = TaskSettings.model_validate({**config.task.model_dump(), **missing})
    return config.model_copy(update={"task": task})


def scenario_toml(config: RunConfig) -> str:
    """``config`` as a scenario file: every setting that differs from its default, and the
    whole ``[network]`` table (whose defaults differ on real links), so that
    :func:`load_config` of the text gives ``config`` back, with ``real_links`` or without."""
    data = config.model_dump(mode="json", exclude_defaults=True)
    data["network"] = config.network.model_dump(mode="json")
    lines: list[str] = []
    _toml_table(data, [], lines)
    return "\n".join(lines).lstrip("\n") + "\n"


def _toml_value(value: JsonValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def _toml_table(data: Settings, path: list[str], lines: list[str]) -> None:
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    arrays = {k: [x for x in v if isinstance(x, dict)] for k, v in data.items()
              if isinstance(v, list) and v and all(isinstance(x, dict) for x in v)}  # fmt: skip
    for key, value in data.items():
        if key not in tables and key not in arrays and value is not None:
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    for key, table in tables.items():
        lines += ["", f"[{'.'.join(_toml_key(k) for k in [*path, key])}]"]
        _toml_table(table, [*path, key], lines)
    for key, items in arrays.items():
        for item in items:
            lines += ["", f"[[{'.'.join(_toml_key(k) for k in [*path, key])}]]"]
            _toml_table(item, [*path, key], lines)


def _toml_key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else json.dumps(key)
