"""Privacy accountants: what an agent has spent so far, and noise calibrated to a target.

Every mechanism but network DP is a (Poisson-subsampled) Gaussian mechanism per step, whose
noise multiplier the graph may stretch (:mod:`airgossip.edge.privacy.graph`): those are accounted by
Opacus's own accountants (RDP or PRV), stepped once per private step. Network DP is one
Gaussian mechanism over the whole run with a sensitivity per pair of agents, converted to
``(epsilon, delta)`` exactly (the analytic Gaussian mechanism, Balle and Wang 2018).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from functools import lru_cache
from types import ModuleType
from typing import Any, Protocol

import numpy as np
from scipy.special import log_ndtr

#: What to install for the mechanisms that need Opacus.
INSTALL_HINT = "pip install 'airgossip[privacy]' (or: pip install opacus)"


class PrivacyError(ValueError):
    """A privacy setting that cannot work here (a missing package, a budget too small)."""


def opacus_module(name: str, mechanism: str) -> ModuleType:
    """Import ``opacus.<name>``; :class:`PrivacyError` naming what to install if absent."""
    try:
        return importlib.import_module(f"opacus.{name}")
    except ImportError:
        raise PrivacyError(
            f"privacy mechanism '{mechanism}' needs Opacus, which is not installed: {INSTALL_HINT}"
        ) from None


def gaussian_delta(mu: float, epsilon: float) -> float:
    """``delta(epsilon)`` of the Gaussian mechanism with sensitivity over noise ``mu``."""
    if mu <= 0:
        return 0.0
    if math.isinf(mu):
        return 1.0
    first = math.exp(log_ndtr(-epsilon / mu + mu / 2))
    second = math.exp(epsilon + log_ndtr(-epsilon / mu - mu / 2))
    return max(0.0, first - second)


def gaussian_epsilon(mu: float, delta: float) -> float:
    """The smallest ``epsilon`` at which the Gaussian mechanism ``mu`` is
    ``(epsilon, delta)``-DP (0 for ``mu = 0``, infinity for ``mu = inf``)."""
    if mu <= 0 or gaussian_delta(mu, 0.0) <= delta:
        return 0.0
    if math.isinf(mu):
        return math.inf
    low, high = 0.0, 1.0
    while gaussian_delta(mu, high) > delta:
        low, high = high, high * 2
        if high > 1e6:
            return math.inf
    for _ in range(100):
        mid = (low + high) / 2
        if gaussian_delta(mu, mid) > delta:
            low = mid
        else:
            high = mid
        if high - low < 1e-9 * max(1.0, high):
            break
    return high


class Ledger(Protocol):
    """What an agent has spent: epsilon at the run's delta after its private steps."""

    steps: int

    def step(self, count: int = 1) -> None:
        """Account ``count`` more private steps (rounds, for network DP)."""

    def epsilon(self, extra_steps: int = 0) -> float:
        """Epsilon spent so far (with ``extra_steps`` more: what the next round would cost)."""


class OpacusLedger:
    """Opacus's accountant (``rdp`` or ``prv``) stepped with one noise multiplier and one
    sampling rate per step, as Opacus's own privacy engine steps it; :meth:`charge` adds steps of
    another multiplier (what a restart costs, see :mod:`airgossip.edge.privacy.journal`)."""

    def __init__(
        self, noise_multiplier: float, sample_rate: float, delta: float, kind: str, mechanism: str
    ) -> None:
        accountants = opacus_module("accountants", mechanism)
        self._make: Callable[[], Any] = lambda: accountants.create_accountant(mechanism=kind)
        self.noise_multiplier = noise_multiplier
        self.sample_rate = sample_rate
        self.delta = delta
        self.steps = 0
        self.charges: dict[float, int] = {}
        self._cache: dict[tuple[int, tuple[tuple[float, int], ...]], float] = {}

    def step(self, count: int = 1) -> None:
        self.steps += count

    def charge(self, noise_multiplier: float, count: int) -> None:
        """Account ``count`` more steps of ``noise_multiplier`` beside the others."""
        self.charges[noise_multiplier] = self.charges.get(noise_multiplier, 0) + count

    def epsilon(self, extra_steps: int = 0) -> float:
        steps = self.steps + extra_steps
        entries = [(self.noise_multiplier, steps), *sorted(self.charges.items())]
        entries = [(sigma, count) for sigma, count in entries if count > 0]
        if not entries:
            return 0.0
        if any(sigma <= 0 for sigma, _ in entries):
            return math.inf
        key = (steps, tuple(sorted(self.charges.items())))
        if key not in self._cache:
            accountant = self._make()
            # The history Opacus's accountant builds from that many calls of step(): one
            # entry per noise multiplier.
            accountant.history = [(sigma, self.sample_rate, count) for sigma, count in entries]
            self._cache = {key: float(accountant.get_epsilon(delta=self.delta))}
        return self._cache[key]


