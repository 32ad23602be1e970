"""The fleet contract: a new mode is one class and one registry line, modes refuse networks
they cannot run instead of becoming another mode, and a fleet can be stopped."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import Field

from airgossip.common.identity import agent_ids
from airgossip.edge.agent import build_agent
from airgossip.edge.observability.stats import MemoryStatsSink, RoundRecord
from airgossip.edge.transport import InMemoryNetwork, InMemoryTransport
from airgossip.emulation.fleets import FLEETS, FleetProgress, Launch, preflight, run_fleet
from airgossip.emulation.fleets.agent_fleet import AgentProcessFleet
from airgossip.emulation.fleets.base import Fleet, group_records, refuse_round_driven
from airgossip.emulation.fleets.namespaces import write_peers
from airgossip.emulation.networks import LinkRuntime, Network
from airgossip.node.command import AgentCommand
from airgossip.scenario.config import (
    ConfigError,
    RunConfig,
    load_config,
    read_scenario,
    scenario_toml,
)
from airgossip.scenario.modes import MODE_TABLES, ModeSettings
from airgossip.scenario.wireless import scenario_path
from tests.support.processes import free_port


class ReversedLockStep(Fleet):
    """A mode written against the contract alone: every agent in this process, in lock step,
    each round's phases run from the last agent to the first."""

    mode = "reversed"
    summary = "lock step, agents in reverse order (a test mode)"
    in_process = True
    #: The order agents run in within a round.
    step = -1

    def __init__(self, config: RunConfig, network: Network, launch: Launch) -> None:
        super().__init__(config, network, launch)
        self.sink = MemoryStatsSink()
        self._runtime = network.runtime(agent_ids(config.agents), clock=lambda: 0.0)

    @classmethod
    def refuse(cls, config: RunConfig, network: Network) -> str | None:
        return "mode 'reversed' has no clock" if network.time_varying else None

    def run(self) -> None:
        config, links, memory = self.config, self._runtime, InMemoryNetwork()
        agents = [
            build_agent(agent_id, index=i, num_agents=config.agents,
                        settings=config.agent_settings(), stats=links.sink(self.sink),
                        transport=InMemoryTransport(memory, agent_id, shaper=links.shaper))
            for i, agent_id in enumerate(agent_ids(config.agents))
        ][:: self.step]  # fmt: skip
        assignments = links.assignments(0.0, {a.agent_id: a.start() for a in agents[:: self.step]})
        for agent in agents:
            agent.set_assignment(assignments[agent.agent_id])
            agent.begin()
        for round_index in range(1, config.rounds + 1):
            for agent in agents:
                agent.local_step(round_index)
                agent.push(round_index)
            for agent in agents:
                agent.mix(round_index)
                if agent.report_due(round_index):
                    agent.report(round_index)
            self.keeper.update(FleetProgress(config.agents, config.rounds,
                                             config.agents, round_index, round_index))  # fmt: skip
        for agent in agents:
            agent.close()

    def records(self) -> dict[str, list[RoundRecord]]:
        return group_records(self.sink.records)

    def clock_s(self) -> float:
        return 0.0

    @property
    def runtime(self) -> LinkRuntime | None:
        return self._runtime


class EveryOther(ModeSettings):
    """A test mode's own table: ``[reversed]``."""

    table: ClassVar[str] = "reversed"
    forward: bool = Field(False, description="run the agents first to last after all")


class ReversedWithSettings(ReversedLockStep):
    """:class:`ReversedLockStep` with a settings table of its own."""

    settings_model = EveryOther

    def run(self) -> None:
        self.step = 1 if self.config.mode_settings(EveryOther).forward else -1
        super().run()


class LoopbackPeers(AgentProcessFleet):
    """A process-based mode written against the base: agent processes on loopback that find
    each other from a static peer list, without a coordinator. Only what differs from the
    other process-based modes: how the agents find their peers."""

    mode = "loopback-peers"
    summary = "agent processes on loopback, a static peer list (a test mode)"

    @classmethod
    def refuse(cls, config: RunConfig, network: Network) -> str | None:
        return refuse_round_driven(cls.mode, network)

    def start_agents(self) -> None:
        ids = agent_ids(self.config.agents)
        peers = self.folder.path / "peers.toml"
        write_peers(peers, {agent_id: f"127.0.0.1:{free_port()}" for agent_id in ids})
        table = read_scenario(peers)["peers"]
        assert isinstance(table, dict)
        for index, agent_id in enumerate(ids):
            own = AgentCommand(listen=str(table[agent_id]), peers=peers)
            self.agents.spawn(index, agent_id, own)


