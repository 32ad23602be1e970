"""The static links' per-message draw for many messages at once.

:class:`~airgossip.emulation.networks.static.BernoulliLinkShaper` decides each message from its own
generator, ``numpy.random.default_rng([seed, hash64(sender, receiver), round, index])``, and
drops it when that generator's first ``random()`` is below the loss. Building a generator
costs microseconds; a fleet of 100,000 agents sends millions of messages a round. The
generator is a pure function of its four keys (NumPy's ``SeedSequence`` hashes them into
the state of a ``PCG64``), so :func:`link_uniforms` computes the same first draw for whole
arrays of keys: the SeedSequence mixing on 32-bit words, the PCG64 seeding and first step on
128-bit integers held as pairs of 64-bit words. The result equals the generator's draw bit
for bit (tests/emulation/test_batched_fleet.py checks it against ``default_rng``), so a
batched verdict is the per-message one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from airgossip.common.seeds import hash64

# NumPy's SeedSequence constants (numpy/random/bit_generator.pyx).
_INIT_A = np.uint32(0x43B0D7E5)
_MULT_A = np.uint32(0x931E8875)
_INIT_B = np.uint32(0x8B51F9DD)
_MULT_B = np.uint32(0x58F38DED)
_MIX_L = np.uint32(0xCA01F9DD)
_MIX_R = np.uint32(0x4973F715)
_XSHIFT = np.uint32(16)
_POOL = 4
# PCG64's 128-bit multiplier as (high, low) 64-bit words.
_PCG_HI = np.uint64(2549297995355413924)
_PCG_LO = np.uint64(4865540595714422341)
_LO32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
_U32 = np.uint64(0x1_0000_0000)


def edge_hashes(ids: Sequence[str], senders: np.ndarray, receivers: np.ndarray) -> np.ndarray:
    """``hash64(ids[sender], ids[receiver])`` for every edge, as ``uint64``."""
    return np.array(
        [hash64(ids[i], ids[j]) for i, j in zip(senders.tolist(), receivers.tolist(), strict=True)],
        dtype=np.uint64,
    )


def _hashmix(value: np.ndarray, const: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    value = value ^ const
    const = const * _MULT_A
    value = value * const
    return value ^ (value >> _XSHIFT), const


def _mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    result: np.ndarray = _MIX_L * x - _MIX_R * y
    mixed: np.ndarray = result ^ (result >> _XSHIFT)
    return mixed


def _pool(entropy: list[np.ndarray]) -> list[np.ndarray]:
    """SeedSequence's entropy pool (4 words) of ``entropy`` (equal-length word columns)."""
    m = entropy[0].shape[0]
    const = np.full(m, _INIT_A, dtype=np.uint32)
    zero = np.zeros(m, dtype=np.uint32)
    pool = []
    for i in range(_POOL):
        word, const = _hashmix(entropy[i] if i < len(entropy) else zero, const)
        pool.append(word)
    for src in range(_POOL):
        for dst in range(_POOL):
            if src != dst:
                mixed, const = _hashmix(pool[src], const)
                pool[dst] = _mix(pool[dst], mixed)
    for src in range(_POOL, len(entropy)):
        for dst in range(_POOL):
            mixed, const = _hashmix(entropy[src], const)
            pool[dst] = _mix(pool[dst], mixed)
    return pool


def _state_words(pool: list[np.ndarray]) -> list[np.ndarray]:
    """``generate_state(4, uint64)``: four 64-bit words from eight 32-bit ones."""
    const = np.full(pool[0].shape[0], _INIT_B, dtype=np.uint32)
    words32 = []
    for k in range(8):
        value = pool[k % _POOL] ^ const
        const = const * _MULT_B
        value = value * const
        words32.append(value ^ (value >> _XSHIFT))
    return [
        words32[2 * k].astype(np.uint64) | (words32[2 * k + 1].astype(np.uint64) << _S32)
        for k in range(4)
    ]


