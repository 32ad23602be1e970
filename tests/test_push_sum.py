"""Push-sum: exact under loss, duplication and reordering; the plain form is not."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

from edge.algorithms import PlainPushSum, ProtocolError, PushSum
from edge.algorithms.base import Ack, Payload
from edge.topology import Phase, build_graph, node_phases


@dataclass
class Fleet:
    """Pure-algorithm fleet with a hostile network: loss, duplicates, reordering, late acks."""

    algos: list[PushSum]
    phases: list[list[Phase]]
    ids: list[str]

    @classmethod
    def build(cls, n: int, topology: str = "exponential", dim: int = 20, seed: int = 0,
              algorithm: type[PushSum] = PushSum) -> Fleet:  # fmt: skip
        gen = torch.Generator().manual_seed(seed)
        ids = [f"a{i}" for i in range(n)]
        graph = build_graph(topology, n)
        algos = [algorithm(torch.randn(dim, generator=gen, dtype=torch.float64) + 1) for _ in ids]
        return cls(algos, [node_phases(graph, ids, i) for i in range(n)], ids)

    def average(self) -> torch.Tensor:
        total_x = sum(a.x for a in self.algos)
        return total_x / len(self.algos)

    def total_mass(self) -> tuple[torch.Tensor, float]:
        """Mass held by agents plus mass still on the edges."""
        x = sum(a.mass()[0] for a in self.algos)
        y = sum(a.mass()[1] for a in self.algos)
        for i, sender in enumerate(self.algos):
            for j, receiver in enumerate(self.algos):
                if i == j:
                    continue
                sx, sy, sbase = sender.out_edge_sum(self.ids[j])
                rx, ry, rbase = receiver.in_edge_sum(self.ids[i])
                if rbase == sbase:
                    sx, sy = sx - rx, sy - ry
                x, y = x + sx, y + sy
        return x, y

    def error(self, target: torch.Tensor) -> float:
        return max(float((a.estimate() - target).norm() / target.norm()) for a in self.algos)


def run(fleet: Fleet, rounds: int, *, loss: float = 0.0, duplicate: float = 0.0,
        max_delay: int = 0, ack_loss: float = 0.0, seed: int = 0,
        check_mass: torch.Tensor | None = None) -> None:  # fmt: skip
    """Every round each agent shares with all out-neighbours; messages may be lost,
    duplicated, or delivered up to ``max_delay`` rounds late (so out of order)."""
    rng = random.Random(seed)
    queue: list[tuple[int, int, int, Payload]] = []  # (due round, sender, receiver, payload)
    n = len(fleet.algos)
    for r in range(rounds):
        for i, algo in enumerate(fleet.algos):
            phase = fleet.phases[i][r % len(fleet.phases[i])]
            for peer, payload in algo.share(phase, set(phase.out_weights)).items():
                copies = 0 if rng.random() < loss else 1 + (rng.random() < duplicate)
                for _ in range(copies):
                    queue.append((r + rng.randint(0, max_delay), i, fleet.ids.index(peer), payload))
        rng.shuffle(queue)
        due, queue = [m for m in queue if m[0] <= r], [m for m in queue if m[0] > r]
        for _, i, j, payload in due:
            ack = fleet.algos[j].receive(fleet.ids[i], payload)
            if rng.random() >= ack_loss:
                fleet.algos[i].on_ack(fleet.ids[j], ack)
        for algo in fleet.algos:
            algo.mix()
        if check_mass is not None:
            x, y = fleet.total_mass()
            torch.testing.assert_close(x, check_mass, rtol=0, atol=1e-10)
            assert y == pytest.approx(n, abs=1e-10)


@pytest.mark.parametrize(
    ("loss", "duplicate", "max_delay", "ack_loss"),
    [(0.0, 0.0, 0, 0.0), (0.3, 0.0, 0, 0.0), (0.2, 0.3, 0, 0.0), (0.2, 0.2, 3, 0.3)],
)
def test_mass_is_conserved_and_average_exact(
    loss: float, duplicate: float, max_delay: int, ack_loss: float
) -> None:
    fleet = Fleet.build(12)
    target = fleet.average()
    initial = sum(a.x.clone() for a in fleet.algos)
    run(fleet, 150, loss=loss, duplicate=duplicate, max_delay=max_delay, ack_loss=ack_loss,
        check_mass=initial)  # fmt: skip
    run(fleet, 60, max_delay=0)  # a quiet network delivers whatever is still on the edges
    assert fleet.error(target) < 1e-10


@pytest.mark.parametrize("loss", [0.1, 0.3])
def test_push_sum_c3_exact_where_plain_is_not(loss: float) -> None:
    exact = Fleet.build(16, dim=100, seed=1)
    plain = Fleet.build(16, dim=100, seed=1, algorithm=PlainPushSum)  # type: ignore[arg-type]
    target = exact.average()
    run(exact, 300, loss=loss, seed=2)
    run(plain, 300, loss=loss, seed=2)
    assert exact.error(target) < 1e-10
    assert plain.error(target) > 1e-2


def test_running_sums_stay_small_over_long_runs() -> None:
    """Acknowledged rebasing keeps the numbers on the wire at a few rounds' worth of mass."""
    fleet = Fleet.build(6, topology="directed-ring", dim=4, seed=3)
    target = fleet.average()
    run(fleet, 3000, loss=0.3, ack_loss=0.2, seed=4)
    largest = max(float(a.out_edge_sum(p)[0].abs().max()) for a in fleet.algos for p in fleet.ids)
    assert largest < 20 * float(target.abs().max())
    assert fleet.error(target) < 1e-12


