"""An authenticated insider fires the shipped alert in a real Prometheus, naming it and no one
else, in fleets that run in lock step and in fleets that run free.

Fleets of eight consensus agents run side by side in this process (:mod:`.insider_fleets`),
each agent serving real gRPC with mutual TLS (the test CA's certificates) and its own
``/metrics`` over real HTTP, on the exponential graph (three in-neighbours each). Debian's
Prometheus scrapes them every second and evaluates ``deploy/prometheus/alerts.yml`` as
shipped, every second.

In the attacked fleet agent-0, with its genuine key, replaces its pushes with the forged ones
of issue 17 (y = 1000, x = 1000 * y on every element, numbered from the acknowledgements it
gets back). In lock step (one round every :data:`ROUND_S` seconds) ``AirgossipSuspectedInsider``
must name agent-0 within :data:`ALERT_ROUNDS` rounds of its first forged push; free-running
(every agent on its own wall-clock runner, 10% loss on every link) within
:data:`FREE_ALERT_S` seconds; and no alert may name an honest agent on an honest agent's word,
in the attacked fleet or in the honest one beside it.

Issue 33's slow drifter (agent-0 sends each out-neighbour the receiver's own estimate plus 0.1
of its norm in one fixed direction) in a free-running robust-push-sum fleet: the shipped
``AirgossipDriftingInsider`` names it within :data:`DRIFT_ALERT_S` seconds, no alert names an
honest agent, and the fleet's drift stays under the budget's bound.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch

from airgossip.edge.transport import GossipMessage
from tests.support.agents import refused
from tests.support.cli import ROOT
from tests.system.insider_fleets import (
    INSIDER,
    WatchedFleet,
    firing,
    honest_named,
    name_the_forger,
    watching,
)

pytestmark = pytest.mark.slow

#: Seconds per lock-step round.
ROUND_S = 1.0
#: Honest rounds before the first forged push (Prometheus holds a few scrapes of every series).
WARM_ROUNDS = 4
#: The issue's bound: the alert fires within this many rounds of the first forged push.
ALERT_ROUNDS = 10
#: Issue 33's bound for free-running fleets: named within this many seconds of the first
#: forged push.
FREE_ALERT_S = 20.0
#: The drifter's bound: named within this many seconds of its first drifted push (its score
#: rises as the fleet agrees: 30 to 70 rounds in lock step, docs/security.md).
DRIFT_ALERT_S = 30.0


@pytest.fixture
def fleets() -> Iterator[tuple[WatchedFleet, WatchedFleet]]:
    attacked = WatchedFleet("attacked", insider=True)
    clean = WatchedFleet("clean", insider=False)
    try:
        yield attacked, clean
    finally:
        attacked.close()
        clean.close()


@pytest.fixture
def free_fleets() -> Iterator[tuple[WatchedFleet, WatchedFleet]]:
    attacked = WatchedFleet("attacked", insider=True, loss=0.1, rounds=1_000_000)
    clean = WatchedFleet("clean", insider=False, loss=0.1, rounds=1_000_000)
    try:
        yield attacked, clean
    finally:
        attacked.close()
        clean.close()


def insider_panels() -> list[tuple[str, str]]:
    """``(title, query)`` of the agent dashboard's insider panels, variables substituted."""
    data = json.loads((ROOT / "deploy/grafana/dashboards/airgossip-agent.json").read_text())
    titles = {
        "Relative increment per in-neighbour",
        "Refusals and clips per in-neighbour",
        "Insider alerts firing",
    }
    panels = [p for p in data["panels"] if p["title"] in titles]
    assert {p["title"] for p in panels} == titles
    variables = {"$__rate_interval": "20s", "$agent": ".*", "$peer": ".*"}
    found = []
    for panel in panels:
        for target in panel["targets"]:
            expr = target["expr"]
            for name, value in variables.items():
                expr = expr.replace(name, value)
            found.append((panel["title"], expr))
    return found


def run_round(fleets: tuple[WatchedFleet, ...], round_index: int) -> None:
    """One lock-step round of every fleet, paced to :data:`ROUND_S`."""
    began = time.monotonic()
    for fleet in fleets:
        fleet.push(round_index)
    deadline = began + 5
    while not all(f.settled() for f in fleets):
        assert time.monotonic() < deadline, "pushes did not finish"
        time.sleep(0.005)
    for fleet in fleets:
        fleet.mix(round_index)
    time.sleep(max(0.0, began + ROUND_S - time.monotonic()))


