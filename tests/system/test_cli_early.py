"""The command line answers at once: a bad flag is refused before torch, gRPC or Flower is
imported, in the same words the full validation uses; ``--version``; every help fits 80
columns with no option name cut."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import click
import pytest
import typer.main
from pydantic import BaseModel
from typer.testing import CliRunner

from airgossip.cli import app
from airgossip.cli.choices import registry_names
from airgossip.cli.early import (
    _Flags,
    _Network,
    check_flags,
    check_run,
    setting_keys,
)
from airgossip.coordinator.policy import POLICIES
from airgossip.edge.tasks import TaskError, resolve_task_factory
from airgossip.edge.tasks.flower import FlowerAppError, load_flower_app
from airgossip.emulation.baselines.flower import FlowerBaseline
from airgossip.emulation.baselines.flower import _check as check_baseline
from airgossip.emulation.fleets import fleet_class, preflight
from airgossip.scenario.config import (
    ConfigError,
    NetworkSettings,
    RunConfig,
    Settings,
    load_config,
    read_scenario,
)
from airgossip.scenario.results import FinalFigures, RoundFigures, RunResults
from airgossip.scenario.wireless import ScenarioNotFound, scenario_path
from tests.support.cli import ROOT

#: Modules a refusal must not have imported (each takes seconds to import).
HEAVY = ("torch", "grpc", "flwr", "scipy", "matplotlib")


def _settings(overrides: Settings, config: Path | None = None) -> str:
    try:
        load_config(config, overrides)
    except ConfigError as err:
        return str(err)
    raise AssertionError(f"{overrides} passed the full validation")


def _raised(call: Callable[[], object], *errors: type[Exception]) -> str:
    try:
        call()
    except errors as err:
        return str(err)
    raise AssertionError("no error")


def _bounds(model: type[BaseModel], field: str) -> dict[str, object]:
    """The numeric bounds (ge, gt, le, lt) a pydantic field sets."""
    return {
        name: getattr(m, name)
        for m in model.model_fields[field].metadata
        for name in ("ge", "gt", "le", "lt")
        if getattr(m, name, None) is not None
    }


MOST_AGENTS = _bounds(RunConfig, "agents")["le"]
assert isinstance(MOST_AGENTS, int)

#: A valid scenario file the flags override (written by the fixture below).
SCENARIO = Path(tempfile.gettempdir()) / f"airgossip-early-{os.getpid()}.toml"
#: A scenario file that is not TOML.
BROKEN = SCENARIO.with_suffix(".broken.toml")
#: A scenario file with misspelt keys, some in tables.
MISSPELT = SCENARIO.with_suffix(".misspelt.toml")
#: A scenario file with a value out of bounds.
OUT_OF_BOUNDS = SCENARIO.with_suffix(".bounds.toml")

#: A command line with a bad flag, and what the full validation says of it.
CASES: list[tuple[list[str], Callable[[], str]]] = [
    (["run", "--topology", "star"], lambda: _settings({"topology": "star"})),
    (["run", "--algorithm", "gossip"], lambda: _settings({"algorithm": "gossip"})),
    (["run", "--compression", "zip"], lambda: _settings({"compression": "zip"})),
    (["run", "--agents", "0"], lambda: _settings({"agents": 0})),
    (["run", "--agents", str(MOST_AGENTS + 1)], lambda: _settings({"agents": MOST_AGENTS + 1})),
    (["run", "--rounds", "0", "--seed", "-1"], lambda: _settings({"rounds": 0, "seed": -1})),
    (["run", "--loss", "1"], lambda: _settings({"network": {"loss": 1.0}})),
    (["run", "--loss", "-0.5"], lambda: _settings({"network": {"loss": -0.5}})),
    (["run", "--device", "tpu"], lambda: _settings({"device": "tpu"})),
    (
        ["run", "--config", str(SCENARIO), "--agents", "0"],
        lambda: _settings({"agents": 0}, SCENARIO),
    ),
    (["run", "--compression", "qsgd:9"], lambda: _settings({"compression": "qsgd:9"})),
    (["run", "--compression", "fp16:2"], lambda: _settings({"compression": "fp16:2"})),
    (["run", "--config", str(MISSPELT)], lambda: _settings({}, MISSPELT)),
    (["run", "--config", str(OUT_OF_BOUNDS)], lambda: _settings({}, OUT_OF_BOUNDS)),
    (
        ["run", "--algorithm", "dpsgd"],
        lambda: _raised(lambda: preflight(load_config(None, {"algorithm": "dpsgd"})), ConfigError),
    ),
    (
        ["run", "--algorithm", "choco", "--topology", "one-peer-exponential"],
        lambda: _raised(
            lambda: preflight(
                load_config(None, {"algorithm": "choco", "topology": "one-peer-exponential"})
            ),
            ConfigError,
        ),
    ),
    (
        ["run", "--task", "no_such_module:thing"],
        lambda: _raised(lambda: resolve_task_factory("no_such_module:thing"), TaskError),
    ),
    (
        ["run", "--task", "json:no_such_callable"],
        lambda: _raised(lambda: resolve_task_factory("json:no_such_callable"), TaskError),
    ),
    (["run", "--mode", "cloud"], lambda: _raised(lambda: fleet_class("cloud"), ConfigError)),
    (["run", "--task", "mnist"], lambda: _raised(lambda: resolve_task_factory("mnist"), TaskError)),
    (
        ["run", "--scenario", "mars"],
        lambda: _raised(lambda: scenario_path("mars"), ScenarioNotFound),
    ),
    (
        ["run", "--scenario", "missing.toml"],
        lambda: _raised(lambda: scenario_path("missing.toml"), ScenarioNotFound),
    ),
    (["compose", "--algorithm", "gossip"], lambda: _settings({"algorithm": "gossip"})),
    (["links", "mars"], lambda: _raised(lambda: scenario_path("mars"), ScenarioNotFound)),
    (
        ["coordinator", "--insecure", "--topology", "star"],
        lambda: f"unknown topology 'star'; choose one of: {', '.join(POLICIES)}",
    ),
    (["coordinator", "--insecure", "--rounds", "0"], lambda: _settings({"rounds": 0})),
    (
        ["agent", "--insecure", "--coordinator", "127.0.0.1:1", "--threads", "0"],
        lambda: "--threads must be 1 or more, got 0",
    ),
    (
        ["agent", "--insecure", "--coordinator", "127.0.0.1:1", "--device", "tpu"],
        lambda: _settings({"device": "tpu"}),
    ),
    (["agent"], lambda: "give exactly one of --coordinator HOST:PORT or --peers FILE"),
    (["compare", "no-such-run"], lambda: "no-such-run/results.json does not exist"),
    (
        ["baseline", "flower", "no-such-app"],
        lambda: _raised(lambda: load_flower_app("no-such-app"), FlowerAppError),
    ),
    (
        ["baseline", "flower", "protos"],
        lambda: _raised(lambda: load_flower_app("protos"), FlowerAppError),
    ),
    (
        ["baseline", "flower", "examples/flower-digits", "--agents", "0"],
        lambda: _raised(
            lambda: check_baseline(FlowerBaseline("examples/flower-digits", agents=0)), ConfigError
        ),
    ),
    (
        ["baseline", "flower", "examples/flower-digits", "--client-cpus", "0"],
        lambda: _raised(
            lambda: check_baseline(FlowerBaseline("examples/flower-digits", client_cpus=0.0)),
            ConfigError,
        ),
    ),
    (
        ["run", "--config", "missing.toml"],
        lambda: _raised(lambda: read_scenario(Path("missing.toml")), ConfigError),
    ),
    (
        ["coordinator", "--insecure", "--config", str(BROKEN)],
        lambda: _raised(lambda: read_scenario(BROKEN), ConfigError),
    ),
    (
        ["agent", "--insecure", "--coordinator", "127.0.0.1:1", "--config", str(BROKEN)],
        lambda: _raised(lambda: read_scenario(BROKEN), ConfigError),
    ),
]


def imported_modules(importtime: str) -> set[str]:
    """The modules ``python -X importtime`` reported importing."""
    names = set()
    for line in importtime.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


@pytest.fixture(scope="module", autouse=True)
def scenario_file() -> object:
    SCENARIO.write_text("agents = 4\nrounds = 3\n")
    BROKEN.write_text("agents = [4\n")
    MISSPELT.write_text("agentz = 4\n[network]\nlossy = 0.2\n[ray]\nnum_cpu = 2\n")
    OUT_OF_BOUNDS.write_text('rounds = 0\n[task]\nname = "digits"\n')
    yield
    SCENARIO.unlink()
    BROKEN.unlink()
    MISSPELT.unlink()
    OUT_OF_BOUNDS.unlink()


@pytest.mark.parametrize(("argv", "full"), CASES, ids=[" ".join(c[0][:3]) for c in CASES])
def test_a_bad_flag_is_refused_before_anything_heavy_in_the_full_checks_words(
    argv: list[str], full: Callable[[], str], tmp_path: Path
) -> None:
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "airgossip", *argv],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    modules = imported_modules(result.stderr)
    assert "airgossip.cli" in modules  # the import log was read
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert not heavy, f"imported before refusing: {heavy[:5]}"
    lines = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
    assert lines == [f"error: {full()}"]


def test_every_registry_name_passes_the_early_check() -> None:
    """The early check refuses only what the full one refuses: every name a registry holds
    gets through it (the full check's own tests cover what it then refuses)."""
    names = registry_names()
    raw = [form for form in names["codecs"].split(", ") if ":" not in form]
    flags: list[Settings] = [{"topology": t} for t in names["topologies"].split(", ")]
    flags += [{"algorithm": a} for a in names["algorithms"].split(", ")]
    flags += [{"mode": m} for m in names["mode_names"].split(", ")]
    flags += [{"task": {"name": t}} for t in [*names["tasks"].split(", "), "mytasks:linear"]]
    flags += [
        {"compression": c}
        for c in ["none", "qsgd:4", "topk:0.1", "randomk:1", "slim:0.1:0.5", *raw]
    ]
    flags += [{"agents": 10_000, "rounds": 1, "seed": 0, "device": "cuda", "network": {"loss": 0}}]
    for flag in flags:
        check_flags(flag)  # exits (typer.Exit) if refused


def test_the_setting_keys_come_from_the_models_without_torch() -> None:
    """The early checks read what a scenario may hold from the settings' models themselves,
    and a fresh interpreter does so without importing torch."""
    probe = (
        "import sys, json; from airgossip.cli.early import setting_keys; "
        "keys = setting_keys(); print(json.dumps(['torch' in sys.modules, keys['keys']]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    torch_loaded, keys = json.loads(done.stdout)
    assert not torch_loaded
    assert keys == setting_keys()["keys"]
    assert {"agents", "rounds", "network", "wireless", "privacy", "transport"} <= set(keys)


def test_what_a_run_accepts_passes_the_early_run_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every algorithm on a graph it runs on, on the graph that is directed by name but not
    on so few agents, and a user's task that exists get through (the task imported)."""
    monkeypatch.chdir(ROOT)
    names = registry_names()
    for algorithm in names["algorithms"].split(", "):
        check_run({"algorithm": algorithm, "topology": "ring"})
    check_run({"algorithm": "dpsgd", "agents": 3})  # exponential on 3 nodes is complete
    check_run({"algorithm": "dpsgd", "topology": "edges", "edges": [[0, 1], [1, 0]], "agents": 2})
    check_run({"algorithm": "dpsgd"}, wireless=True)  # the channel model's graph: full check
    check_run({"task": {"name": "examples.linear_task:LinearTask"}})
    check_run({"task": {"name": "no_such_module:thing"}}, app=True)  # a Flower app is the task


@pytest.mark.parametrize("field", ["agents", "rounds", "seed"])
def test_the_early_bounds_are_the_settings_bounds(field: str) -> None:
    """The early check's copy of a bound moves with the settings' own (one changed alone
    fails here, naming the field)."""
    assert _bounds(_Flags, field) == _bounds(RunConfig, field), field


def test_the_early_loss_bounds_are_the_networks() -> None:
    assert _bounds(_Network, "loss") == _bounds(NetworkSettings, "loss")


def test_version_comes_from_the_package_metadata() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "airgossip", "--version"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"airgossip {metadata.version('airgossip')}\n"


def _command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [prefix]
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            paths += _command_paths(command, (*prefix, name))
        else:
            paths.append((*prefix, name))
    return paths


ROOT_COMMAND = typer.main.get_command(app)
assert isinstance(ROOT_COMMAND, click.Group)


@pytest.mark.parametrize("path", _command_paths(ROOT_COMMAND), ids=" ".join)
def test_every_help_fits_80_columns_with_nothing_cut(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    text = result.output
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text, text
    command = ROOT_COMMAND
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    for param in command.params:
        for flag in [*param.opts, *param.secondary_opts]:
            if flag.startswith("-"):
                assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text), (flag, text)


def test_compare_prints_the_path_it_wrote_the_plot_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run-a"
    run.mkdir()
    rows = [RoundFigures(round=r, mean_accuracy=0.5 + 0.1 * r, bytes_sent=100 * r) for r in (1, 2)]
    final = FinalFigures(**rows[-1].model_dump(), complete=True)
    RunResults(config={"algorithm": "push-sum"}, rounds=rows, final=final).write(
        run / "results.json"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    result = CliRunner().invoke(
        app, ["compare", str(run), "--out", "plots/c.png"], env={"COLUMNS": "80"}
    )
    assert result.exit_code == 0, result.output
    said = [line for line in result.output.splitlines() if line.startswith("plot: ")]
    assert said == [f"plot: {elsewhere / 'plots' / 'c.png'}"]
    assert (elsewhere / "plots" / "c.png").stat().st_size > 1000
