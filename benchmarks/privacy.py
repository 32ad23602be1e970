"""Privacy with numbers: accuracy against epsilon for every ``[privacy]`` mechanism, the
cancelling masks against central DP, and what message loss does to the masks' cancellation.

    python -m benchmarks --only privacy          # about 20 minutes on 2 cores
    python -m benchmarks.privacy                 # the same, markdown on stdout

**The table.** digits, 16 agents, exponential graph, push-sum, 10% message loss, 100
rounds; epsilon in {1, 3, 8} at delta 1e-5. Every private row trains the same way: one step
per round on the agent's whole shard (sample rate 1), per-example gradients clipped to 1,
step size 2, no decay; only the noise differs, each mechanism calibrated to the epsilon by
its own accountant. ``none`` is the task's own training (10 local steps of 16 examples, its
default step size and decay); ``clipped, no noise`` the private training without noise
(epsilon infinite), the utility bound of every private row. Each cell: the agents' mean
test accuracy, and the accuracy of the fleet's average model (the mean of the agents' final
models) after the slash.

**The check.** Cancelling masks within 0.02 of central DP at the same epsilon on a
loss-free graph (DECOR's claim), on the fleet's average model (what the claim is about)
and on the agents' own models.

**Cancellation under loss.** A linear probe (no training, so a run with masks and one
without differ by what the masks leave and nothing else): 16 agents, exponential graph,
1,000 values each, masks of std 1 added by every pair in rounds 1-40 as the mechanism adds
them (to push-sum's value as they are), 40 more rounds of gossip without masks, the same
seeded drops in both runs; and the alternative of masks scaled by the agent's weight. The
figures: the distance between the two runs' fleet averages, and the largest between one
agent's estimates, over the size of one mask.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from benchmarks.suite import Context, Outcome
from edge.algorithms import PlainPushSum, PushSum
from edge.config.identity import agent_ids
from edge.privacy.keys import RunKeyring
from edge.privacy.masks import PairMasks
from edge.privacy.plan import FleetGraph
from edge.tasks import TaskContext, load_task
from edge.topology import build_graph, node_phases
from emulation.config import load_config
from emulation.fleets.inproc import run_in_process
from emulation.results import summarise

AGENTS, ROUNDS, LR = 16, 100, 2.0
EPSILONS = (1.0, 3.0, 8.0)
MECHANISMS = ("dp-sgd", "network-dp", "cancelling", "central")
PRIVATE_TASK = {"name": "digits", "lr": LR, "lr_decay_at": 1.0}


@dataclass(frozen=True)
class Cell:
    accuracy: float
    average_model: float
    epsilon: float | None
    seconds: float
    extra: dict[str, Any]


def _run(loss: float, privacy: dict[str, Any] | None, task: dict[str, Any]) -> Cell:
    settings: dict[str, Any] = {
        "agents": AGENTS, "topology": "exponential", "rounds": ROUNDS, "mode": "inproc",
        "eval_every": ROUNDS, "network": {"loss": loss}, "task": task, "seed": 0,
    }  # fmt: skip
    if privacy is not None:
        settings["privacy"] = privacy
    config = load_config(None, settings)
    began = time.perf_counter()
    records = run_in_process(config)
    seconds = time.perf_counter() - began
    results = summarise(records)
    finals = [r[-1] for r in records.values()]
    average = np.mean([r.estimate for r in finals if r.estimate is not None], axis=0)
    options = {k: v for k, v in task.items() if k != "name"}
    digits = load_task("digits", TaskContext(0, AGENTS, 0, options=options))
    average_accuracy = digits.evaluate(torch.from_numpy(average).float()).metrics["accuracy"]
    extra: dict[str, Any] = {}
    if privacy is not None and privacy.get("mechanism") == "network-dp":
        means = [r.metrics.get("privacy_epsilon_mean") for r in finals]
        extra["epsilon_mean_over_pairs"] = float(np.mean([m for m in means if m is not None]))
    assert results.final.mean_accuracy is not None
    return Cell(results.final.mean_accuracy, float(average_accuracy),
                results.final.privacy_epsilon, seconds, extra)  # fmt: skip


def _private(mechanism: str, epsilon: float) -> dict[str, Any]:
    return {"mechanism": mechanism, "target_epsilon": epsilon, "delta": 1e-5}


def _cell(cell: Cell) -> str:
    return f"{cell.accuracy:.3f} / {cell.average_model:.3f}"


def table(quick: bool) -> tuple[str, dict[str, Any]]:
    """The accuracy table at 10% loss; its markdown and every figure."""
    epsilons = EPSILONS[-1:] if quick else EPSILONS
    figures: dict[str, Any] = {}
    rows = ["| mechanism | " + " | ".join(f"ε = {e:g}" for e in epsilons) + " |",
            "|---|" + "---|" * len(epsilons)]  # fmt: skip
    none = _run(0.1, None, {"name": "digits"})
    clipped = _run(0.1, {"mechanism": "central", "noise_multiplier": 0.0}, PRIVATE_TASK)
    figures["none"], figures["clipped"] = none.__dict__, clipped.__dict__
    rows.append("| none (the task's own training) | " + " | ".join(_cell(none) for _ in epsilons)
                + " |")  # fmt: skip
    rows.append("| clipped, no noise (ε = ∞) | " + " | ".join(_cell(clipped) for _ in epsilons)
                + " |")  # fmt: skip
    for mechanism in MECHANISMS:
        cells = [_run(0.1, _private(mechanism, e), PRIVATE_TASK) for e in epsilons]
        figures[mechanism] = [c.__dict__ for c in cells]
        label = mechanism
        if mechanism == "network-dp":
            worst = " / ".join(f"{c.epsilon:.3g}" for c in cells if c.epsilon is not None)
            label += f" (ε: mean over pairs; worst pair {worst})"
        label += " (reference)" if mechanism == "central" else ""
        rows.append(f"| {label} | " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(rows), figures


def check(quick: bool) -> tuple[list[tuple[float, Cell, Cell]], dict[str, Any]]:
    """Cancelling masks against central DP on a loss-free graph, at every epsilon."""
    epsilons = EPSILONS[-1:] if quick else EPSILONS
    pairs = []
    for e in epsilons:
        central = _run(0.0, _private("central", e), PRIVATE_TASK)
        cancelling = _run(0.0, _private("cancelling", e), PRIVATE_TASK)
        pairs.append((e, cancelling, central))
    figures = {f"{e:g}": {"cancelling": c.__dict__, "central": z.__dict__} for e, c, z in pairs}
    return pairs, figures


def cancellation_probe(loss: float, algorithm: str, *, masks: bool, by_weight: bool = False,
                       seed: int = 0, numel: int = 1000) -> list[np.ndarray]:  # fmt: skip
    """The probe's final estimates (see the module docstring). Masks are added to push-sum's
    value ``x`` as they are, as the mechanism adds them; ``by_weight``: scaled by the agent's
    weight instead, as an ordinary step is (the alternative docs/privacy.md weighs)."""
    ids = agent_ids(AGENTS)
    graph = build_graph("exponential", AGENTS)
    fleet = FleetGraph.of(graph, tuple(ids), "column-stochastic", static=True)
    keyring = RunKeyring(ids, seed=seed)
    start = np.random.default_rng(seed).standard_normal((AGENTS, numel))
    kind = PushSum if algorithm == "push-sum" else PlainPushSum
    agents = {i: kind(torch.from_numpy(start[k]), dtype=torch.float64) for k, i in enumerate(ids)}
    secrets = {i: keyring.for_agent(i) for i in ids}
    pair_masks = {
        i: PairMasks(i, fleet.partners(i), lambda p, me=i: secrets[me].mask_key(p, b"p"), numel)
        for i in ids
    }
    phases = {i: node_phases(graph, ids, k)[0] for k, i in enumerate(ids)}
    drops = np.random.default_rng(seed + 1)
    for round_index in range(1, 81):
        if masks and round_index <= 40:
            for i in ids:
                mask = pair_masks[i].mask(round_index, 1.0)
                agent = agents[i]
                agent.apply_update(mask if by_weight else mask / agent.y)
        for i in ids:
            for peer, payload in agents[i].share(phases[i], ids).items():
                if drops.random() < loss:
                    continue
                agents[i].on_ack(peer, agents[peer].receive(i, payload))
        for i in ids:
            agents[i].mix()
    return [agents[i].estimate().numpy() for i in ids]


def cancellation(quick: bool) -> tuple[str, dict[str, Any]]:
    """What the masks leave behind, lossless and at 10% loss, push-sum and its textbook form."""
    rows = ["| algorithm | loss | fleet average moved by | an agent's estimate moved by |",
            "|---|---|---|---|"]  # fmt: skip
    figures = {}
    mask_size = np.sqrt(1000)  # one mask of std 1 over 1,000 values
    cases = [("push-sum", 0.0, False), ("push-sum", 0.1, False), ("push-sum-plain", 0.1, False),
             ("push-sum", 0.1, True)]  # fmt: skip
    for algorithm, loss, by_weight in cases:
        masked = cancellation_probe(loss, algorithm, masks=True, by_weight=by_weight)
        plain = cancellation_probe(loss, algorithm, masks=False)
        average = np.linalg.norm(np.mean(masked, 0) - np.mean(plain, 0)) / mask_size
        worst = max(np.linalg.norm(m - p) for m, p in zip(masked, plain, strict=True)) / mask_size
        label = f"{algorithm}{', masks scaled by the weight' if by_weight else ''}"
        figures[f"{label} {loss:g}"] = {"average": float(average), "worst": float(worst)}
        rows.append(f"| {label} | {loss:.0%} | {average:.2e} | {worst:.2e} |")
    return "\n".join(rows), figures


def run(ctx: Context) -> list[Outcome]:
    torch.set_num_threads(1)
    began = time.perf_counter()
    accuracy, table_figures = table(ctx.quick)
    pairs, check_figures = check(ctx.quick)
    masks, mask_figures = cancellation(ctx.quick)
    gaps = [(e, c.average_model - z.average_model, c.accuracy - z.accuracy) for e, c, z in pairs]
    within = [abs(avg) <= 0.02 for _, avg, _ in gaps]
    measured = "; ".join(
        f"ε {e:g}: {c.average_model:.3f} vs {z.average_model:.3f} average model, "
        f"{c.accuracy:.3f} vs {z.accuracy:.3f} agents' mean"
        for e, c, z in pairs
    )
    check_rows = ["| ε | cancelling | central | gap (average model) | gap (agents' mean) |",
                  "|---|---|---|---|---|"]  # fmt: skip
    for (e, c, z), (_, avg, own) in zip(pairs, gaps, strict=True):
        check_rows.append(f"| {e:g} | {_cell(c)} | {_cell(z)} | {avg:+.3f} | {own:+.3f} |")
    seconds = time.perf_counter() - began
    return [
        Outcome(
            "privacy table",
            "accuracy against ε for every mechanism (digits, 16 agents, exponential, 10% loss)",
            "see the table (agents' mean / the fleet's average model)",
            None,
            {"table": accuracy, **table_figures, "seconds": round(seconds, 1)},
            note="a table, not a target",
        ),
        Outcome(
            "cancelling vs central DP",
            "within 0.02 of central DP at the same ε, loss-free (DECOR's claim)",
            measured,
            all(within),
            {"table": "\n".join(check_rows), **check_figures},
            note="on the fleet's average model",
        ),
        Outcome(
            "mask cancellation under loss",
            "what masks leave in the estimates, lossless and at 10% loss (measured, not assumed)",
            "; ".join(
                f"{k}: average {v['average']:.1e}, worst agent {v['worst']:.1e}"
                for k, v in mask_figures.items()
            ),
            None,
            {"table": masks, **mask_figures},
            note="in units of one mask",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.privacy")
    parser.add_argument("--quick", action="store_true", help="ε = 8 only")
    args = parser.parse_args()
    from pathlib import Path

    for outcome in run(Context(quick=args.quick, work=Path("."), venvs=Path("."))):
        print(f"## {outcome.target}\n\n{outcome.measured}\n\n{outcome.figures.get('table', '')}\n")


if __name__ == "__main__":
    main()
