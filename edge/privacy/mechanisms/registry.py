"""Privacy mechanisms by the name ``[privacy] mechanism`` takes: adding one is one module
and one line here. Loads no torch (the mechanisms import what they compute with when they
compute), so settings and help texts read it freely."""

from __future__ import annotations

from airgossip.edge.privacy.mechanisms.base import Mechanism
from airgossip.edge.privacy.mechanisms.cancelling import CancellingMasks
from airgossip.edge.privacy.mechanisms.central import CentralReference
from airgossip.edge.privacy.mechanisms.disabled import NoPrivacy
from airgossip.edge.privacy.mechanisms.dp_sgd import DpSgd
from airgossip.edge.privacy.mechanisms.network_dp import NetworkDp

#: Every mechanism by name, in the order help texts list them.
MECHANISMS: dict[str, Mechanism] = {
    m.name: m for m in (NoPrivacy(), DpSgd(), NetworkDp(), CancellingMasks(), CentralReference())
}
#: The mechanism of a run that asks for none.
NO_PRIVACY = MECHANISMS[NoPrivacy.name]


def mechanism_named(value: object) -> Mechanism:
    """The mechanism ``value`` names (a mechanism is itself); ``ValueError`` naming the
    mechanisms there are."""
    if isinstance(value, Mechanism):
        return value
    if isinstance(value, str) and value in MECHANISMS:
        return MECHANISMS[value]
    raise ValueError(f"unknown privacy mechanism {value!r}; choose one of: {', '.join(MECHANISMS)}")
