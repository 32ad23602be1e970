"""The batched in-process fleet (emulation/fleets/batched.py) against the per-agent one.

A seeded lossy run gives the same drops (the same messages, not only as many), the same
counters, and estimates within 1e-9 relative either way; the in-process fleet takes the
batched path by itself where it applies and the per-agent one everywhere else.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from airgossip.common.identity import agent_ids
from airgossip.edge.algorithms.push_sum_rules import STARVED_WEIGHT
from airgossip.edge.observability.stats import RoundRecord
from airgossip.emulation.fleets import reference_answer
from airgossip.emulation.fleets.inproc import InProcessFleet, run_in_process
from airgossip.emulation.networks import network_for
from airgossip.emulation.networks.link_draws import BernoulliDrops, link_uniforms
from airgossip.emulation.networks.static import BernoulliLinkShaper, LinkSpec
from airgossip.scenario.config import RunConfig, load_config
from airgossip.scenario.results import summarise

AGENTS = 64
ROUNDS = 12
RELATIVE = 1e-9


def consensus(**settings: Any) -> RunConfig:
    return load_config(None, {
        "mode": "inproc", "agents": AGENTS, "rounds": ROUNDS, "seed": 5,
        "task": {"name": "consensus", "dim": 16}, **settings,
    })  # fmt: skip


Verdicts = dict[tuple[str, str, int, int], bool]


def journaled(monkeypatch: pytest.MonkeyPatch, config: RunConfig, batched: bool
              ) -> tuple[dict[str, list[RoundRecord]], Verdicts]:  # fmt: skip
    """Run ``config`` one way; every message's verdict by (sender, receiver, round, index)."""
    verdicts: Verdicts = {}
    if batched:
        pairs: dict[int, tuple[str, str]] = {}
        keys, dropped = BernoulliDrops.link_keys, BernoulliDrops.dropped

        def link_keys(self: BernoulliDrops, ids: list[str], src: Any, dst: Any) -> Any:
            out = keys(self, ids, src, dst)
            pairs.update({int(k): (ids[i], ids[j]) for k, i, j in zip(out, src, dst, strict=True)})
            return out

        def verdict(self: BernoulliDrops, link: Any, round_index: int, index: Any) -> Any:
            out = dropped(self, link, round_index, index)
            for k, i, d in zip(link.tolist(), index.tolist(), out.tolist(), strict=True):
                sender, receiver = pairs[k]
                verdicts[(sender, receiver, round_index, i)] = d
            return out

        monkeypatch.setattr(BernoulliDrops, "link_keys", link_keys)
        monkeypatch.setattr(BernoulliDrops, "dropped", verdict)
    else:
        plan = BernoulliLinkShaper.plan

        def planned(self: BernoulliLinkShaper, s: str, r: str, rnd: int, i: int, nb: int) -> Any:
            out = plan(self, s, r, rnd, i, nb)
            verdicts[(s, r, rnd, i)] = out.drop
            return out

        monkeypatch.setattr(BernoulliLinkShaper, "plan", planned)
    records = run_in_process(config, batched=batched)
    monkeypatch.undo()
    return records, verdicts


def test_the_batched_draw_is_the_shapers_generator_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    hashes = rng.integers(0, 2**63, 400, dtype=np.uint64) * np.uint64(2)
    hashes[:100] = rng.integers(0, 2**32, 100, dtype=np.uint64)  # one 32-bit word
    indexes = rng.integers(0, 5000, 400).astype(np.uint64)
    for seed in (0, 11, 2**40 + 3):
        for round_index in (0, 1, 513, 2**35):
            got = link_uniforms(seed, hashes, round_index, indexes)
            want = [
                np.random.default_rng([seed, int(h), round_index, int(i)]).random()
                for h, i in zip(hashes, indexes, strict=True)
            ]
            assert got.tolist() == want


def test_batched_drops_equal_the_shapers_verdicts() -> None:
    ids = agent_ids(300)
    src = np.arange(300)
    dst = (src * 7 + 3) % 300
    drops = BernoulliDrops(seed=9, loss=0.3)
    keys = drops.link_keys(ids, src, dst)
    shaper = BernoulliLinkShaper(LinkSpec(loss=0.3), seed=9)
    for round_index in (1, 7):
        index = (src % 5).astype(np.uint64)
        got = drops.dropped(keys, round_index, index)
        want = [shaper.plan(ids[i], ids[j], round_index, int(k), 100).drop
                for i, j, k in zip(src, dst, index, strict=True)]  # fmt: skip
        assert got.tolist() == want
        assert 40 < int(got.sum()) < 140  # about 30% of 300
    assert not BernoulliDrops(seed=9, loss=0.0).dropped(keys, 1, index).any()


