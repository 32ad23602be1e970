"""Clipping radii of the robust gossip rules: how far a neighbour's value may pull an agent.

Every rule looks at one agent's neighbours: the distance ``d_j`` of each neighbour's value
from the agent's own and the weight ``w_j`` the agent gives it, and an upper bound ``b`` on
the weight its insiders may hold. Pure numbers in, one radius out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: A clip is *counted* (``clipped_by_sender``, the metric ``..._clipped_total``) when it cuts a
#: pull to less than this fraction: CS+-RG clips its farthest neighbours every round by design,
#: most often by little, so a count of every clip accuses honest agents; a forgery is cut by
#: orders of magnitude.
COUNTED_CLIP = 0.5


def insider_weight(weights: Sequence[float], insiders: int) -> float:
    """The most weight ``insiders`` neighbours can hold: the sum of the largest weights."""
    if insiders <= 0:
        return 0.0
    return float(sum(sorted(weights, reverse=True)[:insiders]))


def _by_distance(distances: Sequence[float], weights: Sequence[float]) -> list[tuple[float, float]]:
    if len(distances) != len(weights):
        raise ValueError(f"{len(distances)} distances for {len(weights)} weights")
    return sorted(zip(distances, weights, strict=True))


def self_centred_radius(
    distances: Sequence[float], weights: Sequence[float], insider: float
) -> float:
    """ClippedGossip's adaptive radius (He, Karimireddy and Jaggi 2022, their practical rule).

    The nearest neighbours holding all the weight but ``insider`` are taken as honest, and
    the radius is ``sqrt(sum_j w_j d_j^2 / insider)`` over them: clipping then costs the
    honest neighbours about as much as it takes from the insiders. ``inf`` (no clipping) when
    ``insider`` is 0 or no neighbour is left to clip; 0 when the nearest neighbour alone
    already holds more than the honest weight.
    """
    if insider <= 0.0 or not distances:
        return math.inf
    ordered = _by_distance(distances, weights)
    honest = sum(weights) - insider
    total, squares, count = 0.0, 0.0, 0
    for distance, weight in ordered:
        if total + weight > honest + 1e-12 * max(honest, 1.0):
            break
        total += weight
        squares += weight * distance * distance
        count += 1
    if count == len(ordered):
        return math.inf
    return math.sqrt(squares / insider)


def cs_plus_radius(distances: Sequence[float], weights: Sequence[float], insider: float) -> float:
    """CS+-RG's radius (Gaucher et al., ICML 2025): the distance of the farthest neighbour
    such that the neighbours beyond it hold at least ``2 * insider`` of the weight; every
    neighbour farther than that is clipped to it. ``inf`` when ``insider`` is 0; 0 when the
    nearest neighbour is already inside the ``2 * insider`` farthest weight.
    """
    if insider <= 0.0 or not distances:
        return math.inf
    ordered = _by_distance(distances, weights)
    kept = sum(weights) - 2.0 * insider
    total, radius = 0.0, 0.0
    for distance, weight in ordered:
        total += weight
        if total > kept + 1e-12 * max(abs(kept), 1.0):
            break
        radius = distance
    return radius


def cs_plus_never_mixes(weights: Sequence[float], byzantine: int) -> bool:
    """Whether :func:`cs_plus_radius` is 0 for an agent with these neighbour weights however
    far its neighbours stand: the radius can only be positive when the nearest neighbour lies
    outside the ``2 * insider`` farthest weight, and the lightest neighbour is the likeliest
    to, so it is tried as the nearest. False without neighbours or with ``byzantine`` 0."""
    if not weights or byzantine <= 0:
        return False
    lightest = min(range(len(weights)), key=lambda j: weights[j])
    distances = [1.0 if j == lightest else 2.0 for j in range(len(weights))]
    return cs_plus_radius(distances, weights, insider_weight(weights, byzantine)) == 0.0


def clip_scale(distance: float, radius: float) -> float:
    """Factor that brings a vector of norm ``distance`` within ``radius`` (1 when inside)."""
    if distance <= radius:
        return 1.0
    return radius / distance
