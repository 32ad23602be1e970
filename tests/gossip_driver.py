"""A pure-algorithm fleet on a hostile network, for algorithm tests (no agents, no transport).

Messages travel as the agent sends them: encoded bytes, decoded by the receiver with the
header's codec into whole blocks. The network may lose, duplicate, delay (so reorder)
messages and lose acknowledgements; every draw comes from one seed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from edge.algorithms import GossipAlgorithm, Payload, algorithm_class, create_algorithm
from edge.compression import decode_blocks, get_codec, raw_codec_for
from edge.topology import Phase, build_graph, node_phases

#: Called once per agent and round before sharing: (agent index, algorithm).
LocalStep = Callable[[int, GossipAlgorithm], None]


@dataclass
class AlgorithmFleet:
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
    ) -> None:
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
