"""The Kubernetes manifests under deploy/kubernetes pass ``kubernetes-validate`` (the
API's own schemas, strict: no unknown fields) and agree with one another."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from airgossip.scenario.config import load_config
from tests.support.cli import ROOT

MANIFESTS = ROOT / "deploy" / "kubernetes"
#: The oldest version whose API has everything the manifests use (gRPC probes: 1.27).
VERSIONS = ("1.27.0", kubernetes_validate.latest_version())


def documents() -> list[dict[str, Any]]:
    out = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            out += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return out


def find(kind: str, name: str) -> dict[str, Any]:
    matches = [d for d in documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, (kind, name)
    return matches[0]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_passes_kubernetes_validate(version: str) -> None:
    docs = documents()
    assert len(docs) >= 9
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_strict_validation_refuses_an_unknown_field() -> None:
    agents = find("StatefulSet", "airgossip-agent")
    agents["spec"]["template"]["spec"]["containers"][0]["argz"] = ["agent"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(agents, VERSIONS[0], strict=True)


def test_the_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    present = {p.name for p in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


def test_the_manifests_agree_on_the_fleet(tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(find("ConfigMap", "airgossip-scenario")["data"]["scenario.toml"])
    fleet_size = load_config(scenario).agents
    agents = find("StatefulSet", "airgossip-agent")
    assert agents["spec"]["replicas"] == fleet_size
    assert agents["spec"]["serviceName"] == "airgossip-agent"
    assert find("Service", "airgossip-agent")["spec"]["clusterIP"] == "None"
    coordinator = find("Deployment", "airgossip-coordinator")["spec"]["template"]["spec"]
    assert f"--agents={fleet_size}" in coordinator["containers"][0]["args"]
    claim = coordinator["volumes"][0]["persistentVolumeClaim"]["claimName"]
    find("PersistentVolumeClaim", claim)
    agent = agents["spec"]["template"]["spec"]["containers"][0]
    assert "--coordinator=airgossip-coordinator:7070" in agent["args"]
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["AIRGOSSIP_INDEX"] == "ordinal"  # pod airgossip-agent-3 is agent 3
    assert agent["securityContext"]["capabilities"]["add"] == ["NET_ADMIN"]
    prometheus = yaml.safe_load(find("ConfigMap", "airgossip-prometheus")["data"]["prometheus.yml"])
    sd = [job for job in prometheus["scrape_configs"] if "http_sd_configs" in job]
    assert sd[0]["http_sd_configs"][0]["url"] == "http://airgossip-coordinator:9470/sd"


def test_the_manifests_speak_mutual_tls_with_each_member_s_own_certificate() -> None:
    coordinator = find("Deployment", "airgossip-coordinator")["spec"]["template"]["spec"]
    container = coordinator["containers"][0]
    assert "--certs=/var/lib/airgossip/certs" in container["args"]
    mount = {m["name"]: m for m in container["volumeMounts"]}["certs"]
    assert mount["mountPath"] == "/var/lib/airgossip/certs" and mount["readOnly"]
    secret = {v["name"]: v for v in coordinator["volumes"]}["certs"]["secret"]
    # The coordinator's pod sees its own pair and the CA's certificate, nothing else.
    assert secret["secretName"] == "airgossip-certs"
    assert sorted(i["key"] for i in secret["items"]) == [
        "ca.pem", "coordinator.key", "coordinator.pem"
    ]  # fmt: skip
    agents = find("StatefulSet", "airgossip-agent")["spec"]["template"]["spec"]
    agent = agents["containers"][0]
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["AIRGOSSIP_CERTS"] == "/var/lib/airgossip/certs"
    assert {v["name"]: v for v in agents["volumes"]}["certs"]["secret"]["secretName"] == (
        "airgossip-certs"
    )
    for pod in (container, agent):
        assert not any("insecure" in arg for arg in pod["args"])
        # Kubernetes' own gRPC probe has no client certificate: the image's check dials.
        assert "grpc" not in pod["readinessProbe"]
        assert pod["readinessProbe"]["exec"]["command"][-1].endswith("healthcheck.py")
