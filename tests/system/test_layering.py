"""The dependency rules, executable: one namespace, layers, rooms inside them, no import circles.

Everything is imported as ``airgossip.*``: the folders ``protos``, ``edge``, ``coordinator`` and
``emulation`` are ``airgossip.protos`` and so on (``airgossip/`` links to them), and nothing
imports them by their bare names. Layers import downwards only: ``protos <- edge <- coordinator
<- scenario <- node <- emulation <- airgossip`` (the run's settings and results schema, then the
node runtime that runs one agent process, then the channel, networks and fleets, then the CLI).
Inside ``emulation`` the rooms do too: the channel model imports no network, fleet, node or
settings code, and networks import no fleets. Every import counts, at module level or inside a
function; so does a lower layer starting the CLI by name (``-m airgossip`` in an argument list
or a string, a fork server told to run or preload one of its modules).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The folders at the repository's top level that are installed inside the namespace.
MAPPED = ("protos", "edge", "coordinator", "emulation")
#: Folders from the bottom up: each imports only from the ones before it. ``airgossip/common``
#: (what agents and the coordinator share: ids, seeds, graphs, TLS, the metrics endpoint),
#: ``airgossip/scenario`` (a run's settings and results schema) and ``airgossip/node`` (what
#: runs one agent process) are rooms of the namespace's own folder; the rest of
#: ``airgossip/`` (the CLI) is the top.
LAYERS = ["protos", "airgossip/common", "edge", "coordinator", "airgossip/scenario",
          "airgossip/node", "emulation", "airgossip"]  # fmt: skip
#: Pure packages inside edge that touch no gRPC, protos, Prometheus or transport.
PURE = {
    "edge/algorithms": {"grpc", "protos", "prometheus_client", "edge.transport", "edge.agent"},
    "airgossip/common/topology": {"grpc", "protos", "prometheus_client", "torch", "edge.transport"},
    "edge/compression": {"grpc", "protos", "prometheus_client", "edge.transport"},
}
#: Rooms inside a layer and what each must not import.
ROOMS = {
    # The radio and its motion: NumPy and the [wireless] table, nothing of a run or a process.
    "emulation/channel": {"emulation.networks", "emulation.fleets", "airgossip.scenario.config",
                          "airgossip.scenario.results", "airgossip.node", "coordinator",
                          "grpc"},
    "emulation/networks": {"emulation.fleets"},
    # The codec registry is a leaf: codecs never import it.
    "edge/compression/codec.py": {"edge.compression.registry", "edge.compression.quantize",
                                  "edge.compression.sparsify"},
    "edge/compression/quantize.py": {"edge.compression.registry"},
    "edge/compression/sparsify.py": {"edge.compression.registry"},
}  # fmt: skip


def in_namespace(names: set[str]) -> set[str]:
    """The banned names above as they are imported: ``edge.agent`` is ``airgossip.edge.agent``."""
    return {f"airgossip.{n}" if n.split(".")[0] in MAPPED else n for n in names}


def module_name(path: Path) -> str:
    """The name ``path`` is imported as (``edge/agent.py``: ``airgossip.edge.agent``)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[0] in MAPPED:
        parts = ("airgossip", *parts)
    return ".".join(parts).removesuffix(".__init__")


def layer_of(name: str) -> int | None:
    """The rank in :data:`LAYERS` of the project module ``name`` (None: not the project's)."""
    for rank, folder in enumerate(LAYERS[:-1]):
        prefix = folder.replace("/", ".")
        if within(name, {prefix if prefix.startswith("airgossip.") else f"airgossip.{prefix}"}):
            return rank
    return len(LAYERS) - 1 if within(name, {"airgossip"}) else None


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names; relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package[: len(package) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def sources(where: str) -> list[Path]:
    """The Python files of a folder (or the one file), not through the links in ``airgossip/``."""
    target = ROOT / where
    if target.suffix == ".py":
        return [target]
    # Not through the links (followlinks=False), and the top layer without its rooms.
    rooms = {ROOT / room for room in LAYERS if room.startswith("airgossip/")} - {target}
    paths = [
        Path(folder, name)
        for folder, _, names in os.walk(target)
        if not any(Path(folder).is_relative_to(room) for room in rooms)
        for name in names
        if name.endswith(".py")
    ]
    return sorted(p for p in paths if "_pb2" not in p.name)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for layer in LAYERS for p in sources(layer)}


def within(name: str, prefixes: set[str]) -> bool:
    return any(name == b or name.startswith(b + ".") for b in prefixes)


def test_layers_only_import_downwards() -> None:
    violations = []
    for rank, layer in enumerate(LAYERS):
        for path in sources(layer):
            for name in imports(path):
                target = layer_of(name)
                if target is not None and target > rank:
                    violations.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not violations, "layering violated:\n" + "\n".join(sorted(violations))


def test_nothing_imports_the_folders_by_their_bare_names() -> None:
    """``import edge`` would load a second copy of a module beside ``airgossip.edge``'s."""
    checked = [
        path
        for folder in [*LAYERS, "tests", "benchmarks", "examples", "scripts", "deploy"]
        for path in sources(folder)
    ]
    assert len(checked) > 300
    violations = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in checked
        for name in imports(path)
        if name.split(".")[0] in MAPPED
    ]
    assert not violations, "\n".join(sorted(violations))


def test_only_airgossip_is_installed() -> None:
    """Outside the repository (no folder of it on the path), the four folders are importable
    only inside the namespace."""
    probe = (
        "import importlib.util as u, airgossip.edge.agent, airgossip.protos.gossip_pb2;"
        f"print([u.find_spec(n) is None for n in {list(MAPPED)!r}])"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", probe], cwd=tempfile.gettempdir(),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[True,", "True,", "True,", "True]"], done.stdout


