"""The coordinator's word on where a run is (``GetRun``'s ``fleet_round``, where a restarted
agent skips to) is a round a quorum of its agents reported reaching: one member reporting
rounds far ahead, with its genuine certificate, cannot set it. Real gRPC, mutual TLS."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airgossip.common.security.tls import COORDINATOR_IDENTITY
from airgossip.coordinator.client import CoordinatorClient
from airgossip.coordinator.run import RunSpec
from airgossip.coordinator.service import CoordinatorServer, TopologySpec
from airgossip.edge.observability.stats import RoundRecord
from tests.support.tls import credentials

ROUNDS = 1000


@pytest.fixture
def server() -> Iterator[CoordinatorServer]:
    server = CoordinatorServer(
        expected=4, topology=TopologySpec("ring"), security=credentials(COORDINATOR_IDENTITY),
        run=RunSpec("run-q", {"rounds": ROUNDS}, ROUNDS),
    )  # fmt: skip
    server.start()
    yield server
    server.stop(grace_s=0)


def member(server: CoordinatorServer, i: int) -> CoordinatorClient:
    client = CoordinatorClient(server.address, f"agent-{i}", security=credentials(f"agent-{i}"))
    client.register(f"127.0.0.1:{4000 + i}", "d1", timeout_s=10)
    return client


def reach(client: CoordinatorClient, *rounds: int) -> None:
    for r in rounds:
        client.record(RoundRecord(client.agent_id, r, 0.1 * r))
    client.send_reports()


def fleet_round(client: CoordinatorClient) -> int:
    info = client.run_status()
    assert info is not None
    return info.fleet_round


def test_one_member_reporting_far_ahead_does_not_move_the_fleets_round(
    server: CoordinatorServer,
) -> None:
    clients = [member(server, i) for i in range(4)]
    try:
        insider, restarter, *honest = clients[3], clients[0], clients[1], clients[2]
        reach(restarter, 0, 30)
        reach(insider, 0, ROUNDS - 10)  # the last round a restarted agent would skip to
        assert fleet_round(restarter) == 30  # a quorum of two: the insider and the restarter
        reach(honest[0], 0, 130)
        # three reported: a quorum is two; the insider and one honest agent give 130
        assert fleet_round(restarter) == 130
        reach(honest[1], 0, 131)
        # four reported: a quorum is three, reached by the honest 130 and 131 and the insider
        assert fleet_round(restarter) == 130
    finally:
        for client in clients:
            client.close()
