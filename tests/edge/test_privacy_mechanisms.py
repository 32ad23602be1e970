"""Privacy mechanisms as classes: named once where ``[privacy]`` is parsed, held as objects
downstream, listed without torch; the run's noise resolved once and carried to every agent
and to the figures."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from airgossip.common.topology import build_graph
from airgossip.edge.privacy.mechanisms.base import Mechanism
from airgossip.edge.privacy.mechanisms.cancelling import CancellingMasks
from airgossip.edge.privacy.mechanisms.registry import MECHANISMS, NO_PRIVACY
from airgossip.edge.privacy.noise import carried_noise, noise_inputs, resolve_noise
from airgossip.edge.privacy.plan import NoisePlan, PrivacyGraph
from airgossip.edge.privacy.settings import PrivacySettings

IDS = tuple(f"agent-{i}" for i in range(6))


def fleet_graph() -> PrivacyGraph:
    return PrivacyGraph.of(build_graph("exponential", 6), IDS, "column-stochastic", static=True)


def test_the_registry_and_the_settings_load_no_torch_or_numpy() -> None:
    code = (
        "import sys, airgossip.edge.privacy.settings; "
        "import airgossip.edge.privacy.mechanisms.registry as r; "
        "print(sorted(m for m in ('torch', 'numpy', 'scipy', 'opacus') if m in sys.modules), "
        "list(r.MECHANISMS))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True, cwd=Path(__file__).parents[2])  # fmt: skip
    assert out.stdout.startswith("[] "), out.stdout


def test_a_name_is_looked_up_once_and_written_back_as_the_name() -> None:
    settings = PrivacySettings(mechanism="cancelling", noise_multiplier=1.0)
    assert isinstance(settings.mechanism, CancellingMasks)
    assert settings.model_dump()["mechanism"] == "cancelling"
    assert json.loads(settings.model_dump_json())["mechanism"] == "cancelling"
    assert PrivacySettings.model_validate_json(settings.model_dump_json()) == settings
    assert PrivacySettings().mechanism is NO_PRIVACY and not PrivacySettings().enabled
    again = pickle.loads(pickle.dumps(settings))  # another process holds the same mechanism
    assert again == settings and again.mechanism == settings.mechanism
    assert set(MECHANISMS) == {m.name for m in MECHANISMS.values()}
    assert all(isinstance(m, Mechanism) for m in MECHANISMS.values())


def test_an_unknown_name_lists_the_mechanisms_there_are() -> None:
    with pytest.raises(ValidationError, match="unknown privacy mechanism 'laplace'") as err:
        PrivacySettings(mechanism="laplace")
    assert ", ".join(MECHANISMS) in str(err.value)


@pytest.mark.parametrize(
    "privacy",
    [
        {"mechanism": "dp-sgd", "target_epsilon": 2.0},
        {"mechanism": "central", "target_epsilon": 2.0, "gossip_rounds": 2},
        {"mechanism": "cancelling", "target_epsilon": 2.0},
        {"mechanism": "cancelling", "target_epsilon": 2.0, "mask_multiplier": 3.0},
        {"mechanism": "network-dp", "target_epsilon": 3.0},
    ],
)
def test_a_carried_plan_is_the_one_resolved_and_is_not_resolved_again(
    privacy: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("opacus")
    graph = fleet_graph()
    settings = PrivacySettings.model_validate(privacy)
    fresh = resolve_noise(settings, rounds=5, num_agents=6, graph=graph)
    carried = carried_noise(settings, rounds=5, num_agents=6, graph=graph)
    assert carried.resolved_noise is not None
    # As an agent reads it from the run's config.json: the same numbers, to the last bit.
    read = PrivacySettings.model_validate(json.loads(carried.model_dump_json()))

    def refuse(*args: object, **kwargs: object) -> NoisePlan:
        raise AssertionError("the carried plan was resolved again")

    monkeypatch.setattr(type(settings.mechanism), "plan", refuse)
    plan = resolve_noise(read, rounds=5, num_agents=6, graph=graph)
    assert plan.noise_multiplier == fresh.noise_multiplier
    assert plan.mask_multiplier == fresh.mask_multiplier
    assert plan.accounted_multiplier == fresh.accounted_multiplier
    assert (plan.network is None) == (fresh.network is None)
    with pytest.raises(AssertionError, match="resolved again"):  # other inputs: not carried
        resolve_noise(read, rounds=6, num_agents=6, graph=graph)


def test_a_plan_carried_for_another_graph_or_version_is_not_taken() -> None:
    settings = PrivacySettings(mechanism="cancelling", noise_multiplier=1.0)
    graph = fleet_graph()
    ring = PrivacyGraph.of(build_graph("ring", 6), IDS, "column-stochastic", static=True)
    inputs = noise_inputs(settings, rounds=5, num_agents=6, graph=graph)
    assert inputs.startswith("v1:")
    assert inputs != noise_inputs(settings, rounds=5, num_agents=6, graph=ring)
    dp_sgd = PrivacySettings(mechanism="dp-sgd", noise_multiplier=1.0)
    assert noise_inputs(dp_sgd, rounds=5, num_agents=6, graph=graph) == noise_inputs(
        dp_sgd, rounds=5, num_agents=6, graph=ring
    ), "a mechanism that needs no graph does not depend on it"


def test_a_run_resolves_its_noise_once_for_every_agent_and_the_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("opacus")
    from airgossip.emulation.fleets.run import run_fleet
    from airgossip.scenario.config import load_config

    calls = []
    plan = CancellingMasks.plan

    def counted(self: CancellingMasks, *args: object, **kwargs: object) -> NoisePlan:
        calls.append(1)
        return plan(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(CancellingMasks, "plan", counted)
    config = load_config(None, {
        "agents": 4, "rounds": 2, "mode": "inproc", "network": {"loss": 0.0},
        "task": {"name": "digits", "hidden": 8},
        "privacy": {"mechanism": "cancelling", "target_epsilon": 2.0},
    })  # fmt: skip
    results = run_fleet(config, tmp_path / "out")
    assert len(calls) == 1
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["privacy"]["resolved_noise"]["noise_multiplier"] > 0
    assert results.privacy is not None and results.privacy.mechanism == "cancelling"