def test_pure_packages_stay_pure() -> None:
    violations = []
    for package, banned in PURE.items():
        banned = in_namespace(banned)
        for path in sources(package):
            violations += [
                f"{path.relative_to(ROOT)} imports {name}"
                for name in imports(path)
                if within(name, banned)
            ]
    assert not violations, "\n".join(sorted(violations))


def test_rooms_inside_layers_keep_to_their_side() -> None:
    violations = []
    for room, banned in ROOMS.items():
        banned = in_namespace(banned)
        for path in sources(room):
            violations += [
                f"{path.relative_to(ROOT)} imports {name}"
                for name in imports(path)
                if within(name, banned)
            ]
    assert not violations, "\n".join(sorted(violations))


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (a package's ``__init__`` stands for the
    package; a module importing its own parent package is not an edge)."""
    found = project_modules()
    graph: dict[str, set[str]] = {name: set() for name in found}
    for name, path in found.items():
        for target in imports(path):
            while target and target not in found:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                graph[name].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


#: A command line that runs a module of the CLI package (``python -m airgossip agent``).
RUNS_THE_CLI = re.compile(r"-m\s+airgossip(?:\.cli\b|(?![\w.]))")


def cli_modules() -> set[str]:
    """Every module of the CLI package, by name (``airgossip``, ``airgossip.cli.agent``...)."""
    return {module_name(p) for p in sources(LAYERS[-1])}


def names_the_cli(source: str, where: str, modules: set[str]) -> list[str]:
    """Where ``source`` starts or loads the CLI by name: a string that is one of its
    ``modules`` (an argument after ``-m``, a module for a fork server to run or preload, an
    ``import_module``) or a command line with ``-m airgossip``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        text = node.value if isinstance(node, ast.Constant) else None
        if isinstance(text, str) and (text in modules or RUNS_THE_CLI.search(text)):
            found.append(f"{where}:{node.lineno} names {text[:60]!r}")
    return found


def test_lower_layers_never_start_the_cli_by_name() -> None:
    """What an import walk cannot see: a subprocess or fork server entry point."""
    modules = cli_modules()
    violations = [
        hit
        for layer in LAYERS[:-1]
        for path in sources(layer)
        for hit in names_the_cli(path.read_text(), str(path.relative_to(ROOT)), modules)
    ]
    assert not violations, "a lower layer starts the CLI:\n" + "\n".join(violations)


def test_the_entry_point_check_sees_every_way_of_naming_the_cli() -> None:
    modules = cli_modules()
    assert {"airgossip", "airgossip.cli", "airgossip.cli.agent"} <= modules
    started = """
import sys, importlib
COMMAND = (sys.executable, "-m", "airgossip")
PRELOAD = ("airgossip.cli",)
server.spawn("airgossip", ["agent"])
subprocess.run(["sh", "-c", "python3 -m airgossip agent --index 0"])
importlib.import_module("airgossip.cli.agent")
"""
    assert len(names_the_cli(started, "x.py", modules)) == 5
    unrelated = """
log = logging.getLogger("airgossip.agent")
LABEL = "airgossip.run"
name = f"airgossip-{tag}-agent-0"
COMMAND = (sys.executable, "-m", "airgossip.emulation.agent")
"""
    assert names_the_cli(unrelated, "y.py", modules) == []


def room_graph(layer: str) -> dict[str, set[str]]:
    """The rooms of a layer (its subpackages and top modules) -> the rooms each imports."""
    prefix = f"airgossip.{layer}."
    graph: dict[str, set[str]] = {}
    for name, path in project_modules().items():
        if not name.startswith(prefix):
            continue
        room = name[len(prefix) :].split(".")[0]
        graph.setdefault(room, set())
        for target in imports(path):
            if target.startswith(prefix):
                other = target[len(prefix) :].split(".")[0]
                if other != room:
                    graph[room].add(other)
    for targets in list(graph.values()):
        for target in targets:
            graph.setdefault(target, set())
    return graph


def test_rooms_inside_a_layer_import_one_way() -> None:
    """No arrow back up between the rooms of edge or of emulation: a room that imports
    another is never imported by it, however indirectly."""
    for layer in ("edge", "emulation"):
        graph = room_graph(layer)
        assert len(graph) > 5, graph
        found = circles(graph)
        assert not found, f"rooms of {layer} in a circle:\n" + "\n".join(map(", ".join, found))
    assert {"agent", "algorithms", "transport"} <= set(room_graph("edge"))


def test_no_import_circles() -> None:
    found = circles(import_graph())
    assert not found, "import circles:\n" + "\n".join(", ".join(c) for c in found)


def test_the_checkers_see_imports_and_circles() -> None:
    """Guard against a walker that silently finds nothing, or a cycle finder that cannot."""
    assert "airgossip.common.topology.mixing" in imports(
        ROOT / "airgossip/common/topology/assignment.py"
    )
    assert any("coordinator" in n for n in imports(ROOT / "emulation/fleets/agent_fleet.py"))
    assert layer_of("airgossip.edge.agent") == 2 and layer_of("airgossip.cli.run") == 7
    assert layer_of("airgossip.node.process") == 5 and layer_of("airgossip.scenario") == 4
    assert layer_of("airgossip.common.topology") == 1
    assert layer_of("airgossip") == 7 and layer_of("torch") is None
    assert sources("airgossip/node") and not set(sources("airgossip/node")) & set(
        sources("airgossip")
    )
    graph = import_graph()
    assert "airgossip.node.network" in graph["airgossip.emulation.fleets.base"] or (
        "airgossip.emulation.networks" in graph["airgossip.emulation.fleets.base"]
    )
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
