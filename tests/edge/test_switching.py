"""Switching the gossip graph during training: the schedule, its decisions and the switched
assignments (whole fleets, exactness across switches and what dense-then-sparse and the
reverse cost and buy: tests/emulation/test_switching_fleets.py)."""

from __future__ import annotations

from typing import Any

import pytest

from airgossip.common.topology import (
    FleetFigures,
    SwitchingSettings,
    TopologySwitcher,
    assignments_for_graph,
    build_graph,
    parse_switching,
    switched_assignments,
)


def settings(**values: Any) -> SwitchingSettings:
    return parse_switching(values)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"topologies": ["complete"], "at_rounds": []}, "option 'topologies': List should have"),
        ({"topologies": ["complete", "ring"]}, "give at_rounds .* or trigger"),
        (
            {"topologies": ["complete", "ring"], "at_rounds": [5], "trigger": "loss-plateau"},
            "exactly one of them",
        ),
        ({"topologies": ["complete", "ring"], "at_rounds": [5, 9]}, "need 1 at_rounds"),
        ({"topologies": ["complete", "ring", "ring"], "at_rounds": [9, 9]}, "strictly increasing"),
        ({"topologies": ["complete", "ring"], "at_rounds": [1]}, "rounds from 2"),
        ({"topologies": ["complete", "star"], "at_rounds": [5]}, "unknown topology 'star'"),
        ({"topologies": ["complete", "edges"], "at_rounds": [5]}, "unknown topology 'edges'"),
        ({"topologies": ["ring", "complete"], "trigger": "loss-plateau"}, "needs a threshold"),
        ({"topologies": ["ring", "complete"], "trigger": "accuracy"}, "trigger"),
        (
            {"topologies": ["ring", "ring"], "at_rounds": [5], "every": 3},
            r"unknown option 'every' \(allowed: topologies, at_rounds",
        ),
    ],
)
def test_bad_schedules_say_what_is_allowed(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=f"^switching: .*{message}"):
        settings(**values)


def test_by_round_the_next_graph_starts_at_its_round() -> None:
    switcher = TopologySwitcher(
        settings(topologies=["complete", "ring", "exponential"], at_rounds=[3, 6]), 8
    )
    assert switcher.graph.name == "complete"
    decisions = {r: switcher.observe(FleetFigures(r)) for r in range(1, 10)}
    assert {r: g.name for r, g in decisions.items() if g is not None} == {
        2: "ring",  # observed after round 2: round 3 runs on the ring
        5: "exponential",
    }
    assert switcher.finished and switcher.graph.name == "exponential"


def test_adaptively_on_consensus_distance_after_window_reports_and_min_rounds() -> None:
    switcher = TopologySwitcher(
        settings(
            topologies=["complete", "ring"], trigger="consensus-distance-below", threshold=0.01,
            window=2, min_rounds=4,
        ),
        8,
    )  # fmt: skip
    distances = [0.5, 0.005, 0.2, 0.005, 0.005, None, 0.001, 0.001]
    switched = [
        r
        for r, d in enumerate(distances, start=1)
        if switcher.observe(FleetFigures(r, consensus_distance=d)) is not None
    ]
    assert switched == [5]  # two reports in a row below 0.01 (rounds 4, 5), 4 rounds in
    rising = TopologySwitcher(
        settings(
            topologies=["ring", "complete"],
            trigger="consensus-distance-above",
            threshold=1,
            window=1,
        ),
        8,
    )
    assert rising.observe(FleetFigures(1, consensus_distance=0.5)) is None
    graph = rising.observe(FleetFigures(2, consensus_distance=1.5))
    assert graph is not None and graph.name == "complete"


def test_adaptively_on_a_loss_plateau() -> None:
    switcher = TopologySwitcher(
        settings(topologies=["ring", "complete"], trigger="loss-plateau", threshold=0.15, window=2),
        8,
    )
    losses = [2.0, 1.0, 0.6, 0.55, 0.52]  # gains over two reports: 0.7, 0.45, 0.133
    decisions = [switcher.observe(FleetFigures(r, loss=x)) for r, x in enumerate(losses, 1)]
    assert [d is not None for d in decisions] == [False] * 4 + [True]  # 0.52 vs 0.6: 0.133 < 0.15


def test_switched_assignments_raise_the_epoch_and_keep_the_old_peers() -> None:
    addresses = {f"a{i}": f"mem://a{i}" for i in range(6)}
    first = assignments_for_graph(build_graph("complete", 6), addresses, epoch=3)
    second = switched_assignments(first, build_graph("ring", 6), addresses)
    assert {a.epoch for a in second.values()} == {4}
    assert set(second["a0"].peers) == set(addresses) - {"a0"}  # old peers still known
    assert set(second["a0"].phase(0).out_weights) == {"a1", "a5"}  # but only ring edges used
