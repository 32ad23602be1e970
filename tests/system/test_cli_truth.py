"""The command line tells the truth: help that lists what each command accepts (read from
the registries), bracketed words printed intact, tables that fit 80 columns, custom tasks
found like ``python -m``."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
import typer.main
from rich.console import Console

from airgossip.cli import app
from airgossip.cli.choices import CHOICES, fill, registry_names
from airgossip.cli.display import summary_table
from airgossip.common.topology import TOPOLOGIES
from airgossip.coordinator.policy import POLICIES
from airgossip.edge.algorithms import ALGORITHMS
from airgossip.edge.compression import CODEC_FORMS
from airgossip.edge.tasks import BUILTIN_TASKS
from airgossip.emulation.fleets import FLEETS
from airgossip.scenario.results import FinalFigures, RoundFigures, RunIdentity, RunResults
from airgossip.scenario.wireless import preset_names
from tests.support.cli import ROOT, airgossip, assert_one_line_error, cli
from tests.support.processes import free_port

COMMAND = typer.main.get_command(app)
assert isinstance(COMMAND, click.Group)
#: What each command must name in its help: (option or argument, the names it accepts).
ACCEPTS = {
    "run": [("mode", list(FLEETS)), ("topology", list(TOPOLOGIES)),
            ("algorithm", list(ALGORITHMS)), ("task", list(BUILTIN_TASKS)),
            ("compression", list(CODEC_FORMS)), ("scenario", preset_names())],
    "coordinator": [("topology", list(POLICIES))],
    "topology": [("name", [p for p in POLICIES if p != "edges"])],
    "links": [("scenario", preset_names())],
    "compose": [("topology", list(TOPOLOGIES)), ("algorithm", list(ALGORITHMS)),
                ("task", [t for t in BUILTIN_TASKS if t != "flower"]),
                ("scenario", preset_names())],
}  # fmt: skip
#: Commands that take no mode, topology or other name from a registry.
NAMES_NOTHING = {"agent", "baseline", "certs", "compare"}
BRACKETED = re.compile(r"\[[^\]]+\]")


def command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and subcommand (``baseline flower``), as the words that name it."""
    paths = []
    for name, command in sorted(group.commands.items()):
        paths.append((*prefix, name))
        if isinstance(command, click.Group):
            paths += command_paths(command, (*prefix, name))
    return paths


def find(path: tuple[str, ...]) -> click.Command:
    command: click.Command = COMMAND
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    return command


def rendered_help(*command: str) -> str:
    result = cli(*command, "--help")
    assert result.returncode == 0, result.stdout
    # One line per option even in a narrow panel: join rich's wrapped lines back up.
    return " ".join(line.strip(" │") for line in result.stdout.splitlines())


def test_every_command_is_checked() -> None:
    """A new command says what its help must name (ACCEPTS) or that it names nothing."""
    assert set(COMMAND.commands) == set(ACCEPTS) | NAMES_NOTHING


@pytest.mark.parametrize("command", sorted(ACCEPTS))
def test_help_lists_every_mode_and_topology_a_command_accepts(command: str) -> None:
    found = COMMAND.commands[command]
    params = {p.name: p for p in found.params}
    shown = rendered_help(command)
    for name, accepted in ACCEPTS[command]:
        # An argument's values are said in the command's help (see RegistryHelpCommand).
        said = found.help if isinstance(params[name], click.Argument) else params[name].help
        text = fill(said or "")
        missing = [value for value in accepted if not re.search(rf"\b{re.escape(value)}\b", text)]
        assert not missing, f"{command} {name}: help does not name {missing}"
        assert all(value in shown for value in accepted), (command, name)


