"""The seed papers, one entry each, against a baseline measured in the same run.

Run from the repository root (17 minutes on 2 cores shared with other work)::

    python -m benchmarks.papers                  # every entry, markdown on stdout
    python -m benchmarks.papers --only switching # one entry (ec-dnn, separable, switching,
                                                 # outer, dsgd-ac, slim-dp)

Every run is a scenario's settings (``airgossip.scenario.config``) run by the in-process fleet
(``--mode inproc``: real agents in lock step over the in-memory transport, the static
network's seeded per-link loss, its ``[switching]`` schedule), with the run's figures from
``airgossip.scenario.results.summarise``; every figure comes from the run that prints it. Entries:

- ``ec-dnn`` (#13, C4): parameter averaging of same and independently initialised digits
  models over ten seeds, their output ensemble, and ensemble compression of the independent
  ones.
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
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from airgossip.edge.algorithms import EnsembleCompression, LocalSGD
from airgossip.edge.algorithms.local_sgd import LocalSGDOptions
from airgossip.edge.compression import get_codec
from airgossip.edge.tasks import TaskContext
from airgossip.edge.tasks.digits import DigitsTask
from airgossip.edge.tasks.separable import SeparableOptions, centralized_reference
from airgossip.emulation.fleets import preflight, reference_answer
from airgossip.emulation.fleets.inproc import InProcessFleet
from airgossip.emulation.networks.static import StaticLinks
from airgossip.scenario.config import load_config
from airgossip.scenario.results import FinalFigures, summarise

SKEWED = {"name": "digits", "partition": "dirichlet", "alpha": 0.1}
LOSSLESS = {"loss": 0.0}


def run(label: str, **settings: Any) -> tuple[InProcessFleet, FinalFigures]:
    """One seeded scenario (``settings``: its keys, ``[network]`` 10% loss unless given) in
    the in-process fleet: the finished fleet (its agents, its link runtime) and its final
    figures. The time it took goes to stderr."""
    config = load_config(None, {"mode": "inproc", **settings})
    started = time.monotonic()
    fleet = InProcessFleet(config, preflight(config).network)
    fleet.run()
    final = summarise(fleet.records(), reference=reference_answer(config)).final
    print(f"  {label}: {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
    return fleet, final


def digits_judge(fleet: InProcessFleet) -> DigitsTask:
    """An agent's digits task: the test split is every agent's."""
    task = fleet.agents[0].task
    assert isinstance(task, DigitsTask)
    return task


def models(fleet: InProcessFleet) -> list[torch.Tensor]:
    return [agent.algorithm.estimate() for agent in fleet.agents]


def accuracy(final: FinalFigures) -> str:
    """Mean accuracy, the worst agent's in brackets."""
    return f"{final.mean_accuracy:.4f} ({final.min_accuracy:.4f})"


def megabytes(final: FinalFigures) -> float:
    return final.bytes_sent / 1e6


# -- EC-DNN (#13), C4 -------------------------------------------------------------------------
def alone(seed: int, init: str, rounds: int = 40, **task: Any) -> tuple[float, float, float]:
    """4 agents train on disjoint IID digits shards and never talk (local SGD whose first
    average would come after the run); (mean local accuracy, accuracy of the parameter
    average, accuracy of the output ensemble)."""
    fleet, final = run(
        f"alone, {init}, {rounds} rounds, seed {seed}{f', {task}' if task else ''}", agents=4,
        topology="complete", algorithm="local-sgd", algorithm_options={"period": rounds + 1},
        rounds=rounds, eval_every=rounds, seed=seed, network=LOSSLESS,
        task={"name": "digits", "init": init, **task},
    )  # fmt: skip
    judge, trained = digits_judge(fleet), models(fleet)
    average = judge.evaluate(torch.stack(trained).mean(dim=0)).metrics["accuracy"]
    assert final.mean_accuracy is not None
    return final.mean_accuracy, average, judge.evaluate_ensemble(trained).metrics["accuracy"]


