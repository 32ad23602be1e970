"""The channel model over the links in range against the dense one, and in a fleet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.sparse import issparse

from airgossip.emulation.channel import graph as channel_graph
from airgossip.emulation.channel import model as channel_model
from airgossip.emulation.channel.graph import gossip_adjacency
from airgossip.emulation.channel.model import ChannelModel, LinkState, SparseLinkState
from airgossip.emulation.channel.sparse import SparseChannelModel
from airgossip.emulation.channel.state import FIGURES
from airgossip.emulation.fleets import run_fleet
from airgossip.emulation.networks.gossip_graph import GraphEpoch
from airgossip.scenario.config import load_config, read_scenario
from airgossip.scenario.wireless import WirelessSettings, scenario_path


def settings(**overrides: object) -> WirelessSettings:
    return WirelessSettings.model_validate(overrides)


VARIANTS: list[dict[str, Any]] = [
    {"mobility": {"model": "gauss-markov", "area_m": [300, 300]}},
    {"mobility": {"model": "gauss-markov", "area_m": [300, 300]}, "radio": "lte",
     "path_loss": {"model": "uma"}, "access": "scheduled", "activity": 0.2},
    {"mobility": {"model": "random-waypoint", "area_m": [300, 300]},
     "fading": {"model": "rayleigh"}, "activity": 0.3},  # csma: hidden-node interference
    {"mobility": {"area_m": [300, 300]}, "burst": {"model": "gilbert-elliott", "p": 0.1, "r": 0.3}},
]  # fmt: skip


@pytest.mark.parametrize("overrides", VARIANTS)
def test_over_the_whole_area_with_the_dense_draws_both_models_agree(
    overrides: dict[str, Any],
) -> None:
    s = settings(**overrides)
    dense = ChannelModel(s, 23, 4)
    sparse = SparseChannelModel(s, 23, 4, dense_draws=True, range_m=1e9)
    for step in range(3):
        a, b = dense.state(step), sparse.state(step)
        assert isinstance(a, LinkState) and isinstance(b, SparseLinkState)
        src, dst = a.link_pairs()
        s_src, s_dst = b.link_pairs()
        assert np.array_equal(src, s_src) and np.array_equal(dst, s_dst)
        assert 0 < len(src) < 23 * 22  # some links in range, some not
        for name in FIGURES:
            x, y = a.values(name, src, dst), b.link_values(name)
            if x.dtype == bool:
                assert np.array_equal(x, y), name
            else:
                assert np.allclose(x, y, rtol=1e-5, atol=1e-6), name
        for i in range(23):
            assert np.array_equal(np.flatnonzero(a.hears_of(i)), b.hears_of(i))
            j = int(dst[src == i][0]) if (src == i).any() else (i + 1) % 23
            assert b.chunk_loss(i, j, 3000, 1500) == pytest.approx(a.chunk_loss(i, j, 3000, 1500))
        graph = gossip_adjacency(a, 3, 10.0, dense.sensitivity_dbm)
        assert np.array_equal(graph, gossip_adjacency(b, 3, 10.0, sparse.sensitivity_dbm))


def test_links_in_range_only_with_their_own_draws() -> None:
    s = settings(
        radio="lte", path_loss={"model": "uma"}, activity=0.01,
        mobility={"model": "gauss-markov", "area_m": [6000, 6000]},
    )  # fmt: skip
    n = 300
    model = SparseChannelModel(s, n, 7)
    # devices at 1.5 m both ends: UMa's LOS breakpoint at 6.7 m, about 1 km of reach
    assert 500 < model.range_m < 6000 * 1.5
    again = SparseChannelModel(s, n, 7, cache_steps=2)
    states = [model.state(k) for k in range(4)]
    again.state(3)
    for step in (0, 2):  # evicted, then replayed from step 0: the same values
        assert np.array_equal(again.state(step).sinr_db, states[step].sinr_db)
    other = SparseChannelModel(s, n, 8).state(3)
    assert not np.array_equal(other.positions, states[3].positions)
    dense = ChannelModel(s, n, 7).state(0)
    for st in states:
        assert isinstance(st, SparseLinkState)
        src, dst = st.link_pairs()
        assert (st.link_values("distance_m") <= model.range_m).all()
        assert (st.link_values("rx_dbm") >= model.sensitivity_dbm[dst]).all()
        # Shadowing belongs to the pair: where both directions exist, equal powers both ways.
        back = np.array([st.link(int(j), int(i)) for i, j in zip(src, dst, strict=True)])
        both = back >= 0
        assert np.allclose(st.rx_dbm[st.exists][both], st.rx_dbm[back[both]], atol=1e-3)
        # As many links as the dense model gives the same fleet (other draws, same physics).
        assert st.link_count() == pytest.approx(dense.link_count(), rel=0.15)
        assert not st.has(st.link(0, 0))


def test_the_fleet_size_picks_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    s = settings()
    assert isinstance(channel_model.channel_model(s, 10, 1), ChannelModel)
    monkeypatch.setattr(channel_model, "DENSE_MAX_NODES", 5)
    assert isinstance(channel_model.channel_model(s, 10, 1), SparseChannelModel)


def test_a_virtual_fleet_over_the_links_in_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(channel_model, "DENSE_MAX_NODES", 0)
    config = load_config(
        None,
        {"mode": "virtual", "agents": 12, "rounds": 120, "task": {"name": "consensus"},
         "wireless": {"record": True}},
        base=read_scenario(scenario_path("wifi-indoor")),
    )  # fmt: skip
    results: dict[str, Any] = run_fleet(config, tmp_path).to_json()
    final = results["final"]
    assert final["messages_sent"] > 12 * 100
    assert final["relative_error"] < 1e-6
    assert results["wireless"]["graph_epochs"] >= 1
    assert (tmp_path / "links.jsonl").read_text().count("\n") >= 1


def test_the_ledger_reads_only_a_senders_carrier_sense_domain() -> None:
    from airgossip.emulation.networks.shaper import AirtimeLedger

    rng = np.random.default_rng(7)
    n, step_s = 500, 1.0
    ledger = AirtimeLedger(n)
    for _ in range(300):
        ledger.book(int(rng.integers(n)), 0, float(rng.random() * 0.01), float(rng.random()))
    heard = np.sort(rng.choice(n, size=60, replace=False))
    row = np.zeros(n, dtype=bool)
    row[heard] = True
    until, busy = ledger._until, ledger._busy[0]
    for now in rng.random(20):
        expected = float(busy[heard[until[heard] > now]].sum())  # the n-wide mask's sum
        assert ledger.utilisation(0, heard, step_s, float(now)) == min(1.0, expected)
        dense = ledger.utilisation(0, row, step_s, float(now))
        assert dense == pytest.approx(expected, rel=1e-12)


def _count_steps(model: SparseChannelModel) -> list[int]:
    """The steps ``model`` computes from here on, in order (a replay shows as a repeat)."""
    computed: list[int] = []
    advance = model._advance

    def counting(step: int) -> Any:
        computed.append(step)
        return advance(step)

    model._advance = counting  # type: ignore[method-assign]
    return computed


def test_the_shaper_asks_the_model_for_each_step_once() -> None:
    """Messages in time order whose transfers run into the next step: the shaper keeps the
    steps it may still be asked for, so the model (two steps cached) computes each step once
    and never replays from step 0; the verdicts equal those over a model that keeps every
    step."""
    from airgossip.emulation.networks.shaper import WirelessLinkShaper

    s = settings(step_s=0.1)
    model = SparseChannelModel(s, 40, 3, cache_steps=2)
    now = [0.0]
    shaper = WirelessLinkShaper(model, [f"a{i}" for i in range(40)], lambda: now[0])
    computed = _count_steps(model)
    starts = np.sort(np.random.default_rng(1).random(400)) * 0.6
    verdicts = []
    for k, start in enumerate(starts):
        now[0] = float(start)
        verdicts.append(shaper.plan(f"a{k % 40}", f"a{(k * 7 + 1) % 40}", 1, k, 200_000))
    assert computed == sorted(set(computed))  # each step once, in order
    assert any(v.delay_s > 0.05 for v in verdicts)  # some transfers crossed a step
    roomy = SparseChannelModel(s, 40, 3, cache_steps=100)
    again = WirelessLinkShaper(roomy, [f"a{i}" for i in range(40)], lambda: now[0])
    for k, start in enumerate(starts):
        now[0] = float(start)
        assert again.plan(f"a{k % 40}", f"a{(k * 7 + 1) % 40}", 1, k, 200_000) == verdicts[k]


def test_the_row_scan_finds_the_pairs_and_distances_the_k_d_tree_finds() -> None:
    s = settings(
        radio="lte", path_loss={"model": "uma"},
        mobility={"model": "gauss-markov", "area_m": [1000, 1000]},
    )  # fmt: skip
    n = 700
    model = SparseChannelModel(s, n, 5)
    positions = np.random.default_rng(3).random((n, 2)) * 1000
    positions[1] = positions[0] + [model.range_m, 0.0]  # on the range's edge
    pairs = n * (n - 1) // 2
    scanned = model._candidates(positions, pairs)  # most pairs in range: the row scan
    tree = model._candidates(positions, 0)  # few: the k-d tree
    assert pairs // 2 < scanned[0].size < pairs
    assert np.array_equal(scanned[0], tree[0])
    assert np.array_equal(scanned[1], tree[1])
    assert scanned[1].dtype == np.float32


def test_the_row_scan_and_the_k_d_tree_give_the_same_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pairs leave the range and come back (150 m a step): the row scan's flags say which
    pairs stayed in range as the search over the keys does, so every figure is the same."""
    from airgossip.emulation.channel import in_range as pairs_in_range

    s = settings(
        radio="lte", path_loss={"model": "uma"}, activity=0.05, step_s=5.0,
        mobility={"model": "gauss-markov", "area_m": [2500, 2500], "mean_speed_mps": 30.0},
    )  # fmt: skip
    scanned = SparseChannelModel(s, 300, 9)
    rows, in_range, buffers = [], set(), set()
    for k in range(5):
        rows.append(scanned.state(k))
        assert scanned._pairs is not None
        in_range.add(scanned._pairs.keys.size)
        buffers.add(id(scanned._pairs.keys.base))
    assert len(buffers) == 1  # each scan wrote over the keys of the one before
    monkeypatch.setattr(pairs_in_range, "ROW_SCAN_PAIRS", 0)
    tree = SparseChannelModel(s, 300, 9)
    for step, a in enumerate(rows):
        b = tree.state(step)
        assert isinstance(a, SparseLinkState) and isinstance(b, SparseLinkState)
        for name in (*FIGURES, "indptr", "dst", "hears_ptr", "hears_idx"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert len(in_range) > 1  # pairs left the range or came into it
    assert scanned._pairs is not None and scanned._pairs.near is not None
    assert tree._pairs is not None and tree._pairs.near is None


def test_a_graph_epochs_step_is_kept_past_the_cache_until_the_graph_asks() -> None:
    """Transfers had steps computed past an epoch's start before the event loop reached it:
    the graph's step comes without replaying from step 0, the same state as computed."""
    s = settings(step_s=1.0, graph_interval_s=5.0)
    model = SparseChannelModel(s, 40, 3, cache_steps=2)
    computed = _count_steps(model)
    first = model.graph_state(0.0)
    assert first.rx_dbm is model.state(0).rx_dbm  # what the graph reads, not copied
    states = {k: model.state(k) for k in range(8)}
    assert 5 not in model._cache  # evicted from the cache of two
    kept = model.graph_state(5.0)
    assert isinstance(kept, SparseLinkState) and kept.rx_dbm is states[5].rx_dbm
    assert kept.sinr_db.size == 0 and kept.latency_s.size == 0  # only what the graph reads
    assert np.array_equal(gossip_adjacency(kept, 3), gossip_adjacency(states[5], 3))
    assert kept.link_count() == states[5].link_count()
    assert computed == list(range(8))  # each step once: no replay
    assert model._epoch_start is None  # let go once asked for
    fresh = SparseChannelModel(s, 40, 3).state(5)
    for name in (*FIGURES, "indptr", "dst"):
        assert np.array_equal(getattr(fresh, name), getattr(states[5], name)), name


def test_the_strongest_first_order_is_the_two_key_sorts_order() -> None:
    from airgossip.emulation.channel.graph import _by_sender_strongest_first

    rng = np.random.default_rng(12)
    src = np.sort(rng.integers(0, 300, 20_000)).astype(np.int32)
    strength = np.round(rng.normal(-80, 10, src.size)).astype(np.float32)  # many ties
    strength[rng.random(src.size) < 0.2] = -np.inf
    strength[:50] = 0.0
    strength[50:100] = -0.0
    strength[100:120] = np.float32(3.4e38)
    expected = np.lexsort((-strength, src))
    assert np.array_equal(_by_sender_strongest_first(src, strength), expected)
    as64 = strength.astype(np.float64)
    assert np.array_equal(_by_sender_strongest_first(src, as64), np.lexsort((-as64, src)))


@pytest.mark.parametrize("overrides", VARIANTS)
def test_blocks_of_pairs_and_links_give_the_steps_one_block_gives(
    overrides: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step's pairs and links are worked through a block at a time (fading continued,
    figures computed straight into the step's arrays): every array is the same to the bit
    whatever the block (CSMA's heard powers and Gilbert-Elliott states included)."""
    from airgossip.emulation.channel import in_range, sparse

    s = settings(**overrides)
    whole = [SparseChannelModel(s, 60, 8).state(step) for step in range(3)]
    monkeypatch.setattr(in_range, "BLOCK_PAIRS", 37)  # the pairs' processes
    monkeypatch.setattr(sparse, "BLOCK_PAIRS", 37)  # the links and their figures
    blocks = SparseChannelModel(s, 60, 8)
    for step, a in enumerate(whole):
        b = blocks.state(step)
        assert isinstance(a, SparseLinkState) and isinstance(b, SparseLinkState)
        assert a.dst.size > 37  # several blocks of links
        for name in (*FIGURES, "indptr", "dst", "hears_ptr", "hears_idx"):
            x, y = getattr(a, name), getattr(b, name)
            assert x.dtype == y.dtype and np.array_equal(x, y), name


def test_fading_kept_as_its_two_parts_is_the_complex_fading() -> None:
    """The model over the links in range holds fading as float32 real and imaginary parts
    (drawn straight into them); its draws, AR(1) steps and power gains are the complex
    ones to the bit."""
    from airgossip.emulation.channel import fading
    from airgossip.emulation.channel.draws import StreamDraws

    keys = np.arange(5_000)
    parts = StreamDraws(4).complex_normal(2, 3, keys, 1)
    assert parts.shape == (2, keys.size) and parts.dtype == np.float32
    rng = StreamDraws(4)._rng(2, 3, 1)  # real parts, then imaginary parts
    drawn = rng.standard_normal((2, keys.size), dtype=np.float32) * np.float32(np.sqrt(0.5))
    assert np.array_equal(parts, drawn)
    g = np.empty(keys.size, dtype=np.complex64)
    g.real, g.imag = parts
    rho = fading.doppler_correlation(np.linspace(0.0, 40.0, keys.size), 1.0).astype(np.float32)
    fresh = StreamDraws(5).complex_normal(2, 4, keys)
    w = np.empty_like(g)
    w.real, w.imag = fresh
    stepped = fading.ar1_step(g, rho, w)
    for k, part in enumerate(parts):
        assert np.array_equal(fading.ar1_step(part, rho, fresh[k]), (stepped.real, stepped.imag)[k])
    for k_factor in (None, 2.0):
        gain = fading.power_gain_parts(parts[0], parts[1], k_factor)
        expected = fading.power_gain(g, k_factor)
        assert gain.dtype == expected.dtype and np.array_equal(gain, expected)


def test_the_next_set_flags_are_found_a_window_at_a_time() -> None:
    from airgossip.emulation.channel.pairs import next_set

    rng = np.random.default_rng(5)
    # most set (the first window holds them), few set (the window widened)
    for share, counts in ((0.99, (1, 700, 3000, 1)), (0.01, (1, 150, 300, 1))):
        flags = rng.random(50_000) < share
        places, start = np.flatnonzero(flags), 0
        for count in counts:
            got, after = next_set(flags, start, count)
            done = np.searchsorted(places, start)
            assert np.array_equal(got, places[done : done + count])
            assert after == got[-1] + 1
            start = after
    with pytest.raises(ValueError, match="set flags"):
        next_set(np.zeros(10, dtype=bool), 0, 1)


def test_above_the_sparse_limit_the_gossip_graph_is_a_sparse_array_of_the_same_links(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for overrides in VARIANTS:
        model = SparseChannelModel(settings(**overrides), 40, 2)
        state = model.state(1)
        dense = gossip_adjacency(state, 3, 10.0, model.sensitivity_dbm)
        with monkeypatch.context() as m:
            m.setattr(channel_graph, "SPARSE_LIMIT", 10)
            sparse = gossip_adjacency(state, 3, 10.0, model.sensitivity_dbm)
        assert isinstance(dense, np.ndarray) and issparse(sparse)
        assert dense.sum() > 40 and np.array_equal(sparse.toarray(), dense)
        a, b = GraphEpoch(1, 0.0, dense, 0, True, 1), GraphEpoch(1, 0.0, sparse, 0, True, 1)
        for node in range(40):
            assert np.array_equal(a.out_of(node), b.out_of(node))
            assert np.array_equal(a.into(node), b.into(node))


def test_a_fleet_on_sparse_gossip_graphs_runs_as_on_dense_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(channel_model, "DENSE_MAX_NODES", 0)
    config = load_config(
        None, {"mode": "virtual", "agents": 30, "rounds": 20, "task": {"name": "consensus"}},
        base=read_scenario(scenario_path("wifi-outdoor-mobile")),
    )  # fmt: skip
    runs = []
    for limit in (channel_graph.SPARSE_LIMIT, 10):
        monkeypatch.setattr(channel_graph, "SPARSE_LIMIT", limit)
        results: dict[str, Any] = run_fleet(config, tmp_path / str(limit)).to_json()
        runs.append({k: results[k] for k in ("rounds", "final", "wireless")})
    assert runs[0]["final"]["messages_sent"] > 30 * 20
    assert runs[0]["wireless"]["graph_epochs"] >= 2  # the graph changed in the run
    assert runs[0] == runs[1]