def test_a_new_mode_is_one_class_and_one_registry_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(FLEETS, ReversedLockStep.mode, ReversedLockStep)  # the registry line
    seen: list[FleetProgress] = []
    settings: dict[str, Any] = {"agents": 6, "rounds": 60, "task": {"name": "consensus"},
                                "network": {"loss": 0.2}}  # fmt: skip
    config = load_config(None, {**settings, "mode": "reversed"})
    results = run_fleet(config, tmp_path / "reversed", on_progress=seen.append).to_json()
    assert results["config"]["mode"] == "reversed" and results["final"]["complete"]
    assert results["final"]["relative_error"] < 1e-6  # push-sum exact under 20% loss
    assert results["final"]["messages_dropped"] > 0
    assert [p.slowest_round for p in seen] == list(range(1, 61))
    # The same run in the built-in lock-step mode: the order of agents within a round does
    # not change what lock step computes.
    inproc = run_fleet(load_config(None, {**settings, "mode": "inproc"}), tmp_path / "i")
    assert inproc.final.relative_error == pytest.approx(results["final"]["relative_error"])


def test_a_mode_with_a_table_adds_its_model_and_one_line_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(FLEETS, "reversed", ReversedWithSettings)
    monkeypatch.setitem(MODE_TABLES, "reversed", EveryOther)  # the table's line
    settings: dict[str, Any] = {"agents": 4, "rounds": 5, "task": {"name": "consensus"},
                                "mode": "reversed"}  # fmt: skip
    scenario = tmp_path / "run.toml"
    scenario.write_text('mode = "reversed"\n[reversed]\nforward = true\n')
    config = load_config(scenario, {"agents": 4, "rounds": 5, "task": {"name": "consensus"}})
    assert config.mode_settings(EveryOther).forward
    assert not load_config(None, settings).mode_settings(EveryOther).forward  # its default
    with pytest.raises(ConfigError, match=r"unknown setting 'reversed\.forwards'"):
        load_config(None, {**settings, "reversed": {"forwards": True}})
    results = run_fleet(config, tmp_path / "out").to_json()
    assert results["config"]["reversed"] == {"forward": True}  # written as the scenario had it
    assert results["final"]["complete"]
    assert "[reversed]\nforward = true" in scenario_toml(config)


def test_every_mode_table_is_its_modes_and_no_other_table_is_taken() -> None:
    tables = {m: FLEETS[m].settings_model for m in FLEETS if FLEETS[m].settings_model}
    assert tables == {name: MODE_TABLES[name] for name in MODE_TABLES}
    assert set(tables) == {"containers", "ray"}
    with pytest.raises(ConfigError, match=r"unknown setting 'netwrok'"):
        load_config(None, {"netwrok": {"loss": 0.1}})


@pytest.mark.parametrize(
    ("mode", "preset", "message"),
    [
        ("inproc", "wifi-indoor", "mode 'inproc' runs agents in lock step with no clock"),
        ("virtual", None, "mode 'virtual' runs a network that changes with time"),
        ("cloud", None, "unknown mode 'cloud'; choose one of: process, inproc, virtual"),
    ],
)
def test_a_mode_that_cannot_serve_a_network_says_so(
    mode: str, preset: str | None, message: str, tmp_path: Path
) -> None:
    base = read_scenario(scenario_path(preset)) if preset else None
    config = load_config(None, {"mode": mode, "agents": 4}, base=base)
    with pytest.raises(ConfigError, match=message):
        preflight(config)
    with pytest.raises(ConfigError, match=message):
        run_fleet(config, tmp_path)
    assert not any(tmp_path.iterdir())  # refused before anything was written


@pytest.mark.slow
def test_a_process_based_mode_is_only_its_own_differences(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The base runs, follows, stops and collects the agent processes; the mode says only
    how they find their peers."""
    monkeypatch.setitem(FLEETS, LoopbackPeers.mode, LoopbackPeers)
    config = load_config(None, {"mode": "loopback-peers", "agents": 3, "rounds": 30,
                                "topology": "complete", "task": {"name": "consensus"},
                                "network": {"loss": 0.2}})  # fmt: skip
    results = run_fleet(config, tmp_path / "run", insecure=True).to_json()
    final = results["final"]
    assert results["config"]["mode"] == "loopback-peers" and final["complete"]
    assert final["agents_reporting"] == 3 and final["round"] == 30
    assert final["relative_error"] < 1e-6 and final["messages_dropped"] > 0
    assert sorted(p.name for p in (tmp_path / "run" / "logs").iterdir()) == [
        "agent-0.log", "agent-1.log", "agent-2.log"
    ]  # fmt: skip


def test_an_in_process_fleet_stops_when_asked(tmp_path: Path) -> None:
    config = load_config(None, {"mode": "inproc", "agents": 4, "rounds": 100_000,
                                "task": {"name": "consensus"}})  # fmt: skip
    fleets: list[Any] = []

    def stop_at_round_5(progress: FleetProgress) -> None:
        if progress.slowest_round == 5:
            threading.Thread(target=fleets[0].stop).start()

    results = run_fleet(config, tmp_path, on_progress=stop_at_round_5, on_start=fleets.append)
    assert 5 <= results.final.round < 100 and not results.final.complete


def test_a_mode_says_itself_whether_the_kernel_shapes_its_links() -> None:
    """What sets a mode apart is declared on its class (no list of modes elsewhere)."""
    assert {m for m in FLEETS if FLEETS[m].links_in_kernel} == {"namespaces", "containers"}
    assert {m for m in FLEETS if FLEETS[m].in_process} == {"inproc", "virtual"}
