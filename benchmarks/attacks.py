"""Authenticated insiders against each algorithm: the attack table of docs/security.md.

    python -m benchmarks --only attacks           # about 14 min on 2 busy cores
    python -m benchmarks --only attacks --quick   # huge and hub-dissensus only
    python -m benchmarks.attacks            # the table alone, markdown on stdout

Digits, 16 agents in one process (in lock step, deterministic), 10% loss on every link, one
undirected random graph (so that every algorithm runs on the same links), 1 or 2 insiders
(emulation/attacks.py) sending forged payloads from the first round. For each attack x
algorithm x insiders: the honest agents' final mean (and worst) test accuracy, the largest
distance of an honest agent's model from the honest agents' average, and the distance of
that average from the honest average of the same algorithm's run without insiders. The
robust algorithms are told the number of insiders of the run (``byzantine``): the papers'
assumption of a known bound.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from airgossip.emulation.attacks import ATTACKS, fleet_with_insiders, place_insiders
from airgossip.scenario.config import load_config
from benchmarks.suite import Context, Outcome

AGENTS = 16
ROUNDS = 40
SEED = 3
ALGORITHMS = ("push-sum", "dpsgd", "robust-push-sum", "clipped-gossip", "cs-plus-gossip")
ROBUST = {"robust-push-sum", "clipped-gossip", "cs-plus-gossip"}
TARGET = 0.85
QUICK = ("huge", "hub-dissensus")


def random_edges(n: int, p: float, seed: int) -> list[tuple[int, int]]:
    """A connected undirected random graph (both directions of every edge), degrees varied."""
    rng = np.random.default_rng(seed)
    while True:
        upper = np.triu(rng.random((n, n)) < p, 1)
        a = upper | upper.T
        reach = {0}
        frontier = [0]
        while frontier:
            node = frontier.pop()
            for k in np.flatnonzero(a[node]):
                if int(k) not in reach:
                    reach.add(int(k))
                    frontier.append(int(k))
        if len(reach) == n:
            return [(int(i), int(j)) for i, j in zip(*np.nonzero(a), strict=True)]


@dataclass(frozen=True)
class Cell:
    accuracy: float
    worst: float
    spread: float
    shift: float | None
    clipped: int
    seconds: float


def run_cell(
    algorithm: str, attack: str | None, count: int, edges: list[tuple[int, int]],
    reference: torch.Tensor | None,
) -> tuple[Cell, torch.Tensor]:  # fmt: skip
    options: dict[str, Any] = {"byzantine": max(count, 1)} if algorithm in ROBUST else {}
    config = load_config(None, {
        "agents": AGENTS, "rounds": ROUNDS, "seed": SEED, "mode": "inproc",
        "task": {"name": "digits"}, "algorithm": algorithm, "algorithm_options": options,
        "topology": "edges", "edges": [list(e) for e in edges], "network": {"loss": 0.1},
        "eval_every": ROUNDS,
    })  # fmt: skip
    fleet, liars = fleet_with_insiders(
        config,
        None if attack is None else lambda graph: place_insiders(attack, count, graph, SEED),
    )
    started = time.monotonic()
    fleet.run()
    seconds = time.monotonic() - started
    honest = [i for i in range(AGENTS) if i not in liars]
    ids = {fleet.agents[i].agent_id for i in honest}
    final: dict[str, float] = {}
    for record in fleet.sink.records:
        if record.agent_id in ids and "accuracy" in record.metrics:
            final[record.agent_id] = record.metrics["accuracy"]
    models = torch.stack([fleet.agents[i].algorithm.estimate().double() for i in honest])
    average = models.mean(dim=0)
    spread = float((models - average).norm(dim=1).max())
    shift = None if reference is None else float((average - reference).norm())
    clipped = sum(sum(fleet.agents[i].algorithm.clipped_by_sender.values()) for i in honest)
    accuracies = list(final.values())
    cell = Cell(float(np.mean(accuracies)), min(accuracies), spread, shift, clipped, seconds)
    return cell, average


def table(attacks: tuple[str, ...] = ATTACKS) -> tuple[list[str], dict[str, Any], list[str]]:
    """The markdown rows, the figures, and the robust cells under :data:`TARGET`."""
    edges = random_edges(AGENTS, 0.4, SEED)
    degrees = np.bincount([i for i, _ in edges], minlength=AGENTS)
    header = [
        f"Digits, {AGENTS} agents, {ROUNDS} rounds, 10% loss, seed {SEED}, undirected random "
        f"graph (degrees {degrees.min()} to {degrees.max()}, {len(edges) // 2} links). Cells: "
        "honest mean accuracy (worst honest agent) · largest distance of an honest model from "
        "the honest average · distance of that average from the run without insiders.",
        "",
        "| attack | insiders | " + " | ".join(ALGORITHMS) + " |",
        "|---|---|" + "---|" * len(ALGORITHMS),
    ]
    rows, figures, misses = list(header), {}, []
    references: dict[str, torch.Tensor] = {}
    line = ["| none | 0 |"]
    for algorithm in ALGORITHMS:
        cell, references[algorithm] = run_cell(algorithm, None, 0, edges, None)
        figures[f"none/0/{algorithm}"] = cell.__dict__
        line.append(f" {cell.accuracy:.3f} ({cell.worst:.3f}) · {cell.spread:.2g} |")
        print(f"  none {algorithm}: {cell.seconds:.1f} s", file=sys.stderr, flush=True)
    rows.append("".join(line))
    for attack in attacks:
        for count in (1, 2):
            line = [f"| {attack} | {count} |"]
            for algorithm in ALGORITHMS:
                cell, _ = run_cell(algorithm, attack, count, edges, references[algorithm])
                figures[f"{attack}/{count}/{algorithm}"] = cell.__dict__
                mark = ""
                if cell.accuracy < TARGET or not np.isfinite(cell.accuracy):
                    mark = "**"
                    if algorithm in ROBUST:
                        misses.append(f"{attack}/{count}/{algorithm}")
                line.append(
                    f" {mark}{cell.accuracy:.3f}{mark} ({cell.worst:.3f}) · {cell.spread:.2g} · "
                    f"{cell.shift:.2g} |"
                )
                print(f"  {attack} x{count} {algorithm}: {cell.seconds:.1f} s", file=sys.stderr,
                      flush=True)  # fmt: skip
            rows.append("".join(line))
    return rows, figures, misses


def run(ctx: Context) -> list[Outcome]:
    started = time.monotonic()
    # --quick: the attack that breaks the plain algorithms outright and the topology-aware one.
    rows, figures, misses = table(QUICK if ctx.quick else ATTACKS)
    minutes = (time.monotonic() - started) / 60
    text = "\n".join(rows)
    return [Outcome(
        "attacks",
        f"robust options leave 2 insiders' honest agents >= {TARGET} under every attack",
        f"robust cells under {TARGET}: {', '.join(misses) or 'none'} ({minutes:.1f} min)",
        not misses, {"table": text, "cells": figures},
    )]  # fmt: skip


def main() -> int:
    torch.set_num_threads(1)
    started = time.monotonic()
    rows, _, misses = table()
    print("\n".join(rows))
    minutes = (time.monotonic() - started) / 60
    print(f"\nrobust cells under {TARGET}: {', '.join(misses) or 'none'}; "
          f"{minutes:.1f} min, torch {torch.__version__}, 1 thread")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
