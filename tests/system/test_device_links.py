"""A device's links: as they are unless its scenario emulates some, and then only is the
emulation layer loaded (the node runtime never imports it)."""

from __future__ import annotations

import json
import subprocess
import sys

from airgossip.common.topology import mixing_lambda2
from airgossip.emulation.networks import network_for
from airgossip.node.topology_network import TopologyNetwork
from airgossip.scenario.config import load_config

IDS = [f"agent-{i}" for i in range(6)]

PROBE = """
import json, sys
from airgossip.cli.agent import device_links
from airgossip.scenario.config import load_config
settings = json.loads(sys.argv[1])
links = device_links()
network = links.network_for(load_config(None, settings, real_links=True))
runtime = network.runtime([f"agent-{i}" for i in range(settings["agents"])])
loaded = sorted(m for m in sys.modules if m.startswith("airgossip.emulation"))
print(json.dumps([type(network).__name__, runtime.shaper is None, loaded]))
"""


def device_network(settings: dict[str, object]) -> tuple[str, bool, list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(settings)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    kind, unshaped, loaded = json.loads(done.stdout)
    return kind, unshaped, loaded


def test_a_device_with_real_links_runs_without_the_emulation_layer() -> None:
    kind, unshaped, loaded = device_network({"agents": 6, "topology": "ring"})
    assert (kind, unshaped, loaded) == ("TopologyNetwork", True, [])


def test_a_device_told_to_emulate_a_loss_loads_the_emulated_network() -> None:
    kind, unshaped, loaded = device_network({"agents": 6, "network": {"loss": 0.2}})
    assert (kind, unshaped) == ("StaticNetwork", False)
    assert "airgossip.emulation.networks.static" in loaded


def test_the_links_as_they_are_are_the_static_network_without_impairments() -> None:
    schedule = {"topologies": ["ring", "complete"], "at_rounds": [5]}
    for settings in (
        {"topology": "exponential"},
        {"topology": "erdos-renyi", "seed": 3},
        {"switching": schedule},
    ):
        config = load_config(None, {"agents": 6, **settings}, real_links=True)
        plain, static = TopologyNetwork(config), network_for(config)
        assert not config.emulates_links and static.kind == "static"
        graph = plain.first_graph()
        assert graph.phases[0].tolist() == static.first_graph().phases[0].tolist()
        assert plain.topology() == static.topology()
        addresses = {agent: f"h:{i}" for i, agent in enumerate(IDS)}
        ours = plain.runtime(IDS).assignments(0.0, addresses)
        theirs = static.runtime(IDS).assignments(0.0, addresses)
        assert ours == theirs
        figures = plain.resolved(graph, plain.runtime(IDS))
        assert figures.lambda2 == mixing_lambda2(graph, plain.scheme)
        assert figures == static.resolved(graph, static.runtime(IDS))
        assert plain.describe() == static.describe().rpartition(" · loss")[0]
