"""A restart from a checkpoint never forgets a private step: the journal is written before
the steps, a restarted agent goes on from every step ever taken, draws new noise, and pays
again for the rounds it runs twice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from airgossip.common.identity import agent_ids
from airgossip.common.topology import build_graph
from airgossip.edge.privacy.keys import RunKeyring
from airgossip.edge.privacy.mechanism import PrivacyContext, PrivacyMechanism
from airgossip.edge.privacy.plan import PrivacyGraph
from airgossip.edge.privacy.settings import PrivacySettings
from airgossip.edge.tasks import TaskContext, TrainConfig, load_task

pytest.importorskip("opacus")

IDS = tuple(agent_ids(4))


def mechanism(settings: PrivacySettings, journal: Path, keyring: RunKeyring) -> PrivacyMechanism:
    graph = PrivacyGraph.of(build_graph("ring", 4), IDS, "column-stochastic", static=True)
    task = load_task("digits", TaskContext(0, 4, 0, options={"hidden": 8}))
    return PrivacyMechanism(
        settings, task, agent_id="agent-0", num_agents=4, rounds=10, seed=3,
        context=PrivacyContext(graph, keyring.for_agent("agent-0")), run_context=b"run",
        journal=journal,
    )  # fmt: skip


@pytest.mark.parametrize("kind", ["dp-sgd", "cancelling"])
def test_a_restarted_agent_goes_on_from_every_step_it_took(kind: str, tmp_path: Path) -> None:
    settings = PrivacySettings(mechanism=kind, noise_multiplier=2.0)
    journal, keyring = tmp_path / "agent-0.privacy.json", RunKeyring(IDS, seed=0)
    first = mechanism(settings, journal, keyring)
    start = first.task.initial_parameters()
    # From one start and on the whole shard, two rounds' results differ by their noise only.
    outputs = [first.train(start, TrainConfig(r, 10)).parameters for r in (1, 2, 3)]
    before = first.spent()
    assert before.steps == 3
    assert json.loads(journal.read_text())["steps"] == 3  # on disk before the spending

    # The checkpoint held round 1: rounds 2 and 3 run again after the restart.
    again = mechanism(settings, journal, keyring)
    assert again.spent().steps == 3 and again.spent().epsilon == pytest.approx(before.epsilon)
    redone = again.train(start, TrainConfig(2, 10)).parameters
    # New noise, none that the crashed incarnation used (and sent).
    assert not any(torch.allclose(redone, sent, atol=1e-6) for sent in outputs)
    unseeded = mechanism(settings, tmp_path / "fresh.json", keyring)
    assert torch.allclose(unseeded.train(start, TrainConfig(1, 10)).parameters, outputs[0])
    after = again.spent()
    assert after.steps == 4
    entry = json.loads(journal.read_text())
    assert entry["incarnation"] == 2 and entry["rerun_steps"] == 1 and entry["last_round"] == 3
    once_more = mechanism(settings, tmp_path / "plain.json", keyring)
    for r in (1, 2, 3, 4):
        once_more.train(start, TrainConfig(r, 10))
    if kind == "dp-sgd":  # a round run again is one more step, with fresh noise
        assert after.epsilon == pytest.approx(once_more.spent().epsilon)
    else:  # the same masks twice: charged as if they were known
        assert after.epsilon > once_more.spent().epsilon


def test_an_unreadable_journal_stops_the_agent_with_one_line(tmp_path: Path) -> None:
    journal = tmp_path / "agent-0.privacy.json"
    journal.write_text("{not json")
    settings = PrivacySettings(mechanism="dp-sgd", noise_multiplier=2.0)
    with pytest.raises(ValueError, match=r"unreadable .* cannot tell what it spent"):
        mechanism(settings, journal, RunKeyring(IDS, seed=0))
