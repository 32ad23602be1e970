"""Backends agree: the same scenario through the virtual clock and through real gRPC.

Both send the same messages one at a time per link (as agents do: one in flight per edge)
through a :class:`WirelessLinkShaper` on the same model; the loss rate and the mean delivery
time must agree within statistical bounds. The kernel backend's side of parity (packet loss
and throughput at the receivers) is in ``test_kernel.py``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from airgossip.edge.algorithms.base import Ack
from airgossip.edge.transport.base import GossipMessage, InboundHandler, MessageHeader, SendOutcome
from airgossip.edge.transport.grpc_transport import GrpcTransport
from airgossip.emulation.channel.model import ChannelModel
from airgossip.emulation.fleets.virtual import EventLoop, VirtualTransport
from airgossip.emulation.networks.shaper import WirelessLinkShaper
from airgossip.scenario.wireless import WirelessSettings

MESSAGES_PER_LINK = 80
PAYLOAD = 60_000  # bytes: 60 ms at 8 Mbit/s
LINKS = [("agent-0", "agent-1"), ("agent-2", "agent-3"), ("agent-1", "agent-0")]


class Sink:
    """Accepts everything (the receiving agent's checks are tested elsewhere)."""

    def admit(self, header: MessageHeader) -> None:
        pass

    def deliver(self, message: GossipMessage) -> Ack:
        return Ack(message.header.seq, 0, True, message.header.round)

    def refused(self, error: Any) -> None:
        pass


def scenario(tmp_path: Path) -> WirelessSettings:
    trace = tmp_path / "rate.txt"
    trace.write_text("0 8\n1 8\n")
    return WirelessSettings.model_validate({
        "latency_ms": 5.0, "jitter_ms": 1.0, "activity": 0.0, "loss_timeout_ms": 50,
        "step_s": 0.1,
        "fading": {"model": "none"},
        "burst": {"model": "gilbert-elliott", "p": 0.3, "r": 0.9, "loss_good": 0.05},
        "mobility": {"model": "static", "positions": [[0, 0], [6, 0], [0, 6], [6, 6]]},
        "traces": [{"file": str(trace)}],
    })  # fmt: skip


def message(sender: str, k: int) -> GossipMessage:
    header = MessageHeader(sender, k + 1, k + 1, 0, "push-sum", "float32", PAYLOAD // 4, PAYLOAD)
    return GossipMessage(header, bytes(PAYLOAD))


def virtual_backend(settings: WirelessSettings) -> list[tuple[bool, float]]:
    loop = EventLoop()
    ids = [f"agent-{i}" for i in range(4)]
    shaper = WirelessLinkShaper(ChannelModel(settings, 4, seed=11), ids, loop.clock)
    directory: dict[str, InboundHandler] = {}
    transports = {a: VirtualTransport(loop, directory, a, shaper=shaper) for a in ids}
    for t in transports.values():
        t.start(Sink())
    outcomes: list[tuple[bool, float]] = []

    def send(sender: str, receiver: str, k: int) -> None:
        if k == MESSAGES_PER_LINK:
            return
        start = loop.now

        def done(outcome: SendOutcome) -> None:
            outcomes.append((outcome.delivered, loop.now - start))
            loop.at(loop.now, send, sender, receiver, k + 1)

        transports[sender].send(receiver, f"virtual://{receiver}", message(sender, k), done)

    for sender, receiver in LINKS:
        loop.at(0.0, send, sender, receiver, 0)
    loop.run()
    return outcomes


def grpc_backend(settings: WirelessSettings) -> list[tuple[bool, float]]:
    ids = [f"agent-{i}" for i in range(4)]
    epoch = time.monotonic()
    shaper = WirelessLinkShaper(
        ChannelModel(settings, 4, seed=11), ids, lambda: time.monotonic() - epoch
    )
    transports = {a: GrpcTransport(a, shaper=shaper, max_workers=4) for a in ids}
    addresses = {a: t.start(Sink()) for a, t in transports.items()}
    outcomes: list[tuple[bool, float]] = []
    lock = threading.Lock()

    def run_link(sender: str, receiver: str) -> None:
        for k in range(MESSAGES_PER_LINK):
            finished = threading.Event()
            start = time.monotonic()
            result: list[SendOutcome] = []

            def done(
                outcome: SendOutcome,
                result: list[SendOutcome] = result,
                ev: threading.Event = finished,
            ) -> None:
                result.append(outcome)
                ev.set()

            transports[sender].send(receiver, addresses[receiver], message(sender, k), done)
            assert finished.wait(60)
            with lock:
                outcomes.append((result[0].delivered, time.monotonic() - start))

    try:
        threads = [threading.Thread(target=run_link, args=link) for link in LINKS]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        for t in transports.values():
            t.close()
    return outcomes


def figures(outcomes: list[tuple[bool, float]]) -> tuple[float, float]:
    delivered = [d for ok, d in outcomes if ok]
    return 1 - len(delivered) / len(outcomes), float(np.mean(delivered))


@pytest.mark.timeout(240)
def test_virtual_and_grpc_backends_agree(tmp_path: Path) -> None:
    settings = scenario(tmp_path)
    v_loss, v_time = figures(virtual_backend(settings))
    g_loss, g_time = figures(grpc_backend(settings))
    expected_loss = 1 - (1 - 0.25) * (1 - 0.05)  # GE bad share 0.25 loses all; good loses 5%
    n = MESSAGES_PER_LINK * len(LINKS)
    # Bursts correlate neighbouring drops a little: 4 binomial sigmas, inflated by 1.5.
    bound = 4 * np.sqrt(expected_loss * (1 - expected_loss) / n) * 1.5
    assert abs(v_loss - expected_loss) < bound
    assert abs(g_loss - expected_loss) < bound
    assert abs(v_loss - g_loss) < bound
    # Delivery: 5 ms latency + 60 kB at 8 Mbit/s (airtime shared with the other links).
    assert v_time == pytest.approx(g_time, rel=0.2)
    assert 0.06 < v_time < 0.3
