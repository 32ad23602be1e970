"""The algorithms of the literature, checked against theory on pure-algorithm fleets.

C1 (Taheri et al. 2020) is here; C2, C3 and the learning checks run whole in-process fleets
(tests/test_algorithm_fleets.py).
"""

from __future__ import annotations

import pytest
import torch

from airgossip.common.topology import Phase, metropolis_hastings
from airgossip.edge.algorithms import (
    ALGORITHMS,
    Ack,
    Choco,
    GradientTracking,
    InvalidPayload,
    LocalSGD,
    Payload,
    ProtocolError,
    PushSum,
    QuantizedPushSum,
    create_algorithm,
)
from airgossip.edge.algorithms.shared_copy import MAX_BLOCKS, SharedCopyGossip, default_gamma
from airgossip.edge.compression import get_codec
from tests.support.lossy import AlgorithmFleet

HOSTILE = {"loss": 0.2, "duplicate": 0.2, "max_delay": 3, "ack_loss": 0.3}


# -- C1: quantized push-sum on a directed exponential graph ----------------------------------
def c1_fleet(name: str, compression: str, gamma: float | None = None) -> AlgorithmFleet:
    options = {"gamma": gamma} if gamma is not None else None
    return AlgorithmFleet.build(
        name, 16, dim=100, seed=11, compression=compression, options=options
    )


@pytest.mark.slow
def test_c1_difference_quantized_push_sum_is_exact_where_naive_quantization_is_not() -> None:
    quantized = c1_fleet("quantized-push-sum", "qsgd:4")
    target, total = quantized.average(), quantized.total_x()
    quantized.run(300)
    assert quantized.error(target) < 1e-8
    assert float((quantized.total_x() - total).abs().max()) < 1e-9  # mass conserved

    naive = c1_fleet("push-sum-plain", "qsgd:4")  # Q(x) itself: mass drifts
    naive.run(300)
    assert naive.error(target) > 1e-2
    assert float((naive.total_x() - total).abs().max()) > 1e-2


@pytest.mark.slow
def test_c1_two_bits_need_the_consensus_step() -> None:
    damped = c1_fleet("quantized-push-sum", "qsgd:2", gamma=0.5)
    target, total = damped.average(), damped.total_x()
    damped.run(300)
    assert damped.error(target) < 1e-8
    assert float((damped.total_x() - total).abs().max()) < 1e-9
    undamped = c1_fleet("quantized-push-sum", "qsgd:2", gamma=1.0)
    undamped.run(300)
    assert undamped.error(target) > 1e-2  # what gamma is for


# -- push-sum with a lossy codec: exact total, noisy estimates -------------------------------
def test_push_sum_with_a_lossy_codec_conserves_the_total_but_keeps_noise() -> None:
    from airgossip.common.topology import build_graph, node_phases

    gen = torch.Generator().manual_seed(0)
    ids = [f"a{i}" for i in range(12)]
    starts = [torch.randn(20, generator=gen, dtype=torch.float64) + 1 for _ in ids]
    codec = get_codec("qsgd:4")
    algos = [PushSum(s, codec=codec, seed=i) for i, s in enumerate(starts)]
    graph = build_graph("exponential", 12)
    fleet = AlgorithmFleet(list(algos), [node_phases(graph, ids, i) for i in range(12)], ids)
    total = sum(starts)
    # check_mass: after every round agents plus edges hold exactly the initial total
    fleet.run(150, loss=0.3, duplicate=0.2, max_delay=2, ack_loss=0.2, check_mass=total)
    assert fleet.error(total / 12) > 1e-2  # the codec's error on a round's mass stays


# -- shared copies: exact under a hostile network -------------------------------------------
@pytest.mark.parametrize(
    ("name", "compression", "topology"),
    [
        ("quantized-push-sum", "qsgd:4", "exponential"),
        ("quantized-push-sum", "none", "one-peer-exponential"),
        ("choco", "qsgd:8", "ring"),
        ("choco", "topk:0.5", "complete"),
    ],
    ids=["qps-qsgd4-exponential", "qps-none-one-peer", "choco-qsgd8-ring", "choco-topk-complete"],
)
def test_shared_copies_are_exact_under_loss_duplicates_reordering(
    name: str, compression: str, topology: str
) -> None:
    n = 5 if topology == "complete" else 8
    fleet = AlgorithmFleet.build(name, n, topology=topology, compression=compression, seed=3)
    target, total = fleet.average(), fleet.total_x()
    fleet.run(100, seed=4, **HOSTILE)  # type: ignore[arg-type]
    fleet.run(120)  # a quiet network delivers everything still owed
    assert all(
        isinstance(a, SharedCopyGossip) and a.unacknowledged(p) == 0
        for a in fleet.algos
        for p in fleet.ids
    )
    torch.testing.assert_close(fleet.total_x(), total, rtol=0, atol=1e-10)
    weights = sum(a.mass()[1] for a in fleet.algos)  # type: ignore[attr-defined]
    assert weights == pytest.approx(n, abs=1e-10)
    assert fleet.error(target) < 1e-10