def test_a_forging_insider_fires_the_shipped_alert_naming_it(
    fleets: tuple[WatchedFleet, WatchedFleet], tmp_path: Path
) -> None:
    attacked, clean = fleets
    with watching(fleets, tmp_path) as prometheus:
        round_index = 0
        for _ in range(WARM_ROUNDS):
            round_index += 1
            run_round(fleets, round_index)
        assert not firing(prometheus)
        assert attacked.forger is not None
        attacked.forger.forging = True
        fired_after: int | None = None
        seen: list[dict[str, str]] = []
        for attack_round in range(1, ALERT_ROUNDS + 1):
            round_index += 1
            run_round(fleets, round_index)
            seen += firing(prometheus)
            if fired_after is None and any(
                a["alertname"] == "AirgossipSuspectedInsider" for a in seen
            ):
                fired_after = attack_round
        assert attacked.forger.forged >= 3 * ALERT_ROUNDS  # every round, to all three victims
        assert attacked.spread() > 100  # the forgery took: the fleet follows the insider
        names = sorted({(a["alertname"], a.get("agent", "-"), a["peer"]) for a in seen})
        print(f"alert fired {fired_after} rounds after the first forged push; firing: {names}")
        assert fired_after is not None and fired_after <= ALERT_ROUNDS, seen
        assert all(a["job"] == "attacked" for a in seen), seen  # nothing in the clean fleet
        suspects = {a["peer"] for a in seen if a["alertname"] == "AirgossipSuspectedInsider"}
        assert suspects == {INSIDER}, names
        outliers = {(a["agent"], a["peer"]) for a in seen if a["alertname"].endswith("Outlier")}
        # every accusation names the insider, but those of the insider's own /metrics
        assert all(INSIDER in pair for pair in outliers), names
        assert len({agent for agent, peer in outliers if peer == INSIDER}) >= 2, names
        assert clean.spread() < 10
        # A push the victims refuse is charged to the insider, by reason.
        for peer, header in attacked.forger.headers.items():
            bad = dataclasses.replace(header, seq=header.seq + 1, scalars={"y": -5.0})
            victim = attacked.agents[int(peer.split("-")[1])]
            assert refused(victim, GossipMessage(bad, b"\0" * header.payload_bytes)).code() == (
                grpc.StatusCode.INVALID_ARGUMENT
            )
        charged = 'airgossip_agent_in_neighbour_refused_total{job="attacked", peer="agent-0"}'
        deadline = time.monotonic() + 10
        while len(prometheus.query(charged)) < len(attacked.forger.headers):
            assert time.monotonic() < deadline, prometheus.query(charged)
            time.sleep(0.2)
        assert {r["metric"]["reason"] for r in prometheus.query(charged)} == {"weight"}
        # The agent dashboard's insider panels draw from this Prometheus.
        for title, expr in insider_panels():
            result = prometheus.query(expr)
            assert result, (title, expr)
            if title == "Insider alerts firing":
                assert INSIDER in {r["metric"].get("peer") for r in result}, result


def test_free_running_fleets_name_the_forger_and_no_one_else(
    free_fleets: tuple[WatchedFleet, WatchedFleet], tmp_path: Path
) -> None:
    """Agents on their own wall-clock runners (no pacing, 10% loss): the forger is named
    within :data:`FREE_ALERT_S` of its first forged push, and no alert names an honest agent
    on an honest agent's word, in either fleet: its honest relays are accused after it."""
    attacked, clean = free_fleets
    with watching(free_fleets, tmp_path) as prometheus:
        for fleet in free_fleets:
            fleet.run_free()
        naming = name_the_forger(
            attacked, prometheus, others=[clean], warm_s=10, limit_s=FREE_ALERT_S + 10
        )
    print(
        f"free-running at {naming.rounds_per_s:.1f} rounds/s: forger named after "
        f"{naming.seconds} s, {naming.rounds} rounds; fired: {sorted(naming.seen)}"
    )
    assert naming.rounds_per_s > 2, naming  # it ran free, not at a round a second
    assert naming.seconds is not None and naming.seconds <= FREE_ALERT_S, naming
    assert attacked.spread() > 100  # the forgery took
    assert not honest_named(naming.seen), sorted(naming.seen)
    assert clean.spread() < 10


def test_a_slow_drifter_is_named_and_no_one_else(tmp_path: Path) -> None:
    """Free-running robust-push-sum (10% loss): the drifter is named by the drift rule within
    :data:`DRIFT_ALERT_S`, no alert names an honest agent, and the honest agents stay near
    their initial average (the drift budget holds: the plain push-sum of issue 33 ended 10.85
    away after 240 rounds)."""
    attacked = WatchedFleet(
        "attacked", insider=False, drifter=True, algorithm="robust-push-sum", loss=0.1,
        rounds=1_000_000,
    )  # fmt: skip
    try:
        start = torch.stack([a.task.initial_parameters().double() for a in attacked.agents[1:]])
        with watching([attacked], tmp_path) as prometheus:
            attacked.run_free()
            naming = name_the_forger(
                attacked, prometheus, warm_s=5, limit_s=DRIFT_ALERT_S + 5, after_s=5,
                alert="AirgossipDriftingInsider",
            )  # fmt: skip
    finally:
        attacked.close()
    honest = torch.stack([a.algorithm.estimate().double() for a in attacked.agents[1:]])
    # The bound of docs/security.md: what the budget lets the drifter move each honest
    # out-neighbour, summed, over the honest agents.
    allowed = 0.0
    for agent in attacked.agents[1:]:
        guard = agent.algorithm.drift  # type: ignore[attr-defined]
        norms = {s: float(c.norm()) for s, c in guard.net.items()}
        if INSIDER in norms:
            allowed += guard.budget * guard.reference(INSIDER, norms)
    allowed /= len(attacked.agents) - 1
    print(
        f"free-running at {naming.rounds_per_s:.1f} rounds/s: drifter named after "
        f"{naming.seconds} s, {naming.rounds} rounds; fired: {sorted(naming.seen)}"
    )
    assert naming.rounds_per_s > 2, naming
    assert naming.seconds is not None and naming.seconds <= DRIFT_ALERT_S, naming
    assert not honest_named(naming.seen), sorted(naming.seen)
    bias = float((honest.mean(dim=0) - start.mean(dim=0)).norm())
    print(f"bias {bias:.3g}, bound {allowed:.3g}")
    # The bound takes push-sum weights as 1: within 1% in lock step (docs/security.md).
    assert 0 < bias <= 1.05 * allowed, (bias, allowed)
