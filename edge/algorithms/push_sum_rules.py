"""The decisions of push-sum with running sums, each written once, on one edge or on rows.

:class:`~airgossip.edge.algorithms.push_sum.PushSum` (one agent, torch), the batched
in-process engine (every agent of a lock-step fleet as rows of numpy arrays,
:mod:`airgossip.emulation.fleets.batched`) and the virtual clock's fast path (every agent's
events without agent objects, :mod:`airgossip.emulation.fleets.virtual_fast`) hold the same
state in different shapes; what they decide from it is here, so that the three cannot drift
apart. Each rule takes plain numbers; those marked *elementwise* take numpy arrays of edges or
agents too (they use only comparisons and ``|``), which is how the batched engine applies
them to every edge at once. The vector arithmetic (adding a share to a running sum, a
message's mass to what is pending) stays with each engine, in its own array library.

tests/emulation/test_push_sum_conformance.py runs the same scenarios through the agent, the
batched engine and both virtual engines.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from enum import Enum
from typing import TypeVar, overload

import numpy as np
import numpy.typing as npt

from airgossip.edge.algorithms.base import SEQ_SLACK, ProtocolError

#: Weight below which an agent gives no share away (an agent starts with 1, a fleet's
#: weights sum to its size). An agent that runs far faster than its in-neighbours (it
#: restarted behind them, or they stalled) gives a share away every round and gets little
#: back; without a floor its weight sinks until its float32 state underflows. Keeping a
#: share at home is a valid push-sum step (a self-weight of 1), so mass stays conserved.
STARVED_WEIGHT = 1e-6

Peer = TypeVar("Peer")


@overload
def starved(weight: float) -> bool: ...
@overload
def starved(weight: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_]: ...
def starved(weight: float | npt.NDArray[np.float64]) -> bool | npt.NDArray[np.bool_]:
    """Whether an agent of push-sum ``weight`` keeps every share at home (*elementwise*)."""
    return weight < STARVED_WEIGHT


def kept_weight(self_weight: float, held: Iterable[float]) -> float:
    """The self weight of an agent whose shares ``held`` stay at home: its own plus theirs,
    summed in the order given (every engine sums them so, to the last bit)."""
    return self_weight + sum(held)


def hold_back_weights(
    self_weight: float, out_weights: Mapping[Peer, float], peers: Collection[Peer], *, probe: bool
) -> tuple[float, dict[Peer, float]] | None:
    """``(self weight, out weights)`` with the share of each of ``peers`` kept at home, or
    None where none of them has a share.

    The weights still sum to one, so push-sum conserves mass. With ``probe`` the peers stay
    with weight 0: their edges then carry what they already hold.
    """
    held = [w for p, w in out_weights.items() if p in peers]
    if not held:
        return None
    out = {p: 0.0 if p in peers else w for p, w in out_weights.items() if probe or p not in peers}
    return kept_weight(self_weight, held), out


@overload
def flushes(on_phase: bool, owed_weight: float) -> bool: ...
@overload
def flushes(
    on_phase: npt.NDArray[np.bool_], owed_weight: npt.NDArray[np.float64]
) -> npt.NDArray[np.bool_]: ...
def flushes(
    on_phase: bool | npt.NDArray[np.bool_], owed_weight: float | npt.NDArray[np.float64]
) -> bool | npt.NDArray[np.bool_]:
    """Whether an out-edge carries a message this push (*elementwise*): it is on this phase,
    or it still owes weight (the graph changed, the graph is periodic, or its sender is
    starved: what was given is never stranded)."""
    return on_phase | (owed_weight != 0.0)


@overload
def numbered(seq: int, acked: int) -> bool: ...
@overload
def numbered(seq: npt.NDArray[np.int64], acked: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]: ...
def numbered(
    seq: int | npt.NDArray[np.int64], acked: int | npt.NDArray[np.int64]
) -> bool | npt.NDArray[np.bool_]:
    """Whether an edge's next message takes a new sequence number (*elementwise*): not when
    it is far past anything acknowledged (a dead peer, probed), where the number is reused
    and the receiver may hold either content under it."""
    return seq - acked < SEQ_SLACK


class Placement(Enum):
    """Where a message stands against the receiver's view of its edge."""

    #: Not newer than what the receiver holds: a duplicate or a stale copy, changes nothing.
    STALE = "stale"
    #: Measured from the base the receiver holds: replaces the sum absorbed last.
    REPLACES = "replaces"
    #: Measured from the receiver's last message (the sender took its acknowledgement): all
    #: of it is new.
    REBASED = "rebased"


def placement(
    sender: str, seq: int, base_seq: int, *, held: bool, last_seq: int, held_base: int
) -> Placement:
    """Where message ``seq`` (measured from ``base_seq``) stands on an edge whose receiver
    holds ``last_seq`` measured from ``held_base`` (``held``: it holds anything at all);
    :class:`ProtocolError` where it cannot be placed (the sender must start the edge over)."""
    if seq <= last_seq:
        return Placement.STALE
    if base_seq == held_base:
        return Placement.REPLACES
    if held and base_seq == last_seq:
        return Placement.REBASED
    raise ProtocolError(
        f"message seq {seq} from '{sender}' is measured from seq {base_seq}, but this edge "
        f"is at base {held_base} after seq {last_seq}",
        reason="cannot_place",
    )


def pending_weight(pending: float, weight: float, absorbed: float, where: Placement) -> float:
    """The receiver's pending weight once a message of running weight ``weight`` is in, on an
    edge whose last absorbed sum weighed ``absorbed``."""
    if where is Placement.REPLACES:
        return pending + (weight - absorbed)
    return pending + weight


def absorbs(pending_after: float, pending_before: float) -> bool:
    """Whether a placed message is absorbed: a running sum never shrinks within a lineage,
    and a sender whose would is refused (taking weight back could sink the receiver's below
    zero)."""
    return not pending_after < pending_before


@overload
def rebases(acked_seq: int, base_seq: int) -> bool: ...
@overload
def rebases(
    acked_seq: npt.NDArray[np.int64], base_seq: npt.NDArray[np.int64]
) -> npt.NDArray[np.bool_]: ...
def rebases(
    acked_seq: int | npt.NDArray[np.int64], base_seq: int | npt.NDArray[np.int64]
) -> bool | npt.NDArray[np.bool_]:
    """Whether an acknowledgement of the edge's latest message moves the edge's base to it
    (*elementwise*): both sides then measure from what the receiver holds."""
    return acked_seq > base_seq
