"""Checkpoints are bound to their fleet, run and agent, MACed under a key derived from the
agent's TLS key, and range-checked before use: a checkpoint of another run or agent, an
altered one, an old-format one or one holding values no message could leave (NaN, a zero
push-sum weight) is refused with one line naming the file and why, and the agent takes the
previous good checkpoint of its run, or starts fresh when there is none."""

from __future__ import annotations

import hashlib
import logging
import math
from pathlib import Path

import pytest
import torch
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from airgossip.common.topology import assignments_for_graph, build_graph
from airgossip.edge.agent import Agent, build_agent
from airgossip.edge.agent.checkpoints import (
    OLD_MAGICS,
    SUFFIX,
    UNKEYED,
    CheckpointKey,
    CheckpointOwner,
    CheckpointStore,
    encode_state,
    read_checkpoint,
)
from airgossip.edge.settings import AgentSettings, TaskSettings
from airgossip.edge.transport.memory import InMemoryNetwork, InMemoryTransport
from tests.support.agents import lock_step

SETTINGS = AgentSettings(task=TaskSettings(name="consensus", dim=6), rounds=40, seed=3)
FLEET, RUN, OTHER_RUN = "5f0c1a2b3c4d5e6f", "20260101-120000-ab12", "20260101-090000-cd34"
AGENTS = 3


def private_key_pem() -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


PEMS = {f"agent-{i}": private_key_pem() for i in range(AGENTS)}
KEYS = {agent: CheckpointKey.of_private_key(pem) for agent, pem in PEMS.items()}


def owner(agent: str, run: str = RUN) -> CheckpointOwner:
    return CheckpointOwner(agent, FLEET, run)


def store(folder: Path, agent: str, run: str = RUN) -> CheckpointStore:
    return CheckpointStore(folder / agent, agent, owner=owner(agent, run), key=KEYS[agent])


def fleet(folder: Path, run: str = RUN) -> list[Agent]:
    network = InMemoryNetwork()
    agents = [
        build_agent(f"agent-{i}", index=i, num_agents=AGENTS, settings=SETTINGS,
                    transport=InMemoryTransport(network, f"agent-{i}"),
                    checkpoints=store(folder, f"agent-{i}", run))
        for i in range(AGENTS)
    ]  # fmt: skip
    addresses = {a.agent_id: a.start() for a in agents}
    assignments = assignments_for_graph(build_graph("exponential", AGENTS), addresses)
    for agent in agents:
        agent.set_assignment(assignments[agent.agent_id])
    return agents


def newest(folder: Path, agent: str) -> Path:
    return store(folder, agent).paths()[-1]


def next_path(folder: Path, agent: str) -> Path:
    """Where the next checkpoint of ``agent`` goes: a file put there is its newest."""
    latest = newest(folder, agent)
    serial = int(latest.name[len(agent) + 1 : -len(SUFFIX)])
    return latest.with_name(f"{agent}-{serial + 1:09d}{SUFFIX}")


def rewritten(data: bytes, change: str) -> bytes:
    """agent-1's checkpoint ``data`` with its state changed, MACed under its own key (an
    insider holding the key, or a bug: only the range check stands in the way)."""
    state = read_checkpoint(data, KEYS["agent-1"])
    algorithm = state["algorithm"]
    if change == "nan":
        algorithm["x"][2] = math.nan
    elif change == "zero-weight":
        algorithm["y"] = 0.0
    elif change == "huge":
        algorithm["x"] = algorithm["x"] * 1e20
    elif change == "wrong-shape":
        algorithm["x"] = algorithm["x"][:3]
    return encode_state(state, owner("agent-1"), KEYS["agent-1"])


def bad_checkpoint(kind: str, tmp: Path, good: bytes) -> tuple[bytes, str]:
    """A checkpoint of ``kind`` for agent-1, and what its refusal says."""
    if kind == "foreign-run":  # the same agent, task and key, in another run
        other = fleet(tmp / "other-run", OTHER_RUN)
        lock_step(other, 1, 8)
        other[1].checkpoint()
        return newest(tmp / "other-run", "agent-1").read_bytes(), f"it is of run '{OTHER_RUN}'"
    if kind == "other-agent":  # agent-2's own checkpoint of this run, renamed
        return newest(tmp / "run", "agent-2").read_bytes(), "it is 'agent-2''s checkpoint"
    if kind == "tampered":  # values x1000, the SHA-256 recomputed, the MAC left as it was
        state = read_checkpoint(good, KEYS["agent-1"])
        state["algorithm"]["x"] = state["algorithm"]["x"] * 1000
        body = encode_state(state, owner("agent-1"), KEYS["agent-1"])[:-64]
        assert len(body) == len(good) - 64
        return body + hashlib.sha256(body).digest() + good[-32:], "MAC does not verify"
    if kind == "unkeyed":  # everything right but the key: written as over plaintext
        state = read_checkpoint(good, KEYS["agent-1"])
        return encode_state(state, owner("agent-1"), UNKEYED), "written without a TLS key"
    if kind == "old-format":
        (magic,) = OLD_MAGICS
        return magic + good[len(magic) :], "checkpoint format 1"
    if kind == "nan":
        return rewritten(good, "nan"), "algorithm.x holds NaN or infinite values"
    if kind == "zero-weight":
        return rewritten(good, "zero-weight"), "weight 'y' of at most 1048576, got 0.0"
    if kind == "huge":
        return rewritten(good, "huge"), "out of the bounds messages are held to"
    if kind == "wrong-shape":
        return rewritten(good, "wrong-shape"), "algorithm.x has shape (3,), this agent's (6,)"
    raise AssertionError(kind)