@pytest.mark.parametrize("topology", ["exponential", "ring", "one-peer-exponential"])
@pytest.mark.parametrize("loss", [0.1, 0.3])
def test_batched_and_per_agent_runs_agree(
    monkeypatch: pytest.MonkeyPatch, topology: str, loss: float
) -> None:
    config = consensus(topology=topology, network={"loss": loss})
    agents, agent_verdicts = journaled(monkeypatch, config, batched=False)
    batched, batched_verdicts = journaled(monkeypatch, config, batched=True)
    # the same messages, each with the same fate
    assert batched_verdicts == agent_verdicts
    dropped = sum(agent_verdicts.values())
    assert dropped > 0.5 * loss * len(agent_verdicts)
    assert sorted(batched) == sorted(agents)
    for agent_id, records in agents.items():
        others = batched[agent_id]
        assert [(r.round, r.final, r.counters, r.metrics) for r in others] == [
            (r.round, r.final, r.counters, r.metrics) for r in records
        ]
        for mine, theirs in zip(records, others, strict=True):
            assert mine.estimate is not None and theirs.estimate is not None
            np.testing.assert_allclose(theirs.estimate, mine.estimate, rtol=RELATIVE, atol=0)
            assert theirs.scalars["weight"] == pytest.approx(mine.scalars["weight"], rel=RELATIVE)
    assert sum(r[-1].counters.messages_dropped for r in batched.values()) == dropped
    reference = reference_answer(config)
    want: dict[str, Any] = summarise(agents, reference=reference).to_json()
    got: dict[str, Any] = summarise(batched, reference=reference).to_json()
    for row_want, row_got in zip([*want["rounds"], want["final"]], [*got["rounds"], got["final"]],
                                 strict=True):  # fmt: skip
        for key, value in row_want.items():
            if key == "train_wall_s":
                continue
            if isinstance(value, float):
                assert row_got[key] == pytest.approx(value, rel=RELATIVE, abs=1e-15), key
            else:
                assert row_got[key] == value, key
    assert want["final"]["relative_error"] is not None
    assert want["final"]["messages_dropped"] == dropped


def test_the_fleet_batches_where_it_applies_and_only_there() -> None:
    config = consensus(network={"loss": 0.1}, rounds=3)
    fleet = InProcessFleet(config, network_for(config))
    fleet.run()
    assert fleet.agents == [] and len(fleet.records()) == AGENTS  # batched: no Agent built
    for other in (
        {"compression": "qsgd:4", "algorithm": "quantized-push-sum"},
        {"precision": "float32"},
        {"task": {"name": "separable"}},
    ):
        config = consensus(network={"loss": 0.1}, rounds=3, **other)
        fleet = InProcessFleet(config, network_for(config))
        fleet.run()
        assert len(fleet.agents) == AGENTS  # the per-agent path
        with pytest.raises(ValueError, match="cannot be batched"):
            InProcessFleet(config, network_for(config), batched=True).run()
    config = consensus(network={"loss": 0.1}, rounds=3)
    fleet = InProcessFleet(config, network_for(config))
    fleet.after_build = lambda agents: None  # a harness that wants the agents gets them
    fleet.run()
    assert len(fleet.agents) == AGENTS


def test_starved_agents_hold_their_shares_back_the_same_way() -> None:
    # At 95% loss on a directed ring, weights sink below STARVED_WEIGHT: such an agent keeps
    # its shares home and only flushes what its edge owes.
    config = consensus(agents=4, rounds=300, topology="directed-ring", network={"loss": 0.95})
    agents = run_in_process(config, batched=False)
    batched = run_in_process(config, batched=True)
    starved = 0
    for agent_id, records in agents.items():
        for mine, theirs in zip(records, batched[agent_id], strict=True):
            assert theirs.counters == mine.counters
            assert mine.estimate is not None and theirs.estimate is not None
            np.testing.assert_allclose(theirs.estimate, mine.estimate, rtol=RELATIVE, atol=0)
            assert theirs.scalars["weight"] == pytest.approx(mine.scalars["weight"], rel=RELATIVE)
            starved += mine.scalars["weight"] < STARVED_WEIGHT
    assert starved > 10
