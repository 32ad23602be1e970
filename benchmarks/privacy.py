"""Privacy with numbers: accuracy against epsilon for every ``[privacy]`` mechanism, the
cancelling masks against central DP, and what message loss does to the masks' cancellation.

    python -m benchmarks --only privacy          # about 20 minutes on 2 cores
    python -m benchmarks.privacy                 # the same, markdown on stdout
    python -m benchmarks.privacy --cancelling    # the cancelling rows only (about 5 minutes)

**The table.** digits, 16 agents, exponential graph, push-sum, 10% message loss, 100
rounds; epsilon in {1, 3, 8} at delta 1e-5. Every private row trains the same way: one step
per round on the agent's whole shard (sample rate 1), per-example gradients clipped to 1,
step size 2, no decay; only the noise differs, each mechanism calibrated to the epsilon by
its own accountant; two more rows take a private step every ``GOSSIP_ROUNDS`` rounds
(800 rounds, the same 100 steps). ``none`` is the task's own training (10 local steps of
16 examples, its default step size and decay); ``clipped, no noise`` the private training
without noise (epsilon infinite), the utility bound of every private row. Each cell: the
agents' mean test accuracy, and the accuracy of the fleet's average model (the mean of the
agents' final models) after the slash.

**The check.** Cancelling masks within 0.02 of central DP at the same epsilon on a
loss-free graph (DECOR's claim), on the fleet's average model (what the claim is about)
and on the agents' own models, with one round of gossip per private step (the paper's
algorithm) and with ``GOSSIP_ROUNDS`` (both mechanisms alike; the verdict is on these);
with epsilon against each adversary of ``[privacy] adversary`` (a curious agent, the
default; an eavesdropper that is no agent, the model of DECOR's experiments), and both
again under 10% loss beside central DP there.

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

from airgossip.common.identity import agent_ids
from airgossip.common.topology import build_graph, node_phases
from airgossip.edge.algorithms import PlainPushSum, PushSum
from airgossip.edge.privacy.adversary import ADVERSARIES
from airgossip.edge.privacy.graph import pair_graph
from airgossip.edge.privacy.keys import RunKeyring
from airgossip.edge.privacy.masks import PairMasks
from airgossip.edge.privacy.mechanisms.cancelling import CancellingMasks
from airgossip.edge.privacy.mechanisms.central import CentralReference
from airgossip.edge.privacy.mechanisms.dp_sgd import DpSgd
from airgossip.edge.privacy.mechanisms.network_dp import NetworkDp
from airgossip.edge.privacy.plan import PrivacyGraph
from airgossip.edge.tasks import TaskContext, load_task
from airgossip.emulation.fleets.inproc import run_in_process
from airgossip.scenario.config import load_config
from airgossip.scenario.results import summarise
from benchmarks.suite import Context, Outcome

AGENTS, ROUNDS, LR = 16, 100, 2.0
EPSILONS = (1.0, 3.0, 8.0)
DP_SGD, NETWORK_DP = DpSgd.name, NetworkDp.name
CANCELLING, CENTRAL = CancellingMasks.name, CentralReference.name
MECHANISMS = (DP_SGD, NETWORK_DP, CANCELLING, CENTRAL)
#: Rounds of gossip per private step in the check beside the paper's one: enough for gossip
#: to average the masks out of every model before the next gradient (docs/privacy.md).
GOSSIP_ROUNDS = 8
#: The runs' seed (``--seed``): every figure is deterministic for it.
SEED = 0
PRIVATE_TASK = {"name": "digits", "lr": LR, "lr_decay_at": 1.0}


@dataclass(frozen=True)
class Cell:
    accuracy: float
    average_model: float
    epsilon: float | None
    seconds: float
    extra: dict[str, Any]


def _run(loss: float, privacy: dict[str, Any] | None, task: dict[str, Any], *,
         seed: int | None = None) -> Cell:  # fmt: skip
    """One run of ``ROUNDS`` private steps (times the privacy's ``gossip_rounds`` rounds), of
    the run's seed (data order, noise, mask keys, drops): ``SEED`` unless given."""
    seed = SEED if seed is None else seed
    rounds = ROUNDS * (privacy or {}).get("gossip_rounds", 1)
    settings: dict[str, Any] = {
        "agents": AGENTS, "topology": "exponential", "rounds": rounds, "mode": "inproc",
        "eval_every": rounds, "network": {"loss": loss}, "task": task, "seed": seed,
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
    if privacy is not None and privacy.get("mechanism") == NETWORK_DP:
        means = [r.metrics.get("privacy_epsilon_mean") for r in finals]
        extra["epsilon_mean_over_pairs"] = float(np.mean([m for m in means if m is not None]))
    assert results.final.mean_accuracy is not None
    return Cell(results.final.mean_accuracy, float(average_accuracy),
                results.final.privacy_epsilon, seconds, extra)  # fmt: skip


def _private(mechanism: str, epsilon: float, adversary: str | None = None,
             gossip_rounds: int = 1) -> dict[str, Any]:  # fmt: skip
    out: dict[str, Any] = {"mechanism": mechanism, "target_epsilon": epsilon, "delta": 1e-5}
    if adversary is not None:
        out["adversary"] = adversary
    if gossip_rounds != 1:
        out["gossip_rounds"] = gossip_rounds
    return out


def _cell(cell: Cell) -> str:
    return f"{cell.accuracy:.3f} / {cell.average_model:.3f}"


def table(quick: bool) -> tuple[str, dict[str, Any]]:
    """The accuracy table at 10% loss; its markdown and every figure."""
    epsilons = EPSILONS[-1:] if quick else EPSILONS
    figures: dict[str, Any] = {}
    rows = ["| mechanism | " + " | ".join(f"ε = {e:g}" for e in epsilons) + " |",
            "|---|" + "---|" * len(epsilons)]  # fmt: skip
    none = _run(0.1, None, {"name": "digits"})
    clipped = _run(0.1, {"mechanism": CENTRAL, "noise_multiplier": 0.0}, PRIVATE_TASK)
    figures["none"], figures["clipped"] = none.__dict__, clipped.__dict__
    rows.append("| none (the task's own training) | " + " | ".join(_cell(none) for _ in epsilons)
                + " |")  # fmt: skip
    rows.append("| clipped, no noise (ε = ∞) | " + " | ".join(_cell(clipped) for _ in epsilons)
                + " |")  # fmt: skip
    for mechanism in MECHANISMS:
        cells = [_run(0.1, _private(mechanism, e), PRIVATE_TASK) for e in epsilons]
        figures[mechanism] = [c.__dict__ for c in cells]
        label = mechanism
        if mechanism == NETWORK_DP:
            worst = " / ".join(f"{c.epsilon:.3g}" for c in cells if c.epsilon is not None)
            label += f" (ε: mean over pairs; worst pair {worst})"
        label += " (reference)" if mechanism == CENTRAL else ""
        rows.append(f"| {label} | " + " | ".join(_cell(c) for c in cells) + " |")
    for mechanism in (CANCELLING, CENTRAL):  # the masks averaged out between steps
        k = GOSSIP_ROUNDS
        cells = [_run(0.1, _private(mechanism, e, gossip_rounds=k), PRIVATE_TASK) for e in epsilons]
        figures[f"{mechanism} {k} rounds a step"] = [c.__dict__ for c in cells]
        label = f"{mechanism}, {k} rounds a step" + (" (reference)" if mechanism == CENTRAL else "")
        rows.append(f"| {label} | " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(rows), figures


@dataclass(frozen=True)
class Comparison:
    """Cancelling masks (epsilon against ``adversary``) and central DP at one epsilon, one
    loss rate and one number of gossip rounds per private step."""

    epsilon: float
    loss: float
    adversary: str
    gossip_rounds: int
    cancelling: Cell
    central: Cell

    @property
    def gap_average(self) -> float:
        return self.cancelling.average_model - self.central.average_model

    @property
    def gap_agents(self) -> float:
        return self.cancelling.accuracy - self.central.accuracy


def check(quick: bool, losses: tuple[float, ...] = (0.0,),
          gossip_rounds: tuple[int, ...] = (1, GOSSIP_ROUNDS)) -> list[Comparison]:  # fmt: skip
    """Cancelling masks against central DP at every epsilon, loss rate and number of gossip
    rounds per private step (the same for both), epsilon against each adversary (one central
    run serves both)."""
    epsilons = EPSILONS[-1:] if quick else EPSILONS
    out = []
    for k in gossip_rounds:
        for loss in losses:
            for e in epsilons:
                central = _run(loss, _private(CENTRAL, e, gossip_rounds=k), PRIVATE_TASK)
                for adversary in ADVERSARIES:
                    privacy = _private(CANCELLING, e, adversary, gossip_rounds=k)
                    cancelling = _run(loss, privacy, PRIVATE_TASK)
                    out.append(Comparison(e, loss, adversary, k, cancelling, central))
    return out


def check_table(comparisons: list[Comparison]) -> str:
    rows = ["| rounds a step | loss | ε | ε against | cancelling | central | "
            "gap (average model) | gap (agents' mean) |",
            "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for c in comparisons:
        cells = f"{_cell(c.cancelling)} | {_cell(c.central)}"
        gaps = f"{c.gap_average:+.3f} | {c.gap_agents:+.3f}"
        rows.append(f"| {c.gossip_rounds} | {c.loss:.0%} | {c.epsilon:g} | {c.adversary} | "
                    f"{cells} | {gaps} |")  # fmt: skip
    return "\n".join(rows)


def check_figures(comparisons: list[Comparison]) -> dict[str, Any]:
    return {
        f"{c.gossip_rounds} {c.loss:g} {c.epsilon:g} {c.adversary}": {
            CANCELLING: c.cancelling.__dict__, CENTRAL: c.central.__dict__,
            "gap_average_model": c.gap_average, "gap_agents_mean": c.gap_agents,
        }
        for c in comparisons
    }  # fmt: skip


def noise_table(gossip_rounds: tuple[int, ...] = (1, GOSSIP_ROUNDS)) -> str:
    """The noise each accounting resolves at every epsilon (no training), and what a curious
    agent spends at the noise calibrated against the eavesdropper."""
    from airgossip.edge.privacy.accounting import OpacusLedger
    from airgossip.edge.privacy.graph import cancelling_noise_multiplier
    from airgossip.edge.privacy.noise import resolve_noise
    from airgossip.edge.privacy.settings import PrivacySettings

    ids = tuple(agent_ids(AGENTS))
    fleet = PrivacyGraph.of(build_graph("exponential", AGENTS), ids, "column-stochastic",
                          static=True)  # fmt: skip
    pairs = pair_graph(fleet.adjacency)
    rows = ["| rounds a step | ε | central: curator's σ (per agent) | ε against | "
            "independent σ | masks | effective σ | a curious agent spends |",
            "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for k in gossip_rounds:
        for e in EPSILONS:
            central = resolve_noise(PrivacySettings(**_private(CENTRAL, e)), rounds=ROUNDS,
                                    num_agents=AGENTS, graph=None)  # fmt: skip
            for adversary in ADVERSARIES:
                settings = PrivacySettings(**_private(CANCELLING, e, adversary, k))
                plan = resolve_noise(settings, rounds=ROUNDS * k, num_agents=AGENTS,
                                     graph=fleet)  # fmt: skip
                curious = cancelling_noise_multiplier(pairs, plan.noise_multiplier,
                                                      plan.mask_multiplier)  # fmt: skip
                ledger = OpacusLedger(curious, 1.0, 1e-5, "rdp", CANCELLING)
                ledger.step(ROUNDS)
                rows.append(
                    f"| {k} | {e:g} | {central.accounted_multiplier:.3g} "
                    f"({central.noise_multiplier:.3g}) | {adversary} | "
                    f"{plan.noise_multiplier:.3g} | {plan.mask_multiplier:.3g} | "
                    f"{plan.accounted_multiplier:.3g} | {ledger.epsilon():.3g} |"
                )
    return "\n".join(rows)


def mask_ratios(ratios: tuple[float, ...], adversary: str, loss: float = 0.0,
                gossip_rounds: int = 1) -> str:  # fmt: skip
    """Cancelling masks of ``ratio`` times the independent noise, epsilon against
    ``adversary``, at every epsilon and ``gossip_rounds`` rounds a step: the independent noise
    each ratio needs and what it reaches beside central DP with the same rounds (larger masks
    need less independent noise, and gossip must average them out)."""
    from airgossip.edge.privacy.accounting import opacus_noise_multiplier
    from airgossip.edge.privacy.graph import cancelling_noise_multiplier

    pairs = pair_graph(build_graph("exponential", AGENTS).phases[0])
    rows = ["| ε | masks / independent noise | independent noise | masks | cancelling | "
            "central | gap (average model) |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for e in EPSILONS:
        wanted = opacus_noise_multiplier(e, 1e-5, 1.0, ROUNDS, "rdp", CANCELLING)
        central = _run(loss, _private(CENTRAL, e, gossip_rounds=gossip_rounds), PRIVATE_TASK)
        for ratio in ratios:
            sigma = wanted / cancelling_noise_multiplier(pairs, 1.0, ratio, adversary)
            privacy = {**_private(CANCELLING, e, adversary, gossip_rounds), "mask_ratio": ratio}
            cell = _run(loss, privacy, PRIVATE_TASK)
            rows.append(f"| {e:g} | {ratio:g} | {sigma:.3g} | {ratio * sigma:.3g} | "
                        f"{_cell(cell)} | {_cell(central)} | "
                        f"{cell.average_model - central.average_model:+.3f} |")  # fmt: skip
    return "\n".join(rows)


def cancellation_probe(loss: float, algorithm: str, *, masks: bool, by_weight: bool = False,
                       seed: int = 0, numel: int = 1000) -> list[np.ndarray]:  # fmt: skip
    """The probe's final estimates (see the module docstring). Masks are added to push-sum's
    value ``x`` as they are, as the mechanism adds them; ``by_weight``: scaled by the agent's
    weight instead, as an ordinary step is (the alternative docs/privacy.md weighs)."""
    ids = agent_ids(AGENTS)
    graph = build_graph("exponential", AGENTS)
    fleet = PrivacyGraph.of(graph, tuple(ids), "column-stochastic", static=True)
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
    comparisons = check(ctx.quick)
    masks, mask_figures = cancellation(ctx.quick)
    checked = [c for c in comparisons if c.gossip_rounds == GOSSIP_ROUNDS]
    measured = f"{GOSSIP_ROUNDS} rounds of gossip a step: " + "; ".join(
        f"ε {c.epsilon:g} against {c.adversary}: {c.cancelling.average_model:.3f} vs "
        f"{c.central.average_model:.3f} average model, {c.cancelling.accuracy:.3f} vs "
        f"{c.central.accuracy:.3f} agents' mean"
        for c in checked
    )
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
            all(abs(c.gap_average) <= 0.02 for c in checked),
            {"table": check_table(comparisons), **check_figures(comparisons)},
            note=f"on the fleet's average model, against either adversary, with "
            f"{GOSSIP_ROUNDS} rounds of gossip per private step (one round: see the table)",
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
    global SEED
    parser = argparse.ArgumentParser(prog="python -m benchmarks.privacy")
    parser.add_argument("--quick", action="store_true", help="ε = 8 only")
    only = "only cancelling against central DP, loss-free and at 10%% loss"
    parser.add_argument("--cancelling", action="store_true", help=only)
    parser.add_argument("--mask-ratios", metavar="R,R,...",
                        help="only cancelling with masks of these ratios, loss-free")  # fmt: skip
    parser.add_argument("--adversary", default="eavesdropper", choices=ADVERSARIES,
                        help="with --mask-ratios: whom epsilon is against")  # fmt: skip
    parser.add_argument(
        "--gossip-rounds",
        metavar="K,K,...",
        default=f"1,{GOSSIP_ROUNDS}",
        help="with --cancelling or --mask-ratios: rounds of gossip per private "
        f"step (default 1,{GOSSIP_ROUNDS}; --mask-ratios takes the first)",
    )
    parser.add_argument("--seed", type=int, default=SEED,
                        help=f"seed of every run (default {SEED})")  # fmt: skip
    parser.add_argument("--lr", type=float, default=LR,
                        help=f"step size of every private row (default {LR:g})")  # fmt: skip
    args = parser.parse_args()
    from pathlib import Path

    PRIVATE_TASK["lr"], SEED = args.lr, args.seed
    gossip_rounds = tuple(int(k) for k in args.gossip_rounds.split(","))

    if args.mask_ratios:
        torch.set_num_threads(1)
        ratios = tuple(float(r) for r in args.mask_ratios.split(","))
        print(mask_ratios(ratios, args.adversary, gossip_rounds=gossip_rounds[0]))
        return
    if args.cancelling:
        torch.set_num_threads(1)
        began = time.perf_counter()
        print(noise_table(gossip_rounds) + "\n")
        comparisons = check(args.quick, losses=(0.0, 0.1), gossip_rounds=gossip_rounds)
        print(check_table(comparisons))
        print(f"\n{time.perf_counter() - began:.0f} s")
        return
    for outcome in run(Context(quick=args.quick, work=Path("."), venvs=Path("."))):
        print(f"## {outcome.target}\n\n{outcome.measured}\n\n{outcome.figures.get('table', '')}\n")


if __name__ == "__main__":
    main()
