"""Cancelling masks on a real wire: two agents over gRPC on loopback, one direction through a
TCP relay that records every byte. What crosses is the masked model, never the unmasked one,
and the two differ by exactly the mask; the pair's secret (the X25519 secret and the mask key
derived from it) appears in no byte on the wire and in no log line.

Plaintext on purpose: the check is on what the agent sends, before TLS would hide it (with
TLS, what crosses is ciphertext of these same bytes).
"""

from __future__ import annotations

import base64
import logging
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from airgossip.common.topology import assignments_for_graph, build_graph
from airgossip.edge.agent import Agent, build_agent
from airgossip.edge.agent.runner import WallClockRunner
from airgossip.edge.privacy.keys import RunKeyring, mask_key
from airgossip.edge.privacy.masks import gaussian_stream, mask_sign
from airgossip.edge.privacy.mechanism import PrivacyContext
from airgossip.edge.privacy.plan import PrivacyGraph
from airgossip.edge.settings import AgentSettings
from airgossip.edge.transport.grpc_transport import GrpcTransport

pytest.importorskip("opacus")

IDS = ("agent-0", "agent-1")
NOISE, MASK = 0.5, 3.0


class Relay:
    """A TCP relay to ``target`` that records what the client sends through it."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.sent = bytearray()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._server.getsockname()[1]}"
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = [self._server]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self._sockets += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, record: bool) -> None:
        try:
            while data := source.recv(65536):
                if record:
                    with self._lock:
                        self.sent += data
                sink.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        for s in self._sockets:
            s.close()


def settings(mask: float) -> AgentSettings:
    return AgentSettings.model_validate({
        "task": {"name": "digits", "hidden": 8}, "algorithm": "dpsgd", "rounds": 3, "seed": 5,
        "wait_timeout_s": 5.0,
        "privacy": {"mechanism": "cancelling", "noise_multiplier": NOISE,
                    "mask_multiplier": mask},
    })  # fmt: skip


def pair(mask: float, keyring: RunKeyring) -> list[Agent]:
    graph = PrivacyGraph.of(build_graph("ring", 2), IDS, "metropolis-hastings", static=True)
    agents = []
    for i, agent_id in enumerate(IDS):
        agents.append(build_agent(
            agent_id, index=i, num_agents=2, settings=settings(mask),
            transport=GrpcTransport(agent_id, listen="127.0.0.1:0", security=None),
            privacy=PrivacyContext(graph, keyring.for_agent(agent_id)),
        ))  # fmt: skip
    return agents


@pytest.fixture
def wire(caplog: pytest.LogCaptureFixture) -> Iterator[dict[str, Any]]:
    caplog.set_level(logging.DEBUG)
    keyring = RunKeyring(IDS, seed=5)
    masked, twin = pair(MASK, keyring), pair(0.0, RunKeyring(IDS, seed=6))
    addresses = {a.agent_id: a.start() for a in masked}
    port = int(addresses["agent-1"].rpartition(":")[2])
    relay = Relay(("127.0.0.1", port))
    # agent-0 reaches agent-1 through the relay; the way back is direct.
    routed = {"agent-0": addresses["agent-0"], "agent-1": relay.address}
    ring = build_graph("ring", 2)
    assignments = assignments_for_graph(ring, routed, scheme="metropolis-hastings")
    for agent in masked:
        agent.set_assignment(assignments[agent.agent_id])
    yield {"masked": masked, "twin": twin, "relay": relay, "keyring": keyring}
    relay.close()
    for agent in masked + twin:
        agent.close()


def test_a_message_on_the_wire_differs_from_the_unmasked_model_by_the_mask(
    wire: dict[str, Any],
) -> None:
    masked, twin, relay = wire["masked"], wire["twin"], wire["relay"]
    sender, unmasked_sender = masked[0], twin[0]
    sender.local_step(1)
    unmasked_sender.local_step(1)  # same seeds, same batches, same independent noise
    sent = sender.algorithm.estimate()  # dpsgd sends its whole model
    unmasked = unmasked_sender.algorithm.estimate()
    masked[1].local_step(1)
    for agent in masked:
        agent.push(1)
    for agent in masked:
        WallClockRunner(agent).wait_for_neighbours(1)
    captured = bytes(relay.sent)
    assert sent.numpy().tobytes() in captured
    assert unmasked.numpy().tobytes() not in captured
    # The difference is agent-0's mask for its one partner, computed here from the pair key.
    keyring = wire["keyring"]
    context = f"5:{sender.digest}".encode()
    key = keyring.for_agent("agent-0").mask_key("agent-1", context)
    setup = sender.task.private_training(unmasked, _config(1))
    scale = setup.lr / setup.nominal_examples  # sample_rate 1
    expected = torch.from_numpy(
        gaussian_stream(key, 1, sent.numel()) * mask_sign("agent-0", "agent-1") * MASK * scale
    ).to(torch.float32)
    difference = sent - unmasked
    update = unmasked - sender.task.initial_parameters()
    # A mask of the size of the round's update, not a rounding error.
    assert float(torch.linalg.vector_norm(expected)) > 0.5 * float(torch.linalg.vector_norm(update))
    assert torch.allclose(difference, expected, rtol=1e-4, atol=1e-5)


def test_the_pair_secret_never_crosses_the_wire_nor_reaches_a_log(
    wire: dict[str, Any], caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    masked, relay, keyring = wire["masked"], wire["relay"], wire["keyring"]
    for round_index in (1, 2, 3):
        for agent in masked:
            agent.local_step(round_index)
            agent.push(round_index)
        for agent in masked:
            WallClockRunner(agent).wait_for_neighbours(round_index)
            agent.mix(round_index)
            agent.report(round_index)
    assert masked[1].counters().messages_received >= 3  # agent-0's messages crossed
    shared = keyring._private["agent-0"].exchange(keyring._public["agent-1"])
    assert shared == keyring._private["agent-1"].exchange(keyring._public["agent-0"])
    key = mask_key(shared, "agent-0", "agent-1", f"5:{masked[0].digest}".encode())
    out, err = capfd.readouterr()
    logs = "\n".join(r.getMessage() for r in caplog.records) + out + err
    mechanism = masked[0].task.mechanism
    logs += repr(mechanism.masks) + repr(mechanism) + repr(masked[0].task)
    wire_bytes = bytes(relay.sent)
    assert len(wire_bytes) > 3 * 4 * masked[0].algorithm.numel  # three models went across
    for secret in (shared, key):
        for form in _forms(secret):
            assert form not in wire_bytes
            assert form.decode("latin-1") not in logs


def _forms(secret: bytes) -> list[bytes]:
    """How a secret could show: raw, hex (either case), base64 (standard or URL-safe), and
    any 8-byte run of it (a seed cut from it)."""
    forms = [secret, secret.hex().encode(), secret.hex().upper().encode(),
             base64.b64encode(secret), base64.urlsafe_b64encode(secret)]  # fmt: skip
    forms += [secret[i : i + 8] for i in range(0, len(secret), 8)]
    forms += [str(int.from_bytes(secret[i : i + 8], "little")).encode() for i in (0, 8, 16, 24)]
    return forms


def _config(round_index: int) -> Any:
    from airgossip.edge.tasks import TrainConfig

    return TrainConfig(round_index, 3)
