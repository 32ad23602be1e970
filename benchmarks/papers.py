"""The seed papers, one entry each, against a baseline measured in the same run.

Run from the repository root (5 to 8 minutes on 2 cores)::

    python -m benchmarks.papers                  # every entry, markdown on stdout
    python -m benchmarks.papers --only switching # one entry (ec-dnn, separable, switching,
                                                 # outer, dsgd-ac, slim-dp)

Every fleet here is real agents (``edge.agent.build_agent``: task, algorithm, codec,
admission, byte counts) driven in lock step over the in-memory transport, with links that
drop each message with a seeded Bernoulli draw; every figure comes from the run that
prints it. Entries:

- ``ec-dnn`` (#13, C4): parameter averaging of same and independently initialised digits
  models, their output ensemble, and ensemble compression of the independent ones.
- ``separable`` (#20, C5): decentralized GD on the separable task (16 agents, ring) against
  centralized GD on the pooled data, step for step.
- ``switching`` (#1): graph schedules on class-skewed digits against the complete graph, and
  push-sum's exactness across switches.
- ``outer`` (#9): local SGD every 8 rounds, plain, with DiLoCo's outer Nesterov step and
  pseudo-synchronous, against averaging every round.
- ``dsgd-ac`` (#14): the consensus-step schedules against D-PSGD (three seeds).
- ``slim-dp`` (#11): choco with slim against top-k and random-k at equal bytes.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from edge.agent import Agent, build_agent
from edge.algorithms import EnsembleCompression, LocalSGD, algorithm_class
from edge.algorithms.local_sgd import LocalSGDOptions
from edge.compression import get_codec
from edge.seeds import derive_seed
from edge.settings import AgentSettings
from edge.stats import MemoryStatsSink, RoundRecord
from edge.tasks import TaskContext, TrainConfig, load_task
from edge.tasks.consensus import ConsensusOptions, true_average
from edge.tasks.digits import DigitsTask
from edge.tasks.separable import SeparableOptions, centralized_reference
from edge.topology import (
    FleetFigures,
    Graph,
    TopologySwitcher,
    assignments_for_graph,
    build_graph,
    parse_switching,
    switched_assignments,
)
from edge.transport import InMemoryNetwork, InMemoryTransport
from edge.transport.base import LinkVerdict

SKEWED = {"name": "digits", "partition": "dirichlet", "alpha": 0.1}


class BernoulliLoss:
    """Drops each message with probability ``loss`` (the draw keyed by link and index)."""

    def __init__(self, loss: float, seed: int) -> None:
        self.loss, self.seed = loss, seed

    def plan(self, sender: str, receiver: str, round: int, index: int, nbytes: int) -> LinkVerdict:
        if self.loss <= 0:
            return LinkVerdict()
        draw = random.Random(derive_seed(self.seed, sender, receiver, index)).random()
        return LinkVerdict(drop=draw < self.loss)


@dataclass
class Run:
    agents: list[Agent]
    records: list[RoundRecord]
    switches: list[int]
    wall_s: float

    def final(self, metric: str) -> list[float]:
        last = max(r.round for r in self.records)
        return [r.metrics[metric] for r in self.records if r.round == last]

    def accuracy(self) -> float:
        return float(np.mean(self.final("accuracy")))

    def worst(self) -> float:
        return float(np.min(self.final("accuracy")))

    def megabytes(self) -> float:
        return sum(a.counters().bytes_sent for a in self.agents) / 1e6

    def estimates(self) -> torch.Tensor:
        return torch.stack([a.algorithm.estimate().double() for a in self.agents])

    def consensus_distance(self) -> float:
        stack = self.estimates()
        mean = stack.mean(dim=0)
        return float((stack - mean).norm(dim=1).mean() / mean.norm())

    def average_model_accuracy(self) -> float:
        """Test accuracy of the average of the agents' models (the deployed model of DSGD-AC)."""
        average = self.estimates().mean(dim=0).float()
        return float(self.agents[0].task.evaluate(average).metrics["accuracy"])