def ec_dnn(seed: int) -> list[str]:
    agents, rounds, seeds = 4, 40, range(seed, seed + 10)
    checked = range(seed, seed + 5)  # the seeds of the tests' C4 checks
    lines = [
        f"Digits, {agents} agents, disjoint IID shards, {rounds} rounds of 10 local steps, "
        f"seeds {seeds[0]}-{seeds[-1]}; baseline: the same-initialised models' mean accuracy "
        "and their parameter average.",
        "",
        "| seed | shared: local | shared: average - local | independent: local | independent: "
        "parameter average | independent: average - local | independent: output ensemble |",
        "|---|---|---|---|---|---|---|",
    ]
    shared_loss, independent_loss = {}, {}
    for s in seeds:
        shared, independent = alone(s, "shared"), alone(s, "independent")
        shared_loss[s], independent_loss[s] = shared[1] - shared[0], independent[1] - independent[0]
        lines.append(
            f"| {s} | {shared[0]:.4f} | {shared_loss[s]:+.4f} | {independent[0]:.4f} "
            f"| {independent[1]:.4f} | {independent_loss[s]:+.4f} | {independent[2]:.4f} |"
        )
    for label, chosen in ((f"mean {checked[0]}-{checked[-1]}", checked),
                          (f"mean {seeds[0]}-{seeds[-1]}", seeds)):  # fmt: skip
        lines.append(
            f"| {label} | | {np.mean([shared_loss[s] for s in chosen]):+.4f} | | "
            f"| {np.mean([independent_loss[s] for s in chosen]):+.4f} | |"
        )
    variations = {
        "80 rounds (800 steps)": {"rounds": 80},
        "80 rounds, hidden layer of 64": {"rounds": 80, "hidden": 64},
    }
    lines += [
        "",
        f"Independent starts, mean over seeds {checked[0]}-{checked[-1]}:",
        "",
        "| variation | mean local model | parameter average | average - local |",
        "|---|---|---|---|",
    ]
    for label, options in variations.items():
        figures = np.mean([alone(s, "independent", **options) for s in checked], axis=0)
        lines.append(
            f"| {label} | {figures[0]:.4f} | {figures[1]:.4f} | {figures[1] - figures[0]:+.4f} |"
        )
    fleet, final = run(
        "ensemble compression", agents=agents, topology="complete", algorithm="ensemble",
        rounds=rounds, eval_every=rounds, seed=seed, network=LOSSLESS,
        task={"name": "digits", "init": "independent"}, algorithm_options={"period": 10},
    )  # fmt: skip
    algo = fleet.agents[0].algorithm
    assert isinstance(algo, EnsembleCompression) and final.mean_accuracy is not None
    ensemble = digits_judge(fleet).evaluate_ensemble(algo.last_ensemble).metrics["accuracy"]
    return [
        *lines,
        "",
        f"Ensemble compression (`ensemble`, complete graph, no loss, a combination every 10 "
        f"rounds, independent starts, seed {seed}): mean {accuracy(final)} against the output "
        f"ensemble of its last combination {ensemble:.4f} "
        f"({final.mean_accuracy - ensemble:+.4f}); {megabytes(final):.2f} MB.",
    ]


# -- separable data (#20), C5 -----------------------------------------------------------------
def separable(seed: int) -> list[str]:
    steps, marks = 5000, (100, 1000, 5000)
    fleet, final = run(
        "decentralized GD", agents=16, topology="ring", algorithm="dpsgd", rounds=steps,
        eval_every=100, seed=seed, task={"name": "separable"}, network=LOSSLESS,
    )  # fmt: skip
    records = [r for agent_records in fleet.records().values() for r in agent_records]
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
        at = [r for r in records if r.round == t]
        worst = max(r.metrics["pooled_loss"] for r in at)
        error = max(1 - r.metrics["accuracy"] for r in at)
        lines.append(
            f"| {t} | {reference.pooled_loss[t]:.3e} | {worst:.3e} "
            f"| {worst / reference.pooled_loss[t]:.3f} | {reference.test_error[t]:.4f} "
            f"| {error:.4f} |"
        )
    lines += ["", f"Consensus distance at step {steps}: {final.consensus_distance:.2e}."]
    return lines


# -- topology switching (#1) ------------------------------------------------------------------
def switched_at(fleet: InProcessFleet) -> list[int]:
    links = fleet.runtime
    assert isinstance(links, StaticLinks)
    return links.switched_at


