"""Checkpoints: atomic files with a checksum and a MAC; a corrupt newest one falls back to the
one before it with a clear message; an agent resumes exactly where its checkpoint was.
(Binding to the fleet, run and agent and the range checks: test_checkpoint_binding.py.)"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from airgossip.common.topology import assignments_for_graph, build_graph
from airgossip.edge.agent import build_agent
from airgossip.edge.agent.checkpoints import CheckpointStore, decode_state, encode_state
from airgossip.edge.settings import AgentSettings, TaskSettings
from airgossip.edge.transport.memory import InMemoryNetwork, InMemoryTransport
from tests.support.agents import lock_step


def test_states_round_trip_exactly() -> None:
    state = {
        "x": torch.randn(7, dtype=torch.float64), "f": torch.randn(2, 3), "i": 2**60,
        "y": 0.1 + 0.2, "s": "agent-1", "b": b"\x00\xff", "none": None,
        "nested": {"list": [torch.arange(3), {"empty": torch.zeros(0)}], "t": True},
    }  # fmt: skip
    back = decode_state(encode_state(state))
    assert torch.equal(back["x"], state["x"]) and back["x"].dtype == torch.float64
    assert torch.equal(back["f"], state["f"]) and back["f"].shape == (2, 3)
    assert back["i"] == 2**60 and back["y"] == state["y"] and back["b"] == b"\x00\xff"
    assert torch.equal(back["nested"]["list"][0], torch.arange(3))
    assert back["nested"]["list"][1]["empty"].numel() == 0 and back["none"] is None


def test_a_corrupt_checkpoint_falls_back_to_the_previous_one(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, "agent-0", keep=3)
    paths = [store.save({"round": r, "x": torch.full((4,), float(r))}) for r in range(1, 5)]
    assert [p.name for p in store.paths()] == [p.name for p in paths[1:]]  # the newest three
    assert not list(tmp_path.glob(".*.tmp"))
    data = bytearray(paths[-1].read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped bit in the newest
    paths[-1].write_bytes(bytes(data))
    loaded = store.load_latest()
    assert loaded.state is not None and loaded.state["round"] == 3 and loaded.path == paths[-2]
    assert len(loaded.refused) == 1 and "checksum mismatch" in loaded.refused[0]
    assert str(paths[-1]) in loaded.refused[0]
    paths[-2].write_bytes(paths[-2].read_bytes()[:100])  # truncated
    paths[-3].write_bytes(b"garbage")
    nothing = store.load_latest()
    assert nothing.state is None and nothing.path is None and len(nothing.refused) == 3
    assert "not an airgossip checkpoint" in nothing.refused[-1]
    empty = CheckpointStore(tmp_path / "empty", "agent-0").load_latest()
    assert empty.state is None and empty.refused == ()


SETTINGS = AgentSettings(task=TaskSettings(name="consensus", dim=6), rounds=40, seed=3)


def fleet(folder: Path, n: int = 3) -> list:  # type: ignore[type-arg]
    network = InMemoryNetwork()
    agents = [
        build_agent(f"agent-{i}", index=i, num_agents=n, settings=SETTINGS,
                    transport=InMemoryTransport(network, f"agent-{i}"),
                    checkpoints=CheckpointStore(folder / f"agent-{i}", f"agent-{i}"))
        for i in range(n)
    ]  # fmt: skip
    addresses = {a.agent_id: a.start() for a in agents}
    assignments = assignments_for_graph(build_graph("exponential", n), addresses)
    for agent in agents:
        agent.set_assignment(assignments[agent.agent_id])
    return agents


def test_an_agent_resumes_where_its_checkpoint_was(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agents = fleet(tmp_path)
    lock_step(agents, 1, 5)
    agents[1].checkpoint()
    written = agents[1].algorithm.state_dict()
    restarted = fleet(tmp_path)[1]
    with caplog.at_level(logging.INFO):
        assert restarted.resume() == 5
    assert "resumed round 5" in caplog.text
    back = restarted.algorithm.state_dict()
    assert torch.equal(back["x"], written["x"]) and back["y"] == written["y"]
    # its own state, never its edges': it starts every edge over as a new incarnation
    assert "out" not in written and "in" not in written
    assert restarted.lineages.incarnation > agents[1].lineages.incarnation
    assert restarted.counters() == agents[1].counters()
    # a checkpoint of another agent is refused, not silently taken: the stranger starts fresh
    stranger = fleet(tmp_path)[2]
    stranger.checkpointer = agents[1].checkpointer
    fresh = stranger.algorithm.state_dict()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert stranger.resume() is None
    assert "it is 'agent-1''s checkpoint, not 'agent-2''s" in caplog.text
    assert "starting fresh" in caplog.text and stranger.round == 0
    assert torch.equal(stranger.algorithm.state_dict()["x"], fresh["x"])


def test_checkpoints_are_private_to_their_agent(tmp_path: Path) -> None:
    folder = tmp_path / "shared"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    store = CheckpointStore(folder, "agent-0")
    path = store.save({"round": 1, "x": torch.ones(3)})
    assert folder.stat().st_mode & 0o777 == 0o700
    assert path.stat().st_mode & 0o777 == 0o600
    fresh = CheckpointStore(tmp_path / "a" / "b", "agent-1")
    assert fresh.directory.stat().st_mode & 0o777 == 0o700