def run_fleet(
    n: int,
    topology: str | Graph,
    *,
    loss: float = 0.1,
    switching: dict[str, Any] | None = None,
    **settings: Any,
) -> Run:
    """One seeded lock-step fleet; ``switching`` is a ``[switching]`` table."""
    started = time.monotonic()
    agent_settings = AgentSettings.model_validate(settings)
    network, sink = InMemoryNetwork(), MemoryStatsSink()
    shaper = BernoulliLoss(loss, agent_settings.seed)
    agents = [
        build_agent(f"agent-{i}", index=i, num_agents=n, settings=agent_settings,
                    transport=InMemoryTransport(network, f"agent-{i}", shaper=shaper), stats=sink)
        for i in range(n)
    ]  # fmt: skip
    addresses = {a.agent_id: a.start() for a in agents}
    scheme = algorithm_class(agent_settings.algorithm).mixing
    switcher = (
        TopologySwitcher(parse_switching(switching), n, seed=agent_settings.seed)
        if switching is not None
        else None
    )
    graph = switcher.graph if switcher is not None else topology
    if isinstance(graph, str):
        graph = build_graph(graph, n, seed=agent_settings.seed)
    assignments = assignments_for_graph(graph, addresses, scheme=scheme)
    for agent in agents:
        agent.set_assignment(assignments[agent.agent_id])
        agent.begin()
    switches: list[int] = []
    torch.set_grad_enabled(False)
    for r in range(1, agent_settings.rounds + 1):
        for agent in agents:
            agent.local_step(r)
            agent.push(r)
        for agent in agents:
            agent.mix(r)
            if r % agent_settings.eval_every == 0 or r == agent_settings.rounds:
                agent.report(r)
        if switcher is not None:
            stack = torch.stack([a.algorithm.estimate().double() for a in agents])
            mean = stack.mean(dim=0)
            distance = float((stack - mean).norm(dim=1).mean() / mean.norm())
            losses = [
                x.metrics["loss"] for x in sink.records if x.round == r and "loss" in x.metrics
            ]
            figures = FleetFigures(r, distance, float(np.mean(losses)) if losses else None)
            new_graph = switcher.observe(figures)
            if new_graph is not None:
                switches.append(r + 1)
                assignments = switched_assignments(assignments, new_graph, addresses, scheme=scheme)
                for agent in agents:
                    agent.set_assignment(assignments[agent.agent_id])
    torch.set_grad_enabled(True)
    run = Run(agents, sink.records, switches, time.monotonic() - started)
    for agent in agents:
        agent.close()
    return run


def progress(label: str, run: Run) -> None:
    print(f"  {label}: {run.wall_s:.1f} s", file=sys.stderr, flush=True)


# -- EC-DNN (#13), C4 -------------------------------------------------------------------------
def ec_dnn(seed: int) -> list[str]:
    agents, rounds = 4, 40

    def alone(init: str, length: int = rounds, **options: Any) -> tuple[float, float, float]:
        tasks = []
        for i in range(agents):
            context = TaskContext(i, agents, seed, options={"init": init, **options})
            task = load_task("digits", context)
            assert isinstance(task, DigitsTask)
            tasks.append(task)
        models = [t.initial_parameters() for t in tasks]
        for r in range(1, length + 1):
            models = [
                t.train(m, TrainConfig(r, length)).parameters
                for t, m in zip(tasks, models, strict=True)
            ]
        judge = tasks[0]
        local = float(np.mean([judge.evaluate(m).metrics["accuracy"] for m in models]))
        average = judge.evaluate(torch.stack(models).mean(dim=0)).metrics["accuracy"]
        return local, average, judge.evaluate_ensemble(models).metrics["accuracy"]

    shared, independent = alone("shared"), alone("independent")
    variations = {
        "independent, 80 rounds": alone("independent", 80),
        "independent, 160 rounds": alone("independent", 160),
        "independent, 80 rounds, momentum 0.9": alone("independent", 80, momentum=0.9),
        "independent, 80 rounds, hidden layer of 64": alone("independent", 80, hidden=64),
    }
    ec = run_fleet(
        agents, "complete", loss=0.0, algorithm="ensemble", rounds=rounds, eval_every=rounds,
        seed=seed, task={"name": "digits", "init": "independent"},
        algorithm_options={"period": 10},
    )  # fmt: skip
    progress("ensemble compression", ec)
    judge = ec.agents[0].task
    assert isinstance(judge, DigitsTask)
    algo = ec.agents[0].algorithm
    assert isinstance(algo, EnsembleCompression)
    ensemble = judge.evaluate_ensemble(algo.last_ensemble).metrics["accuracy"]
    return [
        f"Digits, {agents} agents, disjoint IID shards, {rounds} rounds of 10 local steps, "
        f"seed {seed}; baseline: the same-initialised models' mean accuracy.",
        "",
        "| start | mean local model | parameter average | average - local | output ensemble |",
        "|---|---|---|---|---|",
        f"| shared | {shared[0]:.4f} | {shared[1]:.4f} | {shared[1] - shared[0]:+.4f} "
        f"| {shared[2]:.4f} |",
        f"| independent | {independent[0]:.4f} | {independent[1]:.4f} "
        f"| {independent[1] - independent[0]:+.4f} | {independent[2]:.4f} |",
        *(
            f"| {label} | {v[0]:.4f} | {v[1]:.4f} | {v[1] - v[0]:+.4f} | {v[2]:.4f} |"
            for label, v in variations.items()
        ),
        "",
        f"Ensemble compression (`ensemble`, complete graph, a combination every 10 rounds, "
        f"independent starts): mean {ec.accuracy():.4f} (worst {ec.worst():.4f}) against the "
        f"output ensemble of its last combination {ensemble:.4f} "
        f"({ec.accuracy() - ensemble:+.4f}); {ec.megabytes():.2f} MB.",
    ]


