"""The kernel backend: 4 agents in network namespaces, links applied with HTB and iptables.

Needs root, iproute2 and iptables (``scripts/install --dev`` installs them when root); skips
with the reason otherwise. Every namespace the run creates is deleted, pass or fail.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airgossip.emulation.fleets import run_fleet
from airgossip.emulation.networks.kernel import NamespaceNetwork, kernel_support
from airgossip.scenario.config import load_config
from tests.support.cli import assert_tcp_carried_every_message

SUPPORT = kernel_support()
pytestmark = pytest.mark.skipif(not SUPPORT.available, reason=SUPPORT.reason or "no kernel support")


def namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def namespace_names() -> set[str]:
    """The names only: ``ip netns list`` adds ``(id: N)`` to some."""
    return {line.split()[0] for line in namespaces().splitlines() if line.strip()}


def test_network_is_created_shaped_and_removed() -> None:
    tag = f"agtest{secrets.token_hex(3)}"  # clear of names an earlier, killed run left
    with NamespaceNetwork(3, tag=tag) as network:
        listed = namespaces()
        assert all(ns in listed for ns in (*network.namespaces, network.hub))
        shaping = subprocess.run(
            [*network.exec_prefix(0), "tc", "class", "show", "dev", "eth0"],
            capture_output=True, text=True,
        ).stdout  # fmt: skip
        assert shaping.count("htb") >= 3  # default class + one per destination
        server = subprocess.Popen(
            [*network.exec_prefix(2), sys.executable, "-c",
             "import socket; s = socket.create_server(('10.213.0.3', 7100)); "
             "c, _ = s.accept(); c.sendall(b'over veth'); c.close()"],
        )  # fmt: skip
        try:
            reply = ""
            for _ in range(50):  # the server may take a moment to listen
                client = subprocess.run(
                    [*network.exec_prefix(0), sys.executable, "-c",
                     "import socket; c = socket.create_connection(('10.213.0.3', 7100), 2); "
                     "print(c.recv(64).decode())"],
                    capture_output=True, text=True, timeout=30,
                )  # fmt: skip
                reply = client.stdout.strip()
                if reply:
                    break
                time.sleep(0.2)
            assert reply == "over veth"
        finally:
            server.kill()
            server.wait()
    assert not any(name.startswith(tag) for name in namespace_names())


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_four_agents_in_namespaces_match_the_model(tmp_path: Path) -> None:
    trace = tmp_path / "rate.txt"
    trace.write_text("0 6\n2 12\n")  # the rate changes every 2 s: the controller re-applies it
    scenario = tmp_path / "kernel.toml"
    scenario.write_text(f"""
agents = 4
rounds = 4
mode = "namespaces"
wait_timeout_s = 30  # agents wait for their pushes: links stay busy, transfers long
[task]
name = "consensus"
dim = 1000000
[wireless]
name = "kernel-parity"
step_s = 0.5
activity = 0.0
max_out_degree = 3
graph_interval_s = 60
latency_ms = 0
jitter_ms = 0
[wireless.fading]
model = "none"
[wireless.burst]
model = "gilbert-elliott"
p = 0.0
r = 1.0
loss_good = 0.01
[wireless.mobility]
model = "static"
positions = [[0, 0], [8, 0], [0, 8], [8, 8]]
[[wireless.traces]]
file = "{trace}"
""")
    before = namespace_names()
    results = run_fleet(load_config(scenario), tmp_path / "run").to_json()
    assert results["final"]["round"] == 4 and results["final"]["complete"]
    report = json.loads((tmp_path / "run" / "kernel.json").read_text())
    links = report["links"]
    seen = sum(link["packets_seen"] for link in links)
    dropped = sum(link["packets_dropped"] for link in links)
    modelled = sum(link["applied_loss_weighted"] for link in links)
    assert seen > 5000, "too little traffic crossed the namespaces"
    measured_loss, model_loss = dropped / seen, modelled / seen
    assert model_loss == pytest.approx(0.01, rel=1e-6)
    assert measured_loss == pytest.approx(model_loss, rel=0.2)
    busy = sum(link["busy_s"] for link in links)
    throughput = sum(link["busy_bytes"] for link in links) * 8 / busy
    model_rate = sum(link["applied_rate_busy"] for link in links) / busy
    assert busy > 5.0
    assert 6e6 <= model_rate <= 12e6  # the trace's two rates, as applied over time
    assert throughput == pytest.approx(model_rate, rel=0.2)
    assert any("message loss" in effect for effect in report["unapplied"])
    if not report["netem"]:
        assert any("latency and jitter" in effect for effect in report["unapplied"])
    assert not report["controller_errors"]
    assert namespace_names() <= before, "the run left namespaces behind"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_static_network_in_namespaces_drops_packets_at_its_loss(tmp_path: Path) -> None:
    """The same fleet with a static network: the kernel drops each packet with the
    configured loss and limits each link to the configured rate."""
    config = load_config(None, {
        "agents": 3, "rounds": 4, "mode": "namespaces", "topology": "complete",
        "wait_timeout_s": 30, "task": {"name": "consensus", "dim": 400_000},
        "network": {"loss": 0.02, "bandwidth_mbps": 40},
    })  # fmt: skip
    notices: list[str] = []
    before = namespace_names()
    results = run_fleet(config, tmp_path / "run", on_notice=notices.append).to_json()
    assert results["final"]["round"] == 4 and results["final"]["complete"]
    # The console hears what the kernel does not apply, as kernel.json keeps it.
    assert any(n.startswith("the kernel does not apply: ") and "message loss" in n
               for n in notices)  # fmt: skip
    # No agent shaped its links again (--no-link-shaping): TCP carried every message.
    assert results["final"]["messages_sent"] > 0
    assert_tcp_carried_every_message(tmp_path / "run", results)
    report = json.loads((tmp_path / "run" / "kernel.json").read_text())
    seen = sum(link["packets_seen"] for link in report["links"])
    dropped = sum(link["packets_dropped"] for link in report["links"])
    assert seen > 2000
    assert dropped / seen == pytest.approx(0.02, rel=0.25)
    assert all(link["model_loss"] in (None, pytest.approx(0.02)) for link in report["links"])
    assert any("message loss" in effect for effect in report["unapplied"])
    assert namespace_names() <= before, "the run left namespaces behind"
