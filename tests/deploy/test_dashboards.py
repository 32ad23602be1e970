"""The Grafana dashboards: valid provisioning JSON, produced by ``deploy/grafana/
dashboards.py`` with grafana-foundation-sdk (the files are what it writes, and read back
through the SDK's types), every datasource uid resolving to the provisioned datasource,
the panels and variables the operators need, and only metric names the code exports.

That every panel's queries return data is checked against a real Prometheus scraping a
running fleet in ``test_compose_stack.py``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import yaml
from grafana_foundation_sdk.models.dashboard import Dashboard

from tests.deploy.conftest import load_script
from tests.support.cli import ROOT

GRAFANA = ROOT / "deploy" / "grafana"
FILES = sorted((GRAFANA / "dashboards").glob("*.json"))


def generator() -> Any:
    return load_script("dashboards")


def dashboards() -> dict[str, dict[str, Any]]:
    return {path.name: json.loads(path.read_text()) for path in FILES}


def datasource_refs(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        if isinstance(node.get("datasource"), dict):
            yield node["datasource"]
        for value in node.values():
            yield from datasource_refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from datasource_refs(value)


def test_the_files_are_what_the_code_writes() -> None:
    module = generator()
    assert sorted(module.DASHBOARDS) == [p.name for p in FILES]
    for path in FILES:
        assert path.read_text() == module.render(module.DASHBOARDS[path.name]), (
            f"{path.name} is out of date: python deploy/grafana/dashboards.py rewrites it"
        )


def test_the_files_read_back_through_the_sdk_types() -> None:
    for name, data in dashboards().items():
        model = Dashboard.from_json(data)
        assert model.uid == name.removesuffix(".json")
        assert model.panels is not None and len(model.panels) == len(data["panels"])
        again = json.loads(json.dumps(model.to_json(), default=lambda o: o.to_json()))
        assert again["panels"] == data["panels"]


def test_every_datasource_uid_resolves_to_the_provisioned_one() -> None:
    provisioned = yaml.safe_load(
        (GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )
    known = {(d["type"], d["uid"]) for d in provisioned["datasources"]}
    for name, data in dashboards().items():
        refs = list(datasource_refs(data))
        assert len(refs) >= len(data["panels"]) + 2, name  # panels, targets, variables
        for ref in refs:
            assert (ref.get("type"), ref.get("uid")) in known, (name, ref)
    providers = yaml.safe_load(
        (GRAFANA / "provisioning" / "dashboards" / "airgossip.yml").read_text()
    )
    path = providers["providers"][0]["options"]["path"]
    compose = (ROOT / "docker-compose.yml").read_text()
    assert f"./deploy/grafana/dashboards:{path}:ro" in compose
    assert f"{path}/airgossip-fleet.json" in compose  # the home dashboard


def test_the_panels_and_variables_operators_need() -> None:
    titles = {name: {p["title"] for p in d["panels"]} for name, d in dashboards().items()}
    assert titles["airgossip-fleet.json"] >= {
        "Test accuracy per agent", "Consensus distance per agent", "Rounds/s (fleet)",
        "Rounds/s per agent", "Agents alive", "Graph strongly connected", "Mixing |λ2|",
        "Privacy spent per agent (ε)",
        "Energy spent per agent", "Battery left per agent",
    }  # fmt: skip
    assert titles["airgossip-network.json"] >= {
        "Bytes/s per directed link", "Message drop rate per directed link",
        "Packet drop rate per directed link (kernel)", "SINR per link", "Rate per link",
        "Links in range",
    }  # fmt: skip
    assert titles["airgossip-agent.json"] >= {
        "Push latency", "Push latency histogram", "Refused messages by reason",
        "Local step time", "Relative increment per in-neighbour",
        "Drift score per in-neighbour", "Refusals and clips per in-neighbour",
        "Insider alerts firing",
    }  # fmt: skip
    for name, data in dashboards().items():
        variables = {v["name"]: v for v in data["templating"]["list"]}
        assert set(variables) == {"agent", "peer"}, name
        assert all(v["includeAll"] and v["multi"] for v in variables.values())
        for panel in data["panels"]:
            assert panel.get("targets"), (name, panel["title"])
            assert all(t["expr"].strip() for t in panel["targets"])


def test_every_metric_a_panel_reads_is_one_the_code_exports() -> None:
    sources = "".join(
        (ROOT / path).read_text()
        for path in ("edge/observability/metrics.py", "coordinator/observability.py")
    )
    exported = set(re.findall(r'"(airgossip_[a-z0-9_]+)"', sources))
    for name, data in dashboards().items():
        exprs = [t["expr"] for p in data["panels"] for t in p["targets"]]
        exprs += [v["query"] for v in data["templating"]["list"]]
        for metric in set(re.findall(r"airgossip_[a-z0-9_]+", " ".join(exprs))):
            base = re.sub(r"_(total|bucket|sum|count)$", "", metric)
            assert base in exported or metric in exported, (name, metric)