# -- separable data (#20), C5 -----------------------------------------------------------------
def separable(seed: int) -> list[str]:
    steps, marks = 5000, (100, 1000, 5000)
    run = run_fleet(
        16, "ring", loss=0.0, algorithm="dpsgd", rounds=steps, eval_every=100, seed=seed,
        task={"name": "separable"},
    )  # fmt: skip
    progress("decentralized GD", run)
    reference = centralized_reference(seed, 16, SeparableOptions(), steps)
    lines = [
        f"Separable task (dim 20, 100 points per agent, margin 0.1, step 1), 16 agents, ring, "
        f"D-PSGD (decentralized GD), no loss, seed {seed}; baseline: centralized GD on the "
        "pooled 1,600 points, same step size.",
        "",
        "| step | centralized loss | decentralized loss (worst agent) | ratio | centralized "
        "test error | decentralized test error (worst agent) |",
        "|---|---|---|---|---|---|",
    ]
    for t in marks:
        at = [r for r in run.records if r.round == t]
        worst = max(r.metrics["pooled_loss"] for r in at)
        error = max(1 - r.metrics["accuracy"] for r in at)
        lines.append(
            f"| {t} | {reference.pooled_loss[t]:.3e} | {worst:.3e} "
            f"| {worst / reference.pooled_loss[t]:.3f} | {reference.test_error[t]:.4f} "
            f"| {error:.4f} |"
        )
    lines += ["", f"Consensus distance at step {steps}: {run.consensus_distance():.2e}."]
    return lines


# -- topology switching (#1) ------------------------------------------------------------------
def switching(seed: int) -> list[str]:
    common: dict[str, Any] = {"rounds": 80, "eval_every": 1, "seed": seed, "task": SKEWED}
    rows: list[tuple[str, dict[str, Any] | None, str]] = [
        ("complete", None, "complete"),
        ("ring", None, "ring"),
        ("exponential", None, "exponential"),
        ("complete, exponential from 33", {"topologies": ["complete", "exponential"],
                                           "at_rounds": [33]}, ""),
        ("complete, ring from 33", {"topologies": ["complete", "ring"], "at_rounds": [33]}, ""),
        ("complete, ring once consensus distance < 2e-3",
         {"topologies": ["complete", "ring"], "trigger": "consensus-distance-below",
          "threshold": 2e-3}, ""),
        ("ring, complete from 61", {"topologies": ["ring", "complete"], "at_rounds": [61]}, ""),
        ("ring, complete on a loss plateau (< 5% in 5 rounds, 20 rounds in)",
         {"topologies": ["ring", "complete"], "trigger": "loss-plateau", "threshold": 0.05,
          "window": 5, "min_rounds": 20}, ""),
    ]  # fmt: skip
    lines = [
        f"Digits, 16 agents, Dirichlet alpha 0.1, 80 rounds, 10% loss, push-sum, seed {seed}; "
        "baseline: the complete graph throughout.",
        "",
        "| schedule | switched at | accuracy (min) | accuracy - baseline | MB sent "
        "| bytes vs baseline |",
        "|---|---|---|---|---|---|",
    ]
    baseline: Run | None = None
    for label, schedule, topology in rows:
        run = run_fleet(16, topology or "complete", switching=schedule, **common)
        progress(label, run)
        baseline = baseline or run
        at = ", ".join(str(r) for r in run.switches) or "–"
        lines.append(
            f"| {label} | {at} | {run.accuracy():.4f} ({run.worst():.4f}) "
            f"| {run.accuracy() - baseline.accuracy():+.4f} | {run.megabytes():.2f} "
            f"| {run.megabytes() / baseline.megabytes():.3f} |"
        )
    exact = {
        "topologies": ["complete", "ring", "one-peer-exponential", "exponential"],
        "at_rounds": [4, 8, 12],
    }
    n, dim = 16, 30
    lines += [
        "",
        "Consensus (16 agents, 30-dim, 300 rounds, 10% loss), push-sum, complete -> ring -> "
        "one-peer exponential -> exponential at rounds 4, 8, 12:",
        "",
    ]
    reference = true_average(seed, n, ConsensusOptions(dim=dim))
    for label, schedule in (("without switching (exponential)", None), ("switching", exact)):
        run = run_fleet(
            n, "exponential", switching=schedule, rounds=300, eval_every=300, seed=seed,
            task={"name": "consensus", "dim": dim},
        )  # fmt: skip
        error = max(float((e - reference).norm() / reference.norm()) for e in run.estimates())
        lines.append(f"- {label}: max relative error {error:.1e}")
    return lines


