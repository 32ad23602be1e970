"""The dependency rule, executable: protos <- edge <- coordinator <- emulation <- airgossip."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["protos", "edge", "coordinator", "emulation", "airgossip"]
#: Pure packages inside edge that touch no gRPC, protos, Prometheus or transport.
PURE = {
    "edge/algorithms": {"grpc", "protos", "prometheus_client", "edge.transport", "edge.agent"},
    "edge/topology": {"grpc", "protos", "prometheus_client", "torch", "edge.transport"},
    "edge/compression": {"grpc", "protos", "prometheus_client", "edge.transport"},
}


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def sources(package: str) -> list[Path]:
    return [p for p in (ROOT / package).rglob("*.py") if "_pb2" not in p.name]


def test_layers_only_import_downwards() -> None:
    violations = []
    for rank, layer in enumerate(LAYERS):
        forbidden = set(LAYERS[rank + 1 :])
        for path in sources(layer):
            for name in imports(path):
                if name.split(".")[0] in forbidden:
                    violations.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not violations, "layering violated:\n" + "\n".join(violations)


def test_pure_packages_stay_pure() -> None:
    violations = []
    for package, banned in PURE.items():
        for path in sources(package):
            for name in imports(path):
                if any(name == b or name.startswith(b + ".") for b in banned):
                    violations.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not violations, "\n".join(violations)


def test_the_checker_sees_imports() -> None:
    """Guard against a walker that silently finds nothing."""
    assert "edge.topology.mixing" in imports(ROOT / "edge/topology/assignment.py")
    assert any("coordinator" in n for n in imports(ROOT / "emulation/fleet.py"))