def test_choco_keeps_y_at_one_on_a_lossless_network() -> None:
    """With doubly stochastic weights and no loss, choco is CHOCO as published: y == 1."""
    fleet = AlgorithmFleet.build("choco", 6, topology="ring", compression="topk:0.3", seed=1)
    fleet.run(40)
    assert all(a.scalars()["weight"] == pytest.approx(1.0, abs=1e-12) for a in fleet.algos)


def test_stale_and_duplicate_blocks_change_nothing() -> None:
    a = QuantizedPushSum(torch.ones(3, dtype=torch.float64), dtype=torch.float64)
    b = QuantizedPushSum(torch.zeros(3, dtype=torch.float64), dtype=torch.float64)
    phase = Phase(0.5, {"b": 0.5}, ())
    first = a.share(phase, ())["b"] if False else a.share(phase, set())  # edge busy: kept
    assert first == {}
    both = a.share(phase, {"b"})["b"]  # replays block 1 with block 2
    assert (both.base_seq, both.seq) == (0, 2)
    assert b.receive("a", both).absorbed
    before = b.mass()
    assert not b.receive("a", both).absorbed  # duplicate
    a.on_ack("b", Ack(2, 0, True))
    third = a.share(phase, {"b"})["b"]
    assert (third.base_seq, third.seq) == (2, 3)
    b.receive("a", third)
    assert not b.receive("a", both).absorbed  # stale
    assert b.mass()[1] > before[1]


def test_a_receiver_that_lost_its_state_is_refused_then_restarted() -> None:
    a = QuantizedPushSum(torch.ones(2, dtype=torch.float64), dtype=torch.float64)
    b = QuantizedPushSum(torch.zeros(2, dtype=torch.float64), dtype=torch.float64)
    phase = Phase(0.5, {"b": 0.5}, ())
    a.on_ack("b", b.receive("a", a.share(phase, {"b"})["b"]))
    b.mix()
    total_before = a.mass()[0] + b.mass()[0] + a.in_flight()[0]
    fresh = QuantizedPushSum(torch.zeros(2, dtype=torch.float64), dtype=torch.float64)
    owed = a.share(phase, {"b"})["b"]
    assert owed.base_seq == 1
    with pytest.raises(ProtocolError, match="starts after block 1"):
        fresh.receive("a", owed)
    assert float(fresh.mass()[0].abs().sum()) == 0 and fresh.mass()[1] == 1.0
    a.restart_out_edge("b")  # takes back what fresh never got, restarts the edge
    torch.testing.assert_close(a.mass()[0] + b.mass()[0], total_before)
    restart = a.share(phase, {"b"})["b"]
    assert restart.scalars["restart"] == 1.0 and restart.base_seq == 2
    assert fresh.receive("a", restart).absorbed


def test_a_dead_neighbour_costs_bounded_memory_and_keeps_the_mass_home() -> None:
    a = QuantizedPushSum(torch.ones(4, dtype=torch.float64), dtype=torch.float64)
    phase = Phase(0.5, {"dead": 0.5}, ())
    for _ in range(3 * MAX_BLOCKS):
        a.share(phase, {"dead"})  # never acknowledged
    assert a.unacknowledged("dead") == MAX_BLOCKS
    x, y = a.mass()
    flow_x, flow_y = a.in_flight()
    torch.testing.assert_close(x + flow_x, torch.ones(4, dtype=torch.float64))
    assert y + flow_y == pytest.approx(1.0)
    assert y > 0
    message = a.share(phase, {"dead"})["dead"]
    assert message.seq - message.base_seq == MAX_BLOCKS


@pytest.mark.parametrize(
    ("scalars", "vector_blocks", "message"),
    [
        ({"y1": -0.1}, 1, "non-negative weight 'y1'"),
        ({}, 1, "needs a finite, non-negative weight 'y1'"),
        ({"y1": 0.1, "y2": 0.1}, 1, "holds 4 elements for blocks 1..2"),
        ({"y1": 0.1}, 2, "holds 8 elements for blocks 1..1"),
    ],
)
def test_malformed_shared_copy_messages_are_invalid_and_change_nothing(
    scalars: dict[str, float], vector_blocks: int, message: str
) -> None:
    b = QuantizedPushSum(torch.zeros(4, dtype=torch.float64), dtype=torch.float64)
    blocks = sum(1 for k in scalars if k.startswith("y")) or 1
    payload = Payload(torch.ones(4 * vector_blocks, dtype=torch.float64), scalars, blocks, 0)
    with pytest.raises(InvalidPayload, match=message):
        b.receive("a", payload)
    assert float(b.mass()[0].abs().sum()) == 0 and b.mass()[1] == 1.0


