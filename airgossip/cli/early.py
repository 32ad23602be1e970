"""Flags checked before anything heavy is imported, so that a bad one is answered at once.

The settings' full validation (``airgossip.scenario.config``) builds what the settings name,
and that imports torch: seconds before a typo is reported. What a setting can be checked against
without it is checked here first: against the names the registries list (they import none of
what they register: :mod:`airgossip.cli.choices`) and the keys a scenario may hold (read from
the settings' models, which import neither torch nor SciPy), and with the torch-free rules the
full validation itself asks (a codec spec: ``airgossip.edge.compression.forms``; what an
algorithm asks of its graph: ``airgossip.edge.algorithms.graph_needs`` with the graph built by
``airgossip.common.topology``; a user's ``module:callable`` task:
``airgossip.edge.tasks.custom``), in the same words as the full validation:
``tests/system/test_cli_early.py`` holds the two to the same message for every bad value.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from airgossip.cli.choices import registry_names
from airgossip.cli.display import fail
from airgossip.edge.compression.forms import check_compression
from airgossip.scenario.errors import ConfigError, format_validation_error, unknown_setting
from airgossip.scenario.files import Settings, merge, read_scenario

if TYPE_CHECKING:
    from airgossip.scenario.config import KeyTree

#: The settings the first graph of a run is built from.
_GRAPH_SETTINGS = ("algorithm", "topology", "agents", "seed", "edges", "edge_probability")
#: The most agents whose graph is built here too (a 16 MB dense graph): beyond, building it
#: twice costs more than the import it spares.
_EARLY_GRAPH_AGENTS = 4096


class _Network(BaseModel):
    model_config = ConfigDict(extra="ignore")

    loss: float = Field(0.0, ge=0, lt=1)


class _Flags(BaseModel):
    """The bounds of the flags' settings, as ``RunConfig`` and ``AgentSettings`` set them."""

    model_config = ConfigDict(extra="ignore")

    agents: int = Field(8, ge=1, le=100_000)
    rounds: int = Field(40, ge=1, le=10_000_000)
    seed: int = Field(0, ge=0)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    network: _Network = Field(default_factory=_Network)


def _names(placeholder: str) -> list[str]:
    return registry_names()[placeholder].split(", ")


def _settings_problem(flags: Settings) -> str | None:
    """What the full validation would say of these flags' values (first problem), or None."""
    topology = flags.get("topology")
    if isinstance(topology, str) and topology not in _names("topologies"):
        return (
            f"topology: unknown topology '{topology}'; choose one of: "
            f"{registry_names()['topologies']}"
        )
    algorithm = flags.get("algorithm")
    if isinstance(algorithm, str) and algorithm not in _names("algorithms"):
        return (
            f"algorithm: unknown algorithm '{algorithm}'; choose one of: "
            f"{registry_names()['algorithms']}"
        )
    compression = flags.get("compression")
    if isinstance(compression, str):
        try:
            check_compression(compression)
        except ValueError as err:
            return f"compression: {err}"
    try:
        _Flags.model_validate(flags)
    except ValidationError as err:
        return format_validation_error(err)
    return None


def check_scenario_file(path: Path) -> Settings:
    """Refuse a scenario file that cannot be read or is not TOML, as the full check does;
    its settings, as read."""
    try:
        return read_scenario(path)
    except ConfigError as err:
        fail(str(err))


class SettingKeys(TypedDict):
    """What a scenario may hold, as the early checks read it."""

    #: The keys a scenario may hold.
    keys: KeyTree
    #: The defaults of the settings a run's graph is built from.
    defaults: Settings


@cache
def setting_keys() -> SettingKeys:
    """The keys a scenario may hold (a :data:`~airgossip.scenario.config.KeyTree`) and the
    defaults of the settings a run's graph is built from, read from the settings' models
    (which import no torch)."""
    from airgossip.scenario.config import RunConfig
    from airgossip.scenario.config import setting_keys as model_keys

    defaults = {name: RunConfig.model_fields[name].default for name in _GRAPH_SETTINGS}
    return {"keys": model_keys(), "defaults": defaults}


def unknown_settings(data: Any, keys: KeyTree, where: tuple[str | int, ...] = ()) -> list[str]:
    """The keys of ``data`` that ``keys`` does not hold, dotted, in the order the settings'
    validation names them (each table's known keys in its model's order, then its unknown
    ones)."""
    if not isinstance(data, dict):
        return []
    found = []
    for key, inner in keys.items():
        value = data.get(key)
        if inner is None or value is None:
            continue
        if "[]" in inner and isinstance(value, list):
            items = inner["[]"] or {}
            for index, item in enumerate(value):
                found += unknown_settings(item, items, (*where, key, index))
        else:
            found += unknown_settings(value, inner, (*where, key))
    return found + [".".join(map(str, (*where, key))) for key in data if key not in keys]


