"""``--mode ray`` on a real Ray cluster of three nodes on loopback: agents forked by one host
actor per node gossip over mutual TLS and learn; push-sum stays exact under loss (a node removed
mid-run: ``test_ray_node_loss.py``)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from airgossip.common.security.tls import COORDINATOR_IDENTITY, TlsCredentials, dial
from airgossip.emulation.fleets import Fleet, FleetProgress, run_fleet
from airgossip.emulation.fleets.ray_fleet import RayFleet
from airgossip.scenario.config import load_config
from tests.system.ray_support import host_actors, ray_cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def three_nodes() -> Iterator[Any]:
    with pytest.MonkeyPatch.context() as patch, ray_cluster(patch, nodes=3) as cluster:
        yield cluster


def ray_config(cluster: Any, **settings: Any) -> Any:
    ray = {"address": cluster.address, **settings.pop("ray", {})}
    return load_config(None, {"mode": "ray", "ray": ray, **settings})


def health(address: str, agent_id: str, security: TlsCredentials | None) -> str:
    """The agent's gRPC health answer, or the code of the failed call."""
    with dial(address, agent_id, security) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
        except grpc.RpcError as err:
            return str(err.code().name)
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


class Probe:
    """Once the agents train, dials one of them in plaintext and over TLS."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.fleet: RayFleet | None = None
        self.answers: dict[str, str] = {}
        #: Ray's records of the host actors while their agents train.
        self.actors: list[dict[str, Any]] = []
        #: The coordinator's /sd (agent: metrics address) and agent-0's /metrics.
        self.targets: dict[str, str] = {}
        self.scraped = ""

    def started(self, fleet: Fleet) -> None:
        assert isinstance(fleet, RayFleet)
        self.fleet = fleet

    def progress(self, progress: FleetProgress) -> None:
        fleet = self.fleet
        if self.answers or fleet is None or fleet.coordinator is None:
            return
        if progress.slowest_round < 2:
            return
        member = fleet.coordinator.view().members[0]
        credentials = TlsCredentials.load(
            self.out / "certs" / COORDINATOR_IDENTITY, COORDINATOR_IDENTITY
        )
        self.answers = {
            "plaintext": health(member.address, member.agent_id, None),
            "tls": health(member.address, member.agent_id, credentials),
        }
        self.actors = host_actors()
        # Prometheus finds the actors through the coordinator's service discovery.
        sd = fleet.coordinator.metrics_address
        with urllib.request.urlopen(f"http://{sd}/sd", timeout=10) as reply:
            self.targets = {g["labels"]["agent"]: g["targets"][0] for g in json.load(reply)}
        with urllib.request.urlopen(f"http://{self.targets['agent-0']}/metrics", timeout=10) as r:
            self.scraped = r.read().decode()


def test_twelve_agents_spread_over_three_nodes_learn_over_mutual_tls(
    three_nodes: Any, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    probe = Probe(out)
    config = ray_config(three_nodes, agents=12, rounds=25, ray={"placement": "spread"})
    results = run_fleet(
        config, out, on_start=probe.started, on_progress=probe.progress,
        coordinator_metrics_listen="127.0.0.1:0",
    )  # fmt: skip

    # Ray's own records: one host actor on each of the three nodes (by default).
    nodes = {n.node_id for n in three_nodes.list_all_nodes()}
    # (read while they train: the table forgets a dead actor's node)
    assert len(probe.actors) == 3
    assert all(a["State"] == "ALIVE" for a in probe.actors)
    placed = [a["Address"]["NodeID"] for a in probe.actors]
    assert sorted(placed) == sorted(nodes), placed
    # Gossip over mutual TLS: a plaintext client is refused, one with the run's certificate
    # is served; no authority key was written; each actor got only its own key.
    assert probe.answers == {"plaintext": "UNAVAILABLE", "tls": "SERVING"}, probe.answers
    assert not list(out.rglob("ca.key"))
    # Every actor's metrics address is listed by /sd, on its node's (loopback) address.
    assert sorted(probe.targets) == sorted(f"agent-{i}" for i in range(12)), probe.targets
    assert all(t.startswith("127.0.0.1:") for t in probe.targets.values()), probe.targets
    assert 'airgossip_agent_info{agent_id="agent-0"} 1.0' in probe.scraped, probe.scraped[:500]
    report = json.loads((out / "ray.json").read_text())
    # Each host forked four agents, and each agent ran on its host's node: four per node.
    assert sorted(len(agents) for agents in report["hosts"].values()) == [4, 4, 4]
    ran = [s[0]["node_id"] for s in report["agents"].values()]
    assert all(ran.count(node) == 4 for node in nodes), ran
    assert all(s[0]["node_ip"] == "127.0.0.1" for s in report["agents"].values())
    # Learned, and the results are written like every mode's.
    final = json.loads((out / "results.json").read_text())["final"]
    assert final["complete"] and final["agents_reporting"] == 12
    assert results.final is not None
    print(f"12 agents on 3 Ray nodes: mean accuracy {final['mean_accuracy']:.4f}")
    assert final["mean_accuracy"] >= 0.9
    assert (out / "results.png").exists()
    # Each actor's log, and Ray's own output (not the terminal's).
    assert sorted(p.name for p in (out / "logs").iterdir()) == sorted(
        [*(f"agent-{i}.log" for i in range(12)), "ray.log"]
    )
    assert json.loads((out / "ray.json").read_text())["left_out"] == []


def test_consensus_in_ray_mode_is_exact_under_ten_percent_loss(
    three_nodes: Any, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"  # checkpoints on storage every node sees
    config = ray_config(
        three_nodes, agents=6, rounds=60, task={"name": "consensus"},
        network={"loss": 0.1},
        ray={"placement": "pack", "checkpoints": str(shared), "checkpoint_interval_s": 0.5},
    )  # fmt: skip
    run_fleet(config, tmp_path / "run")
    kept = sorted(p.parent.name for p in shared.glob("run/agent-*/agent-*.ckpt"))
    assert sorted(set(kept)) == [f"agent-{i}" for i in range(6)], kept
    final = json.loads((tmp_path / "run" / "results.json").read_text())["final"]
    print(f"consensus, 6 Ray actors, loss 0.1: relative error {final['relative_error']:.2e}")
    assert final["complete"] and final["agents_reporting"] == 6
    assert final["messages_dropped"] > 0
    assert final["relative_error"] < 1e-6
