"""Pairwise masks that cancel: each pair of partners draws the same Gaussian vector each round
from the key they share, and adds it with opposite signs.

The vector comes from ChaCha20 keyed with the pair's mask key (:mod:`airgossip.edge.privacy.keys`),
the round as nonce: a cryptographic stream, so seeing masks of some rounds says nothing of
the others, and nobody without the key can predict or strip them. Its 64-bit words become
uniforms (their top 53 bits) and pairs of uniforms normals (Box-Muller), in float64; the
two ends compute bit-identical vectors, so a pair's two masks sum to exactly zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from airgossip.common.identity import natural_key

#: The round's nonce: ChaCha20 takes 16 bytes, a 4-byte block counter then 12 bytes.
_NONCE_PAD = b"\x00" * 4


def gaussian_stream(key: bytes, round_index: int, numel: int) -> np.ndarray:
    """``numel`` standard normals (float64) from ChaCha20(``key``, nonce ``round_index``)."""
    pairs = (numel + 1) // 2
    nonce = _NONCE_PAD + round_index.to_bytes(12, "little")
    stream = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor()
    words = np.frombuffer(stream.update(bytes(16 * pairs)), dtype="<u8").reshape(pairs, 2)
    unit = 1.0 / (1 << 53)
    u1 = ((words[:, 0] >> np.uint64(11)).astype(np.float64) + 1.0) * unit  # (0, 1]: log is finite
    u2 = (words[:, 1] >> np.uint64(11)).astype(np.float64) * unit
    radius = np.sqrt(-2.0 * np.log(u1))
    angle = 2.0 * math.pi * u2
    out = np.empty(2 * pairs)
    out[0::2] = radius * np.cos(angle)
    out[1::2] = radius * np.sin(angle)
    return out[:numel]


def mask_sign(me: str, peer: str) -> float:
    """+1 for the end of the pair that sorts first, -1 for the other."""
    return 1.0 if natural_key(me) < natural_key(peer) else -1.0


class PairMasks:
    """One agent's masks: the sum over its partners of ``sign * std * stream(pair key)``.

    Parameters
    ----------
    identity:
        This agent's id.
    partners:
        The agents it shares a secret with (both ends of a pair list each other).
    key_of:
        The pair's mask key for a partner (:meth:`airgossip.edge.privacy.keys.PairSecrets.mask_key`
        with the run's context); asked once per partner, kept in memory only.
    numel:
        Length of the masked vector.
    """

    def __init__(
        self,
        identity: str,
        partners: Sequence[str],
        key_of: Callable[[str], bytes],
        numel: int,
    ) -> None:
        self.identity = identity
        self.partners = tuple(sorted(set(partners) - {identity}, key=natural_key))
        self._keys = {p: key_of(p) for p in self.partners}
        self.numel = numel

    def __repr__(self) -> str:  # the keys stay out of every log line and traceback
        return f"PairMasks({self.identity!r}, partners={list(self.partners)!r})"

    def pair_mask(self, peer: str, round_index: int, std: float) -> torch.Tensor:
        """What this agent adds for ``peer`` in ``round_index`` (its partner adds the
        negation)."""
        values = gaussian_stream(self._keys[peer], round_index, self.numel)
        return torch.from_numpy(values * (mask_sign(self.identity, peer) * std))

    def mask(self, round_index: int, std: float) -> torch.Tensor:
        """This agent's mask of ``round_index``: the sum of its pair masks (float64)."""
        total = torch.zeros(self.numel, dtype=torch.float64)
        for peer in self.partners:
            total += self.pair_mask(peer, round_index, std)
        return total
