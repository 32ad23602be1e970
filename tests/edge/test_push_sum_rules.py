"""Push-sum's rules (edge/algorithms/push_sum_rules.py) on one edge and on arrays of edges.

The batched engine applies the elementwise rules to whole arrays: each must answer for every
element what it answers for that element alone.
"""

from __future__ import annotations

import numpy as np
import pytest

from airgossip.edge.algorithms.base import SEQ_SLACK, ProtocolError
from airgossip.edge.algorithms.push_sum_rules import (
    STARVED_WEIGHT,
    Placement,
    absorbs,
    flushes,
    hold_back_weights,
    kept_weight,
    numbered,
    pending_weight,
    placement,
    rebases,
    starved,
)


def test_elementwise_rules_answer_arrays_as_they_answer_each_element() -> None:
    rng = np.random.default_rng(3)
    weights = np.concatenate([[0.0, STARVED_WEIGHT, STARVED_WEIGHT / 2, 1.0],
                              rng.random(50) * 1e-5])  # fmt: skip
    assert starved(weights).tolist() == [starved(float(w)) for w in weights]
    assert starved(STARVED_WEIGHT / 2) and not starved(STARVED_WEIGHT)

    on = rng.random(60) < 0.5
    owed = np.where(rng.random(60) < 0.5, 0.0, rng.random(60))
    each = [flushes(bool(o), float(w)) for o, w in zip(on, owed, strict=True)]
    assert flushes(on, owed).tolist() == each
    assert flushes(False, 0.25) and not flushes(False, 0.0) and flushes(True, 0.0)

    seq = rng.integers(0, 3 * SEQ_SLACK, 80)
    acked = rng.integers(0, 3 * SEQ_SLACK, 80)
    pairs = [(int(s), int(a)) for s, a in zip(seq, acked, strict=True)]
    assert numbered(seq, acked).tolist() == [numbered(s, a) for s, a in pairs]
    assert numbered(SEQ_SLACK - 1, 0) and not numbered(SEQ_SLACK, 0)
    assert rebases(seq, acked).tolist() == [rebases(s, a) for s, a in pairs]


def test_hold_back_keeps_the_held_shares_home_in_order() -> None:
    out = {"a": 0.25, "b": 0.125, "c": 0.375}
    assert hold_back_weights(0.25, out, {"zzz"}, probe=False) is None
    self_weight, kept = hold_back_weights(0.25, out, {"a", "c"}, probe=False) or (0.0, {})
    assert kept == {"b": 0.125}
    assert self_weight == kept_weight(0.25, [0.25, 0.375]) == 0.875
    assert sum(kept.values()) + self_weight == 1.0  # mass conserved
    _, probing = hold_back_weights(0.25, out, {"a"}, probe=True) or (0.0, {})
    assert probing == {"a": 0.0, "b": 0.125, "c": 0.375}
    # the batched engine's starved node keeps self + share + share ... summed in this order
    third = 1.0 / 3.0
    assert kept_weight(third, [third, third]) == third + (0 + third + third)


def test_placement_of_a_message_on_its_edge() -> None:
    def place(seq: int, base: int, *, held: bool = True, last: int = 5, at: int = 3) -> Placement:
        return placement("agent-1", seq, base, held=held, last_seq=last, held_base=at)

    assert place(5, 3) is Placement.STALE and place(2, 0) is Placement.STALE
    assert place(6, 3) is Placement.REPLACES
    assert place(6, 5) is Placement.REBASED
    assert place(1, 0, held=False, last=0, at=0) is Placement.REPLACES
    with pytest.raises(ProtocolError, match="measured from seq 4") as refused:
        place(6, 4)
    assert refused.value.reason == "cannot_place"
    with pytest.raises(ProtocolError):  # no edge yet: only base 0 places
        place(3, 2, held=False, last=0, at=0)


def test_pending_weight_and_absorption() -> None:
    assert pending_weight(1.0, 0.5, 0.25, Placement.REPLACES) == 1.25
    assert pending_weight(1.0, 0.5, 0.25, Placement.REBASED) == 1.5
    assert absorbs(1.25, 1.0) and absorbs(1.0, 1.0)
    assert not absorbs(0.75, 1.0)  # a running sum that shrank: taking weight back is refused
