"""Per-in-neighbour statistics: the relative increment of absorbed messages, the onset of an
in-neighbour's outliers, refusals charged to current in-neighbours only, clip events, and
series forgotten when a peer departs."""

from __future__ import annotations

import pytest
import torch
from prometheus_client import generate_latest

from airgossip.edge.agent.influence import (
    EPISODE_S,
    TYPICAL_AFTER,
    InNeighbourWatch,
    OutlierOnsets,
    held,
    relative_increment,
)
from airgossip.edge.algorithms import DPSGD, PushSum
from airgossip.edge.algorithms.base import Payload
from airgossip.edge.algorithms.robust_push_sum import RobustPushSum
from airgossip.edge.observability.metrics import AgentMetrics
from airgossip.edge.observability.telemetry import ReceiveEvent
from tests.support.prometheus import promtool_check

X0 = torch.tensor([1.0, 2.0, -1.0, 0.5], dtype=torch.float64)


def absorbed(algorithm: PushSum, sender: str, payload: Payload) -> float:
    before = held(algorithm)
    ack = algorithm.receive(sender, payload)
    assert ack.absorbed
    return relative_increment(algorithm, before, payload)


def test_an_honest_share_moves_little_a_forged_push_a_thousandfold() -> None:
    algorithm = PushSum(X0.clone())
    # An in-neighbour holding nearly the same value sends half its mass.
    honest = Payload((X0 * 1.01) * 0.5, {"y": 0.5}, seq=1, base_seq=0)
    assert absorbed(algorithm, "agent-3", honest) == pytest.approx(0.01, rel=1e-9)
    # Its next message is a running sum: only the increment counts (another half share).
    again = Payload((X0 * 1.01) * 1.0, {"y": 1.0}, seq=2, base_seq=0)
    assert absorbed(algorithm, "agent-3", again) == pytest.approx(0.01, rel=1e-9)
    # The insider of issue 17: y = 1000, x = 1000 * y on every element.
    forged = Payload(torch.full((4,), 1000.0 * 1000.0, dtype=torch.float64), {"y": 1000.0}, 1)
    expected = float((torch.full((4,), 1000.0) - X0).norm() / X0.norm())
    assert absorbed(algorithm, "agent-0", forged) == pytest.approx(expected, rel=1e-9)
    assert expected > 300


def test_a_message_that_adds_no_weight_is_measured_by_the_mass_it_moves() -> None:
    algorithm = PushSum(X0.clone())
    assert absorbed(algorithm, "a", Payload(X0 * 0.5, {"y": 0.5}, seq=1)) == pytest.approx(0.0)
    same_weight = Payload(X0 * 0.5 + X0, {"y": 0.5}, seq=2)  # x grows by X0, y by nothing
    assert absorbed(algorithm, "a", same_weight) == pytest.approx(1.0, rel=1e-9)


def test_model_exchanging_algorithms_compare_the_model_carried() -> None:
    algorithm = DPSGD(X0.clone(), dtype=torch.float64)
    model = Payload(X0 * 3, {}, seq=1)
    assert algorithm.receive("b", model).absorbed
    assert relative_increment(algorithm, held(algorithm), model) == pytest.approx(2.0, rel=1e-9)


def test_the_watch_reports_current_in_neighbours_only_with_new_clip_events() -> None:
    algorithm = PushSum(X0.clone())  # every algorithm counts clips (none of its own)
    events: list[frozenset[str]] = []

    class Observer:
        def on_in_neighbours(self, peers: frozenset[str]) -> None:
            events.append(peers)

    watch = InNeighbourWatch(algorithm, Observer())
    watch.set_in_neighbours(frozenset({"a"}))
    assert events == [frozenset({"a"})]
    payload = Payload(X0 * 0.5, {"y": 0.5}, seq=1)
    before = watch.before("a")
    algorithm.receive("a", payload)
    algorithm.clipped_by_sender["a"] += 2
    event = watch.received("a", payload, 32, True, before)
    assert event.increment == pytest.approx(0.0, abs=1e-12) and event.clipped == 2
    algorithm.clipped_by_sender["a"] += 1
    assert watch.received("a", payload, 32, False, watch.before("a")).clipped == 1
    # Not an in-neighbour (a former one delivering what its edge owes): nothing per peer.
    outsider = watch.received("z", payload, 32, True, watch.before("z"))
    assert outsider.increment is None and outsider.clipped == 0