def test_duplicates_and_stale_messages_change_nothing() -> None:
    a, b = PushSum(torch.ones(3, dtype=torch.float64)), PushSum(torch.zeros(3, dtype=torch.float64))
    phase = Phase(0.5, {"b": 0.5}, ())
    first = a.share(phase, {"b"})["b"]
    second = a.share(phase, {"b"})["b"]
    assert b.receive("a", second).absorbed
    assert not b.receive("a", first).absorbed  # older, already included in `second`
    assert not b.receive("a", second).absorbed  # duplicate
    b.mix()
    torch.testing.assert_close(b.x, torch.full((3,), 0.75, dtype=torch.float64))
    assert b.y == pytest.approx(1.0 + 0.75)


def test_inconsistent_base_is_refused_without_state_change_and_recovers() -> None:
    a, b = PushSum(torch.ones(2, dtype=torch.float64)), PushSum(torch.zeros(2, dtype=torch.float64))
    phase = Phase(0.5, {"b": 0.5}, ())
    payload = a.share(phase, {"b"})["b"]
    a.on_ack("b", b.receive("a", payload))  # a rebases onto seq 1
    b.mix()
    restarted = PushSum(torch.zeros(2, dtype=torch.float64))  # b lost its edge state
    payload = a.share(phase, {"b"})["b"]
    assert payload.base_seq == 1
    with pytest.raises(ProtocolError, match="measured from seq 1"):
        restarted.receive("a", payload)
    assert restarted.in_edge_sum("a")[2] == 0 and float(restarted.mass()[0].abs().sum()) == 0
    a.on_refused("b")
    payload = a.share(phase, {"b"})["b"]
    assert payload.base_seq == 0
    assert restarted.receive("a", payload).absorbed


def test_weight_scalar_is_required() -> None:
    b = PushSum(torch.zeros(2, dtype=torch.float64))
    with pytest.raises(ProtocolError, match="weight"):
        b.receive("a", Payload(torch.zeros(2, dtype=torch.float64), {}, 1, 0))
    with pytest.raises(ProtocolError, match="weight"):
        b.receive("a", Payload(torch.zeros(2, dtype=torch.float64), {"y": float("nan")}, 1, 0))


def test_busy_edge_keeps_mass_in_the_running_sum() -> None:
    a, b = PushSum(torch.ones(1, dtype=torch.float64)), PushSum(torch.zeros(1, dtype=torch.float64))
    phase = Phase(0.5, {"b": 0.5}, ())
    assert a.share(phase, ready=()) == {}  # edge busy: nothing sent, mass kept for b
    payload = a.share(phase, {"b"})["b"]
    assert float(payload.vector[0]) == pytest.approx(0.5 + 0.25)
    assert isinstance(b.receive("a", payload), Ack)


def test_plain_push_sum_keeps_what_it_cannot_send() -> None:
    a = PlainPushSum(torch.ones(1, dtype=torch.float64))
    assert a.share(Phase(0.5, {"b": 0.5}, ()), ready=()) == {}
    assert float(a.x[0]) == 1.0 and a.y == 1.0


def test_sgp_update_moves_the_estimate() -> None:
    a = PushSum(torch.zeros(2, dtype=torch.float64))
    a.apply_update(torch.tensor([1.0, -1.0]))
    torch.testing.assert_close(a.estimate(), torch.tensor([1.0, -1.0], dtype=torch.float64))