def test_the_help_names_come_from_the_registries_without_torch() -> None:
    """Help reads the registries themselves, which list their names without importing what
    they register: a fresh interpreter fills every placeholder, and neither torch nor any
    fleet, algorithm or task module is imported for it."""
    probe = (
        "import sys, json; from airgossip.cli.choices import registry_names; "
        "names = registry_names(); "
        "loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith(("
        "'airgossip.emulation.fleets.', 'airgossip.edge.algorithms.', 'airgossip.edge.tasks.'))); "
        "print(json.dumps([names, loaded]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    names, loaded = json.loads(done.stdout)
    assert names == registry_names()
    assert loaded == [
        "airgossip.edge.algorithms.registry",
        "airgossip.edge.tasks.custom",
        "airgossip.edge.tasks.registry",
        "airgossip.emulation.fleets.registry",
    ]
    assert names["mode_names"] == ", ".join(FLEETS) and names["tasks"] == ", ".join(BUILTIN_TASKS)


def test_every_registry_line_loads_the_plugin_it_names() -> None:
    """A registry line is a name and where its plugin lives: each one loads, and the plugin
    declares the name it is registered under."""
    for registry in (ALGORITHMS, BUILTIN_TASKS, FLEETS):
        for name in registry:
            plugin = registry[name]
            declared = getattr(plugin, registry.declares or "", name)
            assert declared == name, (registry.kind, name, registry.target(name))
    assert all(FLEETS.summary(mode) for mode in FLEETS)


@pytest.mark.parametrize("path", command_paths(COMMAND), ids=" ".join)
def test_help_names_only_registries_that_exist(path: tuple[str, ...]) -> None:
    """A placeholder of a registry is filled where help is shown; any other word in braces
    would print as written."""
    found = find(path)
    for text in [getattr(p, "help", None) or "" for p in found.params]:
        for word in re.findall(r"\{(\w+)\}", text):
            assert word in CHOICES, f"{' '.join(path)}: unknown placeholder {{{word}}}"
    shown = rendered_help(*path)
    assert not re.search(r"\{(" + "|".join(CHOICES) + r")\}", shown), shown


@pytest.mark.parametrize("path", command_paths(COMMAND), ids=" ".join)
def test_help_prints_its_bracketed_words(path: tuple[str, ...]) -> None:
    shown = re.sub(r"\s+", " ", rendered_help(*path))
    command = " ".join(path)
    found = find(path)
    texts = [found.help or ""] + [fill(getattr(p, "help", None) or "") for p in found.params]
    for text in texts:
        for word in BRACKETED.findall(text.replace("\\[", "[")):
            assert re.sub(r"\s+", " ", word) in shown, f"{command}: {word!r} is not printed"
    if command == "agent":  # the help that used to lose its word
        assert "a [peers] table" in shown


def test_error_texts_print_their_bracketed_words(tmp_path: Path) -> None:
    peers, scenario = tmp_path / "peers.toml", tmp_path / "s.toml"
    peers.write_text('agent-0 = "127.0.0.1:7000"\n')
    scenario.write_text("agents = 2\n")
    result = cli("agent", "--peers", str(peers), "--config", str(scenario), "--insecure")
    assert_one_line_error(result, "needs a [peers] table")
    result = cli("links", str(scenario))
    assert_one_line_error(result, "has no [wireless] table")


def test_topology_knows_the_coordinators_policies() -> None:
    result = cli("topology", "k-out", "--agents", "8", "--out-degree", "3")
    assert result.returncode == 0, result.stdout
    assert "k-out on 8 nodes: directed" in result.stdout and "|λ2| =" in result.stdout
    assert_one_line_error(cli("topology", "star"), "unknown topology 'star'", "k-out")


def sample_results(out: Path) -> RunResults:
    config = {"agents": 16, "topology": "one-peer-exponential", "algorithm": "quantized-push-sum",
              "compression": "qsgd:4", "mode": "devices", "task": {"name": "digits"},
              "lambda2": 0.5, "rounds": 40}  # fmt: skip
    final = FinalFigures(round=40, mean_accuracy=0.95, min_accuracy=0.94, max_accuracy=0.96,
                         consensus_distance=0.004, messages_sent=1280, messages_dropped=17,
                         bytes_sent=12_345_678, complete=True)  # fmt: skip
    return RunResults(
        config=config, rounds=[RoundFigures(round=40)], final=final, total_wall_s=31.2,
        run=RunIdentity(id="20261201-081730-3f2a", agents={f"agent-{i}": "finished"
                                                           for i in range(16)}),
    )  # fmt: skip


@pytest.mark.parametrize("terminal", [True, False])
def test_the_summary_table_fits_80_columns_and_reads_when_piped(
    terminal: bool, tmp_path: Path
) -> None:
    out = tmp_path / "a-rather-long-folder-name" / "runs" / "20261201-081730-3f2a"
    buffer = io.StringIO()
    console = Console(file=buffer, width=80, force_terminal=terminal, color_system=None)
    links = "one-peer-exponential · emulated loss 0.1 · latency 5 ms [sic]"
    console.print(summary_table(sample_results(out), out, links, title="run [x]"))
    text = buffer.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text
    flat = re.sub(r"\s+", "", text)
    for expected in ("run [x]", "16 finished", "1280 sent, 17 lost", links,
                     str(out / "results.json")):  # fmt: skip
        assert re.sub(r"\s+", "", expected) in flat, expected


def test_the_links_table_fits_80_columns(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "airgossip", "links", "lte-urban", "--agents", "120",
         "--limit", "12", "--png", str(tmp_path / "links.png")],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
        env={**os.environ, "COLUMNS": "80"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines()
             if not line.startswith(("…", "topology picture"))]  # fmt: skip
    assert max(len(line) for line in lines) <= 80
    assert "…" not in "\n".join(lines)  # every id and figure in full
    assert any(re.search(r"agent-0\s+agent-\d+\s", line) for line in lines)


def console_script(tmp_path: Path) -> Path:
    """A stand-in for the installed ``airgossip`` script that runs this checkout's code with
    the checkout itself *not* on ``sys.path`` (as an installed package: its own packages
    importable, nothing else of the repository)."""
    script = tmp_path / "bin" / "airgossip"
    script.parent.mkdir()
    script.write_text(
        "import importlib.machinery, sys\n"
        f"ROOT = {str(ROOT)!r}\n"
        "PACKAGES = {'airgossip', 'edge', 'coordinator', 'emulation', 'protos'}\n"
        "class Checkout:\n"
        "    @staticmethod\n"
        "    def find_spec(name, path=None, target=None):\n"
        "        if name in PACKAGES:\n"
        "            return importlib.machinery.PathFinder.find_spec(name, [ROOT])\n"
        "        return None\n"
        "sys.meta_path.insert(0, Checkout)\n"
        "sys.path = [p for p in sys.path if p not in ('', ROOT)]\n"
        "from airgossip.cli import app\n"
        "sys.exit(app())\n"
    )
    return script


@pytest.mark.timeout(240)
def test_the_readme_custom_task_command_works_from_the_checkout(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", COLUMNS="200")
    # Its agents are `python -m airgossip.emulation.agent` processes started in the
    # checkout: this code.
    result = subprocess.run(
        [sys.executable, str(console_script(tmp_path)), "run", "--task",
         "examples.linear_task:make_task", "--agents", "2", "--rounds", "3",
         "--out", str(tmp_path / "run")],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=200,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["config"]["task"]["name"] == "examples.linear_task:make_task"
    assert results["final"]["complete"] and results["final"]["mean_loss"] is not None
    # Without the current directory it is not found: the script really hides the checkout.
    elsewhere = subprocess.run(
        [sys.executable, str(tmp_path / "bin" / "airgossip"), "run", "--task",
         "examples.linear_task:make_task", "--mode", "inproc", "--rounds", "1",
         "--out", str(tmp_path / "run2")],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=200,
    )  # fmt: skip
    assert_one_line_error(elsewhere, "cannot import module 'examples.linear_task'")


@pytest.mark.timeout(240)
def test_the_fleet_metrics_url_is_printed(tmp_path: Path) -> None:
    port = free_port()
    result = airgossip(
        "run", "--task", "consensus", "--agents", "2", "--rounds", "3",
        "--metrics-port", str(port), "--out", str(tmp_path / "run"),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"fleet metrics at http://127.0.0.1:{port}/metrics" in result.stdout


def test_the_readme_shows_the_whole_custom_task() -> None:
    code = (ROOT / "examples" / "linear_task.py").read_text()
    body = code[code.index("from __future__") :]
    assert f"```python\n{body}```" in (ROOT / "README.md").read_text()
    for name in ("EvalResult", "TaskContext", "TrainConfig", "TrainResult"):
        assert name in body  # the result types a task returns, imported by name
