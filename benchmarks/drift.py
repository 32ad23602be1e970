"""Slow-drift insiders against push-sum and each robust option: the drift table of docs/security.md.

    python -m benchmarks --only drift        # about 5 min on 2 busy cores
    python -m benchmarks.drift               # the table alone, markdown on stdout

16 agents in one process (lock step, deterministic), 10% loss, 1 or 2 ``slow-drift``
insiders (emulation/attacks.py: the receiver's own estimate plus 0.1 of its norm in one fixed
direction, every round). Directed exponential graph for push-sum and robust-push-sum,
undirected circulant of degree 6 (:data:`UNDIRECTED`) for push-sum, robust-push-sum,
clipped-gossip and cs-plus-gossip.
Per cell: the *bias*, the distance of the honest agents' average from the same algorithm's
run without insiders, in units of the honest agents' initial spread (consensus: the largest
distance of an honest starting vector from their exact average) or, on digits, the honest
mean accuracy with the bias; the *bound* of docs/security.md computed from the run's drift
guards (``drift_budget`` times each honest out-neighbour's reference, times the largest
push-sum weight it held in the run, summed, over the honest agents); and the round at which
the shipped drift rules would first name an insider (:func:`named`, on the scores of every
round, lock step), with the count of honest agents they ever name (must be 0).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from airgossip.edge.agent import Agent
from airgossip.emulation.attacks import fleet_with_insiders, place_insiders
from airgossip.scenario.config import load_config
from benchmarks.suite import Context, Outcome

AGENTS = 16
SEED = 3
#: The drift score at which an agent accuses an in-neighbour (deploy/prometheus/alerts.yml).
ALERT = 10.0
#: The undirected graph: the circulant with offsets +-1, +-2, +-5 (degree 6). The attack
#: table's random graph (degrees 3 to 8) leaves agents that cs-plus-gossip with
#: ``byzantine`` 2 never lets mix (8 of 16), and an honest agent frozen at its start offers
#: the same displacement round after round: it scores as a drifter does.
UNDIRECTED = [(i, (i + k) % AGENTS) for i in range(AGENTS) for k in (1, 2, 5, -1, -2, -5)]
CASES = (  # task, graph, algorithm
    ("consensus", "directed", "push-sum"),
    ("consensus", "directed", "robust-push-sum"),
    ("consensus", "undirected", "push-sum"),
    ("consensus", "undirected", "robust-push-sum"),
    ("consensus", "undirected", "clipped-gossip"),
    ("consensus", "undirected", "cs-plus-gossip"),
    ("digits", "undirected", "push-sum"),
    ("digits", "undirected", "robust-push-sum"),
    ("digits", "undirected", "clipped-gossip"),
    ("digits", "undirected", "cs-plus-gossip"),
)
ROUNDS = {"consensus": 200, "digits": 80}


@dataclass(frozen=True)
class Cell:
    bias: float
    bound: float | None
    accuracy: float | None
    alert_round: int | None
    honest_named: int
    honest_max_score: float


def _watch(
    agents: list[Agent], trail: list[dict[tuple[str, str], float]], weights: dict[str, float]
) -> None:
    """Record every agent's drift scores after each of agent-0's mixes (lock step), and in
    ``weights`` the largest push-sum weight each agent held (from 1, the starting weight)."""
    first = agents[0].algorithm
    mix = first.mix

    def recorded() -> None:
        mix()
        scores = {}
        for agent in agents:
            y = getattr(agent.algorithm, "y", None)
            if isinstance(y, float):
                weights[agent.agent_id] = max(weights.get(agent.agent_id, 1.0), y)
            for peer, score in getattr(agent.algorithm, "drift_by_sender", {}).items():
                scores[(agent.agent_id, peer)] = score
        trail.append(scores)

    setattr(first, "mix", recorded)  # noqa: B010


def named(scores: dict[tuple[str, str], float]) -> set[str]:
    """The peers the drift rules name on these scores (deploy/prometheus/alerts.yml, the
    ``airgossip:drift`` recording rules): an agent accuses its top-scored in-neighbour when
    the score is :data:`ALERT` or more; an accusation is credible unless its accuser is accused
    by two or more agents and by at least as many as the peer it accuses; agents that credibly
    accuse someone are relays and never named; of the rest, the peers with the most credible
    accusers are named, when they have two or more."""
    top: dict[str, tuple[float, str]] = {}
    for (a, p), s in scores.items():
        if a != p and s >= ALERT and s > top.get(a, (-1.0, ""))[0]:
            top[a] = (s, p)
    accusations = {(a, p) for a, (_, p) in top.items()}
    accusers: dict[str, int] = {}
    for _, p in accusations:
        accusers[p] = accusers.get(p, 0) + 1
    credible = {
        (a, p)
        for a, p in accusations
        if not (accusers.get(a, 0) >= 2 and accusers.get(a, 0) >= accusers[p])
    }
    relays = {a for a, _ in credible}
    counts: dict[str, int] = {}
    for _, p in credible:
        if p not in relays:
            counts[p] = counts.get(p, 0) + 1
    most = max(counts.values(), default=0)
    return {p for p, c in counts.items() if c == most and c >= 2}


def run_cell(
    task: str, graph: str, algorithm: str, count: int, reference: torch.Tensor | None
) -> tuple[Cell, torch.Tensor]:
    rounds = ROUNDS[task]
    options: dict[str, Any] = {"byzantine": max(count, 1)} if algorithm != "push-sum" else {}
    topology: dict[str, Any] = (
        {"topology": "exponential"}
        if graph == "directed"
        else {"topology": "edges", "edges": [list(e) for e in UNDIRECTED]}
    )
    config = load_config(None, {
        "agents": AGENTS, "rounds": rounds, "seed": SEED, "mode": "inproc",
        "task": {"name": task}, "algorithm": algorithm, "algorithm_options": options,
        **topology, "network": {"loss": 0.1}, "eval_every": rounds,
    })  # fmt: skip
    fleet, liars = fleet_with_insiders(
        config,
        None if count == 0 else lambda g: place_insiders("slow-drift", count, g, SEED),
    )
    trail: list[dict[tuple[str, str], float]] = []
    weights: dict[str, float] = {}
    armed = fleet.after_build

    def hook(agents: list[Agent]) -> None:
        if armed is not None:
            armed(agents)
        _watch(agents, trail, weights)

    fleet.after_build = hook
    fleet.run()
    honest = [i for i in range(AGENTS) if i not in liars]
    ids = {fleet.agents[i].agent_id for i in honest}
    bad = {fleet.agents[i].agent_id for i in liars}
    models = torch.stack([fleet.agents[i].algorithm.estimate().double() for i in honest])
    average = models.mean(dim=0)
    starts = torch.stack([fleet.agents[i].task.initial_parameters().double() for i in honest])
    spread = float((starts - starts.mean(dim=0)).norm(dim=1).max())
    if reference is None:
        reference = starts.mean(dim=0) if task == "consensus" else average
    bias = float((average - reference).norm()) / (spread if task == "consensus" else 1.0)
    bound = None
    if count and algorithm != "push-sum":
        total = 0.0
        for i in honest:
            guard = getattr(fleet.agents[i].algorithm, "drift", None)
            if guard is None:
                continue
            norms = {s: float(c.norm()) for s, c in guard.net.items()}
            weight = weights.get(fleet.agents[i].agent_id, 1.0)
            for liar in bad:
                if liar in norms:
                    total += weight * guard.budget * guard.reference(liar, norms)
        bound = total / len(honest) / (spread if task == "consensus" else 1.0)
    alert_round, honest_named, honest_max = None, set(), 0.0
    for r, scores in enumerate(trail, start=1):
        names = named(scores)  # the insiders' own scores too: their /metrics are scraped
        honest_named |= names & ids
        if alert_round is None and names & bad:
            alert_round = r
        honest_max = max(
            [honest_max] + [v for (a, p), v in scores.items() if p in ids and a in ids]
        )
    accuracy = None
    if task == "digits":
        final = [
            r.metrics["accuracy"]
            for r in fleet.sink.records
            if r.agent_id in ids and "accuracy" in r.metrics
        ]
        accuracy = float(np.mean(final[-len(ids) :]))
    return Cell(bias, bound, accuracy, alert_round, len(honest_named), honest_max), average


def table() -> tuple[list[str], dict[str, Any], list[str]]:
    rows = [
        "| task | graph | algorithm | insiders | bias | bound | digits accuracy | round named "
        "| honest named | honest max score |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    figures: dict[str, Any] = {}
    misses: list[str] = []
    for task, graph, algorithm in CASES:
        started = time.monotonic()
        clean, reference = run_cell(task, graph, algorithm, 0, None)
        if task == "consensus":
            reference = None  # the exact average of the honest starting vectors
        for count, cell in ((0, clean), *((c, run_cell(task, graph, algorithm, c, reference)[0])
                                          for c in (1, 2))):  # fmt: skip
            key = f"{task}/{graph}/{algorithm}/{count}"
            figures[key] = cell.__dict__
            robust = algorithm != "push-sum"
            if robust and (cell.honest_named or (count and cell.bound is not None
                                                 and cell.bias > cell.bound)):  # fmt: skip
                misses.append(key)
            rows.append(
                f"| {task} | {graph} | {algorithm} | {count} | {cell.bias:.3g} | "
                f"{'-' if cell.bound is None else f'{cell.bound:.3g}'} | "
                f"{'-' if cell.accuracy is None else f'{cell.accuracy:.3f}'} | "
                f"{'-' if cell.alert_round is None else cell.alert_round} | "
                f"{cell.honest_named} | {cell.honest_max_score:.2f} |"
            )
        print(f"  {task} {graph} {algorithm}: {time.monotonic() - started:.1f} s",
              file=sys.stderr, flush=True)  # fmt: skip
    return rows, figures, misses


def run(ctx: Context) -> list[Outcome]:
    started = time.monotonic()
    rows, figures, misses = table()
    minutes = (time.monotonic() - started) / 60
    return [Outcome(
        "drift",
        "robust options hold slow-drift insiders under the stated bound, name no honest agent",
        f"cells over the bound or naming honest agents: {', '.join(misses) or 'none'} "
        f"({minutes:.1f} min)",
        not misses, {"table": "\n".join(rows), "cells": figures},
    )]  # fmt: skip


def main() -> int:
    torch.set_num_threads(1)
    started = time.monotonic()
    rows, _, misses = table()
    print("\n".join(rows))
    print(f"\nmisses: {', '.join(misses) or 'none'}; {(time.monotonic() - started) / 60:.1f} min, "
          f"torch {torch.__version__}, 1 thread")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