def sample(metrics: AgentMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_metrics_keep_series_of_current_in_neighbours_only() -> None:
    metrics = AgentMetrics("agent-1")
    metrics.on_receive(ReceiveEvent(True, "agent-0", payload_bytes=8, increment=900.0))
    metrics.on_receive(ReceiveEvent(True, "agent-0", payload_bytes=8, increment=100.0))
    metrics.on_receive(ReceiveEvent(True, "agent-3", payload_bytes=8, increment=0.5, clipped=3))
    metrics.on_receive(ReceiveEvent(False, "agent-0", code="INVALID_ARGUMENT", reason="sequence"))
    metrics.on_receive(ReceiveEvent(False, "", code="PERMISSION_DENIED", reason="wrong_fleet"))
    ratio = "airgossip_agent_in_neighbour_increment_ratio"
    assert sample(metrics, f"{ratio}_sum", peer="agent-0") == 1000.0
    assert sample(metrics, f"{ratio}_count", peer="agent-0") == 2
    assert sample(metrics, "airgossip_agent_in_neighbour_absorbed_total", peer="agent-3") == 1
    assert sample(metrics, "airgossip_agent_in_neighbour_clipped_total", peer="agent-3") == 3
    refused = "airgossip_agent_in_neighbour_refused_total"
    assert sample(metrics, refused, peer="agent-0", reason="sequence") == 1
    assert sample(metrics, refused, peer="", reason="wrong_fleet") is None
    promtool_check(generate_latest(metrics.registry).decode())
    metrics.on_in_neighbours(frozenset({"agent-3"}))  # agent-0 departed
    assert sample(metrics, f"{ratio}_count", peer="agent-0") is None
    assert sample(metrics, refused, peer="agent-0", reason="sequence") is None
    assert sample(metrics, f"{ratio}_count", peer="agent-3") == 1
    metrics.on_in_neighbours(frozenset())
    assert sample(metrics, "airgossip_agent_in_neighbour_clipped_total", peer="agent-3") is None


def test_robust_push_sum_is_measured_before_its_clipping_and_reports_its_clips() -> None:
    # It holds each sender's increment apart until the mix (its pending mass is left as it
    # was): the message is measured by the value its running sum proposes, before clipping.
    algorithm = RobustPushSum(X0.clone(), options={"tau": 0.1})
    watch = InNeighbourWatch(algorithm, object())
    watch.set_in_neighbours(frozenset({"a", "b", "c"}))
    honest = {p: Payload(X0 * 1.01 * 0.5, {"y": 0.5}, seq=1) for p in ("a", "b")}
    forged = Payload(torch.full((4,), 1000.0 * 1000.0, dtype=torch.float64), {"y": 1000.0}, 1)
    events = {}
    for peer, payload in [*honest.items(), ("c", forged)]:
        before = watch.before(peer)
        ack = algorithm.receive(peer, payload)
        events[peer] = watch.received(peer, payload, 32, ack.absorbed, before)
    assert events["a"].increment == pytest.approx(0.01, rel=1e-9)
    assert events["c"].increment == pytest.approx(
        float((torch.full((4,), 1000.0) - X0).norm() / X0.norm()), rel=1e-9
    )
    algorithm.mix()  # clips the forged increment
    assert algorithm.clipped_by_sender["c"] >= 1
    again = Payload(forged.vector * 2, {"y": 2000.0}, seq=2)
    before = watch.before("c")
    event = watch.received("c", again, 32, algorithm.receive("c", again).absorbed, before)
    assert event.clipped == algorithm.clipped_by_sender["c"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_onsets_date_the_first_outlier_of_each_in_neighbour_and_end_a_minute_after_the_last() -> (
    None
):
    clock = Clock()
    onsets = OutlierOnsets(clock)
    # Three in-neighbours moving the agent by 0.5 to 0.8 of its norm: no outlier, no onset.
    for _ in range(TYPICAL_AFTER):
        for peer, increment in (("a", 0.5), ("b", 0.6), ("c", 0.8)):
            assert onsets.observe(peer, increment) == 0.0
            clock.now += 0.1
    # "a" forges: its first message is judged against b's and c's typical values (0.69).
    forged_at = clock.now
    assert onsets.observe("a", 1000.0) == forged_at
    clock.now += 1
    # "b" passes the forgery on a second later: judged against a's and c's typical values,
    # which one forged message moved by a factor of 2 at most, it is an outlier from then.
    assert onsets.observe("b", 300.0) == forged_at + 1
    # The episode keeps its onset while the outliers go on, and for a minute after.
    clock.now += 30
    assert onsets.observe("a", 1000.0) == forged_at
    clock.now += EPISODE_S - 1
    assert onsets.observe("a", 0.5) == forged_at  # 59 s after its last outlier
    clock.now += 2
    assert onsets.observe("a", 0.5) == 0.0


def test_onsets_need_two_other_in_neighbours_with_a_history_and_half_the_norm() -> None:
    clock = Clock()
    onsets = OutlierOnsets(clock)
    for _ in range(TYPICAL_AFTER):
        assert onsets.observe("b", 0.01) == 0.0
    assert onsets.observe("a", 1000.0) == 0.0  # one other in-neighbour: no baseline
    for _ in range(TYPICAL_AFTER - 1):
        onsets.observe("c", 0.01)
    assert onsets.observe("a", 1000.0) == 0.0  # c's history is too short yet
    onsets.observe("c", 0.01)
    assert onsets.observe("a", 0.4) == 0.0  # forty times the others, but under half the norm
    assert onsets.observe("a", 0.6) == clock.now
    onsets.forget(frozenset({"b", "c"}))  # "a" departed: its episode goes with it
    assert onsets.observe("b", 0.01) == 0.0


def test_the_watch_dates_outliers_and_metrics_keep_the_onset_while_it_lasts() -> None:
    algorithm = DPSGD(X0.clone(), dtype=torch.float64)
    clock = Clock()
    watch = InNeighbourWatch(algorithm, object(), clock)
    watch.set_in_neighbours(frozenset({"a", "b", "c"}))
    metrics = AgentMetrics("agent-1")
    events = []
    for model in [X0 * 1.5] * TYPICAL_AFTER:
        for peer in ("b", "c"):
            events.append(watch.received(peer, Payload(model, {}, seq=1), 32, True, None))
    forged = Payload(X0 * 1000, {}, seq=1)
    events.append(watch.received("a", forged, 32, True, watch.before("a")))
    assert events[-1].onset == clock.now and events[0].onset == 0.0
    onset = "airgossip_agent_in_neighbour_outlier_onset_seconds"
    for event in events:
        metrics.on_receive(event)
    assert sample(metrics, onset, peer="a") == clock.now
    assert sample(metrics, onset, peer="b") is None
    promtool_check(generate_latest(metrics.registry).decode())
    clock.now += EPISODE_S + 1
    honest = Payload(X0 * 1.5, {}, seq=1)
    metrics.on_receive(watch.received("a", honest, 32, True, watch.before("a")))
    assert sample(metrics, onset, peer="a") is None
    metrics.on_receive(events[-1])
    metrics.on_in_neighbours(frozenset({"b", "c"}))
    assert sample(metrics, onset, peer="a") is None
