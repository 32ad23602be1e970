"""Random draws per link, addressed by the link's key (``i * n + j``).

Complex draws come as two float32 rows, the real parts and the imaginary parts (``(2, k)``):
each part is drawn straight into its row (the parts of a complex64 array are strided, and
filling them costs twice the draw at 10,000 nodes).

:class:`StreamDraws` draws as many values as keys from a generator of its own per
``(seed, stream, step, sub)``, so a model that holds only the links in range draws for
exactly those. :class:`DenseDraws` (``sub`` ignored) gives the dense model's draws (a whole
``n x n`` array per ``(seed, stream, step)``, indexed by key): with it the model over the
links in range reproduces the dense one where both apply (tests, small fleets).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from airgossip.emulation.channel import fading as fad


class Draws(Protocol):
    def uniform(self, stream: int, step: int, keys: np.ndarray, sub: int = 0) -> np.ndarray: ...

    def normal(self, stream: int, step: int, keys: np.ndarray, sub: int = 0) -> np.ndarray: ...

    def complex_normal(
        self, stream: int, step: int, keys: np.ndarray, sub: int = 0, out: np.ndarray | None = None
    ) -> np.ndarray:
        """``CN(0, 1)`` as float32 ``(2, len(keys))``: real parts, imaginary parts (into
        ``out`` where given)."""
        ...


class StreamDraws:
    """One generator per ``(seed, stream, step, sub)``, drawn in the order of the keys asked
    for (float32): ``U(0, 1)``, ``N(0, 1)`` and ``CN(0, 1)``. The keys are those of the pairs
    in range, a function of the scenario, the seed and the step, so the draws are too."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def _rng(self, stream: int, step: int, sub: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, stream, step, sub, 0x5A])

    def uniform(self, stream: int, step: int, keys: np.ndarray, sub: int = 0) -> np.ndarray:
        return self._rng(stream, step, sub).random(len(keys), dtype=np.float32)

    def normal(self, stream: int, step: int, keys: np.ndarray, sub: int = 0) -> np.ndarray:
        return self._rng(stream, step, sub).standard_normal(len(keys), dtype=np.float32)

    def complex_normal(
        self, stream: int, step: int, keys: np.ndarray, sub: int = 0, out: np.ndarray | None = None
    ) -> np.ndarray:
        """The real parts, then the imaginary parts, each drawn straight into its row (of
        ``out`` where given)."""
        rng = self._rng(stream, step, sub)
        size = len(keys)
        if out is None:
            out = np.empty((2, size), dtype=np.float32)
        for part in out:
            rng.standard_normal(out=part, dtype=np.float32)
            part *= np.float32(np.sqrt(0.5))
        return out


class DenseDraws:
    """The dense model's draws: a whole ``n x n`` array per ``(stream, step)``, then the
    keys' entries (memory and time of the dense model: for tests and small fleets)."""

    def __init__(self, seed: int, n: int) -> None:
        self.seed, self.n = seed, n

    def _rng(self, stream: int, step: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, stream, step])

    def uniform(self, stream: int, step: int, keys: np.ndarray, sub: int = 0) -> np.ndarray:
        full = self._rng(stream, step).random((self.n, self.n), dtype=np.float32)
        return np.asarray(full.ravel()[keys])

    def normal(self, stream: int, step: int, keys: np.ndarray, sub: int = 0) -> np.ndarray:
        full = self._rng(stream, step).standard_normal((self.n, self.n), dtype=np.float32)
        return np.asarray(full.ravel()[keys])

    def complex_normal(
        self, stream: int, step: int, keys: np.ndarray, sub: int = 0, out: np.ndarray | None = None
    ) -> np.ndarray:
        full = fad.complex_normal(self._rng(stream, step), (self.n, self.n)).ravel()[keys]
        if out is None:
            out = np.empty((2, len(keys)), dtype=np.float32)
        out[0], out[1] = full.real, full.imag
        return out
