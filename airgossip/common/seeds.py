"""Seeds and counter-based hashes: every random draw of the project derives from here.

Two families, each written once:

* :func:`hash64` / :func:`derive_seed`: a stable 64-bit (63-bit for seeds) hash of any mix
  of integers and strings (BLAKE2b), for naming a generator after what it belongs to (an
  agent, a link, a block of a message).
* :func:`splitmix64` (one integer) and :func:`splitmix64_array` (a numpy array, the same
  function element-wise): SplitMix64, a bijection on 64-bit integers, for draws that must
  be a pure function of integer keys with no generator state (per-message link verdicts,
  random-k indices), identical on every machine and library version.
"""

from __future__ import annotations

import hashlib

import numpy as np

MASK64 = (1 << 64) - 1
#: SplitMix64's increment (the golden ratio in 64 bits).
GOLDEN64 = 0x9E3779B97F4A7C15
_GOLDEN = np.uint64(GOLDEN64)


def hash64(*parts: int | str) -> int:
    """A 64-bit hash of integers and strings, stable across runs and machines."""
    text = "\x00".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed (fits every generator) from any mix of integers and strings."""
    return hash64(*parts) >> 1


def splitmix64(z: int) -> int:
    """SplitMix64 of one 64-bit integer: ``z + golden``, then the finaliser."""
    z = (z + GOLDEN64) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def splitmix64_array(z: np.ndarray) -> np.ndarray:
    """:func:`splitmix64` element-wise over a ``uint64`` array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = z.astype(np.uint64, copy=False) + _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    out: np.ndarray = x ^ (x >> np.uint64(31))
    return out


def keyed_hash(*keys: int, start: int = 0) -> int:
    """A 64-bit hash that is a pure function of the integer keys (a SplitMix64 chain)."""
    h = start
    for key in keys:
        h = splitmix64(h ^ (key & MASK64))
    return h


def to_unit(h: int) -> float:
    """The top 53 bits of a 64-bit hash as a uniform in [0, 1)."""
    return (h >> 11) * (1.0 / (1 << 53))


def keyed_uniform(*keys: int) -> float:
    """A uniform in [0, 1) that is a pure function of the integer keys."""
    return to_unit(keyed_hash(*keys))