def switching(seed: int) -> list[str]:
    common: dict[str, Any] = {"agents": 16, "rounds": 80, "eval_every": 1, "seed": seed,
                              "task": SKEWED}  # fmt: skip
    rows: list[tuple[str, dict[str, Any]]] = [
        ("complete", {"topology": "complete"}),
        ("ring", {"topology": "ring"}),
        ("exponential", {"topology": "exponential"}),
        ("complete, exponential from 33", {"topologies": ["complete", "exponential"],
                                           "at_rounds": [33]}),
        ("complete, ring from 33", {"topologies": ["complete", "ring"], "at_rounds": [33]}),
        ("complete, ring once consensus distance < 2e-3",
         {"topologies": ["complete", "ring"], "trigger": "consensus-distance-below",
          "threshold": 2e-3}),
        ("ring, complete from 61", {"topologies": ["ring", "complete"], "at_rounds": [61]}),
        ("ring, complete on a loss plateau (< 5% in 5 rounds, 20 rounds in)",
         {"topologies": ["ring", "complete"], "trigger": "loss-plateau", "threshold": 0.05,
          "window": 5, "min_rounds": 20}),
    ]  # fmt: skip
    lines = [
        f"Digits, 16 agents, Dirichlet alpha 0.1, 80 rounds, 10% loss, push-sum, seed {seed}; "
        "baseline: the complete graph throughout.",
        "",
        "| schedule | switched at | accuracy (min) | accuracy - baseline | MB sent "
        "| bytes vs baseline |",
        "|---|---|---|---|---|---|",
    ]
    baseline: FinalFigures | None = None
    for label, table in rows:
        graph = table if "topology" in table else {"switching": table}
        fleet, final = run(label, **common, **graph)
        baseline = baseline or final
        assert final.mean_accuracy is not None and baseline.mean_accuracy is not None
        at = ", ".join(str(r) for r in switched_at(fleet)) or "–"
        lines.append(
            f"| {label} | {at} | {accuracy(final)} "
            f"| {final.mean_accuracy - baseline.mean_accuracy:+.4f} | {megabytes(final):.2f} "
            f"| {final.bytes_sent / baseline.bytes_sent:.3f} |"
        )
    exact = {
        "topologies": ["complete", "ring", "one-peer-exponential", "exponential"],
        "at_rounds": [4, 8, 12],
    }
    lines += [
        "",
        "Consensus (16 agents, 30-dim, 300 rounds, 10% loss), push-sum, complete -> ring -> "
        "one-peer exponential -> exponential at rounds 4, 8, 12:",
        "",
    ]
    consensus: dict[str, Any] = {"agents": 16, "rounds": 300, "eval_every": 300, "seed": seed,
                                 "task": {"name": "consensus", "dim": 30}}  # fmt: skip
    for label, graph in (("without switching (exponential)", {"topology": "exponential"}),
                         ("switching", {"switching": exact})):  # fmt: skip
        _, final = run(f"consensus, {label}", **consensus, **graph)
        lines.append(f"- {label}: max relative error {final.relative_error:.1e}")
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
        baseline: FinalFigures | None = None
        for label, options in rows:
            fleet, final = run(
                f"{topology} {label}", agents=16, topology=topology, algorithm="local-sgd",
                algorithm_options=options, rounds=80, eval_every=80, seed=seed, task=SKEWED,
            )  # fmt: skip
            baseline = baseline or final
            assert final.mean_accuracy is not None and baseline.mean_accuracy is not None
            algo = fleet.agents[0].algorithm
            assert isinstance(algo, LocalSGD)
            lines.append(
                f"| {topology} | {label} | {algo.averaging_rounds} ({last_average(options)}) "
                f"| {accuracy(final)} | {final.mean_accuracy - baseline.mean_accuracy:+.4f} "
                f"| {megabytes(final):.2f} |"
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
            fleet, final = run(
                f"{label} seed {s}", agents=16, topology="ring", algorithm=name,
                algorithm_options=options, rounds=80, eval_every=80, seed=s,
                task={"name": "digits"},
            )  # fmt: skip
            # The average of the replicas: the model DSGD-AC deploys.
            deployed = torch.stack(models(fleet)).mean(dim=0)
            runs.append(
                (final.mean_accuracy, digits_judge(fleet).evaluate(deployed).metrics["accuracy"],
                 final.consensus_distance, megabytes(final))
            )  # fmt: skip
        local, average, distance, sent = (float(np.mean(c)) for c in zip(*runs, strict=True))
        lines.append(f"| {label} | {local:.4f} | {average:.4f} | {distance:.2e} | {sent:.2f} |")
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
    baseline: FinalFigures | None = None
    for spec in rows:
        codec = get_codec(spec)
        _, final = run(
            spec, agents=16, topology="ring", algorithm="choco", compression=spec,
            algorithm_options={"gamma": 0.1}, rounds=120, eval_every=120, seed=seed,
            task={"name": "digits"},
        )  # fmt: skip
        baseline = baseline or final
        assert final.mean_accuracy is not None and baseline.mean_accuracy is not None
        size = codec.max_bytes(numel) + codec.meta_bytes(numel)
        kept = math.ceil(float(spec.split(":")[1]) * numel)
        lines.append(
            f"| `{codec.spec}` | {size} | {kept} | {accuracy(final)} "
            f"| {final.mean_accuracy - baseline.mean_accuracy:+.4f} | {megabytes(final):.2f} |"
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