# -- outer optimizer (#9) ---------------------------------------------------------------------
def last_average(options: dict[str, Any], rounds: int = 80) -> int:
    schedule = LocalSGDOptions.model_validate(options)
    return max((r for r in range(1, rounds + 1) if schedule.averages(r)), default=0)


def outer(seed: int) -> list[str]:
    rows: list[tuple[str, dict[str, Any]]] = [
        ("H = 1 (averaging every round)", {"period": 1}),
        ("H = 8", {"period": 8}),
        ("H = 8, outer Nesterov (lr 0.7, momentum 0.9)",
         {"period": 8, "outer_lr": 0.7, "outer_momentum": 0.9}),
        ("p = 1/8 (pseudo-synchronous)", {"probability": 0.125}),
        ("p = 1/8, outer Nesterov (lr 0.7, momentum 0.9)",
         {"probability": 0.125, "outer_lr": 0.7, "outer_momentum": 0.9}),
    ]  # fmt: skip
    lines = [
        f"Local SGD on digits, 16 agents, Dirichlet alpha 0.1, 80 rounds of 10 local steps, "
        f"10% loss, seed {seed}; baseline: averaging every round (H = 1) on the same graph.",
        "",
        "| graph | schedule | averaging rounds (last) | accuracy (min) | accuracy - baseline "
        "| MB sent |",
        "|---|---|---|---|---|---|",
    ]
    for topology in ("complete", "exponential"):
        baseline: Run | None = None
        for label, options in rows:
            run = run_fleet(
                16, topology, algorithm="local-sgd", algorithm_options=options, rounds=80,
                eval_every=80, seed=seed, task=SKEWED,
            )  # fmt: skip
            progress(f"{topology} {label}", run)
            baseline = baseline or run
            algo = run.agents[0].algorithm
            assert isinstance(algo, LocalSGD)
            lines.append(
                f"| {topology} | {label} | {algo.averaging_rounds} ({last_average(options)}) "
                f"| {run.accuracy():.4f} "
                f"({run.worst():.4f}) | {run.accuracy() - baseline.accuracy():+.4f} "
                f"| {run.megabytes():.2f} |"
            )
    return lines


# -- DSGD-AC (#14) ----------------------------------------------------------------------------
def dsgd_ac(seed: int) -> list[str]:
    seeds = (seed, seed + 1, seed + 2)
    rows: list[tuple[str, str, dict[str, Any]]] = [
        ("dpsgd", "dpsgd", {}),
        ("dpsgd-ac, learning-rate shape (power 3, gamma 1 -> 0)", "dpsgd-ac", {}),
        ("dpsgd-ac, ramp (gamma 0 -> 1 over 60 rounds)", "dpsgd-ac",
         {"shape": "ramp", "ramp_rounds": 60}),
    ]  # fmt: skip
    lines = [
        f"Digits IID, 16 agents, ring, 80 rounds (learning rate / 10 at round 60), 10% loss, "
        f"mean over seeds {', '.join(map(str, seeds))}; baseline: dpsgd (gamma = 1).",
        "",
        "| algorithm | mean local accuracy | accuracy of the average model | consensus distance "
        "| MB sent |",
        "|---|---|---|---|---|",
    ]
    for label, name, options in rows:
        runs = []
        for s in seeds:
            run = run_fleet(
                16, "ring", algorithm=name, algorithm_options=options, rounds=80, eval_every=80,
                seed=s, task={"name": "digits"},
            )  # fmt: skip
            progress(f"{label} seed {s}", run)
            runs.append(
                (run.accuracy(), run.average_model_accuracy(), run.consensus_distance(),
                 run.megabytes())
            )  # fmt: skip
        local, average, distance, megabytes = (float(np.mean(c)) for c in zip(*runs, strict=True))
        lines.append(
            f"| {label} | {local:.4f} | {average:.4f} | {distance:.2e} | {megabytes:.2f} |"
        )
    return lines