KINDS = [
    "foreign-run", "other-agent", "tampered", "unkeyed", "old-format", "nan", "zero-weight",
    "huge", "wrong-shape",
]  # fmt: skip


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and " refused: " in r.getMessage()
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_a_bad_newest_checkpoint_is_refused_in_one_line_and_the_previous_one_taken(
    kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agents = fleet(tmp_path / "run")
    lock_step(agents, 1, 3)
    for agent in agents:
        agent.checkpoint()
    at_three = agents[1].algorithm.state_dict()
    good = newest(tmp_path / "run", "agent-1").read_bytes()
    lock_step(agents, 4, 5)
    data, why = bad_checkpoint(kind, tmp_path, good)
    bad = next_path(tmp_path / "run", "agent-1")
    bad.write_bytes(data)

    restarted = fleet(tmp_path / "run")[1]
    with caplog.at_level(logging.INFO):
        assert restarted.resume() == 3
    lines = refusals(caplog)
    assert len(lines) == 1, lines
    assert str(bad) in lines[0] and why in lines[0], lines[0]
    assert "\n" not in lines[0]
    back = restarted.algorithm.state_dict()
    assert torch.equal(back["x"], at_three["x"]) and back["y"] == at_three["y"]
    resumed = [r.getMessage() for r in caplog.records if "resumed round" in r.getMessage()]
    assert len(resumed) == 1 and bad.name not in resumed[0]


@pytest.mark.parametrize("kind", ["foreign-run", "tampered", "nan", "zero-weight"])
def test_with_no_good_checkpoint_left_the_agent_starts_fresh(
    kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agents = fleet(tmp_path / "run")
    lock_step(agents, 1, 3)
    for agent in agents:
        agent.checkpoint()
    good_path = newest(tmp_path / "run", "agent-1")
    good = good_path.read_bytes()
    data, why = bad_checkpoint(kind, tmp_path, good)
    good_path.write_bytes(data)  # the only checkpoint agent-1 has is the bad one

    restarted = fleet(tmp_path / "run")[1]
    fresh = restarted.algorithm.state_dict()
    with caplog.at_level(logging.INFO):
        assert restarted.resume() is None
    lines = refusals(caplog)
    assert len(lines) == 1 and why in lines[0] and str(good_path) in lines[0], lines
    assert "no checkpoint in" in caplog.text and "starting fresh" in caplog.text
    assert "resumed round" not in caplog.text
    # As it was built: nothing of the refused file was kept.
    assert restarted.round == 0 and not restarted.holds_past
    back = restarted.algorithm.state_dict()
    assert torch.equal(back["x"], fresh["x"]) and back["y"] == fresh["y"]
    assert all(math.isfinite(v) for v in back["x"].tolist())
    # It goes on: its next checkpoint is written and taken up again.
    lock_step([restarted], 1, 2)
    restarted.checkpoint()
    assert fleet(tmp_path / "run")[1].resume() == 2


def test_a_genuine_restart_resumes_its_newest_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agents = fleet(tmp_path / "run")
    lock_step(agents, 1, 4)
    agents[0].checkpoint()
    written = agents[0].algorithm.state_dict()
    restarted = fleet(tmp_path / "run")[0]
    with caplog.at_level(logging.INFO):
        assert restarted.resume() == 4
    assert refusals(caplog) == []
    back = restarted.algorithm.state_dict()
    assert torch.equal(back["x"], written["x"]) and back["y"] == written["y"]


def test_the_mac_key_is_the_agents_own_whatever_the_pem_spelling() -> None:
    pem = PEMS["agent-0"]
    key = serialization.load_pem_private_key(pem, password=None)
    pkcs8 = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    assert CheckpointKey.of_private_key(pkcs8).secret == KEYS["agent-0"].secret
    assert KEYS["agent-0"].secret != KEYS["agent-1"].secret
    assert KEYS["agent-0"].authenticates and not UNKEYED.authenticates
    assert pem not in repr(KEYS["agent-0"]).encode()
    assert KEYS["agent-0"].secret not in repr(KEYS["agent-0"]).encode()


def test_without_a_key_the_mac_proves_integrity_only(tmp_path: Path) -> None:
    """Over plaintext the MAC key is public: a checkpoint rewritten by anyone who can write
    the folder verifies (only the range check stands); documented in docs/security.md."""
    plain = CheckpointStore(tmp_path, "agent-0", owner=CheckpointOwner("agent-0", "", RUN))
    path = plain.save({"x": torch.ones(3)})
    state = read_checkpoint(path.read_bytes(), UNKEYED)
    state["x"] = state["x"] * 1000
    path.write_bytes(encode_state(state, plain.owner, UNKEYED))
    loaded = plain.load_latest()
    assert loaded.state is not None and float(loaded.state["x"][0]) == 1000.0
    # ...and a corrupt one is still told from a good one.
    data = bytearray(path.read_bytes())
    data[40] ^= 0x01
    path.write_bytes(bytes(data))
    assert plain.load_latest().state is None