def test_default_gamma_follows_the_codec() -> None:
    assert default_gamma(get_codec("float32")) == 1.0
    assert default_gamma(get_codec("qsgd:4")) == 1.0
    assert default_gamma(get_codec("qsgd:2")) == 0.5
    assert default_gamma(get_codec("topk:0.01")) == pytest.approx(0.1)
    algo = Choco(torch.zeros(3), codec=get_codec("randomk:0.04"))
    assert algo.gamma == pytest.approx(0.2)
    assert Choco(torch.zeros(3), options={"gamma": 0.3}).gamma == 0.3


# -- D-PSGD ----------------------------------------------------------------------------------
def test_dpsgd_averages_exactly_without_loss_and_only_nearly_with_it() -> None:
    fleet = AlgorithmFleet.build("dpsgd", 8, topology="ring", seed=2)
    target = fleet.average()
    fleet.run(300)
    assert fleet.error(target) < 1e-10
    lossy = AlgorithmFleet.build("dpsgd", 8, topology="ring", seed=2)
    lossy.run(300, loss=0.2, seed=1)
    spread = max(float((a.estimate() - lossy.algos[0].estimate()).norm()) for a in lossy.algos)
    assert spread < 1e-6  # consensus ...
    assert lossy.error(target) > 1e-6  # ... but not on the average: stale models stood in


def test_dpsgd_weights_are_metropolis_hastings() -> None:
    fleet = AlgorithmFleet.build("dpsgd", 5, topology="ring")
    ring = metropolis_hastings(
        torch.tensor([[abs(i - j) in (1, 4) for j in range(5)] for i in range(5)]).numpy()
    )
    phase = fleet.phases[0][0]
    assert phase.self_weight == pytest.approx(ring[0, 0])
    assert phase.out_weights == pytest.approx({"a1": ring[1, 0], "a4": ring[4, 0]})


def test_dpsgd_ignores_older_models() -> None:
    b = create_algorithm("dpsgd", torch.zeros(2), dtype=torch.float32)
    assert b.receive("a", Payload(torch.ones(2), {}, 2, 0)).absorbed
    assert not b.receive("a", Payload(torch.full((2,), 5.0), {}, 1, 0)).absorbed
    b.share(Phase(0.5, {"a": 0.5}, ("a",)), set())
    b.mix()
    torch.testing.assert_close(b.estimate(), torch.full((2,), 0.5))


# -- gradient tracking -----------------------------------------------------------------------
Quadratic = tuple[AlgorithmFleet, torch.Tensor, list[torch.Tensor]]


def quadratic_fleet(name: str, topology: str = "exponential") -> Quadratic:
    """Agent i minimises 0.5 ||z - b_i||^2: the fleet's minimiser is the mean of the b_i."""
    gen = torch.Generator().manual_seed(5)
    targets = [torch.randn(5, generator=gen, dtype=torch.float64) * 3 for _ in range(8)]
    zeros = [torch.zeros(5, dtype=torch.float64) for _ in targets]
    fleet = AlgorithmFleet.build(name, len(zeros), topology=topology, initial=zeros)
    return fleet, sum(targets) / len(targets), targets  # type: ignore[return-value]


def gradient_step(targets: list[torch.Tensor], step: float = 0.1):  # type: ignore[no-untyped-def]
    def local_step(i: int, algo: object) -> None:
        assert isinstance(algo, PushSum)
        algo.apply_update(-step * (algo.estimate() - targets[i]))

    return local_step


def test_gradient_tracking_finds_the_minimiser_where_push_sum_sgd_does_not() -> None:
    tracking, optimum, targets = quadratic_fleet("gradient-tracking")
    tracking.run(350, loss=0.2, duplicate=0.1, seed=3, local_step=gradient_step(targets))
    assert tracking.error(optimum) < 1e-10
    plain, _, _ = quadratic_fleet("push-sum")
    plain.run(350, loss=0.2, duplicate=0.1, seed=3, local_step=gradient_step(targets))
    assert plain.error(optimum) > 1e-2  # heterogeneous pulls balance off the optimum