def check_flags(flags: Settings, config: Path | None = None) -> None:
    """Refuse (one line, exit 2) flag values the full validation would refuse, worded as it
    words them; ``config``: the scenario file the flags override (it names the source, and
    is read here: a missing or broken file is refused first, as the full check does)."""
    scenario = check_scenario_file(config) if config is not None else {}
    unknown = unknown_settings(scenario, setting_keys()["keys"])
    flags = merge(scenario, flags)  # a value the file holds is checked as a flag's is
    problem = "; ".join(map(unknown_setting, unknown)) or _settings_problem(flags)
    if problem is not None:
        source = f"scenario {config}" if config is not None else "settings"
        fail(f"bad {source}: {problem}")
    mode = flags.get("mode")
    if isinstance(mode, str) and mode not in _names("mode_names"):
        fail(f"unknown mode '{mode}'; choose one of: {registry_names()['mode_names']}")
    task = flags.get("task")
    name = task.get("name") if isinstance(task, dict) else None
    if isinstance(name, str) and name not in _names("tasks") and ":" not in name:
        fail(
            f"unknown task '{name}'; choose one of: {registry_names()['tasks']}, "
            "or give your own as module:callable"
        )


def check_run(
    flags: Settings, config: Path | None = None, *, wireless: bool = False, app: bool = False
) -> None:
    """Refuse (one line, exit 2) what a run's preflight would refuse of settings that passed
    :func:`check_flags`, in its words: an algorithm on a graph it cannot run on, a task of
    the user's that cannot be found (imported when found, with whatever it imports).
    ``wireless``: a ``--scenario`` gives the run its graph; ``app``: a Flower app is the
    task."""
    from airgossip.edge.algorithms.graph_needs import directed_graph_refusal, supports_directed

    scenario = check_scenario_file(config) if config is not None else {}
    run: dict[str, Any] = merge(merge(setting_keys()["defaults"], scenario), flags)
    algorithm, topology, agents = run["algorithm"], run["topology"], run["agents"]
    static = not wireless and "wireless" not in scenario and "switching" not in scenario
    if (
        static
        and isinstance(algorithm, str)
        and not supports_directed(algorithm)
        and isinstance(topology, str)
        and isinstance(agents, int)
        and agents <= _EARLY_GRAPH_AGENTS
    ):
        from airgossip.common.topology.graphs import build_graph

        try:  # the named graphs are connected by construction: no SciPy to check it
            graph = build_graph(
                topology, agents, seed=run["seed"], edges=run["edges"],
                p=run["edge_probability"], require_strongly_connected=topology == "edges",
            )  # fmt: skip
        except (ValueError, TypeError, IndexError):
            graph = None  # the full validation says what is wrong with them
        if graph is not None and not graph.is_undirected:
            fail(directed_graph_refusal(algorithm, topology))
    task = run.get("task")
    task = task.get("name") if isinstance(task, dict) else None
    if not app and isinstance(task, str) and ":" in task and task not in _names("tasks"):
        from airgossip.edge.tasks.custom import TaskError, import_task_factory

        try:
            import_task_factory(task)
        except TaskError as err:
            fail(str(err))


def check_scenario(scenario: str | None) -> None:
    """Refuse a ``--scenario`` that is neither a preset nor a file, as the full check does."""
    if scenario is None:
        return
    candidate = Path(scenario)
    if candidate.suffix == ".toml" or candidate.exists():
        if not candidate.exists():
            fail(f"scenario file {candidate} does not exist")
        return
    if scenario not in _names("presets"):
        fail(
            f"unknown scenario '{scenario}'; choose one of: {registry_names()['presets']}, "
            "or give a .toml file"
        )


def check_policy(topology: str | None) -> None:
    """Refuse a coordinator's ``--topology`` that is neither a graph nor its own ``k-out``."""
    names = [*_names("topologies"), "k-out"]
    if topology is not None and topology not in names:
        fail(f"unknown topology '{topology}'; choose one of: {', '.join(names)}")


def check_port(flag: str, port: int | None, *, lowest: int = 0) -> None:
    """Refuse a port number outside ``lowest``..65535."""
    if port is not None and not lowest <= port <= 65535:
        fail(f"{flag} must be within {lowest}..65535, got {port}")