class NetworkLedger:
    """Pairwise network DP of one agent: epsilon towards every other agent after each round
    (``mu_squared`` from :func:`airgossip.edge.privacy.graph.network_sensitivities`, its row). With
    ``local``, every pair gets local DP's figure instead (an agent restarted from a
    checkpoint ran rounds twice, which the graph's linear view does not model)."""

    def __init__(self, mu_squared: Callable[[int], np.ndarray], noise_multiplier: float,
                 delta: float, *, local: bool = False) -> None:  # fmt: skip
        self._mu_squared = mu_squared
        self.noise_multiplier = noise_multiplier
        self.delta = delta
        self.local = local
        self.steps = 0

    def step(self, count: int = 1) -> None:
        self.steps += count

    def pairwise(self, extra_steps: int = 0) -> np.ndarray:
        """Epsilon towards each other agent (the entry of the agent itself is NaN)."""
        squared = self._mu_squared(self.steps + extra_steps)
        if self.local:
            squared = np.where(np.isnan(squared), squared, float(self.steps + extra_steps))
        sigma2 = self.noise_multiplier**2
        return np.array([
            math.nan if math.isnan(m) else
            gaussian_epsilon(math.sqrt(m / sigma2) if sigma2 > 0 else math.inf, self.delta)
            for m in squared
        ])  # fmt: skip

    def epsilon(self, extra_steps: int = 0) -> float:
        """The worst pair: the curious agent that learns most about this one."""
        values = self.pairwise(extra_steps)
        return float(np.nanmax(values)) if np.any(~np.isnan(values)) else 0.0

    def mean_epsilon(self) -> float:
        values = self.pairwise()
        return float(np.nanmean(values)) if np.any(~np.isnan(values)) else 0.0


@lru_cache(maxsize=64)  # every agent of an in-process fleet asks the same
def opacus_noise_multiplier(
    target_epsilon: float, delta: float, sample_rate: float, steps: int, kind: str,
    mechanism: str,
) -> float:  # fmt: skip
    """Opacus's calibration: the noise multiplier that spends ``target_epsilon`` in ``steps``."""
    utils = opacus_module("accountants.utils", mechanism)
    try:
        return float(
            utils.get_noise_multiplier(
                target_epsilon=target_epsilon,
                target_delta=delta,
                sample_rate=sample_rate,
                steps=steps,
                accountant=kind,
                epsilon_tolerance=0.005,
            )
        )
    except ValueError as err:
        raise PrivacyError(
            f"[privacy] target_epsilon {target_epsilon:g} cannot be reached in {steps} steps "
            f"at delta {delta:g}: {err}"
        ) from None


def calibrate(spent: Callable[[float], float], target: float, *, start: float = 1.0) -> float:
    """The smallest noise multiplier ``sigma`` with ``spent(sigma) <= target`` (``spent``
    decreasing in ``sigma``), to a relative 1e-4."""
    low, high = 0.0, start
    while spent(high) > target:
        low, high = high, high * 2
        if high > 1e7:
            raise PrivacyError(f"[privacy] target_epsilon {target:g} needs more noise than 1e7")
    while high - low > 1e-4 * high:
        mid = (low + high) / 2
        if spent(mid) > target:
            low = mid
        else:
            high = mid
    return high