def test_gradient_tracking_conserves_the_tracked_sum() -> None:
    """The fleet's sum of trackers equals the sum of the latest local directions, whatever
    the network does (running sums), once nothing is owed on the edges."""
    tracking, _, targets = quadratic_fleet("gradient-tracking")
    latest: dict[int, torch.Tensor] = {}

    def step(i: int, algo: object) -> None:
        assert isinstance(algo, GradientTracking)
        delta = -0.1 * (algo.estimate() - targets[i])
        latest[i] = -delta
        algo.apply_update(delta)

    tracking.run(60, seed=8, local_step=step, **HOSTILE)  # type: ignore[arg-type]
    tracking.run(40, local_step=None)  # quiet and no new steps: everything arrives
    trackers = sum(a.tracker for a in tracking.algos)  # type: ignore[attr-defined]
    torch.testing.assert_close(trackers, sum(latest.values()), rtol=0, atol=1e-10)


def test_gradient_tracking_sends_two_blocks() -> None:
    algo = GradientTracking(torch.zeros(6), dtype=torch.float32, codec=get_codec("qsgd:4"))
    payload = algo.share(Phase(0.5, {"b": 0.5}, ()), {"b"})["b"]
    assert payload.vector.numel() == 12 and algo.block_numel == 6 and algo.max_blocks == 2
    assert payload.encoded is not None and len(payload.encoded.data) == 2 * 7  # 4 + 3 each
    with pytest.raises(InvalidPayload, match="holds 6 elements, expected 12"):
        algo.receive("b", Payload(torch.zeros(6), {"y": 0.5}, 1, 0))


# -- local SGD -------------------------------------------------------------------------------
def test_local_sgd_is_silent_between_averaging_rounds() -> None:
    algo = LocalSGD(torch.ones(3), options={"period": 3})
    phase = Phase(0.5, {"b": 0.5}, ("b",))
    talks = [bool(algo.share(algo.schedule(r, phase), {"b"})) for r in range(1, 10)]
    assert talks == [False, False, True] * 3
    assert algo.schedule(4, phase).in_neighbours == ()  # the agent waits for no one


def test_local_sgd_with_period_one_is_push_sum() -> None:
    one = AlgorithmFleet.build("local-sgd", 8, options={"period": 1}, seed=4)
    sgp = AlgorithmFleet.build("push-sum", 8, seed=4)
    for fleet in (one, sgp):
        fleet.run(30, loss=0.1, seed=2)
    for a, b in zip(one.algos, sgp.algos, strict=True):
        assert torch.equal(a.estimate(), b.estimate())


def test_local_sgd_averages_every_period() -> None:
    fleet = AlgorithmFleet.build("local-sgd", 8, topology="complete", options={"period": 5})
    target = fleet.average()
    fleet.run(4)
    assert fleet.error(target) > 0.1  # nothing exchanged yet
    fleet.run(1)
    assert fleet.error(target) < 1e-12  # complete graph: one round is the exact average


# -- settings that cannot work are refused up front ------------------------------------------
@pytest.mark.parametrize(
    ("name", "compression", "message"),
    [
        ("dpsgd", "topk:0.1", "dpsgd sends whole models"),
        ("push-sum", "qsgd:1", "qsgd:1 adds noise larger than the vector"),
        ("quantized-push-sum", "qsgd:1", "use qsgd:2 or more bits"),
    ],
)
def test_codecs_an_algorithm_cannot_use_are_refused(
    name: str, compression: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        create_algorithm(name, torch.zeros(3), dtype=torch.float32, codec=get_codec(compression))


def test_options_are_validated_with_what_is_allowed() -> None:
    unknown = r"algorithm 'choco': unknown option 'gama' \(allowed: gamma\)"
    with pytest.raises(ValueError, match=unknown):
        create_algorithm("choco", torch.zeros(3), dtype=torch.float32, options={"gama": 0.1})
    with pytest.raises(ValueError, match="option 'period'"):
        create_algorithm("local-sgd", torch.zeros(3), dtype=torch.float32, options={"period": 0})
    with pytest.raises(ValueError, match=r"unknown option 'gamma' \(allowed: none\)"):
        create_algorithm("push-sum", torch.zeros(3), dtype=torch.float32, options={"gamma": 1})


def test_every_algorithm_is_registered_once() -> None:
    assert set(ALGORITHMS) == {
        "push-sum", "push-sum-plain", "dpsgd", "quantized-push-sum", "choco",
        "gradient-tracking", "local-sgd", "dpsgd-ac", "ensemble",
        "clipped-gossip", "cs-plus-gossip", "robust-push-sum",
    }  # fmt: skip
    undirected = {n for n, c in ALGORITHMS.items() if not c.supports_directed}
    assert undirected == {"dpsgd", "dpsgd-ac", "choco", "clipped-gossip", "cs-plus-gossip"}