# -- Slim-DP (#11) ----------------------------------------------------------------------------
def equal_bytes_spec(form: str, numel: int, budget: int) -> str:
    """``form`` (``"slim:{}:0.5"``) with the largest fraction, written with four decimals,
    whose data and metadata for ``numel`` elements fit ``budget`` bytes."""
    best = ""
    for k in range(1, numel + 1):
        fraction = math.floor(k / numel * 1e4) / 1e4
        if fraction <= 0 or math.ceil(fraction * numel) != k:
            continue  # four decimals cannot name exactly k coordinates
        codec = get_codec(form.format(fraction))
        if codec.max_bytes(numel) + codec.meta_bytes(numel) > budget:
            break
        best = codec.spec
    return best


def slim_dp(seed: int) -> list[str]:
    numel = DigitsTask(TaskContext(0, 16, seed)).initial_parameters().numel()
    budget = get_codec("topk:0.01").max_bytes(numel)
    rows = [
        "topk:0.01",
        equal_bytes_spec("slim:{}:0.5", numel, budget),
        "slim:0.01:0.5",
        equal_bytes_spec("randomk:{}", numel, budget),
    ]
    lines = [
        f"choco on digits IID, 16 agents, ring, 120 rounds, 10% loss, seed {seed}, gamma 0.1 for "
        f"every codec; baseline: topk:0.01 ({budget} bytes a block of {numel} elements). Bytes "
        "a block count the codec's data and metadata (random seeds); MB sent counts everything "
        "on the wire (headers name the codec, so longer specs cost a few bytes a message).",
        "",
        "| compression | bytes a block | coordinates a block | accuracy (min) "
        "| accuracy - baseline | MB sent |",
        "|---|---|---|---|---|---|",
    ]
    baseline: Run | None = None
    for spec in rows:
        codec = get_codec(spec)
        run = run_fleet(
            16, "ring", algorithm="choco", compression=spec, algorithm_options={"gamma": 0.1},
            rounds=120, eval_every=120, seed=seed, task={"name": "digits"},
        )  # fmt: skip
        progress(spec, run)
        baseline = baseline or run
        size = codec.max_bytes(numel) + codec.meta_bytes(numel)
        kept = math.ceil(float(spec.split(":")[1]) * numel)
        lines.append(
            f"| `{codec.spec}` | {size} | {kept} | {run.accuracy():.4f} ({run.worst():.4f}) "
            f"| {run.accuracy() - baseline.accuracy():+.4f} | {run.megabytes():.2f} |"
        )
    return lines


ENTRIES: dict[str, tuple[str, Callable[[int], list[str]]]] = {
    "ec-dnn": ("EC-DNN (#13): parameter averaging, output ensembles, ensemble compression", ec_dnn),
    "separable": ("Separable data (#20): decentralized GD against centralized GD", separable),
    "switching": ("Topology switching (#1)", switching),
    "outer": ("Outer optimizer for local SGD (#9, DiLoCo / PALSGD)", outer),
    "dsgd-ac": ("Controlled disagreement (#14, DSGD-AC)", dsgd_ac),
    "slim-dp": ("Partial exchange (#11, Slim-DP)", slim_dp),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="", help=f"one of: {', '.join(ENTRIES)}")
    args = parser.parse_args(argv)
    if args.only and args.only not in ENTRIES:
        parser.error(f"unknown entry '{args.only}'; choose one of: {', '.join(ENTRIES)}")
    torch.set_num_threads(1)
    started = time.monotonic()
    lines: list[str] = []
    for key, (title, entry) in ENTRIES.items():
        if args.only and key != args.only:
            continue
        print(f"{key} ...", file=sys.stderr, flush=True)
        lines += [f"#### {title}", "", *entry(args.seed), ""]
    elapsed = time.monotonic() - started
    lines.append(f"({elapsed / 60:.1f} min, torch {torch.__version__}, 1 thread)")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
