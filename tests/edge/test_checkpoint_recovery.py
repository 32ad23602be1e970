"""Agents rolled back to their last checkpoint while their peers go on: the fleet's mass is
conserved and it still reaches the exact average.

Pure algorithms on a hostile network (loss, reordering, lost acknowledgements), no agents:
each one writes a checkpoint every few rounds (``state_dict``, then ``committed``), and now
and then one "crashes" and resumes from its last checkpoint, forgetting everything since.
What a crashed process had in flight dies with it (its TCP connections do).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from edge.algorithms import GossipAlgorithm, Payload, create_algorithm
from edge.algorithms.base import Ack
from edge.topology import build_graph, node_phases


@dataclass
class CrashingFleet:
    name: str
    algos: list[GossipAlgorithm]
    ids: list[str]
    initial: list[torch.Tensor]
    compression: str = "none"
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    crashes: int = 0

    @classmethod
    def build(cls, name: str, n: int, *, seed: int, compression: str = "none") -> CrashingFleet:
        gen = torch.Generator().manual_seed(seed)
        ids = [f"a{i}" for i in range(n)]
        initial = [torch.randn(5, generator=gen, dtype=torch.float64) + 1 for _ in ids]
        fleet = cls(name, [], ids, initial, compression)
        fleet.algos = [fleet.fresh(i) for i in range(n)]
        fleet.checkpoints = [fleet.checkpoint(i) for i in range(n)]
        return fleet

    def fresh(self, i: int) -> GossipAlgorithm:
        from edge.compression import get_codec, raw_codec_for

        codec = (
            raw_codec_for(torch.float64)
            if self.compression == "none"
            else get_codec(self.compression)
        )
        algo = create_algorithm(
            self.name, self.initial[i], dtype=torch.float64, codec=codec, seed=i
        )
        algo.checkpointing = True
        return algo

    def checkpoint(self, i: int) -> dict[str, Any]:
        state = self.algos[i].state_dict()
        self.algos[i].committed(state)
        return state

    def crash(self, i: int) -> None:
        algo = self.fresh(i)
        algo.load_state_dict(self.checkpoints[i])
        self.algos[i] = algo
        self.crashes += 1

    def run(
        self, rounds: int, *, loss: float, max_delay: int, ack_loss: float, crash: float,
        every: int, seed: int,
    ) -> None:  # fmt: skip
        rng = random.Random(seed)
        graph = build_graph("exponential", len(self.ids))
        phases = [node_phases(graph, self.ids, i) for i in range(len(self.ids))]
        queue: list[tuple[int, int, int, Payload]] = []
        for r in range(1, rounds + 1):
            for i, algo in enumerate(self.algos):
                phase = phases[i][r % len(phases[i])]
                payloads = algo.share(phase, set(phase.out_weights) | set(self.ids) - {self.ids[i]})
                if algo.checkpoint_before_send or (r + i) % every == 0:
                    self.checkpoints[i] = self.checkpoint(i)
                for peer, payload in payloads.items():
                    if rng.random() >= loss:
                        due = r + rng.randint(0, max_delay)
                        queue.append((due, i, self.ids.index(peer), payload))
            rng.shuffle(queue)
            due_now = [m for m in queue if m[0] <= r]
            queue = [m for m in queue if m[0] > r]
            for _, i, j, payload in due_now:
                ack = self.deliver(j, i, payload)
                if ack is not None and rng.random() >= ack_loss:
                    self.algos[i].on_ack(self.ids[j], ack)
            for algo in self.algos:
                algo.mix()
            if crash and rng.random() < crash:
                victim = rng.randrange(len(self.algos))
                self.crash(victim)
                queue = [m for m in queue if victim not in (m[1], m[2])]

    def deliver(self, j: int, i: int, payload: Payload) -> Ack | None:
        from edge.algorithms import ProtocolError
        from edge.compression import decode_blocks, get_codec

        algo = self.algos[j]
        encoded = payload.encoded
        assert encoded is not None
        vector = decode_blocks(get_codec(encoded.codec), encoded, algo.block_numel, algo.dtype)
        try:
            return algo.receive(self.ids[i], Payload(vector, dict(payload.scalars), payload.seq,
                                                     payload.base_seq))  # fmt: skip
        except ProtocolError:
            self.algos[i].on_refused(self.ids[j])
            return None

    def error(self) -> float:
        target = sum(self.initial) / len(self.initial)
        return max(float((a.estimate() - target).norm() / target.norm()) for a in self.algos)


@pytest.mark.parametrize(
    ("name", "compression"),
    [("push-sum", "none"), ("gradient-tracking", "none"), ("quantized-push-sum", "qsgd:4")],
)
def test_rollbacks_to_checkpoints_conserve_the_fleets_mass(name: str, compression: str) -> None:
    fleet = CrashingFleet.build(name, 8, seed=1, compression=compression)
    fleet.run(300, loss=0.2, max_delay=2, ack_loss=0.2, crash=0.2, every=5, seed=2)
    assert fleet.crashes > 40
    fleet.run(400, loss=0.0, max_delay=0, ack_loss=0.0, crash=0.0, every=5, seed=3)
    assert fleet.error() < 1e-10


def test_without_the_durable_rules_a_rollback_loses_mass() -> None:
    """The same crashes with acknowledgements of what is only in memory and immediate
    re-measuring: the fleet ends far from the average (the check above can fail)."""
    fleet = CrashingFleet.build("push-sum", 8, seed=1)
    for algo in fleet.algos:
        algo.checkpointing = False
    original = fleet.fresh

    def careless(i: int) -> GossipAlgorithm:
        algo = original(i)
        algo.checkpointing = False
        return algo

    fleet.fresh = careless  # type: ignore[method-assign]
    fleet.run(400, loss=0.2, max_delay=2, ack_loss=0.2, crash=0.15, every=5, seed=2)
    fleet.run(600, loss=0.0, max_delay=0, ack_loss=0.0, crash=0.0, every=5, seed=3)
    assert not fleet.error() < 1e-3  # off the average, or (NaN) its weight drained away
