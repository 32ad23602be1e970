"""What the per-in-neighbour statistics cost an agent: measuring each absorbed message.

    python -m benchmarks --only detection

Push-sum absorbs a message (the receiver's own checks and bookkeeping), and with an observer
the agent also measures the message's relative increment (:mod:`airgossip.edge.agent.influence`: one
temporary vector and two norms). Both timed on one thread in the same run, alternating, for
a small and a large model; the goal is that measuring costs no more than absorbing does.
"""

from __future__ import annotations

import time

import torch

from airgossip.edge.agent.influence import held, relative_increment
from airgossip.edge.algorithms import PushSum
from airgossip.edge.algorithms.base import Payload
from benchmarks.suite import Context, Outcome


def timed(numel: int, messages: int, *, measure: bool) -> float:
    """Seconds per absorbed message, the relative increment measured or not."""
    algorithm = PushSum(torch.randn(numel, dtype=torch.float64, generator=torch.manual_seed(0)))
    vector = torch.randn(numel, dtype=torch.float64, generator=torch.manual_seed(1))
    payloads = [Payload(vector * (0.5 * k), {"y": 0.5 * k}, seq=k) for k in range(1, messages + 1)]
    began = time.perf_counter()
    for payload in payloads:
        before = held(algorithm)
        algorithm.receive("peer", payload)
        if measure:
            relative_increment(algorithm, before, payload)
    return (time.perf_counter() - began) / messages


def run(ctx: Context) -> list[Outcome]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        sizes = [(100_000, 100), (1_000_000, 10 if ctx.quick else 30)]
        rows = ["| elements | absorb (ms) | absorb + measure (ms) | measure / absorb |",
                "|---|---|---|---|"]  # fmt: skip
        figures: dict[str, float] = {}
        worst = 0.0
        for numel, messages in sizes:
            plain, measured = [], []
            for _ in range(5):  # alternate, keep the best of each (load from others)
                plain.append(timed(numel, messages, measure=False))
                measured.append(timed(numel, messages, measure=True))
            absorb, both = min(plain), min(measured)
            ratio = (both - absorb) / absorb
            worst = max(worst, ratio)
            figures[f"absorb_ms_{numel}"] = absorb * 1e3
            figures[f"measured_ms_{numel}"] = both * 1e3
            rows.append(f"| {numel:,} | {absorb * 1e3:.2f} | {both * 1e3:.2f} | {ratio:.2f} |")
    finally:
        torch.set_num_threads(threads)
    figures["table"] = "\n".join(rows)  # type: ignore[assignment]
    return [
        Outcome(
            "detection",
            "measuring an absorbed message costs <= absorbing it",
            f"measure / absorb {worst:.2f} at worst (push-sum, float64, one thread)",
            worst <= 1.0,
            figures,
        )
    ]
