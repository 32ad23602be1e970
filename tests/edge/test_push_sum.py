"""Push-sum: exact under loss, duplication and reordering; the plain form is not."""

from __future__ import annotations

import pytest
import torch

from airgossip.common.topology import Phase
from airgossip.edge.algorithms import InvalidPayload, PlainPushSum, ProtocolError, PushSum
from airgossip.edge.algorithms.base import Ack, Payload
from tests.support.lossy import AlgorithmFleet


@pytest.mark.parametrize(
    ("loss", "duplicate", "max_delay", "ack_loss"),
    [(0.0, 0.0, 0, 0.0), (0.3, 0.0, 0, 0.0), (0.2, 0.3, 0, 0.0), (0.2, 0.2, 3, 0.3)],
)
def test_mass_is_conserved_and_average_exact(
    loss: float, duplicate: float, max_delay: int, ack_loss: float
) -> None:
    fleet = AlgorithmFleet.build("push-sum", 12)
    target = fleet.average()
    initial = fleet.total_x()
    fleet.run(150, loss=loss, duplicate=duplicate, max_delay=max_delay, ack_loss=ack_loss,
        check_mass=initial)  # fmt: skip
    fleet.run(60, max_delay=0)  # a quiet network delivers whatever is still on the edges
    assert fleet.error(target) < 1e-10


@pytest.mark.parametrize("loss", [0.1, 0.3])
def test_push_sum_c3_exact_where_plain_is_not(loss: float) -> None:
    exact = AlgorithmFleet.build("push-sum", 16, dim=100, seed=1)
    plain = AlgorithmFleet.build(PlainPushSum.name, 16, dim=100, seed=1)
    target = exact.average()
    exact.run(300, loss=loss, seed=2)
    plain.run(300, loss=loss, seed=2)
    assert exact.error(target) < 1e-10
    assert plain.error(target) > 1e-2


def test_running_sums_stay_small_over_long_runs() -> None:
    """Acknowledged rebasing keeps the numbers on the wire at a few rounds' worth of mass."""
    fleet = AlgorithmFleet.build("push-sum", 6, topology="directed-ring", dim=4, seed=3)
    target = fleet.average()
    fleet.run(3000, loss=0.3, ack_loss=0.2, seed=4)
    sums = [a.out_edge_sum(p)[0] for a in fleet.algos if isinstance(a, PushSum) for p in fleet.ids]
    largest = max(float(s.abs().max()) for s in sums)
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
    a.restart_out_edge("b")
    payload = a.share(phase, {"b"})["b"]
    assert payload.base_seq == 0
    assert restarted.receive("a", payload).absorbed


def test_weight_scalar_is_required() -> None:
    b = PushSum(torch.zeros(2, dtype=torch.float64))
    # Malformed, not a mismatch with the edge's state: the sender must not restart the edge.
    with pytest.raises(InvalidPayload, match="weight"):
        b.receive("a", Payload(torch.zeros(2, dtype=torch.float64), {}, 1, 0))
    with pytest.raises(InvalidPayload, match="weight"):
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
