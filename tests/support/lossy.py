"""The tests' one lossy-network simulator: gossip algorithms with no agents and no transport,
messages encoded and decoded as agents send them, on a network that loses, duplicates,
reorders (delivers up to ``max_delay`` rounds late) and drops acknowledgements, all from one
seed. Push-sum's books can be checked after every round: agents plus edges hold exactly the
initial mass (:meth:`AlgorithmFleet.total_mass`)."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from airgossip.common.topology import Phase, build_graph, node_phases
from airgossip.edge.algorithms import (
    GossipAlgorithm,
    Payload,
    PushSum,
    algorithm_class,
    create_algorithm,
)
from airgossip.edge.compression import decode_blocks, get_codec, raw_codec_for

#: Called once per agent and round before sharing: (agent index, algorithm).
LocalStep = Callable[[int, GossipAlgorithm], None]


@dataclass
class AlgorithmFleet:
    """Agents' algorithms, their phases on the graph and their ids (``a0``, ``a1``...)."""

    algos: list[GossipAlgorithm]
    phases: list[list[Phase]]
    ids: list[str]
    round: int = 0

    @classmethod
    def build(
        cls,
        name: str,
        n: int,
        *,
        topology: str = "exponential",
        dim: int = 20,
        seed: int = 0,
        compression: str = "none",
        options: Mapping[str, Any] | None = None,
        initial: list[torch.Tensor] | None = None,
        dtype: torch.dtype = torch.float64,
    ) -> AlgorithmFleet:
        gen = torch.Generator().manual_seed(seed)
        ids = [f"a{i}" for i in range(n)]
        graph = build_graph(topology, n)
        codec = raw_codec_for(dtype) if compression == "none" else get_codec(compression)
        starts = initial or [torch.randn(dim, generator=gen, dtype=dtype) + 1 for _ in ids]
        algos = [
            create_algorithm(name, start, dtype=dtype, codec=codec, seed=i, options=options)
            for i, start in enumerate(starts)
        ]
        scheme = algorithm_class(name).mixing
        return cls(algos, [node_phases(graph, ids, i, scheme) for i in range(n)], ids)

    def average(self) -> torch.Tensor:
        return sum(a.estimate() for a in self.algos) / len(self.algos)  # type: ignore[return-value]

    def error(self, target: torch.Tensor) -> float:
        return max(float((a.estimate() - target).norm() / target.norm()) for a in self.algos)

    def total_x(self) -> torch.Tensor:
        """Sum of ``x`` held by the agents (unmixed mass included, nothing on the wire)."""
        return sum(a.mass()[0] for a in self.algos)  # type: ignore[attr-defined,return-value]

    def total_mass(self) -> tuple[torch.Tensor, float]:
        """Push-sum's mass held by agents plus mass still on the edges (sent, not yet absorbed)."""
        x = sum(a.mass()[0] for a in self.algos)  # type: ignore[attr-defined]
        y = sum(a.mass()[1] for a in self.algos)  # type: ignore[attr-defined]
        for i, sender in enumerate(self.algos):
            for j, receiver in enumerate(self.algos):
                if i == j or not isinstance(sender, PushSum) or not isinstance(receiver, PushSum):
                    continue
                sx, sy, sbase = sender.out_edge_sum(self.ids[j])
                rx, ry, rbase = receiver.in_edge_sum(self.ids[i])
                if rbase == sbase:
                    sx, sy = sx - rx, sy - ry
                x, y = x + sx, y + sy
        return x, y  # type: ignore[return-value]

    def deliver(self, sender: int, receiver: int, payload: Payload) -> Any:
        algo = self.algos[receiver]
        encoded = payload.encoded
        if encoded is None:  # an algorithm that leaves encoding to the agent
            encoded = algo.codec.encode(payload.vector)
        vector = decode_blocks(get_codec(encoded.codec), encoded, algo.block_numel, algo.dtype)
        wire = Payload(vector, dict(payload.scalars), payload.seq, payload.base_seq)
        return algo.receive(self.ids[sender], wire)

    def run(
        self,
        rounds: int,
        *,
        loss: float = 0.0,
        duplicate: float = 0.0,
        max_delay: int = 0,
        ack_loss: float = 0.0,
        seed: int = 0,
        local_step: LocalStep | None = None,
        after_round: Callable[[AlgorithmFleet], None] | None = None,
        check_mass: torch.Tensor | None = None,
    ) -> None:
        """Run ``rounds`` rounds: each agent shares with its phase's out-neighbours; every copy
        is lost with probability ``loss``, duplicated with ``duplicate``, delivered up to
        ``max_delay`` rounds late; acknowledgements are lost with ``ack_loss``. With
        ``check_mass`` (push-sum), agents plus edges must hold exactly that total after every
        round."""
        rng = random.Random(seed)
        queue: list[tuple[int, int, int, Payload]] = []  # (due round, sender, receiver, payload)
        everyone = set(self.ids)
        for _ in range(rounds):
            r = self.round = self.round + 1
            for i, algo in enumerate(self.algos):
                if local_step is not None:
                    local_step(i, algo)
                phase = algo.schedule(r, self.phases[i][r % len(self.phases[i])])
                for peer, payload in algo.share(phase, everyone - {self.ids[i]}).items():
                    copies = 0 if rng.random() < loss else 1 + (rng.random() < duplicate)
                    for _ in range(copies):
                        due = r + rng.randint(0, max_delay)
                        queue.append((due, i, self.ids.index(peer), payload))
            rng.shuffle(queue)
            due_now = [m for m in queue if m[0] <= r]
            queue = [m for m in queue if m[0] > r]
            for _, i, j, payload in due_now:
                ack = self.deliver(i, j, payload)
                if rng.random() >= ack_loss:
                    self.algos[i].on_ack(self.ids[j], ack)
            for algo in self.algos:
                algo.mix()
            if after_round is not None:
                after_round(self)
            if check_mass is not None:
                x, y = self.total_mass()
                torch.testing.assert_close(x, check_mass, rtol=0, atol=1e-10)
                assert y == pytest.approx(len(self.algos), abs=1e-10)
