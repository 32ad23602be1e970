"""An identity that registers early cannot keep a run's agents out (issue 33, item 2).

What ``airgossip coordinator`` runs (:class:`~airgossip.node.devices.DeviceRun`: its
default roster, mutual TLS with the test CA) and four real agents (what ``airgossip agent``
runs, each in a thread of this process, so that torch is imported once), over real gRPC. Before
the agents start, someone registers with an empty task digest and never heartbeats: a
certificate of the fleet's CA that is not one of the run's agents (refused, nothing
recorded), or one of the run's own identities (recorded, declared dead, and the digest it
fixed released). Either way the four agents then run to the end and the results are written.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import pytest

from airgossip.cli.agent import device_links
from airgossip.common.security.tls import COORDINATOR_IDENTITY, dial
from airgossip.emulation.networks import network_for
from airgossip.node.command import AgentCommand
from airgossip.node.devices import DeviceRun, DeviceRunError, DeviceRunSettings
from airgossip.node.process import run_agent_command
from airgossip.protos import coordinator_pb2, coordinator_pb2_grpc
from airgossip.scenario.results import RunResults
from tests.support.tls import credentials, credentials_folder

AGENTS = 4
ROUNDS = 15
SCENARIO = f'agents = {AGENTS}\nrounds = {ROUNDS}\n[task]\nname = "consensus"\ndim = 8\n'


def device_run(tmp_path: Path, **settings: object) -> DeviceRun:
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(SCENARIO)
    return DeviceRun(
        DeviceRunSettings(
            listen="127.0.0.1:0", metrics_port=0, config=scenario, out=tmp_path / "out",
            certs=credentials_folder(), heartbeat_interval_s=0.5, heartbeat_timeout_s=3.0,
            **settings,  # type: ignore[arg-type]
        ),
        network_for,
    )  # fmt: skip


def squat(address: str, identity: str) -> grpc.StatusCode:
    """Register as ``identity`` with an empty digest, once; never heartbeat."""
    with dial(address, COORDINATOR_IDENTITY, credentials(identity)) as channel:
        try:
            coordinator_pb2_grpc.CoordinatorStub(channel).Register(
                coordinator_pb2.RegisterRequest(agent_id=identity, address="10.66.6.6:7000"),
                timeout=5,
            )
        except grpc.RpcError as err:
            return err.code()
    return grpc.StatusCode.OK


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("squatter", "answer"),
    [("mallory", grpc.StatusCode.PERMISSION_DENIED), ("agent-3", grpc.StatusCode.OK)],
)
def test_an_early_registration_leaves_the_run_complete(
    squatter: str, answer: grpc.StatusCode, tmp_path: Path
) -> None:
    run = device_run(tmp_path)
    address = run.start()
    server = run.server
    assert server is not None
    codes: list[int | str] = [-1] * AGENTS
    try:
        assert squat(address, squatter) == answer
        if squatter == "mallory":
            assert server.view().members == ()
            assert server.servicer.refusals.snapshot() == {("Register", "not_member"): 1}
        else:  # one of the run's identities: it holds the digest until it is declared dead
            deadline = time.monotonic() + 15
            while server.view().members[0].state != "dead":
                assert time.monotonic() < deadline, server.view()
                time.sleep(0.1)

        def agent(i: int) -> None:
            command = AgentCommand(
                coordinator=address, certs=credentials_folder(), index=i, threads=1,
                linger_s=60.0, ready_timeout_s=60.0, metrics_listen="off",
            )  # fmt: skip
            try:
                codes[i] = run_agent_command(command, device_links())
            except Exception as err:  # what the agent said, for the assertion below
                codes[i] = f"{type(err).__name__}: {err}"

        threads = [threading.Thread(target=agent, args=(i,), daemon=True) for i in range(AGENTS)]
        for thread in threads:
            thread.start()
        stopped = threading.Event()
        follower = threading.Timer(120, stopped.set)
        follower.start()
        try:
            complete = run.follow(stopped, lambda view: None, 60.0)
        finally:
            follower.cancel()
        assert complete, (codes, server.view())
        results = run.collect(interrupted=False)
    finally:
        if run.server is not None:
            run.server.stop(grace_s=0)
    for thread in threads:
        thread.join(timeout=30)
    assert codes == [0] * AGENTS
    assert results is not None and results.final.complete
    written = RunResults.read(tmp_path / "out" / "results.json")
    assert written.run is not None
    assert written.run.agents == {f"agent-{i}": "finished" for i in range(AGENTS)}
    assert written.final.round == ROUNDS and written.final.agents_reporting == AGENTS


def test_a_roster_that_cannot_fill_the_run_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(DeviceRunError) as info:
        device_run(tmp_path, roster="0..2")
    assert str(info.value) == (
        "--roster: the roster names 3 agents (agent-0..agent-2); the run waits for 4"
    )
    with pytest.raises(DeviceRunError, match=r"^--roster: '1\.\.x' is not a range: write 0\.\.15"):
        device_run(tmp_path, roster="1..x")
    assert device_run(tmp_path, roster="any").roster.open
