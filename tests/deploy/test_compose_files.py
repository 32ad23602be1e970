"""Compose files pass the Compose Specification's JSON schema: the repository's
docker-compose.yml (which is what ``airgossip/compose.py`` writes) and the bundles
``airgossip compose`` writes; where docker-compose is installed, its own check too.

The schema is vendored in ``schemas/compose-spec.json`` (source and commit in
``schemas/README.md``); nothing is fetched at test time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from airgossip.compose import top_level_compose
from airgossip.scenario.config import load_config, read_scenario, scenario_toml
from airgossip.scenario.wireless import scenario_path
from tests.support.cli import ROOT, assert_one_line_error, cli

SCHEMA = json.loads((Path(__file__).parent / "schemas" / "compose-spec.json").read_text())
_VARIABLE = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's variable interpolation (``${VAR}``, ``${VAR:-default}``)."""
    return _VARIABLE.sub(lambda m: env.get(m.group(1)) or (m.group(2) or ""), text)


def validate(text: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    document = yaml.safe_load(interpolate(text, env or {}))
    jsonschema.Draft7Validator(SCHEMA).validate(document)
    return dict(document)


def docker_compose_accepts(path: Path, env: dict[str, str] | None = None) -> None:
    compose = shutil.which("docker-compose")
    if compose is None:
        return  # the schema above is the check; docker-compose adds its own where present
    result = subprocess.run(
        [compose, "-f", str(path), "config", "-q"],
        capture_output=True, text=True, timeout=60, cwd=path.parent,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_the_top_level_file_is_what_the_code_writes() -> None:
    assert (ROOT / "docker-compose.yml").read_text() == top_level_compose(), (
        "docker-compose.yml is out of date: python -m airgossip.compose rewrites it"
    )


def test_the_top_level_file_passes_the_compose_schema() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    document = validate(text)
    services = document["services"]
    assert set(services) == {"certs", "coordinator", "agent", "prometheus", "grafana"}
    assert services["agent"]["deploy"]["replicas"] == "4"
    assert services["agent"]["cap_add"] == ["NET_ADMIN"]
    assert "coordinator-data:/var/lib/airgossip/data" in services["coordinator"]["volumes"]
    # Mutual TLS: the certs service issues for the fleet's size before anything starts; the
    # others read its volume, never write it.
    certs, coordinator, agent = services["certs"], services["coordinator"], services["agent"]
    assert certs["command"] == ["/var/lib/airgossip/ca", "/var/lib/airgossip/certs", "4"]
    assert certs["volumes"] == [
        "fleet-ca:/var/lib/airgossip/ca", "fleet-certs:/var/lib/airgossip/certs"
    ]  # fmt: skip
    # The authority's key is in a volume only the certs service mounts.
    assert [name for name, s in services.items() if "fleet-ca:" in str(s)] == ["certs"]
    for service in (coordinator, agent):
        assert "fleet-certs:/var/lib/airgossip/certs:ro" in service["volumes"]
        assert service["depends_on"]["certs"] == {"condition": "service_completed_successfully"}
    assert coordinator["command"][-2:] == ["--certs", "/var/lib/airgossip/certs"]
    assert agent["environment"]["AIRGOSSIP_CERTS"] == "/var/lib/airgossip/certs"
    assert "--insecure" not in coordinator["command"] + agent["command"]
    # One build of the image for the stack: the first service's; Prometheus's image is built
    # from Prometheus's own only where deploy/docker/build has not made it.
    assert [name for name, s in services.items() if "build" in s] == ["certs", "prometheus"]
    assert services["prometheus"]["image"] == "airgossip-prometheus:latest"
    assert (ROOT / services["prometheus"]["build"]["context"] / "Dockerfile").is_file()
    # Grafana, whose image only a registry has, starts only when asked for.
    assert services["grafana"]["profiles"] == ["grafana"]
    assert all("profiles" not in s for name, s in services.items() if name != "grafana")
    # One variable sets the fleet size: the coordinator waits for as many as run.
    eight = validate(text, {"AIRGOSSIP_AGENTS": "8"})["services"]
    assert eight["agent"]["deploy"]["replicas"] == "8"
    assert eight["coordinator"]["command"][-4:-2] == ["--agents", "8"]
    assert eight["certs"]["command"][-1] == "8"
    # The agents get the scenario and the fleet size from the coordinator.
    assert "--config" not in eight["agent"]["command"]
    # What it mounts from the repository exists.
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), source
    validate(text, {"AIRGOSSIP_AGENTS": "8"})
    docker_compose_accepts(ROOT / "docker-compose.yml")
    docker_compose_accepts(ROOT / "docker-compose.yml", {"AIRGOSSIP_AGENTS": "8"})


def test_the_schema_refuses_what_compose_would_refuse() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    with pytest.raises(jsonschema.ValidationError, match="cap_adds"):
        validate(text.replace("cap_add:", "cap_adds:"))
    with pytest.raises(jsonschema.ValidationError):
        validate(text.replace("init: true", "init: [1]"))


def test_airgossip_compose_writes_a_bundle_for_a_larger_fleet(tmp_path: Path) -> None:
    out = tmp_path / "big"
    result = cli("compose", "--agents", "32", "--scenario", "wifi-indoor", "--rounds", "60",
                 "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stdout
    text = (out / "docker-compose.yml").read_text()
    document = validate(text)
    agent = document["services"]["agent"]
    assert agent["deploy"]["replicas"] == 32
    coordinator = document["services"]["coordinator"]
    assert "./scenario.toml:/etc/airgossip/scenario.toml:ro" in coordinator["volumes"]
    # What the coordinator reads (real links unless asked) is what was asked for.
    config = load_config(out / "scenario.toml", real_links=True)
    assert config.agents == 32 and config.rounds == 60
    assert config.wireless is not None and config.wireless.name == "wifi-indoor"
    # Paths back to the repository resolve from the bundle's folder.
    assert document["services"]["certs"]["command"][-1] == "32"
    context = out / document["services"]["certs"]["build"]["context"]
    assert (context / "Dockerfile").is_file()
    prometheus = document["services"]["prometheus"]["volumes"][0].split(":")[0]
    assert (out / prometheus).is_file()
    docker_compose_accepts(out / "docker-compose.yml")


@pytest.mark.parametrize("preset", [None, "wifi-indoor", "lte-urban"])
def test_a_written_scenario_reads_back_as_it_was_on_real_links_too(
    preset: str | None, tmp_path: Path
) -> None:
    base = read_scenario(scenario_path(preset)) if preset else None
    for overrides in ({"agents": 12}, {"network": {"loss": 0.0}}, {"network": {"loss": 0.3}}):
        config = load_config(None, overrides, base=base)
        path = tmp_path / "scenario.toml"
        path.write_text(scenario_toml(config))
        assert load_config(path) == config
        assert load_config(path, real_links=True) == config


def test_airgossip_compose_refuses_bad_input(tmp_path: Path) -> None:
    assert_one_line_error(cli("compose", "--agents", "0"), "--agents", "1..250")
    assert_one_line_error(
        cli("compose", "--scenario", "no-such-preset", "--out", str(tmp_path / "x")),
        "no-such-preset",
    )
    assert_one_line_error(
        cli("compose", "--topology", "star", "--out", str(tmp_path / "y")), "star"
    )
    out = tmp_path / "twice"
    assert cli("compose", "--agents", "5", "--out", str(out)).returncode == 0
    assert_one_line_error(cli("compose", "--agents", "6", "--out", str(out)), "--force")
    assert cli("compose", "--agents", "6", "--out", str(out), "--force").returncode == 0
    static = load_config(out / "scenario.toml", real_links=True)
    assert static.agents == 6 and static.network.loss == 0.1  # emulated, as airgossip run
