"""The accountants: what an agent reports it spent is what Opacus's own privacy engine
reports for the same steps; the Gaussian conversion of network DP is Opacus's numerical
(PRV) accountant's; calibration reaches its target; what the graph does to a guarantee,
checked against an independent computation."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from airgossip.common.topology import build_graph
from airgossip.edge.privacy.accounting import (
    OpacusLedger,
    PrivacyError,
    gaussian_delta,
    gaussian_epsilon,
    opacus_module,
)
from airgossip.edge.privacy.graph import (
    cancelling_limit,
    cancelling_noise_multiplier,
    cancelling_sensitivities,
    network_sensitivities,
    pair_graph,
)
from airgossip.edge.privacy.mechanism import PrivacyContext, PrivacyMechanism
from airgossip.edge.privacy.noise import resolve_noise
from airgossip.edge.privacy.plan import PrivacyGraph, mean_pair_epsilon
from airgossip.edge.privacy.settings import PrivacySettings
from airgossip.edge.tasks import TaskContext, TrainConfig, load_task

opacus = pytest.importorskip("opacus")


def digits(index: int = 0, agents: int = 16) -> object:
    return load_task("digits", TaskContext(index, agents, 0))


def test_dp_sgd_spends_what_opacus_privacy_engine_spends_for_the_same_steps() -> None:
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    task = digits()
    sigma, rounds, steps = 1.1, 4, 3
    settings = PrivacySettings(mechanism="dp-sgd", noise_multiplier=sigma, sample_rate=0.1,
                               steps_per_round=steps)  # fmt: skip
    mechanism = PrivacyMechanism(
        settings, task, agent_id="agent-0", num_agents=16, rounds=rounds, seed=7,
        context=PrivacyContext(), run_context=b"test",
    )  # fmt: skip
    start = task.initial_parameters()  # type: ignore[attr-defined]
    for r in range(1, rounds + 1):
        start = mechanism.train(start, TrainConfig(r, rounds)).parameters
    ours = mechanism.spent()
    assert ours.steps == rounds * steps

    # Opacus's own engine on the same shard: Poisson batches of rate 1/len(loader) = 0.1.
    setup = task.private_training(start, TrainConfig(1, rounds))  # type: ignore[attr-defined]
    data = TensorDataset(setup.features, setup.labels)
    loader = DataLoader(data, batch_size=len(data) // 10 + (len(data) % 10 > 0))
    assert 1 / len(loader) == pytest.approx(0.1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 8), torch.nn.ReLU(), torch.nn.Linear(8, 10))
    engine = PrivacyEngine(accountant="rdp")
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=loader, noise_multiplier=sigma, max_grad_norm=1.0,
    )  # fmt: skip
    taken = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        while taken < rounds * steps:
            for x, y in loader:
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
                taken += 1
                if taken == rounds * steps:
                    break
    assert engine.accountant.history == [(sigma, 0.1, rounds * steps)]
    assert ours.epsilon == pytest.approx(engine.get_epsilon(1e-5), rel=1e-12)
    assert 0 < ours.epsilon < math.inf


def test_a_target_epsilon_is_spent_by_the_last_round() -> None:
    plan = resolve_noise(
        PrivacySettings(mechanism="dp-sgd", target_epsilon=3.0, sample_rate=0.2),
        rounds=50, num_agents=16, graph=None,
    )  # fmt: skip
    ledger = OpacusLedger(plan.noise_multiplier, 0.2, 1e-5, "rdp", "dp-sgd")
    ledger.step(50)
    assert 2.95 <= ledger.epsilon() <= 3.0
    ledger.step(1)
    assert ledger.epsilon() > 3.0


def test_the_prv_ledger_is_opacus_prv_accountant_stepped_as_the_engine_steps_it() -> None:
    from opacus.accountants import PRVAccountant

    ledger = OpacusLedger(1.3, 0.05, 1e-5, "prv", "dp-sgd")
    ledger.step(200)
    ledger.charge(0.9, 3)  # a restart's charge: a second entry of its own multiplier
    engine = PRVAccountant()
    for _ in range(200):
        engine.step(noise_multiplier=1.3, sample_rate=0.05)
    for _ in range(3):
        engine.step(noise_multiplier=0.9, sample_rate=0.05)
    assert ledger.epsilon() == pytest.approx(engine.get_epsilon(1e-5), rel=1e-9)


def test_the_exact_gaussian_conversion_agrees_with_opacus_numerical_accountant() -> None:
    from opacus.accountants import PRVAccountant, RDPAccountant

    for sigma, steps in ((2.0, 1), (5.0, 40), (30.0, 100)):
        mu = math.sqrt(steps) / sigma  # composition of Gaussian mechanisms
        ours = gaussian_epsilon(mu, 1e-5)
        assert gaussian_delta(mu, ours) == pytest.approx(1e-5, rel=1e-3)
        prv, rdp = PRVAccountant(), RDPAccountant()
        prv.history = rdp.history = [(sigma, 1.0, steps)]
        # PRV is a numerical upper bound within its eps_error; RDP's conversion is looser.
        assert ours <= prv.get_epsilon(1e-5, eps_error=0.01) <= ours + 0.03
        assert rdp.get_epsilon(1e-5) >= ours
    assert gaussian_epsilon(0.0, 1e-5) == 0.0
    assert gaussian_epsilon(math.inf, 1e-5) == math.inf


def test_without_opacus_one_line_names_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    # As if it were not installed: an import of it fails as a missing package's does.
    for name in ("opacus", "opacus.accountants"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(PrivacyError) as caught:
        opacus_module("accountants", "dp-sgd")
    assert str(caught.value) == (
        "privacy mechanism 'dp-sgd' needs Opacus, which is not installed: "
        "pip install 'airgossip[privacy]' (or: pip install opacus)"
    )


# -- what the graph does --------------------------------------------------------------------


def test_cancelling_masks_against_a_direct_computation_on_a_path() -> None:
    # Path 0 - 1 - 2 - 3, a curious agent 3 knows the mask it shares with 2.
    pairs = pair_graph(np.array([[0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1], [0, 0, 0, 0]]))
    sigma, mask = 0.7, 2.0
    mu = cancelling_sensitivities(pairs, sigma, mask)
    # What 3 sees of agents 0..2: independent noise plus the masks of pairs (0,1), (1,2).
    incidence = np.array([[1.0, 0.0], [-1.0, 1.0], [0.0, -1.0]])
    cov = sigma**2 * np.eye(3) + mask**2 * incidence @ incidence.T
    assert mu[0, 3] == pytest.approx(math.sqrt(np.linalg.inv(cov)[0, 0]), rel=1e-12)
    assert mu[2, 3] == pytest.approx(math.sqrt(np.linalg.inv(cov)[2, 2]), rel=1e-12)
    # No masks: the agent's own noise alone; huge masks: the independent noise of the rest.
    assert cancelling_noise_multiplier(pairs, sigma, 0.0) == pytest.approx(sigma)
    exponential = pair_graph(build_graph("exponential", 16).phases[0])
    assert cancelling_limit(exponential) == pytest.approx(math.sqrt(15))
    assert cancelling_noise_multiplier(exponential, 1.0, 1e4) == pytest.approx(
        math.sqrt(15), rel=1e-4
    )


def test_network_sensitivities_against_a_simulation_of_the_view() -> None:
    rng = np.random.default_rng(3)
    n, rounds = 4, 3
    adjacency = build_graph("exponential", n).phases[0]
    w = np.zeros((n, n))
    for i in range(n):
        targets = [i, *np.flatnonzero(adjacency[i])]
        w[targets, i] = rng.dirichlet(np.ones(len(targets)))
    # What scales an agent's update as it enters the state: here y_t = W^t 1, push-sum's
    # weight (the mechanisms add theirs unscaled, the default).
    weights = [np.linalg.matrix_power(w, t) @ np.ones(n) for t in range(rounds)]
    got = network_sensitivities(w, rounds, weights=np.array(weights))
    assert got.exact
    for u, v in ((0, 1), (2, 0), (3, 2)):
        # The view, built from unit injections through the dynamics: column (r, i) is what
        # v receives from each in-neighbour in each round when agent i adds 1 in round r.
        seen = [j for j in range(n) if w[v, j] > 0 and j != v]
        columns = {}
        for r in range(rounds):
            for i in range(n):
                state, view = np.zeros(n), []
                for t in range(rounds):
                    state = w @ state if t else state
                    state = state + (np.eye(n)[i] * weights[r][i] if t == r else 0)
                    view.extend(state[seen])
                columns[r, i] = np.array(view)
        noise = np.stack([columns[r, i] for r in range(rounds) for i in range(n) if i != v], 1)
        signal = np.stack([columns[r, u] for r in range(rounds)], 1)
        q = signal.T @ np.linalg.pinv(noise @ noise.T) @ signal
        assert got.at(rounds)[u, v] == pytest.approx(min(np.abs(q).sum(), rounds), rel=1e-8)
        q1 = signal[: len(seen), :1].T @ np.linalg.pinv(
            (noise @ noise.T)[: len(seen), : len(seen)]) @ signal[: len(seen), :1]  # fmt: skip
        assert got.at(1)[u, v] == pytest.approx(min(float(q1[0, 0]), 1.0), rel=1e-8)
    assert (got.at(rounds) <= rounds + 1e-12).all()


def test_network_dp_is_calibrated_on_the_mean_pair_and_amplified_by_distance() -> None:
    graph = build_graph("exponential", 16)
    fleet = PrivacyGraph.of(graph, tuple(f"agent-{i}" for i in range(16)), "column-stochastic",
                          static=True)  # fmt: skip
    settings = PrivacySettings(mechanism="network-dp", target_epsilon=3.0)
    plan = resolve_noise(settings, rounds=12, num_agents=16, graph=fleet)
    assert plan.network is not None
    assert mean_pair_epsilon(plan.network, 12, plan.noise_multiplier, 1e-5) == pytest.approx(
        3.0, abs=0.01
    )
    pairwise = plan.pairwise_epsilon(12, 1e-5)
    local = gaussian_epsilon(math.sqrt(12) / plan.noise_multiplier, 1e-5)
    off = ~np.eye(16, dtype=bool)
    assert pairwise[off].max() <= local + 1e-9  # never worse than local DP
    assert pairwise[off].mean() < 0.8 * local  # and better on average
