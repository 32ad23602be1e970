"""The shipped alert rules: valid for Prometheus, right on their unit tests (promtool), loaded
by every Prometheus config the project ships."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from tests.support.cli import ROOT

PROMETHEUS = ROOT / "deploy" / "prometheus"
RULES = PROMETHEUS / "alerts.yml"


def promtool(*args: str | Path) -> str:
    binary = shutil.which("promtool")
    assert binary, "promtool is missing: `./scripts/install --dev` installs Debian's prometheus"
    result = subprocess.run(
        [binary, *map(str, args)], capture_output=True, text=True, timeout=60, cwd=PROMETHEUS
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_rules_are_valid_and_pass_their_unit_tests() -> None:
    assert "SUCCESS: 19 rules found" in promtool("check", "rules", RULES)
    assert "SUCCESS" in promtool("test", "rules", "alerts_test.yml")


def test_every_shipped_prometheus_config_loads_the_rules() -> None:
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"]
    promtool("check", "config", PROMETHEUS / "prometheus.yml")  # finds and checks alerts.yml
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    volumes = compose["services"]["prometheus"]["volumes"]
    assert "./deploy/prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro" in volumes
    kubernetes = next(
        doc
        for doc in yaml.safe_load_all((ROOT / "deploy/kubernetes/prometheus.yaml").read_text())
        if doc["kind"] == "ConfigMap"
    )
    assert yaml.safe_load(kubernetes["data"]["prometheus.yml"])["rule_files"] == ["alerts.yml"]
    assert kubernetes["data"]["alerts.yml"] == RULES.read_text(), (
        "the ConfigMap's copy is out of date: python deploy/prometheus/sync_kubernetes.py"
    )


def test_alerts_name_the_suspected_peer() -> None:
    rules = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    alerts = {r["alert"]: r for r in rules if "alert" in r}
    assert set(alerts) == {
        "AirgossipInNeighbourOutlier",
        "AirgossipSuspectedInsider",
        "AirgossipRefusalsFromPeer",
        "AirgossipClipsFromPeer",
        "AirgossipDriftingInsider",
    }
    for rule in alerts.values():
        assert "{{ $labels.peer }}" in rule["annotations"]["summary"]