def _mulhi64(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The high 64 bits of the 128-bit product of two 64-bit words."""
    a_lo, a_hi = a & _LO32, a >> _S32
    b_lo, b_hi = b & _LO32, b >> _S32
    lo_lo = a_lo * b_lo
    hi_lo = a_hi * b_lo
    lo_hi = a_lo * b_hi
    cross = (lo_lo >> _S32) + (hi_lo & _LO32) + lo_hi
    high: np.ndarray = a_hi * b_hi + (hi_lo >> _S32) + (cross >> _S32)
    return high


def _step(hi: np.ndarray, lo: np.ndarray, inc_hi: np.ndarray, inc_lo: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """One PCG64 step: ``state * MULT + inc`` modulo 2**128."""
    new_lo = lo * _PCG_LO
    new_hi = _mulhi64(lo, _PCG_LO) + lo * _PCG_HI + hi * _PCG_LO
    out_lo = new_lo + inc_lo
    carry = (out_lo < new_lo).astype(np.uint64)
    return new_hi + inc_hi + carry, out_lo


def _first_uniform(words: list[np.ndarray]) -> np.ndarray:
    """The first ``random()`` of a PCG64 seeded with SeedSequence state ``words``."""
    s_hi, s_lo, i_hi, i_lo = words
    # srandom: state = 0; inc = (initseq << 1) | 1; step; state += initstate; step.
    inc_hi = (i_hi << np.uint64(1)) | (i_lo >> np.uint64(63))
    inc_lo = (i_lo << np.uint64(1)) | np.uint64(1)
    hi, lo = inc_hi, inc_lo  # the first step from state 0
    lo2 = lo + s_lo
    hi = hi + s_hi + (lo2 < lo).astype(np.uint64)
    hi, lo = _step(hi, lo2, inc_hi, inc_lo)
    hi, lo = _step(hi, lo, inc_hi, inc_lo)  # next64: step, then output XSL-RR
    xored = hi ^ lo
    rot = hi >> np.uint64(58)
    out = (xored >> rot) | (xored << ((np.uint64(64) - rot) & np.uint64(63)))
    uniform: np.ndarray = (out >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)
    return uniform


def link_uniforms(seed: int, hashes: np.ndarray, round_index: int, indexes: np.ndarray
                  ) -> np.ndarray:  # fmt: skip
    """``default_rng([seed, hashes[k], round_index, indexes[k]]).random()`` for every ``k``.

    ``seed`` and ``round_index`` are below 2**64 and ``indexes`` below 2**32 (a link's
    message count); ``hashes`` are ``uint64``.
    """
    if not 0 <= seed < 1 << 64 or not 0 <= round_index < 1 << 64:
        raise ValueError("seed and round must be within [0, 2**64)")
    hashes = np.asarray(hashes, dtype=np.uint64)
    indexes = np.asarray(indexes, dtype=np.uint64)
    if indexes.size and int(indexes.max()) >= 1 << 32:
        raise ValueError("message indexes must be below 2**32")
    m = hashes.shape[0]
    out = np.empty(m, dtype=np.float64)
    if m == 0:
        return out

    def column(value: int) -> list[np.ndarray]:
        words = [value & 0xFFFFFFFF] + ([value >> 32] if value >= 1 << 32 else [])
        return [np.full(m, w, dtype=np.uint32) for w in words]

    # SeedSequence takes an integer as its little-endian 32-bit words: one below 2**32.
    h_lo, h_hi = (hashes & _LO32).astype(np.uint32), (hashes >> _S32).astype(np.uint32)
    two = hashes >= _U32
    index = indexes.astype(np.uint32)
    with np.errstate(over="ignore"):
        # A hash below 2**32 is one word to SeedSequence, two otherwise: two entropy lengths.
        for has_two in (False, True):
            sel = np.flatnonzero(two == has_two)
            if sel.size == 0:
                continue
            entropy = [c[sel] for c in column(seed)]
            entropy += [h_lo[sel], h_hi[sel]] if has_two else [h_lo[sel]]
            entropy += [c[sel] for c in column(round_index)] + [index[sel]]
            out[sel] = _first_uniform(_state_words(_pool(entropy)))
    return out


class BernoulliDrops:
    """:class:`~airgossip.emulation.networks.static.BernoulliLinkShaper`'s drops for arrays of
    messages (a :class:`~airgossip.node.network.BatchedDrops`): the same loss on every
    link, the same draw per message."""

    def __init__(self, seed: int, loss: float) -> None:
        self.seed, self.loss = seed, loss

    def link_keys(self, ids: list[str], senders: np.ndarray, receivers: np.ndarray
                  ) -> np.ndarray:  # fmt: skip
        return edge_hashes(ids, senders, receivers)

    def dropped(self, keys: np.ndarray, round_index: int, indexes: np.ndarray) -> np.ndarray:
        if self.loss == 0:  # the shaper draws nothing: no message is lost
            return np.zeros(keys.shape[0], dtype=bool)
        lost: np.ndarray = link_uniforms(self.seed, keys, round_index, indexes) < self.loss
        return lost
